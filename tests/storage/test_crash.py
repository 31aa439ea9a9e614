"""A writer killed with SIGKILL mid-ingest leaves only whole shards; a re-run gives the exact count."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from storage.catalog import Catalog
from storage.schemas import TURNS
from storage.writer import table_dir

ROOT = Path(__file__).resolve().parents[2]
STEPS, ROWS, SHARD_ROWS = 24, 120_000, 40_000


def _worker(store: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "tests.storage.ingest_worker", str(store), "crash", str(STEPS), str(ROWS), str(SHARD_ROWS)]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_sigkill_mid_ingest_leaves_whole_shards(tmp_path: Path) -> None:
    store = tmp_path / "store"
    base = table_dir(store, TURNS)
    proc = _worker(store)
    deadline = time.monotonic() + 120
    saw_temporary = False
    while time.monotonic() < deadline and proc.poll() is None:
        shards = list(base.glob("run=crash/step=*/part-*.parquet"))
        temporaries = list(base.glob("run=crash/step=*/.*.tmp"))
        if len(shards) >= 4 and temporaries:
            saw_temporary = True
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait(timeout=30)
    assert saw_temporary, "the writer finished before it could be killed mid-write"
    assert proc.returncode == -signal.SIGKILL

    visible = sorted(base.glob("run=crash/step=*/part-*.parquet"))
    assert 4 <= len(visible) < STEPS * ROWS // SHARD_ROWS
    for shard in visible:  # every visible shard is whole and readable
        assert pq.read_table(shard).num_rows == SHARD_ROWS
    with Catalog(store, "crash") as catalog:
        count = catalog.query("select count(*) as n from turns").column("n")[0].as_py()
    assert count == len(visible) * SHARD_ROWS

    rerun = _worker(store)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err.decode()
    with Catalog(store, "crash") as catalog:
        counts = catalog.query("select count(*) as n, count(distinct step) as steps from turns").to_pylist()[0]
        per_step = catalog.query("select min(c) as lo, max(c) as hi from (select count(*) c from turns group by step)").to_pylist()[0]
    assert counts == {"n": STEPS * ROWS, "steps": STEPS}
    assert per_step == {"lo": ROWS, "hi": ROWS}
    assert list(base.glob("run=crash/step=*/.*.tmp")) == []
