"""The relaxation of a partial run (each stage given the whole cluster) and the hand-set fixed
split it is weighed against."""

import pytest

from libra.planner.cost_model import CostModel
from libra.planner.planner import PlannerSettings
from libra.planner.profiles import MODELS, parse_cluster
from libra.planner.trigger import TriggerSettings
from libra.sim.modes import RolloutMode
from libra.sim.relaxation import Relaxation
from libra.sim.runner import draw, simulate
from libra.sim.systems import FixedSplit, StaticUniform
from libra.sim.workloads import workload_spec

COST = CostModel(parse_cluster("6x8:a800"), MODELS["qwen3-14b"])


def run(system_class, spec, mode, steps=6, **kwargs):
    """One system over `steps` batches of `spec` (seed 1), as `simulate` runs it."""
    drawn = draw(spec, COST, steps, 1, mode)
    return drawn.run(system_class(drawn.cost, PlannerSettings(), TriggerSettings(), mode, drawn.group_size, **kwargs))


@pytest.mark.parametrize("mode", ["partial", "async"])
def test_no_system_trains_faster_than_the_relaxation(mode: str) -> None:
    spec = workload_spec("search-r1", prompts_per_step=8)
    relaxed = run(Relaxation, spec, RolloutMode(mode))
    runs = simulate(spec, COST, 6, ["static-uniform", "areal-static-optimal", "libra", "greedy-heuristic"], seed=1,
                    mode=RolloutMode(mode))
    assert all(r.tokens_per_s < relaxed.tokens_per_s for r in runs.values())
    # every trajectory decodes alone: no step of the relaxation's rollout batches two sequences
    assert all(s.rollout_gpus >= 8 * 128 for s in relaxed.steps) and relaxed.steps[1].train_gpus == COST.cluster.gpus


def test_a_fixed_split_trains_on_the_gpus_it_is_given_and_static_uniform_is_half() -> None:
    spec = workload_spec("search-r1", prompts_per_step=8)
    mode = RolloutMode("partial")
    quarter = run(FixedSplit, spec, mode, steps=3, train_gpus=12)
    assert {s.train_gpus for s in quarter.steps} == {12} and {s.rollout_gpus for s in quarter.steps} <= {32, 36}
    half = run(FixedSplit, spec, mode, steps=3, train_gpus=24)
    assert [s.step_s for s in half.steps] == [s.step_s for s in run(StaticUniform, spec, mode, steps=3).steps]
    simulated = simulate(spec, COST, 3, ["static-uniform"], seed=1, mode=mode)["static-uniform"]
    assert [s.step_s for s in half.steps] == [s.step_s for s in simulated.steps]
    with pytest.raises(ValueError, match="a fixed split trains on 1 to 47 of 48 GPUs, got 48"):
        FixedSplit(COST, PlannerSettings(), TriggerSettings(), train_gpus=48)
