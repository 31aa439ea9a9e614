"""Shared records that cross module boundaries.

Small frozen dataclasses with units in their field comments. `storage/` maps these onto Arrow
schemas; the planner, the scheduler and the simulator read them. Later subsystems add their own
records here (plans, pool events) when more than one package needs them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum


class ToolStatus(StrEnum):
    """How a tool call ended, as the causal tree keys it."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    NONE = "none"  # the final turn: no tool was called


NO_TOOL = "none"  # tool_name of a final turn


@dataclass(frozen=True, slots=True)
class Turn:
    """One model generation and the tool return that follows it."""

    trajectory_id: str  # unique within a run: "<prompt_id>/<sample_id>"
    prompt_id: str  # prompts with the same id are samples of the same task
    sample_id: str  # which sample of the prompt
    turn_idx: int  # 0, 1, ... without gaps
    context_tokens: int  # tokens in the context when this turn starts (prompt + earlier turns)
    gen_tokens: int  # tokens generated in this turn
    tool_name: str  # tool called at the end of the turn; NO_TOOL on the final turn
    tool_payload_tokens: int  # tokens of the tool result appended after this turn (0 if none)
    tool_status: ToolStatus  # NONE on the final turn
    # known for turns a live rollout generated, None for imported traces:
    instance: str | None = None  # rollout instance that generated the turn
    bucket: int | None = None  # length bucket the router chose for the turn
    migrated: bool | None = None  # re-prefilled on another instance than the previous turn's
    gen_latency_s: float | None = None  # wall time of the generation (s)
    tool_latency_s: float | None = None  # wall time of the tool call (s)
    model_version: int | None = None  # the policy weights that generated the turn


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A whole multi-turn trajectory: the unit that is rolled out, rewarded and trained on."""

    trajectory_id: str
    prompt_id: str
    sample_id: str
    source: str  # workload or dataset name
    prompt_tokens: int  # initial prompt size
    turns: tuple[Turn, ...]
    reward: float | None  # final reward; None when unknown
    model_version: int | None = None  # the policy weights that generated it; None for imported traces
    rollout_s: float | None = None  # wall time from its first prefill to its last token; None for imported traces
    category: str | None = None  # the task's kind within its environment (a math template); None when unknown
    outcome: str | None = None  # solved | wrong | unanswered (no answer in the expected form); None for imported traces

    def __setstate__(self, state: tuple) -> None:
        """Unpickling (a checkpoint's batches): one pickled before the later fields existed gets their defaults."""
        fields = dataclasses.fields(self)
        if len(state) > len(fields):
            raise ValueError(f"a pickled trajectory with {len(state)} fields, this version has {len(fields)}: "
                             "load it with the version of Libra that wrote it")
        for i, f in enumerate(fields):
            object.__setattr__(self, f.name, state[i] if i < len(state) else f.default)

    @property
    def gen_tokens(self) -> int:
        """Tokens the policy generated over all turns."""
        return sum(t.gen_tokens for t in self.turns)

    @property
    def tool_payload_tokens(self) -> int:
        """Tokens of tool results appended to the context over all turns."""
        return sum(t.tool_payload_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        """Final context length: prompt + generated + tool payload tokens."""
        return self.prompt_tokens + self.gen_tokens + self.tool_payload_tokens

    @property
    def num_tool_calls(self) -> int:
        return sum(1 for t in self.turns if t.tool_name != NO_TOOL)
