"""The GRPO update as the elastic pool's task: shards summed over policy tokens make the trainer's
update, and a hybrid killed while it trains GRPO beside two core ranks costs no gradient."""

from pathlib import Path

import pytest
import torch

from libra.config import TrainerConfig
from libra.pools.pool import ElasticPool
from libra.pools.states import State
from libra.trainer.pool_task import GRPOTask, read_step, step_path, write_step
from libra.trainer.trainer import PolicyTrainer
from tests.libra.trainer.policies import assert_same_policy, random_samples

CONFIG = TrainerConfig(lr=0.01, warmup_steps=2, steps=12, micro_batch_tokens=64, seed=0)


def publish(directory: Path, steps: int, per_step: int = 6) -> Path:
    for step in range(steps):
        write_step(directory, step, random_samples(step, per_step))
    return directory


def trained(policy: Path, steps: int, per_step: int = 6) -> dict[str, torch.Tensor]:
    """The trainer alone, one process, on the same steps."""
    trainer = PolicyTrainer(policy, CONFIG)
    for step in range(steps):
        trainer.train_step(random_samples(step, per_step))
    return trainer.model.state_dict()


def test_published_samples_read_back_equal_and_a_missing_step_says_what_to_do(tmp_path):
    samples = random_samples(3)
    write_step(tmp_path, 3, samples)
    assert list(read_step(tmp_path, 3)) == samples
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(FileNotFoundError, match="step 4's samples are not published .*must call write_step"):
        read_step(tmp_path, 4, wait_s=0.1)


def test_shards_summed_over_policy_tokens_make_the_trainers_update(tiny_policy, tmp_path):
    task = GRPOTask(str(tiny_policy), CONFIG, str(publish(tmp_path, 2)))
    model, optimizer = task.build()
    for step in range(2):
        total = 0.0
        for rows in (range(0, 1), range(1, 4), range(4, 6)):  # uneven shards, several micro-batches each
            total += task.accumulate(model, step, rows).weight
        assert total == sum(s.policy_tokens for s in random_samples(step))
        for p in model.parameters():
            p.grad /= total
        task.update(model, optimizer, step)
    assert_same_policy(model.state_dict(), trained(tiny_policy, 2), atol=1e-6)


def test_a_hybrid_killed_while_it_trains_grpo_costs_no_gradient(tiny_policy, tmp_path):
    steps = 12
    task = GRPOTask(str(tiny_policy), CONFIG, str(publish(tmp_path / "steps", steps)))
    pool = ElasticPool(task, steps=steps, core_ranks=2, hybrids=1, min_step_s=0.4, group_timeout_s=3.0,
                       out_dir=tmp_path / "pool").start()
    pool.request_join("hybrid-0")
    pool.wait_for(lambda events: any(e.event == "activated" for e in events), timeout_s=120)
    pool.wait_for(lambda events: pool.progress >= events[-1].step + 2, timeout_s=60)
    pool.kill("hybrid-0")
    result = pool.wait(300)

    assert [s["step"] for s in result.steps] == list(range(steps))  # every step once, none skipped
    assert any(s["active"] == 3 for s in result.steps)  # the hybrid trained GRPO beside the core
    retried = [s["step"] for s in result.steps if s["retried"]]
    assert len(retried) <= 1  # the step in flight when it died (none if it died between steps)
    after = (retried or [s["step"] for s in result.steps if s["active"] == 3][-1:])[0]
    assert all(s["active"] == 2 for s in result.steps if s["step"] > after)
    assert pool.state("hybrid-0") is State.FAILED
    died = [e for e in result.events if e.worker_id == "hybrid-0" and e.event == "died"]
    assert len(died) == 1 and "SIGKILL" in died[0].detail
    # the same weights as the trainer alone on every step: nothing lost, nothing counted twice
    assert_same_policy(result.model, trained(tiny_policy, steps), atol=1e-5)
    assert step_path(task.steps_dir, 0).exists()  # the published steps stay for a resumed run
