"""The solvers against brute force on random small instances (hypothesis)."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.planner.cost_model import CostModel
from libra.planner.exhaustive import ExhaustivePlanner, best_rollout, best_training
from libra.planner.planner import Planner, PlannerSettings
from libra.planner.profiles import HARDWARE, MODELS, Cluster
from libra.planner.rollout_search import GroupTimes, RolloutSearch
from libra.planner.training_search import TrainingTable
from libra.planner.workload import TrajectoryLength, build_workload

SMALL_MODELS = ["qwen2.5-3b", "qwen3-4b", "qwen2.5-7b", "qwen3-8b", "qwen3-30b-a3b"]


@st.composite
def instances(draw):
    hardware = HARDWARE[draw(st.sampled_from(["a800", "h100", "h200"]))]
    per_node = draw(st.sampled_from([2, 4]))
    cluster = Cluster(draw(st.integers(1, 2)), per_node, hardware)
    model = MODELS[draw(st.sampled_from(SMALL_MODELS))]
    trajectories = draw(st.lists(
        st.builds(TrajectoryLength, st.integers(16, 2_000), st.integers(1, 24_000), st.integers(0, 8_000),
                  st.integers(1, 12), st.floats(0, 30)),
        min_size=1, max_size=24,
    ))
    bounds = sorted(draw(st.sets(st.integers(500, 30_000), min_size=0, max_size=3)))
    workload = build_workload(trajectories, draw(st.sampled_from([16, 64, 256])), bounds or None)
    return CostModel(cluster, model), workload


def _same(a: float, b: float) -> bool:
    return (math.isinf(a) and math.isinf(b)) or math.isclose(a, b, rel_tol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(["one_step_off", "sync"]), st.sampled_from([0.0, 0.5]))
def test_planner_equals_exhaustive_search(instance, mode, hybrid_fraction) -> None:
    cost, workload = instance
    plan_settings = PlannerSettings(mode=mode, max_hybrid_fraction=hybrid_fraction, hybrid_shares=2, granularity=1)
    fast = Planner(cost, workload, plan_settings).plan()
    slow = ExhaustivePlanner(cost, workload, plan_settings).plan()
    assert _same(fast.t_iter_s, slow.t_iter_s)


@settings(max_examples=60, deadline=None)
@given(instances(), st.integers(1, 8))
def test_rollout_dp_equals_brute_force(instance, gpus) -> None:
    cost, workload = instance
    layout = RolloutSearch(cost, workload).solve(gpus)
    assert _same(layout.seconds, best_rollout(cost, gpus, workload))
    if not math.isinf(layout.seconds):
        assert layout.gpus <= gpus
        covered = [i for g in layout.groups for i in range(g.first_bucket, g.last_bucket + 1)]
        assert covered == list(range(len(workload.buckets)))  # every bucket once, in order
        assert [g.tp for g in layout.groups] == sorted(g.tp for g in layout.groups)
        assert all(cost.instance_fits(g.tp, g.max_tokens) for g in layout.groups)


@settings(max_examples=60, deadline=None)
@given(instances(), st.integers(1, 8))
def test_training_search_equals_brute_force_and_fits(instance, gpus) -> None:
    cost, workload = instance
    best = TrainingTable(cost, workload).best(gpus)
    brute = best_training(cost, gpus, workload)
    assert (best is None) == (brute is None)
    if best is not None:
        assert _same(best.seconds, brute.seconds)
        assert best.config.gpus <= gpus
        assert best.memory_bytes <= cost.train_memory_limit_bytes()


@settings(max_examples=20, deadline=None)
@given(instances())
def test_plans_are_deterministic_and_within_memory(instance) -> None:
    cost, workload = instance
    first = Planner(cost, workload).plan()
    second = Planner(cost, workload).plan()
    assert first == second
    assert first.gpus <= cost.cluster.gpus
    if first.train is not None:
        assert first.train.memory_bytes <= cost.train_memory_limit_bytes()
        assert cost.train_memory_bytes(first.train.config, workload.max_tokens) == first.train.memory_bytes


@settings(max_examples=60, deadline=None)
@given(instances(), st.sampled_from([1, 2, 4]))
def test_group_time_never_rises_with_more_instances(instance, tp) -> None:
    cost, workload = instance
    times = [cost.group_time(tp, count, workload.buckets) for count in range(1, 17)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:], strict=False))


@settings(max_examples=30, deadline=None)
@given(instances())
def test_evaluate_reproduces_the_plan_on_its_own_workload(instance) -> None:
    from libra.planner.planner import evaluate

    cost, workload = instance
    planner = Planner(cost, workload, PlannerSettings(max_hybrid_fraction=0.5, hybrid_shares=2, granularity=1))
    plan = planner.plan()
    if not math.isinf(plan.t_iter_s):
        assert math.isclose(evaluate(planner, plan), plan.t_iter_s, rel_tol=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(1, 64))
def test_searches_sharing_group_times_find_what_each_finds_alone(instance, gpus: int) -> None:
    """The planner's variants (one per TP size, and all of them) share the cost model's group times:
    each finds the layout it finds alone, and the ones after the first cost fewer groups."""
    cost, workload = instance
    shared = GroupTimes(cost, workload)
    costed = 0
    for tps in ((1, 2, 4, 8), (8,), (4,), (1, 2, 4, 8)):
        alone, together = RolloutSearch(cost, workload, tps), RolloutSearch(cost, workload, tps, shared)
        assert together.solve(gpus) == alone.solve(gpus)
        assert together.group_evaluations <= alone.group_evaluations
        costed += together.group_evaluations
    assert costed == len(shared.seconds)
    other = build_workload([TrajectoryLength(100, 50, 0, 1, 0.0)], 16)
    with pytest.raises(ValueError, match="same cost model and workload"):
        RolloutSearch(cost, other, (8,), shared)
