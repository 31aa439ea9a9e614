import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra.errors import LibraError
from storage.catalog import Catalog, list_runs
from storage.manifest import RunExistsError, RunLock, RunLockedError, RunManifest, StepFiles, read_manifest
from storage.schemas import TABLES, TRAJECTORIES, TURNS
from storage.synthetic import synthetic_turns, trajectories_of
from storage.writer import StoreWriter, check_run_name, conform, step_dir


def _count(root: Path, run: str) -> int:
    with Catalog(root, run) as catalog:
        return catalog.query("select count(*) as n from turns").column("n")[0].as_py()


def _listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_layout_and_metadata(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path)
    paths = writer.write_step("turns", "r1", 3, synthetic_turns("r1", 3, 50), shard_rows=20)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        f"turns/v1/run=r1/step=00000003/part-00000001-0000{i}.parquet" for i in range(3)
    ]
    assert [pq.read_metadata(p).num_rows for p in paths] == [20, 20, 10]
    schema = pq.read_schema(paths[0])
    assert schema.metadata[b"libra.table"] == b"turns" and schema.metadata[b"libra.version"] == b"1"
    assert schema.field("gen_tokens").metadata == {b"doc": b"tokens generated in this turn", b"unit": b"tokens"}
    manifest = json.loads(read_manifest(tmp_path, "r1").to_json())
    assert manifest == {"format": 1, "run": "r1", "generation": 1, "committed_at": manifest["committed_at"],
                        "origin": "steps", "tables": {"turns/v1": {"3": [1, 3, 50]}}}
    assert _listing(tmp_path) == ["_runs/r1.lock", "_runs/r1.manifest"] + [
        f"turns/v1/run=r1/step=00000003/part-00000001-0000{i}.parquet" for i in range(3)
    ]
    assert (tmp_path / "_runs" / "r1.lock").read_bytes() == b" " * 512  # released cleanly


def test_manifest_round_trip() -> None:
    manifest = RunManifest("r", 7, 1.5, "import of x.csv", {"turns/v1": {0: StepFiles(7, 2, 10), 12: StepFiles(3, 1, 0)}})
    assert RunManifest.from_json(manifest.to_json()) == manifest
    assert [p.as_posix() for p in manifest.files("/s", TURNS)] == [
        "/s/turns/v1/run=r/step=00000000/part-00000007-00000.parquet",
        "/s/turns/v1/run=r/step=00000000/part-00000007-00001.parquet",
        "/s/turns/v1/run=r/step=00000012/part-00000003-00000.parquet",
    ]
    assert manifest.rows(TURNS) == 10 and manifest.files("/s", TRAJECTORIES) == []


def test_manifest_slots(tmp_path: Path) -> None:
    """Two slots, written in turn; a torn slot is ignored; a manifest that outgrows its slots moves
    to a new file with twice the room."""
    writer = StoreWriter(tmp_path, fsync=False)
    path = tmp_path / "_runs" / "r.manifest"
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 5))
    assert path.stat().st_size == 8192  # two 4 KiB slots
    writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 5))
    data = path.read_bytes()
    assert data[:8] == data[4096:4104] == b"LIBRAMAN"  # generation 1 in slot 0, generation 2 in slot 1
    assert read_manifest(tmp_path, "r").generation == 2
    torn = bytearray(data)
    torn[4096 + 100] ^= 0xFF  # a write of slot 1 cut short: generation 1 is in force again
    path.write_bytes(bytes(torn))
    assert (read_manifest(tmp_path, "r").generation, sorted(read_manifest(tmp_path, "r").steps(TURNS))) == (1, [0])
    path.write_bytes(data)
    inode = path.stat().st_ino
    writer.write_run("turns", "r", pa.concat_tables([synthetic_turns("r", s, 1) for s in range(2, 400)]))
    payload = len(read_manifest(tmp_path, "r").to_json())
    assert 4096 < payload < 8192
    room = -(-2 * (64 + payload) // 4096) * 4096  # outgrew 4 KiB: twice the room it needs, in whole pages
    assert path.stat().st_ino != inode and path.stat().st_size == 2 * room == 2 * 12288
    assert (read_manifest(tmp_path, "r").generation, len(read_manifest(tmp_path, "r").steps(TURNS))) == (3, 400)
    with pytest.raises(LibraError, match=r"has no valid slot; write it again whole with the command that wrote it \(libra traces import FILE --run r --replace; libra train --run r --restart; "):
        path.write_bytes(b"\0" * 8192)
        read_manifest(tmp_path, "r")


def test_a_commit_cut_short_leaves_the_previous_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.manifest

    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 5))
    writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 5))

    def cut(fd: int, data: bytes, offset: int) -> int:  # the process dies half way through the slot
        os.pwrite(fd, bytes(data)[: len(data) // 2], offset)
        raise KeyboardInterrupt

    monkeypatch.setattr(storage.manifest, "_pwrite_all", cut)
    with pytest.raises(KeyboardInterrupt):
        writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 50))
    monkeypatch.undo()
    assert _count(tmp_path, "r") == 10
    assert sorted(read_manifest(tmp_path, "r").steps(TURNS).items()) == [(0, StepFiles(1, 1, 5)), (1, StepFiles(2, 1, 5))]
    writer.write_step("turns", "r", 2, synthetic_turns("r", 2, 5))
    assert _count(tmp_path, "r") == 15


def test_rewriting_a_step_replaces_its_rows(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 100), shard_rows=10)
    writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 40))
    assert _count(tmp_path, "r") == 140
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 100), shard_rows=10)
    assert _count(tmp_path, "r") == 140
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 25), shard_rows=50)  # fewer shards: the old ones go
    assert sorted(p.name for p in step_dir(tmp_path, TURNS, "r", 0).iterdir()) == ["part-00000004-00000.parquet"]
    assert _count(tmp_path, "r") == 65
    assert read_manifest(tmp_path, "r").tables == {"turns/v1": {0: StepFiles(4, 1, 25), 1: StepFiles(2, 1, 40)}}


def test_write_run_splits_unsorted_steps(tmp_path: Path) -> None:
    table = pa.concat_tables([synthetic_turns("r", s, 7) for s in (2, 0, 1)])
    StoreWriter(tmp_path, fsync=False).write_run("turns", "r", table)
    with Catalog(tmp_path, "r") as catalog:
        rows = catalog.query("select step, count(*) as n from turns group by step order by step").to_pylist()
    assert rows == [{"step": 0, "n": 7}, {"step": 1, "n": 7}, {"step": 2, "n": 7}]
    assert read_manifest(tmp_path, "r").generation == 1  # one commit for the three steps


def test_transaction_publishes_tables_together(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    turns = synthetic_turns("r", 1, 30)
    with Catalog(tmp_path, "r") as reader, writer.transaction("r") as tx:
        tx.write_step("turns", 1, turns)
        tx.write_step("trajectories", 1, trajectories_of(turns))
        staged = reader.query("select (select count(*) from turns) as turns, (select count(*) from trajectories) as t")
        assert staged.to_pylist() == [{"turns": 10, "t": 0}]  # staged shards are not read
    with Catalog(tmp_path, "r") as catalog:
        rows = catalog.query("select (select count(*) from turns) as turns, (select count(*) from trajectories) as t")
    assert rows.to_pylist() == [{"turns": 40, "t": 2}]
    assert read_manifest(tmp_path, "r").generation == 2
    assert list_runs(tmp_path) == ["r"]


def test_catalog_follows_commits(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    with Catalog(tmp_path, "r") as catalog:
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 10}]
        writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 12))  # removes the files the views listed
        writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 5))
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 17}]


def test_a_query_racing_a_commit_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.catalog

    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    with Catalog(tmp_path, "r") as catalog:
        writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 12))
        real = storage.catalog.manifests_signature
        calls = []

        def late(root: Path, run: str | None) -> tuple:  # the commit lands after the check, before the read
            calls.append(run)
            return catalog._signature if len(calls) == 1 else real(root, run)

        monkeypatch.setattr(storage.catalog, "manifests_signature", late)
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 12}]
        assert len(calls) >= 2


def test_an_exception_aborts_the_transaction(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    before = _listing(tmp_path)
    with pytest.raises(ValueError, match="required column 'gen_tokens' is missing"):
        with writer.transaction("r") as tx:
            tx.write_step("turns", 0, synthetic_turns("r", 0, 99))
            tx.write_step("turns", 5, synthetic_turns("r", 5, 10))
            tx.write_step("turns", 6, synthetic_turns("r", 6, 10).drop_columns(["gen_tokens"]))
    assert _listing(tmp_path) == before  # staged shards and the directories made for them are gone
    assert (tmp_path / "_runs" / "r.lock").read_bytes() == b" " * 512
    assert _count(tmp_path, "r") == 10
    with pytest.raises(RuntimeError):  # a new run that fails is not created
        with writer.transaction("fresh") as tx:
            tx.write_step("turns", 0, synthetic_turns("fresh", 0, 10))
            raise RuntimeError("boom")
    assert list_runs(tmp_path) == ["r"]
    assert not (tmp_path / "turns" / "v1" / "run=fresh").exists()


def test_create_and_replace_modes(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    with writer.transaction("r", mode="create", origin="first") as tx:
        tx.write_run("turns", pa.concat_tables([synthetic_turns("r", s, 10) for s in range(3)]))
    with pytest.raises(RunExistsError, match=r"^run 'r' already exists in store .* \(first, committed .*\); "
                                             r"pass --replace to replace it whole$"):
        with writer.transaction("r", mode="create") as tx:
            tx.write_step("turns", 0, synthetic_turns("r", 0, 1))
    with writer.transaction("r", mode="replace", origin="second") as tx:
        tx.write_step("turns", 7, synthetic_turns("r", 7, 4))
    manifest = read_manifest(tmp_path, "r")
    assert (manifest.origin, manifest.generation, manifest.tables) == ("second", 2, {"turns/v1": {7: StepFiles(2, 1, 4)}})
    assert _listing(tmp_path / "turns") == ["v1/run=r/step=00000007/part-00000002-00000.parquet"]
    with pytest.raises(ValueError, match="nothing staged to replace"):
        with writer.transaction("r", mode="replace"):
            pass
    assert read_manifest(tmp_path, "r") == manifest


def test_uncommitted_files_are_invisible_and_swept(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    directory = step_dir(tmp_path, TURNS, "r", 0)
    # what a writer killed mid-commit leaves: shards of its generation, a half manifest, its record in the lock
    (directory / "part-00000002-00000.parquet").write_bytes(b"PAR1 half a file")
    step_dir(tmp_path, TURNS, "r", 3).mkdir()
    pq.write_table(synthetic_turns("r", 3, 5), step_dir(tmp_path, TURNS, "r", 3) / "part-00000002-00000.parquet")
    (tmp_path / "_runs" / ".r.manifest.999.deadbeef.tmp").write_text("{")
    (tmp_path / "_runs" / "r.lock").write_text(json.dumps({"pid": 999999, "purpose": "update (steps)", "since": 0}))
    assert _count(tmp_path, "r") == 10
    writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 10))  # not blocked; sweeps what the dead writer left
    assert _listing(tmp_path) == ["_runs/r.lock", "_runs/r.manifest",
                                  "turns/v1/run=r/step=00000000/part-00000001-00000.parquet",
                                  "turns/v1/run=r/step=00000001/part-00000002-00000.parquet"]
    assert _count(tmp_path, "r") == 20


def test_one_writer_per_run(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, fsync=False, lock_wait_s=0.2)
    writer.write_step("turns", "r", 0, synthetic_turns("r", 0, 10))
    with RunLock(tmp_path, "r", purpose="import (test)", wait_s=0):
        with pytest.raises(RunLockedError, match=rf"^run 'r' is being written by another process \(pid {os.getpid()}, "
                                                 r"import \(test\), since \d\d:\d\d:\d\d\); try again when it has "
                                                 r"finished after waiting 0.2 s$"):
            writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 10))
        writer.write_step("turns", "other", 0, synthetic_turns("other", 0, 3))  # other runs are not blocked
    writer.write_step("turns", "r", 1, synthetic_turns("r", 1, 10))
    assert _count(tmp_path, "r") == 20


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


def test_a_column_added_to_a_schema_reads_as_null_in_files_written_before_it(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path)
    steps = TABLES["steps"]
    [shard] = writer.write_step("steps", "r1", 0, pa.Table.from_pylist([{"run": "r1", "step": 0, "trajectories": 64}],
                                                                         schema=steps.arrow))
    pq.write_table(pq.read_table(shard).drop_columns(["failed_trajectories", "dropped_groups"]), shard)  # as written before
    writer.write_step("steps", "r1", 1, pa.Table.from_pylist(
        [{"run": "r1", "step": 1, "trajectories": 62, "failed_trajectories": 2, "dropped_groups": 1}], schema=steps.arrow))
    with Catalog(tmp_path, "r1") as catalog:
        rows = catalog.query("select step, trajectories, failed_trajectories, dropped_groups from steps order by step")
    assert rows.to_pylist() == [{"step": 0, "trajectories": 64, "failed_trajectories": None, "dropped_groups": None},
                                {"step": 1, "trajectories": 62, "failed_trajectories": 2, "dropped_groups": 1}]


def test_a_run_of_another_origin_is_refused_and_the_hint_names_the_command_that_wrote_it(tmp_path: Path) -> None:
    from storage.manifest import TRAIN_ORIGIN, ManifestUnreadable, RunExistsError, manifest_path, rewrite_hint
    from storage.writer import refuse_other_origin

    writer = StoreWriter(tmp_path, fsync=False)
    with writer.transaction("r", origin="simulation of x") as tx:
        tx.write_step("turns", 0, synthetic_turns("r", 0, 1))
    with pytest.raises(RunExistsError, match=r"^run 'r' already exists in store .* \(simulation of x\) and is not a "
                                             r"training run, which would replace it; name the new run another way"):
        refuse_other_origin(tmp_path, "r", TRAIN_ORIGIN, "a training run")
    refuse_other_origin(tmp_path, "r", "simulation of x", "a simulation")  # its own kind: no refusal
    refuse_other_origin(tmp_path, "new", TRAIN_ORIGIN, "a training run")  # no such run yet
    manifest_path(tmp_path, "r").write_bytes(b"\0" * 8192)
    with pytest.raises(ManifestUnreadable, match="has no valid slot"):
        refuse_other_origin(tmp_path, "r", TRAIN_ORIGIN, "a training run")
    refuse_other_origin(tmp_path, "r", TRAIN_ORIGIN, "a training run", replacing=True)  # replaced whole
    assert rewrite_hint("r", "import of t.csv, prompts_per_step=4") == "import it again whole: libra traces import t.csv --run r --replace"
    assert rewrite_hint("r", TRAIN_ORIGIN) == "train it again whole: libra train --run r --restart"
    assert rewrite_hint("r", "simulation of x") == "simulate it again whole: libra simulate ... --run r --replace"


def test_a_run_name_with_a_trailing_newline_is_refused():
    with pytest.raises(LibraError, match="is not allowed"):
        check_run_name("fixture-train\n")
    assert check_run_name("fixture-train") == "fixture-train"
