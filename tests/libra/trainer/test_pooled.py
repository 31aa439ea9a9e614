"""The pooled trainer (the live run's trainer when it has hybrids) makes the trainer's updates: the
same weights, statistics and optimizer state as `PolicyTrainer` on the same steps, with a hybrid
that joins, trains and is killed; and it resumes from a checkpoint's optimizer state as the
trainer does."""

import pytest
import torch

from libra.config import PoolConfig, RolloutConfig, TrainerConfig
from libra.errors import LibraError
from libra.trainer.pooled import PooledTrainer
from libra.trainer.trainer import PolicyTrainer, load_policy
from tests.libra.trainer.policies import assert_same_policy, random_samples

CONFIG = TrainerConfig(lr=0.01, warmup_steps=2, steps=8, micro_batch_tokens=64, seed=0, kl_coef=0.1)
POOL = PoolConfig(group_timeout_s=3.0, poll_s=0.02)
STEPS = 8


def saved(trainer: PooledTrainer, directory) -> dict[str, torch.Tensor]:
    """The trainer's weights as saved for the engines and checkpoints, loaded as a policy."""
    directory.mkdir()
    trainer.save_weights(directory)
    return load_policy(directory, torch.device("cpu")).state_dict()


def assert_same_stats(got, want) -> None:
    assert (got.tokens, got.sequences, got.lr) == (want.tokens, want.sequences, want.lr)
    for field in ("loss", "kl", "entropy", "clip_fraction", "logprob_gap", "grad_norm"):
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-4, abs=1e-6), field


def test_a_hybrid_that_joins_trains_and_is_killed_leaves_the_trainers_updates(tiny_policy, tmp_path):
    alone = PolicyTrainer(tiny_policy, CONFIG, RolloutConfig(), reference_dir=tiny_policy)
    pooled = PooledTrainer(tiny_policy, CONFIG, RolloutConfig(), POOL, tmp_path / "pool", hybrids=1)
    pooled.set_desired(1)
    hybrids, killed = [], None
    try:
        for step in range(STEPS):
            stats = pooled.train_step(random_samples(step))
            assert_same_stats(stats, alone.train_step(random_samples(step)))
            hybrids.append(stats.hybrids)
            if stats.hybrids and killed is None and step < STEPS - 2:
                pooled.kill(0)  # between updates, as a member of the training generation
                pooled.set_desired(0)  # not restarted: the steps after it are the core's alone
                killed = step
        assert pooled.updates == STEPS
        assert_same_policy(saved(pooled, tmp_path / "weights"), alone.model.state_dict(), atol=1e-5)
        state = pooled.optimizer_state()
        assert state["updates"] == STEPS
        exp_avg = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
        want = [s["exp_avg"] for s in alone.optimizer.state_dict()["state"].values()]
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(exp_avg, want, strict=True))
    finally:
        pooled.close()
    assert killed is not None, f"the hybrid never trained: {hybrids}"
    assert hybrids[killed + 1:] == [0] * (STEPS - killed - 1)


def test_a_resumed_pool_continues_from_the_checkpoints_optimizer_state(tiny_policy, tmp_path):
    config = CONFIG.model_copy(update={"steps": 5})
    first = PooledTrainer(tiny_policy, config, RolloutConfig(), POOL, tmp_path / "first", hybrids=1)
    alone = PolicyTrainer(tiny_policy, config, RolloutConfig(), reference_dir=tiny_policy)
    try:
        for step in range(2):
            first.train_step(random_samples(step))
            alone.train_step(random_samples(step))
        checkpoint = tmp_path / "checkpoint"
        checkpoint.mkdir()
        first.save_weights(checkpoint)
        (checkpoint / "tokenizer_config.json").write_text("{}")
        state = first.optimizer_state()
    finally:
        first.close()
    resumed = PooledTrainer(checkpoint, config, RolloutConfig(), POOL, tmp_path / "resumed", hybrids=1,
                            reference_dir=tiny_policy)
    resumed.load_optimizer_state(state)
    resumed.set_desired(1)
    try:
        for step in range(2, config.steps):
            assert_same_stats(resumed.train_step(random_samples(step)), alone.train_step(random_samples(step)))
        assert resumed.updates == config.steps
        assert_same_policy(saved(resumed, tmp_path / "weights"), alone.model.state_dict(), atol=1e-5)
    finally:
        resumed.close()
    done = PooledTrainer(checkpoint, config, RolloutConfig(), POOL, tmp_path / "done", hybrids=1)
    done.load_optimizer_state({**state, "updates": config.steps})
    with pytest.raises(LibraError, match="all 5 of its updates; raise trainer.steps"):
        done.train_step(random_samples(config.steps))
