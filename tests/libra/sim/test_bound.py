"""The proven bound: no simulated system beats it, and each of its terms is exactly what the physics charges
for the cases where the physics can reach it."""

from dataclasses import replace

import pytest

from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.scheduler.routers import Buckets, LeastLoad, Oracle
from libra.sim.bound import longest_s, rollout_gpu_s, run_bound
from libra.sim.rollout import InstanceSpec, RolloutSim, path_of
from libra.sim.runner import simulate
from libra.sim.systems import SYSTEMS
from libra.sim.workloads import SimTrajectory, SimTurn, WorkloadGenerator, workload_spec

COST = CostModel(parse_cluster("6x8:a800"), MODELS["qwen3-14b"])


@pytest.mark.parametrize(("workload", "cluster"), [("search-r1", "2x8:a800"), ("dapo-math", "2x8:a800"),
                                                   ("r2e-gym", "2x8:h100")])
def test_no_system_beats_the_bound(workload: str, cluster: str) -> None:
    spec = workload_spec(workload, group_size=4, prompts_per_step=8)
    cost = CostModel(parse_cluster(cluster), MODELS["qwen3-8b"])
    runs = simulate(spec, cost, 3, list(SYSTEMS), seed=1)
    generator = WorkloadGenerator(spec, 1)
    bound = run_bound(cost, [generator.step(k) for k in range(3)])
    for name, run in runs.items():
        assert run.total_time_s >= bound.total_s, name
    assert runs["oracle"].total_time_s < 1.3 * bound.total_s  # and it is not vacuous


def test_one_sequence_alone_runs_exactly_at_the_longest_term() -> None:
    """A lone trajectory on a TP8 instance (the fastest for a batch of one) takes exactly the bound's
    longest-trajectory time: prefills, batch-1 decode steps and its tool call."""
    t = SimTrajectory("p/0", "p", 500, (SimTurn(2000, "search", 300, "ok", 1.5), SimTurn(800, "none", 0, "none", 0.0)))
    result = RolloutSim(COST, [InstanceSpec(8, 0)], LeastLoad(Buckets(()))).run([t])
    assert longest_s(COST, [t]) == pytest.approx(result.makespan_s)


def test_rollout_work_is_below_what_any_layout_spends() -> None:
    """Busy GPU-seconds of real layouts, uniform and heterogeneous, exceed the rollout work bound;
    256 equal sequences decoding side by side on one TP1 instance reach it exactly (the bound's
    ideal: every step a full batch of `max_batch` sequences on one GPU, its GEMM phase, its KV
    reads, its one sequence's tail and its fixed cost shared by all of them)."""
    batch = WorkloadGenerator(workload_spec("search-r1"), seed=0).step(0)
    work = rollout_gpu_s(COST, batch)
    truth = {t.trajectory_id: path_of(t).remaining_at_decisions for t in batch}
    for layout, bounds in [([InstanceSpec(1, 0)] * 48, ()), ([InstanceSpec(8, 0)] * 6, ()),
                           ([InstanceSpec(1, 0)] * 16 + [InstanceSpec(4, 1)] * 8, (3000,))]:
        result = RolloutSim(COST, layout, Oracle(Buckets(bounds), truth, measure="total")).run(batch)
        assert result.busy_gpu_s >= work
    full = [SimTrajectory(f"p{i}/0", f"p{i}", 100, (SimTurn(800, "none", 0, "none", 0.0),)) for i in range(256)]
    busy = RolloutSim(COST, [InstanceSpec(1, 0)], LeastLoad(Buckets(()))).run(full).busy_gpu_s
    assert busy == pytest.approx(rollout_gpu_s(COST, full), rel=1e-12)


def test_host_cost_per_sequence_keeps_the_bound_below_every_system() -> None:
    """With a host cost per sequence per decode step (a CPU engine's), the bound still holds."""
    spec = workload_spec("dapo-math", group_size=4, prompts_per_step=8)
    base = CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"])
    cost = replace(base, coefficients=replace(base.coefficients, decode_seq_s=2e-4))
    runs = simulate(spec, cost, 3, list(SYSTEMS), seed=1)
    bound = run_bound(cost, [WorkloadGenerator(spec, 1).step(k) for k in range(3)])
    assert bound.total_s > run_bound(base, [WorkloadGenerator(spec, 1).step(k) for k in range(3)]).total_s
    for name, run in runs.items():
        assert run.total_time_s >= bound.total_s, name
