import math
from dataclasses import replace

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
    """1K -> 32K tokens. Same trajectories per step: rollout x182, training x43. Same token budget
    (512 x 1K tokens): rollout x31, training x1.7. The published figures are x95 and x3.9."""
    r1, t1 = _times(512, 1024)
    r32, t32 = _times(512, 32768)
    assert (round(r32 / r1), round(t32 / t1)) == (182, 43)
    r32_budget, t32_budget = _times(16, 32768)
    assert (round(r32_budget / r1), round(t32_budget / t1, 1)) == (31, 1.7)
    assert r32_budget / r1 > 15 * (t32_budget / t1)


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
    gemm, weights, kv, one, comm = cost.decode_step_features(1, 1, 1000)
    assert weights > 50 * gemm and kv == one and comm == 0.0
    c = cost.coefficients  # the GEMM phase is the weights' read; then the one sequence's attention, twice
    assert cost.decode_step_s(1, 1, 1000) == pytest.approx(c.decode_memory * weights + (c.decode_kv + c.decode_kv_tail) * kv
                                                           + c.decode_step_s + c.decode_seq_s)


def test_no_credit_for_fractional_pools_that_cannot_train() -> None:
    """2x8 H100, Qwen3-14B, SWE lengths: 7 GPUs cannot train, so a 7-GPU core plus hybrids must not
    be planned as if it could."""
    from libra.planner.cost_model import CostModel
    from libra.planner.profiles import MODELS, parse_cluster
    from tests.libra.planner.builders import trace_workload

    plan = Planner(CostModel(parse_cluster("2x8:h100"), MODELS["qwen3-14b"]), trace_workload("swe_gemini3_mini_A")).plan()
    assert plan.train is not None and not math.isinf(plan.t_iter_s)
    assert plan.train.config.gpus <= plan.train_gpus


def test_a_lone_sequence_decodes_at_weights_over_bandwidth_plus_nvlink_latency() -> None:
    """Qwen3-14B on A800, one sequence of 1K context. First principles: each token reads the
    weights' share of each GPU (29.5 GB / tp at 2,039 GB/s, at the read ceiling measured on an
    H200: 0.87 of the datasheet's), pays the fixed cost of a CUDA-graphed step (3 ms, measured on
    the H200) and runs 2 all-reduces per layer of one 10 KiB activation over NVLink (a few
    microseconds each): about 19.5-20 / 12 / 7.5-8 / 5.5-6 ms."""
    cost = a800_14b()
    weights_s = [cost.model.weight_bytes / tp / cost.hw.hbm_bandwidth for tp in (1, 2, 4, 8)]
    latency = [cost.decode_step_s(tp, 1, 1000) for tp in (1, 2, 4, 8)]
    assert [round(t * 1e3, 1) for t in latency] == [19.8, 12.0, 7.8, 5.8]
    assert all(w / 0.87 + 0.003 < t < w / 0.87 + 0.003 + 0.001 for w, t in zip(weights_s, latency, strict=True))
    assert latency[0] / latency[3] > 3  # TP8 buys the tail's latency ...
    # ... and costs throughput at large batches: tokens per GPU-second fall with TP at batch 256
    per_gpu = [256 / cost.decode_step_s(tp, 256, 4096) / tp for tp in (2, 4, 8)]
    assert per_gpu[0] > per_gpu[1] > per_gpu[2]


def test_engine_all_reduce_is_one_shot_for_small_messages_and_two_shot_for_large() -> None:
    """Inside a node an engine all-reduce waits one hop (one-shot) or two (two-shot), not the
    ring's 2(n-1) = 14 at TP8; A800 NVLink 200 GB/s per direction, 5 us per hop."""
    cost = a800_14b()
    small = 5120 * 2  # one token's activation (Qwen3-14B hidden 5120, bf16)
    assert cost._engine_all_reduce_s(small, 8, 1) == pytest.approx(5e-6 + 7 * small / 200e9)
    large = 256 * small
    assert cost._engine_all_reduce_s(large, 8, 1) == pytest.approx(2 * 5e-6 + 2 * 7 / 8 * large / 200e9)
    assert cost._engine_all_reduce_s(small, 1, 80) == 0.0
    # 80 calls per token (2 per layer) at TP8 cost under half a millisecond, against 5.6 ms for rings
    assert 80 * cost._engine_all_reduce_s(small, 8, 1) < 0.5e-3 < 80 * 14 * 5e-6


def test_group_time_agrees_with_the_rollout_physics() -> None:
    """The planner's price of a uniform group (its share at the steady batch, the longest
    trajectory's tail decoded alone) against the simulator running the same batch on the same
    instances: within 20% on a short, a long-reasoning and a long-horizon SWE workload, at every TP.
    Pricing the tail at the full batch's step time was up to 3x too slow at TP8."""
    from libra.scheduler.routers import Buckets, LeastLoad
    from libra.sim.rollout import InstanceSpec, RolloutSim
    from libra.sim.training import workload_of
    from libra.sim.workloads import WorkloadGenerator, workload_spec

    cost = a800_14b()
    for name in ("search-r1", "dapo-math", "r2e-gym"):
        batch = WorkloadGenerator(workload_spec(name), seed=0).step(0)
        buckets = workload_of(batch).buckets
        for tp, count in ((1, 16), (2, 8), (4, 4), (8, 2)):
            simulated = RolloutSim(cost, [InstanceSpec(tp, 0)] * count, LeastLoad(Buckets(()))).run(batch).makespan_s
            assert 0.8 < cost.group_time(tp, count, buckets) / simulated < 1.2, (name, tp)


def test_instances_driven_by_one_process_share_its_host_time_per_sequence() -> None:
    """With only a host cost per sequence (0.4 ms a token), 64 equal trajectories take 64 x 200 x
    0.4 ms = 5.12 s on one instance; two instances halve it when each has a server of its own, and
    do not when one process drives both (`shared_host`: each step also waits for the other's
    sequences). The rollout simulator runs the same batch to the same times."""
    from libra.scheduler.routers import Buckets, LeastLoad
    from libra.sim.rollout import InstanceSpec, RolloutSim
    from libra.sim.training import workload_of
    from libra.sim.workloads import SimTrajectory, SimTurn

    base = a800_14b()
    host_only = replace(base.coefficients, decode_compute=0.0, decode_memory=0.0, decode_kv=0.0, decode_kv_tail=0.0,
                        rollout_comm=0.0, decode_step_s=0.0,
                        prefill_compute=0.0, decode_seq_s=4e-4)
    batch = [SimTrajectory(f"p{i}/0", f"p{i}", 100, (SimTurn(200, "none", 0, "none", 0.0),)) for i in range(64)]
    buckets = workload_of(batch).buckets
    for shared, two in ((False, 2.56), (True, 5.12)):
        cost = replace(base, coefficients=host_only, rollout=base.rollout.model_copy(update={"shared_host": shared}))
        assert cost.group_time(1, 1, buckets) == pytest.approx(5.12)
        assert cost.group_time(1, 2, buckets) == pytest.approx(two)
        for count, expected in ((1, 5.12), (2, two)):
            simulated = RolloutSim(cost, [InstanceSpec(1, 0)] * count, LeastLoad(Buckets(()))).run(batch).makespan_s
            assert simulated == pytest.approx(expected), (shared, count)
