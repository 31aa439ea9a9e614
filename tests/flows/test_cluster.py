"""A training run across hosts: a Ray head and two worker hosts, each in its own network namespace on
this machine (`tests/hosts.py`), `libra train` on the head's host with `cluster.ray_address` set.
Each worker host has two workers; the static split puts an engine (a Ray actor) and a trainer rank on
each, so the two data-parallel ranks all-reduce over gloo between hosts.

Mid-run one worker host disappears (every process in its namespace killed): the run notices, waits
for Ray to count it gone, places itself anew on the host that is left and continues from the last
completed step; the host then comes back (a new Ray node at its address) and the run places itself
on both again before the next iteration. Every step is recorded once, in the store and MLflow.
"""

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.flows.test_train import mlflow_runs, store_steps
from tests.hosts import NetnsHosts, available
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
LOSE_AFTER = 2  # the host goes once this many iterations are checkpointed

pytestmark = pytest.mark.skipif(bool(available()), reason=available() or "test hosts")


def cluster_config(base: Path, policy: Path, address: str) -> Path:
    config = {
        "store": {"root": str(base / "store"), "fsync": False},
        "tracking": {"tracking_uri": f"sqlite:///{base / 'mlflow.db'}", "artifact_root": str(base / "artifacts")},
        "orchestration": {"prefect_home": str(base / "prefect")},
        "rollout": {"engine": "hf", "max_turns": 3, "max_tokens_per_turn": 40, "max_context": 512},
        "trainer": {"policy": str(policy), "run": "hosts", "steps": STEPS, "prompts_per_step": 2,
                    "samples_per_prompt": 4, "eval_prompts": 2, "eval_every": 100, "checkpoint_dir": str(base / "checkpoints"),
                    "lr": 1e-4},
        "placement": {"strategy": "static"},
        "pool": {"group_timeout_s": 20},
        "cluster": {"ray_address": address, "start_timeout_s": 90},
    }
    path = base / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_for(predicate, timeout_s: float, what: str, proc) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}: " + proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.2)


def plans(base: Path) -> list[dict]:
    from storage.catalog import Catalog

    try:
        with Catalog(base / "store", "hosts") as catalog:
            return catalog.query("select step, plan_id, reason, train_gpus, rollout_gpus from plans order by step").to_pylist()
    except Exception:  # noqa: BLE001 - no plans table yet
        return []


@pytest.mark.slow
def test_training_across_hosts_survives_losing_one(policy_dir, tmp_path: Path):  # noqa: F811
    with NetnsHosts(workers=2, cpus=2) as hosts:
        config = cluster_config(tmp_path, policy_dir, hosts.ray_address)
        lost = hosts.workers[1]
        proc = hosts.run_on(hosts.head, [sys.executable, "-m", "cli.main", "train", "--config", str(config), "--json"],
                            cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, stdout=__import__("subprocess").PIPE,
                            stderr=__import__("subprocess").PIPE, text=True)
        latest = tmp_path / "checkpoints" / "hosts" / "LATEST"
        wait_for(lambda: latest.exists() and latest.read_text().strip() == f"step-{LOSE_AFTER:06d}", 600,
                 f"checkpoint {LOSE_AFTER}", proc)
        hosts.kill(lost)
        wait_for(lambda: any("lost host" in p["reason"] for p in plans(tmp_path)), 300, "re-placement", proc)
        hosts.start(lost)
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-4000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["steps"] == STEPS

    rows = store_steps(tmp_path, "hosts")
    assert [(r["step"], r["n"], r["ids"]) for r in rows] == [(s, 8, 8) for s in range(STEPS)]  # each step once
    placed = plans(tmp_path)
    lost_rows = [p for p in placed if f"lost host {lost.address}" in p["reason"]]
    back_rows = [p for p in placed if f"host {lost.address} back" in p["reason"]]
    assert len(lost_rows) == 1 and lost_rows[0]["train_gpus"] + lost_rows[0]["rollout_gpus"] == 2
    assert len(back_rows) == 1 and back_rows[0]["train_gpus"] + back_rows[0]["rollout_gpus"] == 4
    assert LOSE_AFTER <= lost_rows[0]["step"] < back_rows[0]["step"], placed

    from storage.catalog import Catalog

    with Catalog(tmp_path / "store", "hosts") as catalog:
        events = catalog.query("select step, worker_id, event, detail from pool_events order by step, time_s").to_pylist()
        steps = catalog.query("select step, train_gpus, rollout_gpus from steps order by step").to_pylist()
    first = [e for e in events if e["step"] == 0 and e["event"] == "placed" and e["worker_id"].startswith("core-")]
    assert {e["detail"].split()[1] for e in first} == {w.address for w in hosts.workers}  # one rank per host
    assert [e["event"] for e in events if e["worker_id"] == f"host-{lost.address}"] == ["host_lost", "host_joined"]
    assert steps[0]["train_gpus"] == 2 and steps[lost_rows[0]["step"]]["train_gpus"] == 1
    assert steps[-1]["train_gpus"] == 2

    runs, client = mlflow_runs(tmp_path, "hosts")
    assert len(runs) == 1
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "reward")) == list(range(STEPS))
