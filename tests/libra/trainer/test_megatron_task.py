"""The elastic pool trains megatron-core's model (libra/trainer/megatron_task.py): a pooled trainer
on trainer.backend megatron, whose core and hybrids are each megatron's `GPTModel` in one process,
makes the torch trainer's updates on the same steps, with a hybrid that joins and trains as an extra
data-parallel replica; its published updates are HF weights and the torch trainer's optimizer
layout, so a run resumes from them on either backend."""

import pytest
import torch

from libra.config import PoolConfig, RolloutConfig, TrainerConfig
from libra.errors import LibraError
from libra.trainer.pooled import PooledTrainer
from libra.trainer.trainer import PolicyTrainer
from tests.libra.trainer.policies import assert_same_policy, random_samples
from tests.libra.trainer.test_pooled import assert_same_stats, saved

# lr 1e-3: summing in another order (two replicas, megatron's fused weights) moves AdamW's first
# steps by up to lr x the relative rounding (tests/libra/trainer/test_megatron_trainer.py says why)
CONFIG = TrainerConfig(lr=1e-3, warmup_steps=1, steps=5, micro_batch_tokens=64, seed=0, kl_coef=0.1,
                       backend="megatron")
POOL = PoolConfig(group_timeout_s=5.0, poll_s=0.02)


def test_hybrids_train_megatrons_model_as_data_parallel_replicas_equal_to_the_torch_trainer(tiny_policy, tmp_path):
    alone = PolicyTrainer(tiny_policy, CONFIG, RolloutConfig(), reference_dir=tiny_policy)
    pooled = PooledTrainer(tiny_policy, CONFIG, RolloutConfig(), POOL, tmp_path / "pool", hybrids=1)
    pooled.set_desired(1)
    hybrids = []
    try:
        for step in range(CONFIG.steps):
            stats = pooled.train_step(random_samples(step))
            assert type(pooled.pool.task).__name__ == "MegatronGRPOTask"
            assert_same_stats(stats, alone.train_step(random_samples(step)))
            hybrids.append(stats.hybrids)
        assert_same_policy(saved(pooled, tmp_path / "weights"), alone.model.state_dict(), atol=1e-5)
        state = pooled.optimizer_state()
    finally:
        pooled.close()
    assert sum(hybrids) >= 2, f"the hybrid trained in fewer than two updates: {hybrids}"
    # the published optimizer state is the torch trainer's layout: the torch trainer resumes from it
    want = alone.optimizer.state_dict()["state"]
    assert len(state["optimizer"]["state"]) == len(want)
    for i, moments in want.items():
        ours = state["optimizer"]["state"][i]
        assert torch.allclose(ours["exp_avg"], moments["exp_avg"], atol=1e-6)
        assert torch.allclose(ours["exp_avg_sq"], moments["exp_avg_sq"], atol=1e-8)
        assert float(ours["step"]) == float(moments["step"]) == CONFIG.steps
    resumed = PolicyTrainer(tmp_path / "weights", CONFIG.model_copy(update={"backend": "torch", "steps": 6}),
                            RolloutConfig(), reference_dir=tiny_policy)
    resumed.load_optimizer_state(state)
    assert resumed.optimizer.state_dict()["state"][0]["exp_avg"].equal(state["optimizer"]["state"][0]["exp_avg"])


def test_the_megatron_task_builds_on_the_cpu_only(tiny_policy, tmp_path):
    from libra.trainer.megatron_task import join_megatron

    with pytest.raises(LibraError, match="the pool's megatron task runs on the CPU \\(pool.device cpu\\), not cuda"):
        join_megatron(torch.device("cuda"))
