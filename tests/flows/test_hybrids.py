"""A training run with a hybrid: the rollout worker also trains, as a hybrid of the elastic pool
beside the trainer's core rank, and is killed (SIGKILL) in the middle of an update. The run goes on:
every iteration is recorded once, the update the hybrid died in is redone by the core alone, and the
final weights are those of the trainer alone on the same batches (nothing lost, nothing counted
twice). The hybrid's transitions are in the store's `pool_events` at their iterations.

The run trains in this process (the flow, with a thread in place of a person at a terminal) so that
the test can kill the hybrid the moment an update has started. Two checks that nothing is lost or
counted twice: each update's policy tokens, summed by the pool over its replicas' shards, are the
batch's; and the final weights are those of the trainer alone on the same batches, to 1e-5 (all
but elements whose gradients cancel to rounding noise, at most 1 in 10,000). The
second is as strong as the batches' gradients: the shipped policy solves about one math task in
ten, and a batch in which no group's rewards differ has no gradient (an exact zero in the run and
in the comparison alike). A KL term with weight decay would give every update a gradient, but a
KL against weights that decay moved by 1e-5 is float cancellation noise, which AdamW's normalised
step turns into moves of up to the learning rate: not a comparison to 1e-5.
"""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from libra.config import LibraConfig
from libra.pools.states import State
from libra.trainer.pool_task import published_path, read_step, step_path
from libra.trainer.trainer import PolicyTrainer, load_policy
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture
from tests.libra.trainer.policies import assert_same_policy

STEPS = 4


def config_for(base: Path, policy: Path) -> LibraConfig:
    return LibraConfig.model_validate({
        "store": {"root": str(base / "store"), "fsync": False},
        "tracking": {"tracking_uri": f"sqlite:///{base / 'mlflow.db'}", "artifact_root": str(base / "artifacts")},
        "orchestration": {"prefect_home": str(base / "prefect")},
        "rollout": {"engine": "vllm", "max_turns": 3, "max_tokens_per_turn": 96, "max_context": 1024},
        "trainer": {"policy": str(policy), "run": "hybrid", "steps": STEPS, "prompts_per_step": 2, "samples_per_prompt": 4,
                    "eval_prompts": 2, "eval_every": 10, "checkpoint_dir": str(base / "checkpoints"), "lr": 1e-4,
                    "kl_coef": 0.5},
        "placement": {"strategy": "static", "hybrids": 1},
    })


def kill_during_an_update(pool_dir: Path, killed: dict, held: dict, stop: threading.Event) -> None:
    """Once the hybrid trains, wait for the next update's samples to be published (the update has
    begun: every replica is computing its shard), freeze the hybrid at once with SIGSTOP (the update
    cannot finish without its shard, however fast the machine), then SIGKILL it. `held`: the run's
    session once its context holds it."""
    while not stop.is_set():
        session = held.get("session")
        pool = session.trainer.pool if session is not None else None
        if pool is not None and pool.state("hybrid-0") is State.TRAINING:
            step = pool.progress + 1  # the core is at step `progress` (maybe computing it): wait for the next
            while not step_path(pool_dir / "steps-from-0", step).exists():  # the pool of a run from update 0
                if stop.is_set():
                    return
                time.sleep(0.001)
            os.kill(pool.provider.procs["hybrid-0"].pid, signal.SIGSTOP)
            time.sleep(0.2)
            killed["published"] = published_path(session.trainer.work_dir / "published", step + 1).is_dir()
            pool.kill("hybrid-0")
            killed["pool_step"] = step
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_a_hybrid_killed_during_an_update_of_a_live_run_costs_no_gradient(policy_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    from flows.train import train_flow
    from tasks.run_context import RunContext

    config = config_for(tmp_path, policy_dir)
    root = tmp_path / "checkpoints" / "hybrid"
    killed: dict = {}
    held: dict = {}
    hold = RunContext.hold

    def hold_and_show(context, session) -> None:
        hold(context, session)
        held["session"] = session

    monkeypatch.setattr(RunContext, "hold", hold_and_show)
    stop = threading.Event()
    killer = threading.Thread(target=kill_during_an_update, args=(root / "pool", killed, held, stop), daemon=True)
    killer.start()
    try:
        summary = train_flow(config)
    finally:
        stop.set()
        killer.join()
    assert summary["step"] == STEPS and "pool_step" in killed
    assert not killed["published"]  # the hybrid was frozen inside the update: it could not finish

    from storage.catalog import Catalog

    with Catalog(tmp_path / "store", "hybrid") as catalog:
        steps = catalog.query("SELECT step, hybrid_gpus, train_gpus, rollout_gpus, trained_tokens FROM steps "
                              "ORDER BY step").to_pylist()
        events = catalog.query("SELECT step, event, detail FROM pool_events WHERE worker_id = 'hybrid-0' "
                               "ORDER BY time_s").to_pylist()
    assert [s["step"] for s in steps] == list(range(STEPS))  # each iteration once
    assert all((s["train_gpus"], s["rollout_gpus"]) == (1, 1) for s in steps)
    # the pool's step k is iteration k's update (the run started from the policy)
    k = killed["pool_step"]
    assert any(s["hybrid_gpus"] == 1 for s in steps[:k])  # the hybrid trained beside the core before
    assert steps[k]["hybrid_gpus"] == 0  # the update it died in: the core's alone, over the whole batch
    kinds = [e["event"] for e in events]
    assert "activated" in kinds and kinds.count("died") == 1
    died = events[kinds.index("died")]
    assert died["step"] == k and "SIGKILL" in died["detail"]

    log = json.loads((root / "pool" / "pool-from-0" / "steps.json").read_text())
    assert [s["step"] for s in log] == list(range(STEPS))  # every update once, none skipped
    assert log[k]["active"] == 1  # redone by the core alone (or, had it died between updates, taken by it alone)

    # the run's final weights are the trainer's alone on the batches the pool trained
    alone = PolicyTrainer(policy_dir, config.trainer, config.rollout, reference_dir=policy_dir)
    batches = [read_step(root / "pool" / "steps-from-0", step) for step in range(STEPS)]
    assert [s["trained_tokens"] for s in steps] == [sum(x.policy_tokens for x in batch) for batch in batches]
    for batch in batches:
        alone.train_step(batch)
    final = load_policy(root / f"step-{STEPS:06d}", torch.device("cpu")).state_dict()
    # up to 1 in 10,000 elements may differ by rounding noise that AdamW amplified (at most the
    # learning rate an update; `assert_same_policy` says why)
    assert_same_policy(final, alone.model.state_dict(), atol=1e-5, noise_share=1e-4, bound=2 * STEPS * config.trainer.lr)
