"""Partial rollouts and the asynchronous mode in the simulator: the batch closes at its last needed
group, the rest are suspended where they stand and continued later with their context prefilled
again, every token is generated once, stale groups are dropped and counted, and no run beats the
bound of what it trained."""

import pytest

from libra.errors import LibraError
from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.scheduler.routers import Buckets, LeastLoad
from libra.sim.bound import pooled_bound_s, run_bound
from libra.sim.modes import Feed, RolloutMode, rollout_version, token_gaps
from libra.sim.rollout import Close, InstanceSpec, Progress, RolloutSim
from libra.sim.runner import simulate
from libra.sim.systems import SYSTEMS
from libra.sim.workloads import SimTrajectory, SimTurn, WorkloadGenerator, workload_spec
from tasks.sim_tasks import run_bounds

COST = CostModel(parse_cluster("6x8:a800"), MODELS["qwen3-14b"])
FINAL = ("none", 0, "none", 0.0)


def one_turn(tid: str, prompt: str, gen: int) -> SimTrajectory:
    return SimTrajectory(tid, prompt, 100, (SimTurn(gen, *FINAL),))


def test_the_batch_closes_at_its_last_needed_group_and_suspends_the_rest_where_they_stand() -> None:
    short = [one_turn("a/0", "a", 50), one_turn("a/1", "a", 60)]
    long = [one_turn("b/0", "b", 400), one_turn("b/1", "b", 1000)]
    groups = {t.trajectory_id: t.prompt_id for t in short + long}
    result = RolloutSim(COST, [InstanceSpec(1, 0)], LeastLoad(Buckets(()))).run(short + long, close=Close(groups, 1))
    # four sequences decode together from the start; group a is complete after 60 steps
    prefill = 4 * COST.prefill_s(1, 100, 100)
    steps = 50 * COST.decode_step_s(1, 4, 100) + 10 * COST.decode_step_s(1, 3, 100)
    assert result.makespan_s == pytest.approx(prefill + steps)
    assert result.completed_groups == ["a"] and result.group_crowd == [2]  # b's two turns still decoding
    assert result.suspended == {"b/0": Progress(0, 60), "b/1": Progress(0, 60)}
    assert result.generated == {"a/0": 50, "a/1": 60, "b/0": 60, "b/1": 60}
    assert result.gen_tokens == 230


def test_a_suspended_trajectory_resumes_with_its_context_prefilled_and_every_token_generated_once() -> None:
    t = SimTrajectory("b/0", "b", 100, (SimTurn(300, "search", 40, "ok", 2.0), SimTurn(200, *FINAL)))
    resumed = RolloutSim(COST, [InstanceSpec(2, 0)], LeastLoad(Buckets(()))).run([t], resume={"b/0": Progress(0, 120)})
    context = 100 + 120
    assert resumed.resumed == 1 and resumed.resumed_prefill_tokens == context
    assert resumed.generated == {"b/0": 180 + 200}  # the rest of turn 0, then turn 1
    expected = (COST.prefill_s(2, context, context) + 180 * COST.decode_step_s(2, 1, context) + 2.0
                + COST.prefill_s(2, 40, 440) + 200 * COST.decode_step_s(2, 1, 440))
    assert resumed.makespan_s == pytest.approx(expected)
    # suspended in its tool call: the call's time left, then the whole context prefilled again
    in_tool = RolloutSim(COST, [InstanceSpec(2, 0)], LeastLoad(Buckets(()))).run(
        [t], resume={"b/0": Progress(1, 0, tool_left_s=0.5)})
    assert in_tool.resumed_prefill_tokens == 440 and in_tool.generated == {"b/0": 200}
    assert in_tool.makespan_s == pytest.approx(0.5 + COST.prefill_s(2, 440, 440) + 200 * COST.decode_step_s(2, 1, 440))


def test_the_async_close_waits_for_the_update_beside_it() -> None:
    batch = [one_turn("a/0", "a", 50), one_turn("b/0", "b", 5000)]
    groups = {t.trajectory_id: t.prompt_id for t in batch}
    early = RolloutSim(COST, [InstanceSpec(1, 0)], LeastLoad(Buckets(()))).run(batch, close=Close(groups, 1))
    held = RolloutSim(COST, [InstanceSpec(1, 0)], LeastLoad(Buckets(()))).run(batch, close=Close(groups, 1, hold_s=30.0))
    assert early.makespan_s < 30.0 and held.makespan_s == pytest.approx(30.0)
    assert held.generated["b/0"] > early.generated["b/0"]  # it went on generating while the update ran


def test_a_partial_run_generates_every_trained_token_once_and_drops_stale_groups_whole() -> None:
    spec = workload_spec("search-r1", group_size=4, prompts_per_step=6)
    generator = WorkloadGenerator(spec, 3)
    batches = [generator.step(k) for k in range(12)]
    runs = simulate(spec, COST, 8, ["static-uniform"], seed=3, mode=RolloutMode("partial", 1.5, 1))
    run = runs["static-uniform"]
    trained = [t for batch in run.trained for t in batch]
    assert len({t.trajectory_id for t in trained}) == len(trained)  # no trajectory trained twice
    assert all(len(batch) % 4 == 0 for batch in run.trained)  # whole groups only
    generated = sum(s.gen_tokens for s in run.steps)
    assert generated == sum(t.gen_tokens for t in trained) + run.untrained_tokens  # each token generated once
    dropped = sum(s.stale_dropped for s in run.steps)
    assert dropped > 0  # with a bound of 1 update, some groups wait too long
    assert all(s.version_gap_max <= 1 + 1 for s in run.steps)  # one-step-off's 1 plus at most the bound
    assert {t.trajectory_id for t in trained} <= {t.trajectory_id for b in batches for t in b}


def test_token_gaps_count_each_token_by_its_version() -> None:
    feed = Feed([[one_turn("a/0", "a", 10)]], RolloutMode("partial"))
    group = feed.fresh[0]
    group.versions = {3: 30, 5: 10}
    assert token_gaps([group], 5) == (0.75, 1.5, 2)
    assert rollout_version(True, 4) == 4 and rollout_version(False, 4) == 3 and rollout_version(False, 0) == 0


@pytest.mark.parametrize("mode", ["partial", "async"])
def test_no_run_beats_the_bound_of_what_it_trained(mode: str) -> None:
    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    cost = CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"])
    runs = simulate(spec, cost, 4, list(SYSTEMS), seed=1, mode=RolloutMode(mode))
    generator = WorkloadGenerator(spec, 1)
    batches = [generator.step(k) for k in range(4)]
    bounds = run_bounds(cost, batches, runs)
    for name, run in runs.items():
        assert run.total_time_s >= bounds[name], name
        assert bounds[name] == pooled_bound_s(cost, run.trained, 4)
    # the pooled bound of the synchronous batches is below the synchronous bound (it drops the straggler)
    assert pooled_bound_s(cost, batches, 4) < run_bound(cost, batches).total_s


def test_partial_rollouts_cut_the_straggler_out_of_the_step() -> None:
    spec = workload_spec("dapo-math", group_size=4, prompts_per_step=8)
    sync = simulate(spec, COST, 6, ["static-uniform"], seed=2)["static-uniform"]
    partial = simulate(spec, COST, 6, ["static-uniform"], seed=2, mode=RolloutMode("partial"))["static-uniform"]
    assert max(s.rollout_s for s in partial.steps[1:]) < max(s.rollout_s for s in sync.steps[1:])
    assert partial.tokens_per_s > sync.tokens_per_s
    assert sync.offpolicy_share == pytest.approx(sum(sum(t.gen_tokens for t in b) for b in sync.trained[1:])
                                                 / sum(sum(t.gen_tokens for t in b) for b in sync.trained))


@pytest.mark.parametrize(("mode", "message"), [(RolloutMode("sync", 1.5, 0), None),
                                               (dict(name="partial", max_staleness=0), "max_staleness 0"),
                                               (dict(name="async", overprovision=0.5), "overprovision 0.5"),
                                               (dict(name="later"), "rollout_mode 'later'")])
def test_bad_modes_are_refused_with_what_to_do(mode, message) -> None:
    if message is None:
        assert mode.max_staleness == 0  # synchronous training needs no staleness bound
        return
    with pytest.raises(LibraError, match=message):
        RolloutMode(**mode)


def test_a_dropped_trajectory_teaches_the_router_no_length() -> None:
    from libra.scheduler.libra_router import LibraRouter

    router = LibraRouter(Buckets((1000,)), measure="total")
    router.start("p/0", "p", 100)
    router.start("p/1", "p", 100)
    router.drop("p/0")
    assert router.active == [1, 0] and router.current == {"p/1": 0}
    assert router.lengths.same_step == {} and set(router.lengths.running) == {"p/1"}
    router.finish("p/1", 700)  # a sample that ended is evidence: log(600) tokens after the prompt
    assert router.lengths.same_step == {"p": [pytest.approx(6.3969297)]}


def test_a_stream_of_uneven_batches_trains_its_mean_batch_and_never_runs_dry() -> None:
    """A trace replay's batches alternate in size: a batch is their mean number of groups, so the run
    starts as many groups as it trains."""
    big = [one_turn(f"{p}/{i}", f"p{p}", 20) for p in range(4) for i in range(2)]
    small = [one_turn(f"{p}/{i}b", f"q{p}", 20) for p in range(2) for i in range(2)]
    feed = Feed([big, small] * 3, RolloutMode("partial", 1.0))
    assert feed.needed == 3
    launched = feed.launch(0, colocated=False)
    assert len({launched.close.groups[t.trajectory_id] for t in launched.trajectories}) == 3


def test_a_partial_probe_prices_training_for_a_step_s_batch_not_all_the_step_finished() -> None:
    """The first step of a partial run finishes 1.5x its batch (every group it started, short samples
    of the carried ones too); a plan probed on it trains a batch's worth, shaped as those trajectories."""
    from libra.planner.planner import PlannerSettings
    from libra.planner.trigger import TriggerSettings
    from libra.sim.systems import make_system, plan_layout
    from libra.sim.training import train_seconds

    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    generator = WorkloadGenerator(spec, 2)
    system = make_system("+planner", COST, PlannerSettings(), TriggerSettings(), RolloutMode("partial"), 4)
    batch = generator.step(0)
    finished = batch + generator.step(1)[:16]  # 1.5x the batch
    system.configure(0, finished, batch, None)
    plan = system.controller.current
    makespan, released = system.replays[(-1, *plan_layout(plan))]
    trained, config = train_seconds(COST, plan.train.config, plan.train_gpus, finished, system.planner_settings, len(batch))
    all_of_it, _ = train_seconds(COST, plan.train.config, plan.train_gpus, finished, system.planner_settings)
    assert not released and trained < all_of_it
    expected = max(makespan, trained) + COST.weight_sync_s()
    assert system.probe(plan) == expected


def test_a_partial_probe_is_calibrated_by_the_rollouts_measured_under_the_plan_in_force() -> None:
    """A replay has only the trajectories a step finished (not the suspended stragglers that kept
    their groups open), so under partial rollouts its times are scaled by the recent steps' measured
    rollout over their replay on the instances they ran on; without partial rollouts nothing is, and
    an asynchronous rollout held by a longer update says nothing of its close."""
    from libra.planner.planner import PlannerSettings
    from libra.planner.trigger import StepTimes, TriggerSettings
    from libra.sim.systems import make_system
    from libra.sim.training import train_seconds

    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    generator = WorkloadGenerator(spec, 2)
    for mode, measured in (("partial", lambda k: (40.0 + k, 10.0)), ("sync", lambda k: (40.0 + k, 10.0)),
                           ("async", lambda k: (60.0, 60.0))):
        system = make_system("+planner", COST, PlannerSettings(), TriggerSettings(), RolloutMode(mode), 4)
        previous, times = generator.step(-1), None
        for k in range(3):
            batch = generator.step(k)
            config = system.configure(k, previous, batch, times)
            times = StepTimes(k, *measured(k))  # as if measured: longer than any replay here
            previous = batch[: len(batch) * 3 // 4]
        system.configure(3, previous, generator.step(3), times)
        assert sorted(system.ran) == [1, 2] and system.ran[2][:3] == (*measured(2), config.layout)
        replayed = sum(system._replay(s, b, *system.ran[s][2:])[0] for s, b in system.recent)
        factor = system._calibration()
        assert factor == ((41.0 + 42.0) / replayed if mode == "partial" else 1.0)
        plan = system.controller.current
        trains = [train_seconds(COST, plan.train.config, plan.train_gpus, b, system.planner_settings,
                                len(batch) if mode != "sync" else None)[0] for _, b in system.recent]
        steps = [max(system.replays[(s, *system.ran[s][2:4])][0] * factor, train) + COST.weight_sync_s()
                 for (s, _), train in zip(system.recent, trains, strict=True)]
        assert system.probe(plan) == pytest.approx(sum(steps) / len(steps), rel=1e-12)
        assert factor > 1 if mode == "partial" else factor == 1.0


def test_under_partial_rollouts_a_system_plans_from_whole_groups() -> None:
    """What a step finished lacks the suspended samples that kept their groups open: a system is
    given the groups the step completed for training, every sample of each."""
    from collections import Counter

    from libra.planner.planner import PlannerSettings
    from libra.planner.trigger import TriggerSettings
    from libra.sim.runner import run_system, spare_batches, workload_batches
    from libra.sim.systems import StaticUniform

    seen = []

    class Spy(StaticUniform):
        def configure(self, step, previous, upcoming, times):
            seen.append(list(previous))
            return super().configure(step, previous, upcoming, times)

    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    mode = RolloutMode("partial")
    batches, warmup = workload_batches(spec, 5, 3)
    run = run_system(Spy(COST, PlannerSettings(), TriggerSettings(), mode, 4), COST, batches, warmup, PlannerSettings(),
                     mode=mode, spare=spare_batches(spec, 5, 3))
    assert seen[0] == warmup and sum(s.suspended for s in run.steps) > 0
    for k, previous in enumerate(seen[1:]):
        assert set(Counter(t.prompt_id for t in previous).values()) == {4} and len(previous) == 32
        assert previous == run.trained[k]
