from pathlib import Path

import pytest

from libra.errors import LibraError, TraceFormatError
from libra.traces import MAX_COUNT, PROGRESS_ROWS, bundled_traces, group_by_step, read_trace, steps_by_prompt
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


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    return path


def _header_and(rows: str) -> bytes:
    return (",".join(HEADER) + "\n" + rows).encode()


def test_a_byte_order_mark_is_read_as_utf8(tmp_path: Path) -> None:
    plain = small_trace(tmp_path / "plain.csv")
    with_bom = _write(tmp_path, b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_trace(with_bom).trajectories == read_trace(plain).trajectories


def test_bytes_that_are_not_utf8_name_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, _header_and("x,p,s,0,1,none,0,,5,,api_usage\n") + b"x,p\xe9,s,0,1,none,0,,5,,api_usage\n")
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert (info.value.line, info.value.reason) == (3, "not UTF-8 text (byte 0xe9 at column 4); a trace is a UTF-8 CSV file")
    with pytest.raises(TraceFormatError, match=r":1: not UTF-8 text \(byte 0x89 at column 1\)"):
        read_trace(_write(tmp_path, b"\x89PNG\r\n\x1a\n\x00\x00"))


def test_counts_beyond_the_largest_are_refused(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    rows[0]["gen_tokens"] = str(2**64 + 1)
    assert _error(tmp_path, rows).reason == (
        "gen_tokens = '18446744073709551617' is more than 2,147,483,647, the largest count a trace may hold")
    rows[0]["gen_tokens"] = "9" * 5000  # past Python's int-from-string limit
    assert _error(tmp_path, rows).reason == (
        f"gen_tokens = {'9' * 40!r}... (5,000 characters) is more than 2,147,483,647, the largest count a trace may hold")
    rows[0]["gen_tokens"] = str(MAX_COUNT)
    path = write_trace(tmp_path / "max.csv", rows)
    assert read_trace(path).trajectories[0].gen_tokens == 2**31 - 1


@pytest.mark.parametrize("text", ["+3", "1_000", "\u0663", " 1 2", "0x10"])
def test_counts_are_plain_ascii_digits(tmp_path: Path, text: str) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    rows[0]["gen_tokens"] = text
    assert _error(tmp_path, rows).reason == f"gen_tokens must be a non-negative integer, got {text.strip()!r}"


def test_a_field_over_the_csv_limit_is_a_format_error(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    rows[0]["source"] = "s" * 200_000
    err = _error(tmp_path, rows)
    assert (err.line, err.reason) == (2, "a field is longer than 131,072 characters (an unclosed quote?); "
                                         "a trace's fields are ids, names and numbers")
    path = _write(tmp_path, _header_and('x,"p,s,0,1,none,0,,5,,api_usage\n' + ("y" * 99 + "\n") * 2000))  # never closed
    with pytest.raises(TraceFormatError, match=r":1313: a field is longer than 131,072 characters"):
        read_trace(path)


def test_a_trajectory_without_tokens_is_refused(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")]) + trace_rows("q", "s", 0, [(0, "none", 0, "")])
    err = _error(tmp_path, rows)
    assert (err.line, err.reason) == (3, "trajectory q/s has no tokens (prompt_tokens, gen_tokens and "
                                         "tool_payload_tokens are all 0); a trajectory holds at least one token")
    rows = trace_rows("q", "s", 0, [(1, "none", 0, "")])  # one generated token is enough
    assert read_trace(write_trace(tmp_path / "one.csv", rows)).trajectories[0].total_tokens == 1


def test_directories_and_repeated_columns(tmp_path: Path) -> None:
    with pytest.raises(LibraError) as info:
        read_trace(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory; pass a CSV file in the per-turn trace format"
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    err = _error(tmp_path, rows, HEADER + ["gen_tokens"])
    assert (err.line, err.reason) == (1, "column(s) gen_tokens appear more than once in the header")


def test_values_quoted_in_errors_are_cut_short(tmp_path: Path) -> None:
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    rows[0]["final_reward"] = "x" * 1000
    assert _error(tmp_path, rows).reason == f"final_reward must be a number or empty, got {'x' * 40!r}... (1,000 characters)"


def test_progress_hears_bytes_read(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "data" / "traces" / "tora_gsm8k.csv"
    heard: list[tuple[int, int]] = []
    trace = read_trace(path, progress=lambda done, total: heard.append((done, total)))
    size = path.stat().st_size
    assert trace.rows == 5274 and len(heard) == 5274 // PROGRESS_ROWS + 1
    assert heard[-1] == (size, size) and all(0 < done <= size and total == size for done, total in heard)
    assert [done for done, _ in heard] == sorted(done for done, _ in heard)


def test_bundled_traces_are_found() -> None:
    assert [p.name for p in bundled_traces()] == [
        "fireact_hotpotqa.csv", "swe_gemini3_mini_A.csv", "taubench_airline.csv", "tora_gsm8k.csv"]


def test_ids_that_would_make_one_trajectory_of_two_are_refused(tmp_path: Path) -> None:
    # 'a/b','c' and 'a','b/c' were both stored as trajectory a/b/c
    rows = trace_rows("a/b", "c", 5, [(1, "none", 0, "")]) + trace_rows("a", "b/c", 5, [(1, "none", 0, "")])
    err = _error(tmp_path, rows)
    assert (err.line, err.reason) == (2, "prompt_id and sample_id must not contain '/' (a trajectory's id is "
                                         "prompt_id/sample_id), got 'a/b' and 'c'")


@pytest.mark.parametrize("column", ["prompt_id", "sample_id", "tool_name", "source"])
@pytest.mark.parametrize("control", ["\x1b[31m", "\x9b31m", "\u202e"], ids=["escape", "c1-csi", "bidi-override"])
def test_control_characters_in_names_are_refused(tmp_path: Path, column: str, control: str) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[0][column] = rows[0][column] + control  # would colour the terminal of whoever queries the store, or turn a name around
    err = _error(tmp_path, rows)
    assert err.line == 2 and err.reason.startswith(f"{column} holds a control character (a newline, NUL, escape, ...): ")


def test_line_endings_of_a_lone_cr_and_a_second_byte_order_mark_say_so(tmp_path: Path) -> None:
    path = small_trace(tmp_path / "t.csv")
    text = path.read_text()
    (tmp_path / "cr.csv").write_text(text.replace("\r\n", "\n").replace("\n", "\r"), newline="")
    with pytest.raises(TraceFormatError) as info:
        read_trace(tmp_path / "cr.csv")
    assert info.value.reason == "a line ends with a lone carriage return (CR); lines must end with LF or CRLF"
    (tmp_path / "boms.csv").write_text("\ufeff\ufeff" + text, newline="")
    with pytest.raises(TraceFormatError) as info:
        read_trace(tmp_path / "boms.csv")
    assert (info.value.line, info.value.reason) == (1, "the header starts with a second byte-order mark; save the file "
                                                       "with one at most")
