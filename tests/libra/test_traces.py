from pathlib import Path

import pytest

from libra.errors import LibraError, TraceFormatError
from libra.traces import group_by_step, read_trace, steps_by_prompt
from libra.types import ToolStatus
from tests.builders import HEADER, small_trace, trace_rows, write_trace


def test_small_trace_parses_exactly(tmp_path: Path) -> None:
    trace = read_trace(small_trace(tmp_path / "t.csv"))
    assert trace.rows == 6
    assert [t.trajectory_id for t in trace.trajectories] == ["p1/a", "p1/b", "p2/a"]
    first = trace.trajectories[0]
    assert first.prompt_tokens == 10
    assert [u.context_tokens for u in first.turns] == [10, 35, 3042]
    assert [u.tool_status for u in first.turns] == [ToolStatus.OK, ToolStatus.ERROR, ToolStatus.NONE]
    assert (first.gen_tokens, first.tool_payload_tokens, first.total_tokens, first.num_tool_calls) == (16, 3020, 3046, 2)
    assert trace.trajectories[1].total_tokens == 16
    assert trace.trajectories[2].reward == 0.0
    assert trace.trajectories[2].total_tokens == 630


def test_steps_follow_prompt_order(tmp_path: Path) -> None:
    trace = read_trace(small_trace(tmp_path / "t.csv"))
    assert steps_by_prompt(trace.trajectories, 1) == {"p1": 0, "p2": 1}
    assert steps_by_prompt(trace.trajectories, 2) == {"p1": 0, "p2": 0}
    grouped = group_by_step(trace.trajectories, 1)
    assert {k: [t.trajectory_id for t in v] for k, v in grouped.items()} == {0: ["p1/a", "p1/b"], 1: ["p2/a"]}
    with pytest.raises(LibraError):
        steps_by_prompt(trace.trajectories, 0)


def test_shared_swe_trace_counts() -> None:
    trace = read_trace(Path(__file__).resolve().parents[2] / "data" / "traces" / "swe_gemini3_mini_A.csv")
    assert (trace.rows, len(trace.trajectories)) == (10222, 246)


def _error(tmp_path: Path, rows: list[dict[str, str]], header: list[str] = HEADER) -> TraceFormatError:
    path = write_trace(tmp_path / "bad.csv", rows, header)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    return info.value


def test_missing_column_names_it(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    err = _error(tmp_path, rows, [h for h in HEADER if h != "gen_tokens"])
    assert (err.line, "missing column(s) gen_tokens" in err.reason) == (1, True)
    assert str(err).startswith(str(tmp_path / "bad.csv") + ":1: ")


def test_non_integer_tokens_names_the_line(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[1]["gen_tokens"] = "2.5"
    err = _error(tmp_path, rows)
    assert err.line == 3
    assert err.reason == "gen_tokens must be a non-negative integer, got '2.5'"


def test_negative_tokens_rejected(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[0]["tool_payload_tokens"] = "-4"
    assert _error(tmp_path, rows).reason == "tool_payload_tokens must be a non-negative integer, got -4"


def test_turn_gap_is_reported(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (1, "search", 3, "ok"), (2, "none", 0, "")])
    del rows[1]
    err = _error(tmp_path, rows)
    assert err.line == 3
    assert err.reason == "trajectory p/s: turn_idx 2 skips turn 1 (a turn gap)"


def test_repeated_turn_is_reported(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows.append(dict(rows[1]))
    err = _error(tmp_path, rows)
    assert (err.line, err.reason) == (4, "trajectory p/s: turn_idx 1 repeats (a turn gap)")


def test_final_turn_rules(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, ""), (2, "none", 0, "")])
    rows[1]["prompt_tokens"] = ""
    assert _error(tmp_path, rows).reason == "trajectory p/s: turn 0 calls no tool but is not the last turn"
    rows = trace_rows("p", "s", 5, [(1, "none", 4, "")])
    assert "tool_payload_tokens 0" in _error(tmp_path, rows).reason
    rows = trace_rows("p", "s", 5, [(1, "search", 4, "maybe"), (1, "none", 0, "")])
    assert _error(tmp_path, rows).reason == "tool_status must be one of ok, error, timeout after a tool call, got 'maybe'"


def test_prompt_tokens_on_turn_zero_only(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[0]["prompt_tokens"] = ""
    assert _error(tmp_path, rows).reason == "prompt_tokens is required on turn 0"
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[1]["prompt_tokens"] = "9"
    assert _error(tmp_path, rows).reason == "prompt_tokens belongs on turn 0 only, found on turn 1"


def test_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TraceFormatError, match="empty file"):
        read_trace(tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text(",".join(HEADER) + "\n")
    with pytest.raises(TraceFormatError, match="no data rows"):
        read_trace(tmp_path / "header.csv")
    with pytest.raises(LibraError, match="no such trace file"):
        read_trace(tmp_path / "absent.csv")


def test_ragged_row_and_bad_reward(tmp_path: Path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text(",".join(HEADER) + "\nx,p,s,0,1,none,0,,5\n")
    with pytest.raises(TraceFormatError, match=r":2: 9 fields, header has 11"):
        read_trace(path)
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    rows[0]["final_reward"] = "good"
    assert _error(tmp_path, rows).reason == "final_reward must be a number or empty, got 'good'"
