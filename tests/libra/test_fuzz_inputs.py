"""Fuzzing the readers of user files: whatever the bytes, `read_trace` returns a trace or raises a
`LibraError`, and `load_config` returns a config or raises a `ConfigError` (the CLI prints either as
one line). Random bytes, CSV rows built from the trace columns with hostile values, and YAML
documents built from the config's own keys with hostile values and aliases. About 4,000 cases, a
fixed seed (a failure reproduces), well under a minute on two cores.
"""

from __future__ import annotations

import codecs
import csv
import io
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.config import LibraConfig
from libra.config_loading import load_config
from libra.errors import ConfigError, LibraError
from libra.traces import MAX_COUNT, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, TraceFile, read_trace

BASE = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    return settings(BASE, max_examples=examples)


WORKDIR = Path(tempfile.mkdtemp(prefix="libra-fuzz-"))
HEADER = ",".join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS) + "\n"


def trace_outcome(data: bytes) -> TraceFile | None:
    """read_trace on a file holding `data`: the trace, or None after a LibraError (anything else fails)."""
    path = WORKDIR / "fuzz.csv"
    path.write_bytes(data)
    try:
        trace = read_trace(path)
    except LibraError as exc:
        assert str(exc)  # a message to print
        return None
    assert trace.rows == sum(len(t.turns) for t in trace.trajectories)
    for t in trace.trajectories:
        assert t.total_tokens >= 1
        assert [u.turn_idx for u in t.turns] == list(range(len(t.turns)))
        assert all(0 <= u.gen_tokens <= MAX_COUNT and 0 <= u.tool_payload_tokens <= MAX_COUNT for u in t.turns)
    return trace


def config_outcome(data: bytes) -> LibraConfig | None:
    path = WORKDIR / "fuzz.yaml"
    path.write_bytes(data)
    try:
        return load_config(path)
    except ConfigError as exc:
        assert str(exc).startswith(str(path))
        return None


# --- traces -------------------------------------------------------------------------------------

@fuzz(500)
@given(st.binary(max_size=600))
def test_random_bytes_are_a_trace_or_a_libra_error(data: bytes) -> None:
    trace_outcome(data)


@fuzz(500)
@given(st.binary(max_size=600))
def test_random_bytes_after_a_header_are_a_trace_or_a_libra_error(data: bytes) -> None:
    trace_outcome(HEADER.encode() + data)


HOSTILE_TEXT = st.sampled_from([
    "", " ", "0", "-0", "-1", "007", "+3", "1_000", "2.5", "1e3", "nan", "inf", "-inf", "1e400", "\u0663", "\uff11",
    str(MAX_COUNT), str(MAX_COUNT + 1), str(2**63), str(2**64 + 5), "9" * 5000, "none", "None", "ok", "OK", "error",
    "timeout", "maybe", "search", "a,b", 'say "hi"', "line\nbreak", "\r", "\x00", "\ufeff", "é", "x" * 300,
])
INTEGER_TEXT = st.integers(0, 9).flatmap(  # mostly plain counts
    lambda k: st.integers(0, 40).map(str) if k < 7 else st.one_of(st.integers(-3, 2**80).map(str), HOSTILE_TEXT))
CELL = st.one_of(INTEGER_TEXT, st.text(max_size=12), HOSTILE_TEXT, st.just("\udcff"), st.just("y" * 140_000))


@st.composite
def trace_files(draw: st.DrawFn) -> bytes:
    """A CSV of the trace columns with trajectories that are well-formed; half of the files are then
    made hostile: columns dropped, repeated or shuffled, hostile values in random cells, cut short."""
    hostile = draw(st.booleans())
    columns = list(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)
    if hostile and draw(st.booleans()):
        columns = draw(st.permutations(columns))
    if hostile and draw(st.integers(0, 4)) == 0:
        columns = draw(st.lists(st.sampled_from(columns + ["extra"]), max_size=len(columns) + 1))
    count = INTEGER_TEXT if hostile else st.integers(1, 40).map(str)
    rows = []
    for trajectory in range(draw(st.integers(0 if hostile else 1, 4))):
        turns = draw(st.integers(1, 4))
        for turn in range(turns):
            last = turn == turns - 1
            row = {
                "source": "fuzz", "prompt_id": f"p{trajectory % 2}", "sample_id": str(trajectory),
                "turn_idx": str(turn), "gen_tokens": draw(count), "tool_name": "none" if last else "search",
                "tool_payload_tokens": "0" if last else draw(count), "tool_status": "" if last else "ok",
                "prompt_tokens": draw(count) if turn == 0 else "", "final_reward": "1.0", "gen_tokens_method": "chars/4",
            }
            if hostile and draw(st.integers(0, 3)) == 0:
                row[draw(st.sampled_from(columns or ["source"]))] = draw(CELL)  # a hostile value in a random column
            rows.append([row.get(c, draw(CELL)) for c in columns])
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC])))
    writer.writerow(columns)
    writer.writerows(rows)
    text = buffer.getvalue()
    if hostile and draw(st.integers(0, 4)) == 0:  # cut somewhere, maybe inside a quoted field
        text = text[: draw(st.integers(0, len(text)))]
    data = text.encode("utf-8", "surrogatepass")
    return (codecs.BOM_UTF8 if draw(st.booleans()) else b"") + data


OUTCOMES = {"trace": 0, "error": 0}


@fuzz(1200)
@given(trace_files())
def test_csv_rows_with_hostile_values_are_a_trace_or_a_libra_error(data: bytes) -> None:
    OUTCOMES["trace" if trace_outcome(data) is not None else "error"] += 1


def test_the_fuzzed_csv_files_reached_both_ends_of_the_parser() -> None:
    """The files above were not all refused at the first check: many were read whole."""
    if sum(OUTCOMES.values()) < 1200:
        pytest.skip("runs after test_csv_rows_with_hostile_values_are_a_trace_or_a_libra_error")
    assert OUTCOMES["trace"] >= 200 and OUTCOMES["error"] >= 200


# --- configs ------------------------------------------------------------------------------------

SECTIONS = {name: list(field.annotation.model_fields) for name, field in LibraConfig.model_fields.items()}
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=20), HOSTILE_TEXT)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=8)


@st.composite
def config_documents(draw: st.DrawFn) -> bytes:
    """YAML of the config's sections and keys (and some unknown ones) with arbitrary values."""
    document: dict = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "nope"]), max_size=4)):
        keys = SECTIONS.get(section, ["x"]) + ["unknown"]
        if draw(st.integers(0, 7)) == 0:
            document[section] = draw(VALUE)
        else:
            document[section] = {key: draw(VALUE) for key in draw(st.lists(st.sampled_from(keys), max_size=4))}
    text = yaml.safe_dump(document, allow_unicode=draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass")


@fuzz(800)
@given(config_documents())
def test_yaml_documents_are_a_config_or_a_config_error(data: bytes) -> None:
    config_outcome(data)


@fuzz(400)
@given(st.binary(max_size=400))
def test_random_bytes_are_a_config_or_a_config_error(data: bytes) -> None:
    config_outcome(data)


YAML_PIECES = st.sampled_from([
    "store:", "  root: x", "  root: &r [1, 2]", "  root: *r", "planner: {batch_trajectories: 7}", "<<: *a",
    "a: &a {root: y}", "b: &b [*a, *a, *a, *a]", "c: [*b, *b, *b, *b]", "- x", "? [1]", ": y", "!!python/name:os.system",
    "!!binary aGVsbG8=", "store: {fsync: yes}", "traces:\n  prompts_per_step: 0x10", "%YAML 1.1", "---", "...", "[", "{",
    "'", '"\\x00"', "\t", "key: value: more", "& anchor", "*missing", "scheduler: {payload_bounds: [5, 1]}",
])


@fuzz(600)
@given(st.lists(YAML_PIECES, max_size=8))
def test_yaml_fragments_are_a_config_or_a_config_error(pieces: list[str]) -> None:
    config_outcome("\n".join(pieces).encode())
