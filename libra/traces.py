"""Reading per-turn trace files (the format in data/traces/README.md).

One parser serves every consumer: `libra traces import` (into the store), router evaluation and
the simulator's `trace:FILE.csv` workload. It validates everything before returning, so a caller
that writes only after `read_trace` succeeds never writes half a file. Errors name the file, the
line and the reason.

Any file at all gives a `TraceFile` or a `LibraError` (a `TraceFormatError` when the content is at
fault), never another exception: the bytes are decoded as UTF-8 line by line (a byte-order mark is
dropped; a line that is not UTF-8 is an error naming it), CSV errors (a field over 128 KiB, ...)
become format errors, counts are plain ASCII digits up to `MAX_COUNT`, so every sum fits the store's
64-bit columns, and a trajectory holds at least one token (the planner, the simulator and the
router replay divide by lengths). A fuzz test (tests/libra/test_fuzz_inputs.py) holds it to that.
Reading reports its progress, in bytes, to an optional callback; the parser itself prints nothing.
"""

from __future__ import annotations

import codecs
import csv
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from libra.checks import count_of
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
TEXT_COLUMNS = ("source", "prompt_id", "sample_id", "tool_name", "tool_status", "gen_tokens_method")
# shown raw, they would drive the terminal of whoever reads the store (C0, DEL and C1 controls), or
# show a name other than it is (the bidirectional overrides and marks: "U+202E" turns a name around)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
MAX_COUNT = 2**31 - 1  # the largest token count or turn index a trace may hold
MAX_FIELD_CHARS = 131_072  # Python's csv field limit; a trace's fields are ids, names and numbers
PROGRESS_ROWS = 8_192  # rows between two progress reports
_STATUSES = {"ok": ToolStatus.OK, "error": ToolStatus.ERROR, "timeout": ToolStatus.TIMEOUT}
_INTEGER = re.compile(r"-?[0-9]+")

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "traces"  # traces of real agents shipped with Libra

ReadProgress = Callable[[int, int], None]
"""Called as (bytes read, bytes in the file) while a trace is read, and once at the end."""


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


def bundled_traces() -> list[Path]:
    """The trace files shipped in data/traces, by name."""
    return sorted(BUNDLED.glob("*.csv"))


def shown(text: str, limit: int = 40) -> str:
    """A value from the file as an error message quotes it: repr, cut to about `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} characters)"


def _open(path: Path) -> tuple[BinaryIO, int]:
    """The file opened for reading in binary, and its size; a LibraError if it cannot be."""
    if not path.is_file():
        if path.is_dir():
            raise LibraError(f"{path}: is a directory; pass a CSV file in the per-turn trace format")
        if path.exists():
            raise LibraError(f"{path}: not a regular file; pass a CSV file in the per-turn trace format")
        raise LibraError(f"{path}: no such trace file; pass a CSV in the per-turn trace format")
    try:
        fh = path.open("rb")
        return fh, os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise LibraError(f"{path}: cannot read the trace file ({exc.strerror})") from None


class _Lines:
    """The file's lines decoded as UTF-8, for csv.reader; counts the bytes consumed."""

    def __init__(self, fh: BinaryIO, name: str) -> None:
        self.fh = fh
        self.name = name
        self.bytes_read = 0

    def __iter__(self) -> Iterator[str]:
        for number, raw in enumerate(self.fh, start=1):
            self.bytes_read += len(raw)
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(
                    self.name, number, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                    "a trace is a UTF-8 CSV file") from None


def read_trace(path: str | Path, progress: ReadProgress | None = None) -> TraceFile:
    """Parse and validate a per-turn trace CSV; raise TraceFormatError on the first problem in it
    (LibraError when the file cannot be read at all). `progress` hears how many bytes are read."""
    path = Path(path)
    name = str(path)
    fh, size = _open(path)
    groups: dict[tuple[str, str], list[_Row]] = {}
    with fh:
        lines = _Lines(fh, name)
        reader = csv.reader(lines)
        try:
            rows = _read_rows(name, reader, groups, lambda: progress(lines.bytes_read, size) if progress else None)
        except csv.Error as exc:
            raise TraceFormatError(name, max(reader.line_num, 1), _csv_reason(exc)) from None
        except OSError as exc:
            raise LibraError(f"{path}: cannot read the trace file ({exc.strerror})") from None
    if progress:
        progress(size, size)
    if rows == 0:
        raise TraceFormatError(name, 2, "no data rows after the header")
    trajectories = tuple(_assemble(name, key, group) for key, group in groups.items())
    return TraceFile(path=name, trajectories=trajectories, rows=rows)


def _read_rows(name: str, reader: Iterator[list[str]], groups: dict[tuple[str, str], list[_Row]],
               report: Callable[[], None]) -> int:
    """Validate the header and every row into `groups`; returns the number of data rows."""
    header = next(reader, None)
    if header is None:
        raise TraceFormatError(name, 1, "empty file: expected a header row " + ",".join(REQUIRED_COLUMNS))
    header = [h.strip() for h in header]
    if header and header[0].startswith("\ufeff"):
        raise TraceFormatError(name, 1, "the header starts with a second byte-order mark; save the file with one at most")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TraceFormatError(
            name, 1, f"missing column(s) {', '.join(missing)}; a trace needs {', '.join(REQUIRED_COLUMNS)}"
        )
    twice = sorted({c for c in REQUIRED_COLUMNS if header.count(c) > 1})
    if twice:
        raise TraceFormatError(name, 1, f"column(s) {', '.join(twice)} appear more than once in the header")
    index = {c: header.index(c) for c in REQUIRED_COLUMNS}
    rows = 0
    for values in reader:
        line = reader.line_num  # type: ignore[attr-defined]
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise TraceFormatError(name, line, f"{len(values)} fields, header has {len(header)}")
        field = {c: values[i].strip() for c, i in index.items()}
        key = (field["prompt_id"], field["sample_id"])
        if not key[0] or not key[1]:
            raise TraceFormatError(name, line, "prompt_id and sample_id must not be empty")
        if "/" in key[0] or "/" in key[1]:  # a trajectory is prompt_id/sample_id: 'a/b','c' and 'a','b/c' would be one
            raise TraceFormatError(name, line, f"prompt_id and sample_id must not contain '/' (a trajectory's id is "
                                               f"prompt_id/sample_id), got {shown(key[0], 40)} and {shown(key[1], 40)}")
        for column in TEXT_COLUMNS:
            if _CONTROL.search(field.get(column, "")):
                raise TraceFormatError(name, line, f"{column} holds a control character (a newline, NUL, escape, ...): "
                                                   f"{shown(field[column], 40)}")
        groups.setdefault(key, []).append(_parse_row(name, line, field))
        rows += 1
        if rows % PROGRESS_ROWS == 0:
            report()
    return rows


def _csv_reason(exc: csv.Error) -> str:
    if "new-line character seen in unquoted field" in str(exc):
        return "a line ends with a lone carriage return (CR); lines must end with LF or CRLF"
    if "field larger than field limit" in str(exc):
        return (f"a field is longer than {MAX_FIELD_CHARS:,} characters (an unclosed quote?); "
                "a trace's fields are ids, names and numbers")
    return f"not valid CSV ({exc})"


def _int_field(path: str, line: int, field: dict[str, str], column: str) -> int:
    text = field[column]
    if not _INTEGER.fullmatch(text):
        raise TraceFormatError(path, line, f"{column} must be a non-negative integer, got {shown(text)}")
    if text.startswith("-") and text.strip("-0"):
        raise TraceFormatError(path, line, f"{column} must be a non-negative integer, got {text if len(text) <= 40 else shown(text)}")
    value = count_of(text.lstrip("-"), MAX_COUNT)  # (a minus sign before zeros only: 0)
    if value is None:
        raise TraceFormatError(path, line, f"{column} = {shown(text)} is more than {MAX_COUNT:,}, the largest count a trace may hold")
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
                path, line, f"tool_status must be one of ok, error, timeout after a tool call, got {shown(status_text)}"
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
            raise TraceFormatError(path, line, f"final_reward must be a number or empty, got {shown(field['final_reward'])}") from None
        if not math.isfinite(reward):
            raise TraceFormatError(path, line, f"final_reward must be finite, got {shown(field['final_reward'])}")
    return _Row(line, field["source"], turn_idx, gen_tokens, tool_name, payload, status, prompt_tokens, reward)


def _assemble(path: str, key: tuple[str, str], group: list[_Row]) -> Trajectory:
    prompt_id, sample_id = key
    trajectory_id = f"{prompt_id}/{sample_id}"
    named = trajectory_id if len(trajectory_id) <= 80 else shown(trajectory_id, 80)
    ordered = sorted(group, key=lambda r: (r.turn_idx, r.line))
    for expected, row in enumerate(ordered):
        if row.turn_idx != expected:
            what = "repeats" if row.turn_idx < expected else f"skips turn {expected}"
            raise TraceFormatError(path, row.line, f"trajectory {named}: turn_idx {row.turn_idx} {what} (a turn gap)")
    first = ordered[0]
    for row in ordered[1:]:
        if row.reward != first.reward:
            raise TraceFormatError(path, row.line, f"trajectory {named}: final_reward differs between its rows")
        if row.source != first.source:
            raise TraceFormatError(path, row.line, f"trajectory {named}: source differs between its rows")
    for row in ordered[:-1]:
        if row.tool_name == NO_TOOL:
            raise TraceFormatError(path, row.line, f"trajectory {named}: turn {row.turn_idx} calls no tool but is not the last turn")
    assert first.prompt_tokens is not None  # checked on turn 0 by _parse_row
    turns: list[Turn] = []
    context = first.prompt_tokens
    for row in ordered:
        turns.append(
            Turn(trajectory_id, prompt_id, sample_id, row.turn_idx, context, row.gen_tokens,
                 row.tool_name, row.tool_payload_tokens, row.tool_status)
        )
        context += row.gen_tokens + row.tool_payload_tokens
    if context == 0:
        raise TraceFormatError(path, first.line, f"trajectory {named} has no tokens (prompt_tokens, gen_tokens and "
                               "tool_payload_tokens are all 0); a trajectory holds at least one token")
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
