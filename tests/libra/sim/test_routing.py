import pytest

from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.scheduler.routers import Buckets
from libra.sim.rollout import InstanceSpec
from libra.sim.routing import bucket_shares, compare_routers
from libra.sim.workloads import SimTrajectory, SimTurn

COST = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-14b"])


def _one_turn(tid: str, prompt: int, gen: int) -> SimTrajectory:
    return SimTrajectory(tid, tid.split("/")[0], prompt, (SimTurn(gen, "none", 0, "none", 0.0),))


def test_routing_is_judged_by_the_makespan_its_placements_cost() -> None:
    """One TP1 instance for short trajectories, one TP4 for long ones. Routing on true lengths puts
    the 6,000-token trajectory on TP4; MLFQ starts everything on the shortest bucket and, with no
    tool return to demote at, leaves it on TP1, where it is the step's straggler."""
    layout = [InstanceSpec(1, 0), InstanceSpec(4, 1)]
    batch = [_one_turn("a/0", 100, 200), _one_turn("b/0", 100, 6000)]
    results = compare_routers(COST, layout, (1000,), [batch], ["oracle", "mlfq"])
    long_on = {tp: COST.prefill_s(tp, 100, 100) + 6000 * COST.decode_step_s(tp, 1, 100) for tp in (1, 4)}
    assert results["oracle"].makespans_s == (pytest.approx(long_on[4]),)
    assert results["mlfq"].makespans_s[0] == pytest.approx(long_on[1], rel=1e-3)  # the short one barely slows it
    assert results["oracle"].migrated_share == 0.0


def test_routers_learn_from_finished_steps_and_only_later_steps_are_scored() -> None:
    """A prompt that recurs: the length predictor knows after one step that it runs long."""
    layout = [InstanceSpec(1, 0), InstanceSpec(4, 1)]
    steps = [[_one_turn(f"p/{k}", 100, 6000), _one_turn(f"q/{k}", 100, 200)] for k in range(3)]
    results = compare_routers(COST, layout, (1000,), steps, ["predictor", "oracle"], warmup_steps=1)
    assert len(results["predictor"].makespans_s) == 2
    assert results["predictor"].makespans_s == pytest.approx(results["oracle"].makespans_s)
    with pytest.raises(ValueError, match="warmup_steps"):
        compare_routers(COST, layout, (1000,), steps, ["oracle"], warmup_steps=3)


def test_bucket_shares() -> None:
    batch = [_one_turn("a/0", 100, 200), _one_turn("b/0", 100, 6000), _one_turn("c/0", 100, 700)]
    assert bucket_shares(batch, Buckets((1000,))) == (2 / 3, 1 / 3)
