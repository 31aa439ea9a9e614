import math
import random

import pytest

from libra.planner.controller import PlanController
from libra.planner.planner import Planner, fixed_layout_time, recost
from libra.planner.trigger import (
    StepTimes,
    TriggerSettings,
    decide,
    drift_of,
    replan_reason,
    streak,
    switch_cost_s,
)
from tests.libra.planner.builders import a800_14b, trace_workload


def test_replan_reasons() -> None:
    s = TriggerSettings(period_steps=10, warmup_steps=2, pressure_ratio=1.25, pressure_steps=1)
    assert replan_reason(1, None, None, s) is None
    assert replan_reason(2, None, None, s) == "initial"
    assert replan_reason(11, 2, None, s) is None
    assert replan_reason(12, 2, None, s) == "periodic"
    # a plan forced during warm-up is provisional: made again when the warm-up is over, once
    assert replan_reason(1, 0, None, s) is None and replan_reason(2, 0, None, s) == "warm-up over"
    assert replan_reason(3, 2, None, s) is None
    assert replan_reason(5, 2, StepTimes(5, 100.0, 90.0), s) is None
    assert replan_reason(5, 2, StepTimes(5, 130.0, 100.0), s) == "pressure: rollout 1.30x slower than planned"
    assert replan_reason(5, 2, StepTimes(5, 100.0, 125.0), s) == "pressure: train 1.25x slower than planned"
    # a plan that is unbalanced on purpose (rollout planned 1.5x train) is not under pressure at 1.5x
    assert replan_reason(5, 2, StepTimes(5, 150.0, 100.0), s, expected_ratio=1.5) is None
    assert replan_reason(5, 2, StepTimes(5, 200.0, 100.0), s, expected_ratio=1.5) == "pressure: rollout 1.33x slower than planned"
    # by default a drift must last two steps: one straggler-bound step is not a drift
    two = TriggerSettings(period_steps=10, warmup_steps=2, pressure_ratio=1.25, pressure_steps=2)
    assert replan_reason(5, 2, StepTimes(5, 130.0, 100.0), two, persisted=1) is None
    assert replan_reason(5, 2, StepTimes(5, 130.0, 100.0), two, persisted=2) == "pressure: rollout 1.30x slower than planned"
    assert TriggerSettings().pressure_steps == 2


def test_a_streak_counts_steps_in_a_row_the_same_stage_slower() -> None:
    s = TriggerSettings(pressure_ratio=1.25)
    counts, previous = [], 0
    for drift in [1.0, 1.3, 1.5, 1.1, 1.3, 1 / 1.3, 1 / 1.4, None, 2.0]:
        previous = streak(previous, drift, s)
        counts.append(previous)
    assert counts == [0, 1, 2, 0, 1, -1, -2, 0, 1]


def test_decide_weighs_gain_against_switch_cost() -> None:
    cost = a800_14b()
    small = Planner(cost, trace_workload("swe_gemini3_mini_A", scale=0.25)).plan()
    large = Planner(cost, trace_workload("swe_gemini3_mini_A", scale=0.5)).plan()
    s = TriggerSettings()
    switch = switch_cost_s(cost, small, large, s)
    assert switch == pytest.approx(15 + 20 + 16 * cost.model.total_params / (large.train_gpus * 2e9))
    assert switch_cost_s(cost, small, small, s) == 0.0
    same = decide(small.t_iter_s, small, small, cost, s)
    assert (same.apply, same.reason) == (False, "same plan")
    tiny_gain = decide(large.t_iter_s + 1.0, large, small, cost, s)
    assert not tiny_gain.apply and "<= switch cost" in tiny_gain.reason
    below_threshold = decide(large.t_iter_s * 1.04, large, small, cost, s)
    assert not below_threshold.apply and "relative gain 3.8% < 5%" in below_threshold.reason
    worth_it = decide(large.t_iter_s * 1.2, large, small, cost, s)
    assert worth_it.apply and worth_it.gain_per_step_s == pytest.approx(large.t_iter_s * 0.2)
    assert decide(float("inf"), large, small, cost, s).apply


def test_a_move_pays_off_only_over_the_steps_the_run_has_left() -> None:
    cost = a800_14b()
    small = Planner(cost, trace_workload("swe_gemini3_mini_A", scale=0.25)).plan()
    large = Planner(cost, trace_workload("swe_gemini3_mini_A", scale=0.5)).plan()
    s = TriggerSettings(period_steps=10, min_relative_gain=0.0)  # the payback rule alone
    switch = switch_cost_s(cost, small, large, s)
    current = large.t_iter_s + switch / 4  # the gain repays the move in 4 steps
    assert decide(current, large, small, cost, s).horizon_steps == 10
    assert decide(current, large, small, cost, s, steps_left=25).horizon_steps == 10  # the next plan comes first
    assert decide(current, large, small, cost, s, steps_left=5).apply
    late = decide(current, large, small, cost, s, steps_left=3)
    assert (late.apply, late.horizon_steps) == (False, 3) and "x 3 steps <= switch cost" in late.reason
    assert decide(current, large, small, cost, s, steps_left=0).horizon_steps == 0


def _drive(controller: PlanController, workloads, hold=None) -> None:
    for step, workload in enumerate(workloads):
        current = controller.current
        times = None
        if current is not None and current.train is not None:  # "measured" = the plan in force, re-costed
            counts = {g.tp: g.count for g in current.rollout.groups}
            times = StepTimes(step, fixed_layout_time(controller.cost, workload, counts),
                              controller.cost.train_time(current.train.config, workload).seconds)
        controller.observe(step, workload, times, hold=hold)


def test_stationary_noisy_workload_never_moves() -> None:
    base = trace_workload("swe_gemini3_mini_A", scale=0.25)
    rng = random.Random(0)
    controller = PlanController(a800_14b())
    _drive(controller, [base.scaled(1 + rng.uniform(-0.1, 0.1)) for _ in range(100)])
    applied = [e for e in controller.events if e.applied]
    assert [e.reason for e in applied] == ["initial"]
    assert len(controller.events) >= 10  # it did re-plan, and declined every time


def test_doubling_lengths_move_gpus_toward_rollout() -> None:
    base = trace_workload("taubench_airline", scale=4)  # 13K to 26K tokens at the tail
    controller = PlanController(a800_14b())
    _drive(controller, [base.scaled(1 + step / 100) for step in range(100)])
    applied = [e.candidate for e in controller.events if e.applied]
    rollout_share = [p.rollout_gpus + p.hybrid_rollout_share * p.hybrid_gpus for p in applied]
    assert len(applied) >= 2
    assert rollout_share == sorted(rollout_share)  # every move goes toward rollout
    assert rollout_share[-1] > rollout_share[0]


def test_probe_replaces_the_cost_model_and_learns_per_variant() -> None:
    """Two variants (uniform TP2, uniform TP4 instances); the probe says TP4 plans run 3x slower
    than costed and TP2 plans as costed: the probed TP2 plan wins, and TP4's correction learns 3x."""

    from libra.planner.planner import PlannerSettings

    cost = a800_14b()
    variants = [PlannerSettings(max_hybrid_fraction=0.0, rollout_tps=(tp,)) for tp in (4, 2)]
    probed = []

    def probe(plan):
        probed.append(plan)
        tps = set(plan.rollout.instance_counts)
        return plan.t_iter_s * (3.0 if tps == {4} else 1.0)

    controller = PlanController(cost, variants[0], TriggerSettings(warmup_steps=0), variants=variants, probe=probe)
    event = controller.observe(0, trace_workload("swe_gemini3_mini_A", scale=0.25))
    assert len(probed) == 2  # both variants' best plans (probe_candidates = 2)
    assert set(event.candidate.rollout.instance_counts) == {2}
    assert event.candidate.t_iter_s == probed[[set(p.rollout.instance_counts) for p in probed].index({2})].t_iter_s
    assert controller.probe_correction == [pytest.approx(2.0), pytest.approx(1.0)]  # 0.5 x 1 + 0.5 x 3


def test_a_held_move_is_recorded_unapplied_and_keeps_the_plan_in_force() -> None:
    base = trace_workload("taubench_airline", scale=4)
    free, held = PlanController(a800_14b()), PlanController(a800_14b())
    workloads = [base.scaled(1 + step / 100) for step in range(100)]
    _drive(free, workloads)
    first_move = next(e for e in free.events[1:] if e.applied)
    asked = []

    def hold(plan):
        asked.append(plan)
        return "calibrating: not yet"

    _drive(held, workloads[: first_move.step + 1], hold)  # the same decisions until the first move
    event = held.events[-1]
    assert (event.step, event.applied, event.held) == (first_move.step, False, "calibrating: not yet")
    assert event.decision is not None and event.decision.apply  # the move paid; the hold kept it back
    assert asked == [event.candidate] and held.current is held.events[0].candidate  # the plan in force stays


def _planned(controller: PlanController, workload) -> None:
    controller.observe(2, workload, None, force=True)
    assert controller.current is not None


def test_pressure_compares_with_the_prediction_as_the_measured_rollouts_corrected_it() -> None:
    """Rollouts measured 1.5x the plan's raw prediction: the correction has learnt it, so steps that
    keep running at 1.5x are as expected, not pressure (the raw prediction fired on every one)."""
    workload = trace_workload("swe_gemini3_mini_A", scale=0.25)
    controller = PlanController(a800_14b(), trigger=TriggerSettings(period_steps=100, warmup_steps=2))
    _planned(controller, workload)
    plan = controller.current
    controller.rollout_correction[controller.current_variant] = 1.5
    times = StepTimes(3, 1.5 * plan.t_rollout_s, plan.t_train_s)
    assert controller.due(3, times) is None
    assert controller.due(4, times) is None
    assert controller.due(5, StepTimes(5, 1.5 * 1.3 * plan.t_rollout_s, plan.t_train_s)) is None  # one step
    assert controller.due(6, StepTimes(6, 1.5 * 1.3 * plan.t_rollout_s, plan.t_train_s)) == (
        "pressure: rollout 1.30x slower than planned")


def test_pressure_fires_once_per_drift_episode() -> None:
    """A drift of 1.4x fires at its second step in a row and once only while it persists; one that
    grows another 1.25x (to 1.75x) fires again; back in balance, then 1.4x again: a new episode,
    which fires at its second step."""
    workload = trace_workload("swe_gemini3_mini_A", scale=0.25)
    controller = PlanController(a800_14b(), trigger=TriggerSettings(period_steps=100, warmup_steps=2))
    _planned(controller, workload)
    plan = controller.current
    drifts = [1.4, 1.4, 1.4, 1.5, 1.75, 1.75, 1.0, 1.4, 1.4]
    reasons = [controller.due(3 + i, StepTimes(3 + i, d * plan.t_rollout_s, plan.t_train_s)) for i, d in enumerate(drifts)]
    assert reasons == [None, "pressure: rollout 1.40x slower than planned", None, None,
                       "pressure: rollout 1.75x slower than planned", None, None,
                       None, "pressure: rollout 1.40x slower than planned"]
    again = StepTimes(11, 1.4 * plan.t_rollout_s, plan.t_train_s)
    assert controller.due(11, again) == reasons[-1]  # asked twice: one answer, and the step counted once
    assert controller.due(12, StepTimes(12, 1.4 * plan.t_rollout_s, plan.t_train_s)) is None
    assert controller.streak == (12, 3)


def test_a_lone_straggler_step_or_a_swing_is_no_pressure() -> None:
    """One step 2.85x slower in rollout (a straggler-bound batch), and a swing from the rollout
    slower to training slower, fire nothing: neither stage has stayed the slower one."""
    workload = trace_workload("swe_gemini3_mini_A", scale=0.25)
    controller = PlanController(a800_14b(), trigger=TriggerSettings(period_steps=100, warmup_steps=2))
    _planned(controller, workload)
    plan = controller.current
    drifts = [1.0, 2.85, 1.0, 2.0, 1 / 2.0, 2.0, 1 / 2.0]
    reasons = [controller.due(3 + i, StepTimes(3 + i, d * plan.t_rollout_s, plan.t_train_s)) for i, d in enumerate(drifts)]
    assert reasons == [None] * len(drifts)


def test_a_drift_planned_for_and_kept_does_not_fire_again() -> None:
    """The lengths double and the stage times follow: pressure re-plans; no move pays (moving costs
    an hour here), so the plan stays, costed on the doubled workload. Steps that keep running as
    that costing predicts are then no pressure, though they are as far from the plan's first
    prediction as the step that fired."""
    small = trace_workload("swe_gemini3_mini_A", scale=0.25)
    large = trace_workload("swe_gemini3_mini_A", scale=0.5)
    controller = PlanController(a800_14b(), trigger=TriggerSettings(period_steps=10, warmup_steps=2, switch_base_s=3600.0))
    _planned(controller, small)
    plan = controller.current
    now = recost(Planner(controller.cost, large, controller.planner_settings), plan)
    drift = (now.t_rollout_s / now.t_train_s) / (plan.t_rollout_s / plan.t_train_s)
    assert max(drift, 1 / drift) >= 1.25  # a drift the rule sees
    times = [StepTimes(k, now.t_rollout_s, now.t_train_s) for k in range(3, 9)]
    assert controller.due(3, times[0]) is None
    event = controller.observe(4, large, times[1])
    assert event is not None and event.reason.startswith("pressure") and not event.applied
    assert controller.current is plan and controller.baseline == now
    assert [controller.due(t.step, t) for t in times[2:]] == [None] * 4
    assert controller.streak == (8, 0)


def test_a_placement_adopted_between_two_questions_is_asked_anew() -> None:
    """The planning flow asks before a run has a plan (forced: "initial"), then adopts the run's own
    placement and asks again for the same step: during warm-up that is no reason to plan."""
    workload = trace_workload("swe_gemini3_mini_A", scale=0.25)
    controller = PlanController(a800_14b(), trigger=TriggerSettings(period_steps=100, warmup_steps=2))
    times = StepTimes(0, 10.0, 10.0)
    assert controller.due(1, times, force=True) == "initial"
    controller.adopt(Planner(controller.cost, workload, controller.planner_settings).plan_at(16), 0)
    assert controller.due(1, times, force=True) is None
    assert controller.observe(1, workload, times, force=True) is None
    assert controller.due(2, times, force=True) == "initial"  # warm-up over: the first plan


def test_a_controller_checkpointed_before_drift_episodes_loads() -> None:
    import pickle

    controller = PlanController(a800_14b())
    state = pickle.dumps(controller)
    old = pickle.loads(state)
    del old.__dict__["fired_drift"], old.__dict__["_asked"], old.__dict__["streak"]
    restored = pickle.loads(pickle.dumps(old))
    assert restored.fired_drift is None and restored.streak == (None, 0) and restored.due(0) is None


def test_a_plan_that_predicts_no_ratio_measures_no_drift() -> None:
    """A plan whose rollout cannot run (its time infinite: a memory setting no instance fits) had given a
    drift of 0, and the trigger divided by it: every planning step of the run failed, resumed or not."""
    times = StepTimes(3, 10.0, 5.0)
    assert drift_of(times, math.inf) is None and drift_of(times, 0.0) is None and drift_of(times, math.nan) is None
    assert drift_of(times, 2.0) == 1.0
    assert drift_of(StepTimes(3, math.inf, 5.0), 2.0) is None


def test_when_no_variant_can_plan_the_error_says_why() -> None:
    """The planner's reason (here its granularity) had been dropped for a bare "no feasible plan"."""
    from libra.errors import LibraError
    from libra.planner.planner import PlannerSettings

    controller = PlanController(a800_14b(), PlannerSettings(granularity=48), TriggerSettings(warmup_steps=0))
    with pytest.raises(LibraError, match=r"^no planner variant found a feasible plan for this workload: no train/rollout "
                                         r"split of 48 GPUs at a granularity of 48 GPUs; use mode colocated, more GPUs "
                                         r"or a finer granularity$"):
        controller.observe(0, trace_workload("swe_gemini3_mini_A", scale=0.25))


def test_the_search_reports_each_pool_it_searched_and_plans_the_same() -> None:
    """`libra plan` on a large cluster searched for minutes without a word; its bar hears this."""
    from libra.planner.planner import PlannerSettings

    workload = trace_workload("swe_gemini3_mini_A", scale=0.25)
    settings = PlannerSettings(max_hybrid_fraction=0.25, hybrid_shares=4)
    heard = []
    planner = Planner(a800_14b(), workload, settings)
    pools = 1 + len(planner.hybrid_sizes()[1:]) * 3  # no hybrid, then each hybrid size at shares 1/4, 2/4, 3/4
    assert pools == 1 + 12 * 3  # 48 GPUs, a quarter of them hybrids at most, one GPU a step
    plan = planner.plan(progress=lambda done, total: heard.append((done, total)))
    assert heard == [(i, pools) for i in range(1, pools + 1)]
    assert plan == Planner(a800_14b(), workload, settings).plan()
