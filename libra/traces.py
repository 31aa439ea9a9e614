"""Reading per-turn trace files (the format in data/traces/README.md).

One parser serves every consumer: `libra traces import` (into the store), router evaluation and
the simulator's `trace:FILE.csv` workload. It validates everything before returning, so a caller
that writes only after `read_trace` succeeds never writes half a file. Errors name the file, the
line and the reason.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from libra.errors import LibraError, TraceFormatError
from libra.types import NO_TOOL, ToolStatus, Trajectory, Turn

REQUIRED_COLUMNS = (
    "source",
    "prompt_id",
    "sample_id",
    "turn_idx",
    "gen_tokens",
    "tool_name",
    "tool_payload_tokens",
    "tool_status",
    "prompt_tokens",
    "final_reward",
)
OPTIONAL_COLUMNS = ("gen_tokens_method",)
_STATUSES = {"ok": ToolStatus.OK, "error": ToolStatus.ERROR, "timeout": ToolStatus.TIMEOUT}


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A validated trace: trajectories in order of first appearance in the file."""

    path: str
    trajectories: tuple[Trajectory, ...]
    rows: int  # data rows read (= turns)


@dataclass(slots=True)
class _Row:
    line: int
    source: str
    turn_idx: int
    gen_tokens: int
    tool_name: str
    tool_payload_tokens: int
    tool_status: ToolStatus
    prompt_tokens: int | None
    reward: float | None


def read_trace(path: str | Path) -> TraceFile:
    """Parse and validate a per-turn trace CSV; raise TraceFormatError on the first problem."""
    path = Path(path)
    if not path.is_file():
        raise LibraError(f"{path}: no such trace file; pass a CSV in the per-turn trace format")
    name = str(path)
    groups: dict[tuple[str, str], list[_Row]] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(name, 1, "empty file: expected a header row " + ",".join(REQUIRED_COLUMNS))
        header = [h.strip() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise TraceFormatError(
                name, 1, f"missing column(s) {', '.join(missing)}; a trace needs {', '.join(REQUIRED_COLUMNS)}"
            )
        index = {c: header.index(c) for c in REQUIRED_COLUMNS}
        rows = 0
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceFormatError(name, line, f"{len(values)} fields, header has {len(header)}")
            field = {c: values[i].strip() for c, i in index.items()}
            key = (field["prompt_id"], field["sample_id"])
            if not key[0] or not key[1]:
                raise TraceFormatError(name, line, "prompt_id and sample_id must not be empty")
            groups.setdefault(key, []).append(_parse_row(name, line, field))
            rows += 1
    if rows == 0:
        raise TraceFormatError(name, 2, "no data rows after the header")
    trajectories = tuple(_assemble(name, key, group) for key, group in groups.items())
    return TraceFile(path=name, trajectories=trajectories, rows=rows)


def _int_field(path: str, line: int, field: dict[str, str], column: str) -> int:
    text = field[column]
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(path, line, f"{column} must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise TraceFormatError(path, line, f"{column} must be a non-negative integer, got {value}")
    return value


def _parse_row(path: str, line: int, field: dict[str, str]) -> _Row:
    turn_idx = _int_field(path, line, field, "turn_idx")
    gen_tokens = _int_field(path, line, field, "gen_tokens")
    payload = _int_field(path, line, field, "tool_payload_tokens")
    tool_name = field["tool_name"] or NO_TOOL
    status_text = field["tool_status"].lower()
    if tool_name == NO_TOOL:
        if status_text not in ("", "none") or payload != 0:
            raise TraceFormatError(
                path, line, "a turn with tool_name 'none' must have an empty tool_status and tool_payload_tokens 0"
            )
        status = ToolStatus.NONE
    else:
        if status_text not in _STATUSES:
            raise TraceFormatError(
                path, line, f"tool_status must be one of ok, error, timeout after a tool call, got {status_text!r}"
            )
        status = _STATUSES[status_text]
    prompt_tokens: int | None = None
    if turn_idx == 0:
        if not field["prompt_tokens"]:
            raise TraceFormatError(path, line, "prompt_tokens is required on turn 0")
        prompt_tokens = _int_field(path, line, field, "prompt_tokens")
    elif field["prompt_tokens"]:
        raise TraceFormatError(path, line, f"prompt_tokens belongs on turn 0 only, found on turn {turn_idx}")
    reward: float | None = None
    if field["final_reward"]:
        try:
            reward = float(field["final_reward"])
        except ValueError:
            raise TraceFormatError(path, line, f"final_reward must be a number or empty, got {field['final_reward']!r}") from None
        if not math.isfinite(reward):
            raise TraceFormatError(path, line, f"final_reward must be finite, got {field['final_reward']!r}")
    return _Row(line, field["source"], turn_idx, gen_tokens, tool_name, payload, status, prompt_tokens, reward)


def _assemble(path: str, key: tuple[str, str], group: list[_Row]) -> Trajectory:
    prompt_id, sample_id = key
    trajectory_id = f"{prompt_id}/{sample_id}"
    ordered = sorted(group, key=lambda r: (r.turn_idx, r.line))
    for expected, row in enumerate(ordered):
        if row.turn_idx != expected:
            what = "repeats" if row.turn_idx < expected else f"skips turn {expected}"
            raise TraceFormatError(path, row.line, f"trajectory {trajectory_id}: turn_idx {row.turn_idx} {what} (a turn gap)")
    first = ordered[0]
    for row in ordered[1:]:
        if row.reward != first.reward:
            raise TraceFormatError(path, row.line, f"trajectory {trajectory_id}: final_reward differs between its rows")
        if row.source != first.source:
            raise TraceFormatError(path, row.line, f"trajectory {trajectory_id}: source differs between its rows")
    for row in ordered[:-1]:
        if row.tool_name == NO_TOOL:
            raise TraceFormatError(path, row.line, f"trajectory {trajectory_id}: turn {row.turn_idx} calls no tool but is not the last turn")
    assert first.prompt_tokens is not None  # checked on turn 0 by _parse_row
    turns: list[Turn] = []
    context = first.prompt_tokens
    for row in ordered:
        turns.append(
            Turn(trajectory_id, prompt_id, sample_id, row.turn_idx, context, row.gen_tokens,
                 row.tool_name, row.tool_payload_tokens, row.tool_status)
        )
        context += row.gen_tokens + row.tool_payload_tokens
    return Trajectory(trajectory_id, prompt_id, sample_id, first.source, first.prompt_tokens, tuple(turns), first.reward)


def steps_by_prompt(trajectories: Iterable[Trajectory], prompts_per_step: int) -> dict[str, int]:
    """RL order: step k takes the k-th batch of `prompts_per_step` prompts (by first appearance),
    with all their samples."""
    if prompts_per_step < 1:
        raise LibraError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
    steps: dict[str, int] = {}
    for trajectory in trajectories:
        if trajectory.prompt_id not in steps:
            steps[trajectory.prompt_id] = len(steps) // prompts_per_step
    return steps


def group_by_step(trajectories: Sequence[Trajectory], prompts_per_step: int) -> dict[int, list[Trajectory]]:
    """Trajectories of each step, in step order (see `steps_by_prompt`)."""
    steps = steps_by_prompt(trajectories, prompts_per_step)
    out: dict[int, list[Trajectory]] = {}
    for trajectory in trajectories:
        out.setdefault(steps[trajectory.prompt_id], []).append(trajectory)
    return dict(sorted(out.items()))
