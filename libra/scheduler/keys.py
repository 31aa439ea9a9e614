"""Reducing a tool return to the key of a causal-tree edge.

A return is (tool, payload tokens, status). The tree keys it as (tool type, payload-size class,
status). Two granularities: `fine` keeps the tool name as recorded (`bash:cat`), `coarse` keeps only
the tool family before the first ':' (`bash`). Payload classes use fixed bounds (default 500 and
5,000 tokens: small, medium, large).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Granularity = Literal["fine", "coarse"]


@dataclass(frozen=True, slots=True)
class ToolReturn:
    tool_name: str
    payload_tokens: int
    status: str  # ok / error / timeout


@dataclass(frozen=True)
class KeyScheme:
    granularity: Granularity = "coarse"
    payload_bounds: tuple[int, ...] = (500, 5_000)  # class i holds payloads <= bounds[i]; the last class the rest

    def payload_class(self, tokens: int) -> int:
        for i, bound in enumerate(self.payload_bounds):
            if tokens <= bound:
                return i
        return len(self.payload_bounds)

    def tool_type(self, tool_name: str) -> str:
        return tool_name.split(":", 1)[0] if self.granularity == "coarse" else tool_name

    def key(self, ret: ToolReturn) -> tuple[str, int, str]:
        return self.tool_type(ret.tool_name), self.payload_class(ret.payload_tokens), ret.status
