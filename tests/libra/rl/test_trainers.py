"""The run's trainer chosen and placed (libra/rl/trainers.py): a megatron trainer whose layout the
planner decides, started on the trainer's workers in the planner's first layout and resharded when
a plan changes it, in a live session (a vLLM engine, the shipped policy, two one-core workers)."""

import os

import pytest

from libra.config import LibraConfig
from libra.rl.cluster import Placement
from libra.rl.runs import open_session
from libra.rl.trainers import reshard_row
from libra.trainer.layout import Layout
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture


def planned(tmp_path, policy) -> LibraConfig:
    return LibraConfig.model_validate({
        "rollout": {"engine": "vllm", "max_turns": 2, "max_tokens_per_turn": 24, "max_context": 512},
        "trainer": {"policy": str(policy), "run": "planned", "prompts_per_step": 2, "samples_per_prompt": 2,
                    "checkpoint_dir": str(tmp_path / "checkpoints"), "backend": "megatron", "layout": "planned",
                    "pipeline": "sync", "lr": 1e-4},
        "placement": {"strategy": "colocated"}})


def pinned(trainer) -> list[set[int]]:
    return [set(os.sched_getaffinity(rank.pid)) for rank in trainer._ranks]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores: two one-core workers")
def test_the_planners_layout_trains_and_a_move_reshards_the_trainer(policy_dir, tmp_path):  # noqa: F811
    cores = sorted(os.sched_getaffinity(0))[:2]
    session = open_session(planned(tmp_path, policy_dir).model_copy(deep=True))
    try:
        # colocated on two workers: the planner's training search splits the small policy's batch
        assert session.placement.layout == session.trainer.layout == Layout(dp=2)
        assert pinned(session.trainer) == [{cores[0]}, {cores[1]}]
        session.rollout(0)
        session.score(0)
        first = session.update(0)
        assert first.timing.layout == Layout(dp=2) and session.trainer.updates == 1
        session.sync()

        # a plan that keeps the workers but trains on one rank: the engine stays, the trainer is
        # resharded into the plan's layout, its rank on the first training worker (the other idles)
        restarted = session.apply(Placement(((0, 1),), (0, 1), True, "plan-1", layout=Layout()))
        reshard = session.reshard
        assert not restarted and (reshard.before, reshard.after) == (Layout(dp=2), Layout()) and reshard.seconds > 0
        assert session.trainer.layout == Layout() and pinned(session.trainer) == [{cores[0]}]
        row = reshard_row(1, 12.5, reshard, 1)
        assert row | {"detail": ""} == {"step": 1, "time_s": 12.5, "worker_id": "trainer", "gpus": 1,
                                        "from_state": "training", "to_state": "training",
                                        "event": "trainer_resharded", "detail": ""}
        assert row["detail"].startswith("tp=1 pp=1 dp=2 -> tp=1 pp=1 dp=1 in ")
        session.rollout(1)
        session.score(1)
        second = session.update(1)
        assert second.timing.layout == Layout() and session.trainer.updates == 2
        assert second.stats.lr == first.stats.lr * 2  # the warmup's second step: the schedule went on
    finally:
        session.close()
