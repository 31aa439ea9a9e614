"""`libra train` end to end on the transformers engine and the shipped policy: GRPO iterations as
Prefect flows, the store and MLflow written once per step, and a run killed with SIGKILL
mid-iteration that continues where it stopped.

The killed-and-resumed run ends with the weights of the uninterrupted one to 1e-5, not bit for bit:
the engine batches whichever turns are waiting when it steps, which depends on when tool calls
return, and a forward pass over a batch padded differently differs in the last bits of its
log-probs (the sampled tokens are the same: each request samples from its own seeded generator).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def write_config(base: Path, policy: Path, run: str) -> Path:
    config = {
        "store": {"root": str(base / "store"), "fsync": False},
        "tracking": {"tracking_uri": f"sqlite:///{base / 'mlflow.db'}", "artifact_root": str(base / "artifacts")},
        "orchestration": {"prefect_home": str(base / "prefect")},
        "rollout": {"engine": "hf", "max_turns": 3, "max_tokens_per_turn": 40, "max_context": 512},
        "trainer": {"policy": str(policy), "run": run, "steps": STEPS, "prompts_per_step": 2, "samples_per_prompt": 4,
                    "eval_prompts": 2, "eval_every": 2, "checkpoint_dir": str(base / "checkpoints"), "lr": 1e-4},
    }
    path = base / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def libra(config: Path, *extra: str) -> subprocess.Popen:
    """`libra train` in a process of its own, its Prefect the test session's server (a run's own
    temporary server, the embedded default, is `tests/cli`'s to exercise; it costs a process 10 s)."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {"PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.Popen([sys.executable, "-m", "cli.main", "train", "--config", str(config), "--json", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finished(proc: subprocess.Popen) -> dict:
    """The summary of a `libra train --json` that succeeded: its stdout exactly one JSON document
    (with vLLM's engines too, `tests/flows/test_replanning.py`: they log to stdout by default)."""
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("\n") == 1, out[-3000:]
    return json.loads(out)


def weights(checkpoint: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(checkpoint) / "model.safetensors"))


def mlflow_runs(base: Path, run: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{base / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("libra-train-math")
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`libra.run` = '{run}'"), client


def store_steps(base: Path, run: str) -> list[dict]:
    from storage.catalog import Catalog

    with Catalog(base / "store", run) as catalog:
        return catalog.query("select step, count(*) as n, count(distinct trajectory_id) as ids, "
                             "min(model_version) as v from trajectories group by step order by step").to_pylist()


@pytest.mark.slow
def test_train_killed_mid_iteration_resumes_and_matches_the_uninterrupted_run(policy_dir, tmp_path):  # noqa: F811
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight_dir.mkdir()
    killed_dir.mkdir()
    straight = finished(libra(write_config(straight_dir, policy_dir, "demo")))
    assert straight["steps"] == STEPS and straight["resumed_at"] == 0
    assert set(straight["heldout"]) == {"0", "2", "3"}  # at the start, every 2 updates and at the end
    assert {"run", "reward_start", "reward_end", "tokens_per_s", "mlflow_run_id", "checkpoint"} <= set(straight)

    config = write_config(killed_dir, policy_dir, "demo")
    proc = libra(config)
    latest = killed_dir / "checkpoints" / "demo" / "LATEST"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() == "step-000001":
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # just after iteration 0's checkpoint: its record may not be written yet
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with contextlib.suppress(ProcessLookupError):  # what it started (its engines) would hold its output open
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)

    resumed = finished(libra(config))
    assert resumed["resumed_at"] == 1 and resumed["steps"] == STEPS
    got, want = weights(resumed["checkpoint"]), weights(straight["checkpoint"])
    assert got.keys() == want.keys()
    for name in want:
        assert (got[name] - want[name]).abs().max().item() <= 1e-5, name

    rows = store_steps(killed_dir, "demo")
    assert rows == [{"step": s, "n": 8, "ids": 8, "v": max(0, s - 1)} for s in range(STEPS)]  # one-step-off: 1 stale
    assert rows == store_steps(straight_dir, "demo")
    runs, client = mlflow_runs(killed_dir, "demo")
    assert len(runs) == 1 and runs[0].info.run_id == resumed["mlflow_run_id"]
    for metric in ("reward", "loss", "tokens_per_s"):
        assert sorted(m.step for m in client.get_metric_history(resumed["mlflow_run_id"], metric)) == list(range(STEPS))
    assert sorted(m.step for m in client.get_metric_history(resumed["mlflow_run_id"], "heldout_reward")) == [0, 2, 3]
    assert runs[0].data.params["trainer.steps"] == str(STEPS)
    assert client.get_run(resumed["mlflow_run_id"]).data.tags["libra.checkpoint"].endswith("step-000003")

    again = finished(libra(config))  # a finished run is reported, not trained again
    assert again["resumed_at"] == STEPS and again["reward_end"] == resumed["reward_end"]
    assert store_steps(killed_dir, "demo") == rows
