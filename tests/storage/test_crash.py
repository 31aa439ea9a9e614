"""Writers killed with SIGKILL, and writers racing for one run.

- An import killed at random points (14 times, random delays up to twice the import's duration, the
  previous import of the run being replaced each time with another prompts-per-step) leaves the
  run exactly as a clean import leaves it: the previous one, or the new one, never a mix; the next
  import removes the killed one's files and is not blocked by its lock. One more kill waits until
  shards are staged, so a kill mid-import is certain to be among them.
- A step writer killed mid-step leaves whole steps only; its re-run gives the exact rows.
- Two imports into one run at once: one is refused with a one-line message (or, serialised,
  refused as existing or replacing the other), and the store ends as one clean import.
"""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from libra.config import StoreConfig
from storage.catalog import Catalog, list_runs
from storage.ingest import import_trace
from storage.manifest import read_manifest, walk_run_files
from storage.schemas import TABLES, TURNS

ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "data" / "traces" / "swe_gemini3_mini_A.csv"
STEPS, ROWS, SHARD_ROWS = 24, 120_000, 40_000
KILLS = 14


def _steps_worker(store: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "tests.storage.ingest_worker", "steps", str(store), "crash", str(STEPS), str(ROWS),
            str(SHARD_ROWS)]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _cli_worker(*argv: str) -> subprocess.Popen:
    """A `libra` process that starts its command when told (see ingest_worker)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.storage.ingest_worker", "cli", *argv], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    return proc


def _import_worker(store: Path, prompts_per_step: int, *extra: str) -> subprocess.Popen:
    return _cli_worker("traces", "import", str(SWE), "--run", "crash", "--store", str(store),
                       "--prompts-per-step", str(prompts_per_step), *extra)


def _go(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def fingerprint(store: Path, run: str = "crash") -> str | None:
    """A hash of every row of the run's tables (None when the run is not visible)."""
    if run not in list_runs(store):
        return None
    digest = hashlib.sha256()
    with Catalog(store, run) as catalog:
        for table in TABLES:
            digest.update(repr(catalog.query(f"select * from {table} order by all").to_pylist()).encode())
    return digest.hexdigest()


def leftovers(store: Path, run: str = "crash") -> list[Path]:
    """Files under the run's directories that its manifest does not list."""
    manifest = read_manifest(store, run)
    listed = {p for schema in TABLES.values() for p in manifest.files(store, schema)} if manifest else set()
    return [p for schema in TABLES.values() for p in walk_run_files(store, schema, run) if p not in listed]


def reference(tmp_path: Path, prompts_per_step: int) -> str:
    store = tmp_path / f"reference-{prompts_per_step}"
    import_trace(SWE, "crash", StoreConfig(root=str(store), fsync=False), prompts_per_step)
    return fingerprint(store)


def test_sigkill_at_random_points_of_an_import(tmp_path: Path) -> None:
    expected = {8: reference(tmp_path, 8), 2: reference(tmp_path, 2)}
    assert expected[8] != expected[2]
    timing = _import_worker(tmp_path / "timing", 8)
    _go(timing)
    out, err = timing.communicate(timeout=120)
    assert timing.returncode == 0, err
    duration = float(out.splitlines()[-1].split()[1])  # the import alone, after the interpreter started

    store = tmp_path / "store"
    rng = random.Random(20261201)
    state = None  # the run is absent before the first commit
    outcomes = {"kept": 0, "replaced": 0, "killed_with_staged_files": 0}
    spare = _import_worker(store, 8, "--replace")
    for i in range(KILLS):
        proc, prompts_per_step = spare, (8, 2)[i % 2]
        if i + 1 < KILLS:  # the next worker starts its interpreter while this one is killed
            spare = _import_worker(store, (8, 2)[(i + 1) % 2], "--replace")
        _go(proc)
        time.sleep(rng.uniform(0, 2 * duration))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        staged = leftovers(store)
        if proc.returncode == -signal.SIGKILL and staged:
            outcomes["killed_with_staged_files"] += 1
        observed = fingerprint(store)
        assert observed in (state, expected[prompts_per_step]), f"kill {i}: the run is neither the previous nor the new import"
        assert list_runs(store) == ([] if observed is None else ["crash"])
        outcomes["kept" if observed == state else "replaced"] += 1
        state = observed

    # Random delays may all miss the short window in which shards are staged, so further kills wait for it.
    for _ in range(5):
        if outcomes["killed_with_staged_files"]:
            break
        proc = _import_worker(store, 8, "--replace")
        _go(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not leftovers(store):
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        if proc.returncode == -signal.SIGKILL and leftovers(store):
            outcomes["killed_with_staged_files"] += 1
        observed = fingerprint(store)
        assert observed in (state, expected[8]), "a directed kill: the run is neither the previous nor the new import"
        state = observed
    assert outcomes["killed_with_staged_files"] >= 1, outcomes  # some kills did land mid-import
    final = _import_worker(store, 2, "--replace")  # not blocked by the dead holders' lock; sweeps their files
    _go(final)
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err
    assert fingerprint(store) == expected[2]
    assert leftovers(store) == []
    assert sorted(p.name for p in (store / "_runs").iterdir()) == ["crash.lock", "crash.manifest"]
    print(f"import {duration:.2f} s; {KILLS} kills: {outcomes}")


def test_sigkill_mid_step_leaves_whole_steps(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = _steps_worker(store)
    deadline = time.monotonic() + 120
    killed_mid_step = False
    while time.monotonic() < deadline and proc.poll() is None:
        manifest = read_manifest(store, "crash")
        if manifest is not None and manifest.generation >= 4 and leftovers(store):
            os.kill(proc.pid, signal.SIGKILL)
            killed_mid_step = True
            break
        time.sleep(0.002)
    proc.wait(timeout=30)
    assert killed_mid_step, "the writer finished before it could be killed mid-step"
    assert proc.returncode == -signal.SIGKILL

    manifest = read_manifest(store, "crash")
    committed = len(manifest.steps(TURNS))
    assert 4 <= committed < STEPS
    assert leftovers(store)  # the killed step's shards are on disk, and invisible:
    for shard in manifest.files(store, TURNS):
        assert pq.read_metadata(shard).num_rows == SHARD_ROWS
    with Catalog(store, "crash") as catalog:
        rows = catalog.query("select step, count(*) as n from turns group by step order by step").to_pylist()
    assert rows == [{"step": s, "n": ROWS} for s in range(committed)]

    rerun = _steps_worker(store)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err.decode()
    with Catalog(store, "crash") as catalog:
        counts = catalog.query("select count(*) as n, count(distinct step) as steps from turns").to_pylist()[0]
        per_step = catalog.query("select min(c) as lo, max(c) as hi from (select count(*) c from turns group by step)").to_pylist()[0]
    assert counts == {"n": STEPS * ROWS, "steps": STEPS}
    assert per_step == {"lo": ROWS, "hi": ROWS}
    assert leftovers(store) == []


def test_two_imports_into_one_run_at_once(tmp_path: Path) -> None:
    expected = {8: reference(tmp_path, 8), 2: reference(tmp_path, 2)}
    refusals = []
    for trial, replace in enumerate((False, False, True, True)):
        store = tmp_path / f"store-{trial}"
        extra = ("--replace",) if replace else ()
        procs = {8: _import_worker(store, 8, *extra), 2: _import_worker(store, 2, *extra)}
        for proc in procs.values():
            _go(proc)
        results = {pps: proc.communicate(timeout=120) + (proc.returncode,) for pps, proc in procs.items()}
        succeeded = [pps for pps, (_, _, code) in results.items() if code == 0]
        assert succeeded, results
        for _, err, code in results.values():
            assert code in (0, 2), err
            if code == 2:
                assert err.count("\n") == 1 and err.startswith("libra: error: run 'crash' "), err
                assert "is being written by another process (pid " in err or (
                    not replace and "already exists" in err and err.endswith("pass --replace to replace it whole\n")), err
                refusals.append(err.split("crash' ", 1)[1].split(" (")[0])
        assert fingerprint(store) in [expected[pps] for pps in succeeded]
        assert leftovers(store) == []
    print(f"refusals: {refusals}")
    assert "is being written by another process" in refusals, refusals  # the imports did overlap at least once
