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
_HEADER = re.compile(r"\s*([A-Za-z_][\w-]*)\s*:")  # after <tool>: NAME and its colon


@dataclass(frozen=True)
class Action:
    kind: str  # tool | answer | malformed
    name: str = ""
    argument: str = ""
    error: str = ""


def parse(text: str, tools: tuple[str, ...]) -> Action:
    """What a model turn asks for: its first complete <answer>...</answer> or <tool>NAME: ...</tool>,
    whichever opens later (text before it is thinking; the engine stops at the first closing tag).
    Linear in the turn's length, whatever the model wrote (a regex search from every opening tag
    was quadratic: thousands of unclosed tags held the rollout for seconds)."""
    answer = _first_answer(text)
    tool = _first_tool(text)
    if answer and (not tool or answer[0] > tool[0]):
        return Action("answer", argument=answer[1].strip())
    if tool:
        _, name, argument = tool
        if name not in tools:
            return Action("malformed", name=name, error=f"unknown tool {name!r}; tools: {', '.join(tools)}")
        return Action("tool", name, argument.strip())
    if "<tool>" in text:
        return Action("malformed", error="malformed tool call: expected <tool>NAME: ARGUMENT</tool> with NAME one of "
                      + ", ".join(tools))
    return Action("malformed", error="no tool call and no answer: end the turn with <tool>NAME: ARGUMENT</tool> "
                  "or <answer>TEXT</answer>")


def _first_answer(text: str) -> tuple[int, str] | None:
    """(where it opens, its text) of the first <answer> that a later </answer> closes."""
    last_close = text.rfind("</answer>")
    start = text.find("<answer>")
    if last_close < 0 or start < 0 or start + len("<answer>") > last_close:
        return None
    body = start + len("<answer>")
    return start, text[body:text.find("</answer>", body)]


def _first_tool(text: str) -> tuple[int, str, str] | None:
    """(where it opens, NAME, its argument) of the first <tool> with a NAME and a colon that a later
    </tool> closes. A header cannot hold '<', so one that starts before the last </tool> ends before it."""
    last_close = text.rfind("</tool>")
    start = text.find("<tool>")
    while 0 <= start < last_close:
        header = _HEADER.match(text, start + len("<tool>"))
        if header is not None:
            return start, header.group(1), text[header.end():text.find("</tool>", header.end())]
        start = text.find("<tool>", start + 1)
    return None


def observation(output: str, status: str, max_chars: int = 2_000) -> str:
    """What a tool's output adds to the context: at most `max_chars` characters, each one UTF-8 can
    carry. A lone surrogate (a test's value the code under test built from `"\\udc80"`, read back
    from the runner's JSON) becomes `?`: the tokenizer refuses it, and that had raised out of the
    whole rollout."""
    text = output if len(output) <= max_chars else output[:max_chars] + " [...]"
    text = text.encode("utf-8", "replace").decode("utf-8")
    return f"<obs>{text}</obs>\n" if status == "ok" else f"<obs status=error>{text}</obs>\n"


OPENINGS = ("<obs status=error>", "<obs>")  # an observation's first tag (the longer first: both start "<obs")


def observation_ids(tokenizer, text: str) -> list[int]:
    """The token ids of `observation`'s text: its tags as the special tokens they are, and the
    tool's output between them as plain text throughout. A call printing `</obs>`, `<answer>` or
    `<|eos|>` had put those very tokens in the context. An output without such text has the ids the
    whole text has (the tokenizer splits at special tokens before anything else)."""
    opening = next(tag for tag in OPENINGS if text.startswith(tag))
    body, _, after = text[len(opening):].rpartition("</obs>")

    def ids(part: str, split_special_tokens: bool = False) -> list[int]:
        return tokenizer(part, add_special_tokens=False, split_special_tokens=split_special_tokens)["input_ids"]

    return ids(opening) + ids(body, split_special_tokens=True) + ids("</obs>" + after)

