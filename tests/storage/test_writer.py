from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra.errors import LibraError
from storage.catalog import Catalog
from storage.schemas import TABLES, TURNS
from storage.synthetic import synthetic_turns
from storage.writer import StoreWriter, check_run_name, conform, step_dir


def _count(root: Path, run: str) -> int:
    with Catalog(root, run) as catalog:
        return catalog.query("select count(*) as n from turns").column("n")[0].as_py()


def test_layout_and_metadata(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path)
    paths = writer.write_step("turns", "r1", 3, synthetic_turns("r1", 3, 50), shard_rows=20)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        f"turns/v1/run=r1/step=00000003/part-0000{i}.parquet" for i in range(3)
    ]
    assert [pq.read_metadata(p).num_rows for p in paths] == [20, 20, 10]
    schema = pq.read_schema(paths[0])
    assert schema.metadata[b"libra.table"] == b"turns" and schema.metadata[b"libra.version"] == b"1"
    assert schema.field("gen_tokens").metadata == {b"doc": b"tokens generated in this turn", b"unit": b"tokens"}


def test_rewriting_a_step_replaces_its_rows(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 100), shard_rows=10)
    writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 40))
    assert _count(tmp_path, "r") == 140
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 100), shard_rows=10)
    assert _count(tmp_path, "r") == 140
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 25), shard_rows=50)  # fewer shards: stale ones go
    assert sorted(p.name for p in step_dir(tmp_path, TURNS, "r", 0).iterdir()) == ["part-00000.parquet"]
    assert _count(tmp_path, "r") == 65


def test_write_run_splits_unsorted_steps(tmp_path: Path) -> None:
    table = pa.concat_tables([synthetic_turns("r", s, 7) for s in (2, 0, 1)])
    StoreWriter(tmp_path, fsync=False).write_run("turns", "r", table)
    with Catalog(tmp_path, "r") as catalog:
        rows = catalog.query("select step, count(*) as n from turns group by step order by step").to_pylist()
    assert rows == [{"step": 0, "n": 7}, {"step": 1, "n": 7}, {"step": 2, "n": 7}]


def test_temporaries_are_invisible_and_cleaned(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    directory = step_dir(tmp_path, TURNS, "r", 0)
    (directory / ".part-00001.parquet.999.deadbeef.tmp").write_bytes(b"PAR1 half a file")
    assert _count(tmp_path, "r") == 10
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    assert sorted(p.name for p in directory.iterdir()) == ["part-00000.parquet"]


def test_conform_fills_and_checks() -> None:
    minimal = pa.table({"trajectory_id": ["t"], "prompt_id": ["p"], "sample_id": ["s"], "turn_idx": [0],
                        "context_tokens": [5], "gen_tokens": [3], "tool_name": ["none"],
                        "tool_payload_tokens": [0], "tool_status": ["none"], "is_final": [True]})
    out = conform(TURNS, minimal, "r", 4)
    assert out.schema.equals(TURNS.arrow, check_metadata=True)
    assert out.column("run").to_pylist() == ["r"] and out.column("step").to_pylist() == [4]
    assert out.column("instance").to_pylist() == [None]
    with pytest.raises(ValueError, match="unknown column"):
        conform(TURNS, minimal.append_column("colour", pa.array(["red"])), "r", 4)
    with pytest.raises(ValueError, match="required column 'gen_tokens' is missing"):
        conform(TURNS, minimal.drop_columns(["gen_tokens"]), "r", 4)
    with pytest.raises(ValueError, match="another step"):
        conform(TURNS, minimal.append_column("step", pa.array([5])), "r", 4)
    with pytest.raises(ValueError, match="has 1 null"):
        conform(TURNS, minimal.set_column(5, "gen_tokens", pa.array([None], pa.int64())), "r", 4)
    with pytest.raises(pa.ArrowInvalid):
        conform(TURNS, minimal.set_column(5, "gen_tokens", pa.array([2.5])), "r", 4)


def test_run_names_are_checked(tmp_path: Path) -> None:
    for bad in ("", "../x", "a b", "-x", "x" * 129):
        with pytest.raises(LibraError, match="not allowed"):
            check_run_name(bad)
    check_run_name("swe_gemini3-A.1")


def test_every_table_has_documented_columns() -> None:
    for schema in TABLES.values():
        assert schema.column_names[:2] == ("run", "step")
        for column in schema.columns:
            assert column.doc, f"{schema.name}.{column.name} lacks a doc"
