import math

import pytest

from libra.planner.cost_model import TrainConfig
from libra.planner.planner import Planner
from libra.planner.workload import uniform_workload
from tests.libra.planner.builders import a800_14b


def _times(trajectories: int, length: int) -> tuple[float, float]:
    """Best rollout and training time on 24 A800 GPUs each, Qwen3-14B, 512-token prompts."""
    planner = Planner(a800_14b(), uniform_workload(trajectories, 512, length - 512))
    return planner.t_rollout(24), planner.t_train(24)


def test_rollout_grows_far_faster_than_training_with_length() -> None:
    """1K -> 32K tokens. Same trajectories per step: rollout x172, training x43. Same token budget
    (512 x 1K tokens): rollout x45, training x1.7. The published figures are x95 and x3.9."""
    r1, t1 = _times(512, 1024)
    r32, t32 = _times(512, 32768)
    assert (round(r32 / r1), round(t32 / t1)) == (172, 43)
    r32_budget, t32_budget = _times(16, 32768)
    assert (round(r32_budget / r1), round(t32_budget / t1, 1)) == (45, 1.7)
    assert r32_budget / r1 > 20 * (t32_budget / t1)


def test_kv_capacity_and_fit() -> None:
    cost = a800_14b()
    # per GPU: 0.9 * 80 GB - weights/tp - 1 GB, over 160 KiB/tp per token (8 KV heads)
    assert [cost.kv_capacity_tokens(tp) for tp in (1, 2, 4, 8)] == [253072, 686422, 1553121, 3286519]
    assert cost.instance_fits(1, 131_072) and not cost.instance_fits(1, 131_073)  # max context caps TP1 too
    assert math.isinf(cost.group_time(1, 4, uniform_workload(8, 100, 300_000).buckets))


def test_training_memory_shrinks_with_parallelism() -> None:
    cost = a800_14b()
    single = cost.train_memory_bytes(TrainConfig(1, 1, 1, 1, 1), 8192)
    assert single > cost.train_memory_limit_bytes()  # 14B with Adam does not fit one GPU
    tp4 = cost.train_memory_bytes(TrainConfig(4, 1, 1, 1, 1), 8192)
    tp4_dp4 = cost.train_memory_bytes(TrainConfig(4, 1, 4, 1, 1), 8192)
    assert single > tp4 > tp4_dp4
    assert tp4_dp4 < cost.train_memory_limit_bytes()


def test_decode_is_memory_bound_at_small_batch() -> None:
    cost = a800_14b()
    compute, memory, comm = cost.decode_step_features(1, 1, 1000)
    assert memory > 50 * compute and comm == 0.0
    assert cost.decode_step_s(1, 1, 1000) == pytest.approx(memory / 0.85 + 0.003)


def test_no_credit_for_fractional_pools_that_cannot_train() -> None:
    """2x8 H100, Qwen3-14B, SWE lengths: 7 GPUs cannot train, so a 7-GPU core plus hybrids must not
    be planned as if it could."""
    from libra.planner.cost_model import CostModel
    from libra.planner.profiles import MODELS, parse_cluster
    from tests.libra.planner.builders import trace_workload

    plan = Planner(CostModel(parse_cluster("2x8:h100"), MODELS["qwen3-14b"]), trace_workload("swe_gemini3_mini_A")).plan()
    assert plan.train is not None and not math.isinf(plan.t_iter_s)
    assert plan.train.config.gpus <= plan.train_gpus
