"""The text protocol between the policy and the tools.

A turn of the model ends with a tool call or the final answer:

    <tool>NAME: ARGUMENT</tool>        e.g. <tool>python: print(17 * 3)</tool>
    <answer>TEXT</answer>

Generation stops at `</tool>` or `</answer>` (`STOPS`). The tool's output comes back as

    <obs>OUTPUT</obs>                  (status ok)
    <obs status=error>MESSAGE</obs>    (status error or timeout)

A turn that is neither (no closing tag, an unknown tool, no `:`) is answered with an error
observation naming what was expected; it never stops the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STOPS = ("</tool>", "</answer>")
SPECIAL = ("<tool>", "</tool>", "<answer>", "</answer>", "<obs>", "<obs status=error>", "</obs>")
_TOOL = re.compile(r"<tool>\s*([A-Za-z_][\w-]*)\s*:(.*?)</tool>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


@dataclass(frozen=True)
class Action:
    kind: str  # tool | answer | malformed
    name: str = ""
    argument: str = ""
    error: str = ""


def parse(text: str, tools: tuple[str, ...]) -> Action:
    """What a model turn asks for; the last complete tag wins (text before it is thinking)."""
    answer = _ANSWER.search(text)
    tool = _TOOL.search(text)
    if answer and (not tool or answer.start() > tool.start()):
        return Action("answer", argument=answer.group(1).strip())
    if tool:
        name = tool.group(1)
        if name not in tools:
            return Action("malformed", name=name, error=f"unknown tool {name!r}; tools: {', '.join(tools)}")
        return Action("tool", name, tool.group(2).strip())
    if "<tool>" in text:
        return Action("malformed", error="malformed tool call: expected <tool>NAME: ARGUMENT</tool> with NAME one of "
                      + ", ".join(tools))
    return Action("malformed", error="no tool call and no answer: end the turn with <tool>NAME: ARGUMENT</tool> "
                  "or <answer>TEXT</answer>")


def observation(output: str, status: str, max_chars: int = 2_000) -> str:
    text = output if len(output) <= max_chars else output[:max_chars] + " [...]"
    return f"<obs>{text}</obs>\n" if status == "ok" else f"<obs status=error>{text}</obs>\n"
