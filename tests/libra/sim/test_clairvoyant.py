"""The clairvoyant probes of how much placement and hybrids could add to a partial run: the closing
groups on instances of their own (`ClairvoyantClose`, `GroupLanes`), and hybrids whose joins cost
what the pool says or nothing (`HybridSplit`)."""

import pytest

from libra.planner.cost_model import TrainConfig
from libra.planner.planner import PlannerSettings
from libra.planner.trigger import TriggerSettings
from libra.scheduler.keys import ToolReturn
from libra.scheduler.routers import GroupLanes
from libra.sim import probes, systems
from libra.sim.modes import RolloutMode
from libra.sim.probes import ClairvoyantClose, HybridSplit, alone_s
from libra.sim.relaxation import Relaxation
from libra.sim.rollout import Progress
from libra.sim.systems import FixedSplit
from libra.sim.training import join_seconds, with_hybrids
from libra.sim.workloads import SimTrajectory, SimTurn, workload_spec
from tests.libra.sim.test_relaxation import COST, run

PARTIAL = RolloutMode("partial")


def test_group_lanes_keep_the_named_groups_on_bucket_0_from_start_to_end() -> None:
    router = GroupLanes({"a0": "a", "a1": "a", "b0": "b"}, frozenset({"a"}))
    assert [router.start(t, "p", 10).bucket for t in ("a0", "a1", "b0")] == [0, 0, 1]
    back = ToolReturn("search", 40, "ok")
    assert [router.on_return(t, back, 200).bucket for t in ("a0", "a1", "b0")] == [0, 0, 1]
    router.finish("a0", 300)
    assert "a0" not in router.current


def test_alone_s_sums_each_turn_at_a_batch_of_one_with_its_tools_and_prefills() -> None:
    turns = (SimTurn(100, "search", 50, "ok", 2.0), SimTurn(30, "none", 0, "none", 0.0))
    t = SimTrajectory("t0", "p", 400, turns)
    step = COST.decode_step_s
    whole = (100 * step(4, 1, 450) + 2.0 + COST.prefill_s(4, 50, 500) + 30 * step(4, 1, 565))
    assert alone_s(COST, 4, t) == pytest.approx(whole, rel=1e-12)
    # suspended 60 tokens into its first turn: 40 left there, then the same tool and last turn
    rest = 40 * step(4, 1, 480) + 2.0 + COST.prefill_s(4, 50, 500) + 30 * step(4, 1, 565)
    assert alone_s(COST, 4, t, Progress(0, 60)) == pytest.approx(rest, rel=1e-12)
    # in the tool call with 0.5 s left: only that wait and the last turn remain
    assert alone_s(COST, 4, t, Progress(1, 0, 0.5)) == pytest.approx(0.5 + 30 * step(4, 1, 565), rel=1e-12)


def test_the_clairvoyant_close_sets_the_closing_groups_apart_and_stays_under_the_relaxation(monkeypatch) -> None:
    spec = workload_spec("search-r1", prompts_per_step=8)
    made: list[GroupLanes] = []  # each step's router (where the simulator is compiled, its methods cannot be wrapped)

    def lanes_of(groups, first):
        made.append(GroupLanes(groups, first))
        return made[-1]

    monkeypatch.setattr(probes, "GroupLanes", lanes_of)
    lanes = run(ClairvoyantClose, spec, PARTIAL, train_gpus=32, lane=(1, 8), rest=(2, 4), margin=1.25)
    assert len(made) == len(lanes.steps)
    # 8 prompts a step, 1.5x in flight: 12 groups of 16 samples, of which ceil(8 x 1.25) = 10 set apart at a fresh step
    first = made[0]
    assert len(first.groups) == 12 * 16 and len(set(first.groups.values())) == 12 and len(first.first) == 10
    assert sum(group in first.first for group in first.groups.values()) == 10 * 16
    for router in made:  # the groups that close the batch on bucket 0, every other one on bucket 1
        assert router.first and router.first < set(router.groups.values())
    assert {s.instances for s in lanes.steps} == {((4, 2), (8, 1))} and {s.train_gpus for s in lanes.steps} == {32}
    assert lanes.tokens_per_s < run(Relaxation, spec, PARTIAL).tokens_per_s
    fixed = run(FixedSplit, spec, PARTIAL, train_gpus=32)
    assert lanes.tokens_per_s != fixed.tokens_per_s  # the lanes change the rollout (this run: by a few %)


def test_a_clairvoyant_close_refuses_what_it_cannot_probe() -> None:
    make = ClairvoyantClose
    args = (COST, PlannerSettings(), TriggerSettings())
    with pytest.raises(ValueError, match="needs partial rollouts"):
        make(*args, RolloutMode("sync"), train_gpus=32, lane=(1, 8), rest=(2, 4))
    with pytest.raises(ValueError, match=r"lanes of 1 x TP8 and 3 x TP4 need 20 GPUs; training leaves 16"):
        make(*args, PARTIAL, train_gpus=32, lane=(1, 8), rest=(3, 4))
    with pytest.raises(ValueError, match=r"margin >= 1\), got 0.5"):
        make(*args, PARTIAL, train_gpus=32, lane=(1, 8), rest=(2, 4), margin=0.5)


def test_a_free_join_is_a_join_at_release_and_hybrids_split_as_told() -> None:
    config = TrainConfig(tp=1, pp=4, dp=8, ep=1, micro_batch=1)
    # one replica (4 GPUs) released at 2 s joins at 2 s: 2 s at 8 replicas, the rest at 9
    assert with_hybrids(COST, 20.0, config, [(4, 2.0)], join_s=0.0) == (2.0 + 18.0 * 8 / 9, [(2.0, "join_training", 4)])
    late = 2.0 + join_seconds(COST, config)
    assert with_hybrids(COST, 20.0, config, [(4, 2.0)])[0] == pytest.approx(late + (20.0 - late) * 8 / 9, rel=1e-12)
    spec = workload_spec("search-r1", prompts_per_step=8)
    # training on 8 GPUs outlasts the rollout: the hybrids released in its tail join it, free at once
    # and paid a join's seconds later
    free = run(HybridSplit, spec, PARTIAL, steps=4, train_gpus=8, hybrid_gpus=8, leave_fraction=0.5, join_s=0.0)
    paid = run(HybridSplit, spec, PARTIAL, steps=4, train_gpus=8, hybrid_gpus=8, leave_fraction=0.5)
    assert {(s.train_gpus, s.rollout_gpus, s.hybrid_gpus) for s in free.steps} == {(8, 32, 8)}
    assert [s.rollout_s for s in free.steps] == [s.rollout_s for s in paid.steps]
    join_s = join_seconds(COST, paid.steps[1].train_config)
    for f, p in zip(free.steps[1:], paid.steps[1:], strict=True):
        (left, _, gpus), = [e for e in f.hybrid_events if e[1] == "leave_rollout"]
        assert [e for e in f.hybrid_events if e[1] == "join_training"] == [(left, "join_training", 8)]
        assert [e for e in p.hybrid_events if e[1] == "join_training"] == [(left + join_s, "join_training", 8)]
        assert f.train_s < p.train_s
    # a core of 12 GPUs holds one instance of the tuned size, TP8 (a fixed split's uniform layout)
    core12 = run(HybridSplit, spec, PARTIAL, steps=2, train_gpus=28, hybrid_gpus=8, leave_fraction=0.5)
    assert {(s.rollout_gpus, s.hybrid_gpus) for s in core12.steps} == {(8, 8)}
    args = (COST, PlannerSettings(), TriggerSettings(), PARTIAL)
    with pytest.raises(ValueError, match="hybrids take 1 to 19 of the 20 GPUs training leaves, got 20"):
        HybridSplit(*args, train_gpus=28, hybrid_gpus=20, leave_fraction=0.5)
    with pytest.raises(ValueError, match="between 0 and 1, got 1.0"):
        HybridSplit(*args, train_gpus=28, hybrid_gpus=8, leave_fraction=1.0)


def test_the_probes_are_not_systems_a_user_can_pick() -> None:
    assert not {"clairvoyant-close", "hybrid-split", "fixed-split"} & set(systems.SYSTEMS)
