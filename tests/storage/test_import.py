"""Import rules: a run is created whole; importing into it again is refused unless replace, which
replaces it whole; an import does not wait for another writer of the run."""

import hashlib
import json
import time
from pathlib import Path

import pytest

from libra.config import StoreConfig
from storage.catalog import Catalog, list_runs
from storage.ingest import import_trace
from storage.manifest import RunExistsError, RunLock, RunLockedError, read_manifest
from tests.builders import small_trace, trace_rows, write_trace

ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "data" / "traces" / "swe_gemini3_mini_A.csv"


def snapshot(root: Path) -> dict[str, str]:
    """Every file of the store with the hash of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def shape(root: Path, run: str) -> dict:
    with Catalog(root, run) as catalog:
        return catalog.query("""
            select (select count(*) from trajectories) as trajectories,
                   (select count(distinct trajectory_id) from trajectories) as trajectory_ids,
                   (select count(*) from turns) as turns,
                   (select count(distinct (trajectory_id, turn_idx)) from turns) as turn_keys,
                   (select count(distinct step) from trajectories) as steps,
                   (select max(step) from turns) as last_step,
                   (select max(n) from (select count(distinct prompt_id) as n from trajectories group by step)) as prompts_max
        """).to_pylist()[0]


def test_reimport_is_refused_without_replace(tmp_path: Path) -> None:
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    first = import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
    assert first.replaced is False
    before = snapshot(tmp_path / "store")
    with pytest.raises(RunExistsError, match=r"^run 's' already exists in store .*/store \(import of t.csv, "
                                             r"prompts_per_step=1, committed \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\); "
                                             r"pass --replace to replace it whole$"):
        import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=2)
    assert snapshot(tmp_path / "store") == before


def test_replace_with_another_prompts_per_step_gives_exactly_the_new_rows(tmp_path: Path) -> None:
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    root = tmp_path / "store"
    import_trace(SWE, "swe", store, prompts_per_step=8)
    assert shape(root, "swe") == {"trajectories": 246, "trajectory_ids": 246, "turns": 10222, "turn_keys": 10222,
                                  "steps": 31, "last_step": 30, "prompts_max": 8}
    summary = import_trace(SWE, "swe", store, prompts_per_step=2, replace=True)
    assert (summary.steps, summary.shards, summary.replaced) == (123, 246, True)
    assert shape(root, "swe") == {"trajectories": 246, "trajectory_ids": 246, "turns": 10222, "turn_keys": 10222,
                                  "steps": 123, "last_step": 122, "prompts_max": 2}
    manifest = read_manifest(root, "swe")
    assert (manifest.generation, manifest.origin) == (2, "import of swe_gemini3_mini_A.csv, prompts_per_step=2")
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.parquet"))
    assert len(files) == 246 and all("/part-00000002-" in f for f in files)  # the first import's files are gone


def test_replace_with_another_file_drops_the_old_trajectories(tmp_path: Path) -> None:
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
    other = write_trace(tmp_path / "other.csv", trace_rows("q9", "z", 4, [(3, "none", 0, "")]))
    import_trace(other, "s", store, prompts_per_step=1, replace=True)
    with Catalog(store.root, "s") as catalog:
        assert catalog.query("select trajectory_id, step from trajectories").to_pylist() == [{"trajectory_id": "q9/z", "step": 0}]
        assert catalog.query("select trajectory_id, turn_idx from turns").to_pylist() == [{"trajectory_id": "q9/z", "turn_idx": 0}]


def test_refresh_replaces_only_an_import_of_a_file_of_the_same_name(tmp_path: Path) -> None:
    """What the trace-analysis flow (`libra run`) does: its own earlier import of t.csv is replaced,
    and a run of that name that something else wrote (here an import of another file, or a
    simulation's steps) is refused and left byte for byte."""
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    import_trace(small_trace(tmp_path / "t.csv"), "t", store, prompts_per_step=1)
    assert import_trace(small_trace(tmp_path / "t.csv"), "t", store, prompts_per_step=2, refresh=True).replaced
    (tmp_path / "elsewhere").mkdir()
    other = write_trace(tmp_path / "elsewhere" / "other.csv", trace_rows("q9", "z", 4, [(3, "none", 0, "")]))
    import_trace(other, "other-run", store, prompts_per_step=1)
    before = snapshot(tmp_path / "store")
    renamed = small_trace(tmp_path / "elsewhere" / "t.csv")
    with pytest.raises(RunExistsError, match=r"^run 'other-run' already exists in store .*/store \(import of other.csv, "
                                             r"prompts_per_step=1\) and is not an import of t.csv, which would replace it; rename the trace file, "
                                             r"or import it under another run name with `libra traces import t.csv --run NAME`$"):
        import_trace(renamed, "other-run", store, prompts_per_step=1, refresh=True)
    assert snapshot(tmp_path / "store") == before


def test_a_failed_import_leaves_the_previous_run(tmp_path: Path) -> None:
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
    before = snapshot(tmp_path / "store")
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[1]["gen_tokens"] = "many"
    with pytest.raises(Exception, match="gen_tokens must be a non-negative integer"):
        import_trace(write_trace(tmp_path / "bad.csv", rows), "s", store, prompts_per_step=1, replace=True)
    assert snapshot(tmp_path / "store") == before


def test_an_import_does_not_wait_for_another_writer(tmp_path: Path) -> None:
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    with RunLock(tmp_path / "store", "s", purpose="replace (import of x.csv)", wait_s=0):
        started = time.monotonic()
        with pytest.raises(RunLockedError, match=r"^run 's' is being written by another process \(pid \d+, replace "
                                                 r"\(import of x.csv\), since \d\d:\d\d:\d\d\); try again when it "
                                                 r"has finished$"):
            import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
        assert time.monotonic() - started < 1.0
    assert list_runs(tmp_path / "store") == []
    import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
    assert list_runs(tmp_path / "store") == ["s"]


def test_runs_lists_committed_runs_and_notes_the_others(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from cli.main import main

    store = tmp_path / "store"
    import_trace(small_trace(tmp_path / "t.csv"), "s", StoreConfig(root=str(store), fsync=False), prompts_per_step=1)
    legacy = store / "turns" / "v1" / "run=old" / "step=00000000"  # a store written before manifests
    legacy.mkdir(parents=True)
    (legacy / "part-00000.parquet").write_bytes((next((store / "turns").rglob("*.parquet"))).read_bytes())
    assert main(["runs", "--store", str(store), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == ["s"]
    assert err == ("libra: note: not listed, no committed import: old (an import still running or killed, or written "
                   "before run manifests; import again to use)\n")
    import_trace(small_trace(tmp_path / "t.csv"), "old", StoreConfig(root=str(store), fsync=False), prompts_per_step=1)
    assert sorted(p.name for p in legacy.iterdir()) == ["part-00000001-00000.parquet"]  # the old file was swept
    assert main(["runs", "--store", str(store)]) == 0
    assert capsys.readouterr() == ("old\ns\n", "")


def test_a_run_whose_manifest_is_torn_in_both_slots_is_refused_and_replace_writes_it_whole(tmp_path: Path) -> None:
    from storage.manifest import ManifestUnreadable, manifest_path

    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    root = tmp_path / "store"
    import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
    path = manifest_path(root, "s")
    path.write_bytes(path.read_bytes()[:30])  # neither slot whole
    with pytest.raises(ManifestUnreadable, match=r"^run 's': manifest .* has no valid slot; write it again whole with the command that wrote it "
                                                   r"\(libra traces import FILE --run s --replace; libra train --run s "
                                                   r"--restart; libra simulate \.\.\. --run s --replace\)$"):
        import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1)
    summary = import_trace(small_trace(tmp_path / "t.csv"), "s", store, prompts_per_step=1, replace=True)
    assert summary.replaced is False  # nothing of the unreadable run was kept
    assert read_manifest(root, "s").generation == 1
    assert shape(root, "s")["trajectories"] == summary.trajectories


def test_a_shard_that_does_not_hold_the_rows_its_manifest_counts_is_refused_not_read(tmp_path: Path) -> None:
    """A shard copied over another (files moved around inside a store), one that is gone and one that
    is no Parquet file: each is refused in one line naming the table and step, before any query."""
    from libra.errors import LibraError
    from storage.manifest import step_dir
    from storage.schemas import TURNS

    root = tmp_path / "store"
    import_trace(small_trace(tmp_path / "t.csv"), "s", StoreConfig(root=str(root), fsync=False), prompts_per_step=1)
    first, second = (next(step_dir(root, TURNS, "s", step).glob("*.parquet")) for step in (0, 1))
    kept = first.read_bytes()
    first.write_bytes(second.read_bytes())  # step 1's 2 turns where step 0's 4 were
    with pytest.raises(LibraError, match=r"^run 's': turns step 0 has 2 rows in its shards, its manifest says 4 \(files "
                                         r"copied or changed inside the store\); import it again whole: libra traces "
                                         r"import t\.csv --run s --replace$"):
        Catalog(root, "s")
    first.write_bytes(b"not parquet")
    with pytest.raises(LibraError, match=rf"^run 's': turns shard {first} is not a readable Parquet file \(.+\); "
                                         r"import it again whole: libra traces import t\.csv --run s --replace$"):
        Catalog(root, "s")
    first.unlink()
    with pytest.raises(LibraError, match=rf"^run 's': turns shard {first} listed by its manifest is missing; "
                                         r"import it again whole: libra traces import t\.csv --run s --replace$"):
        Catalog(root, "s")
    first.write_bytes(kept)  # put back as it was: read again
    assert shape(root, "s")["turns"] == 6
