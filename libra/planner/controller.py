"""The planning loop's state: the plan in force, when it was made, and what each step decides.

`PlanController.observe` is called once per RL step with the recent workload and the measured stage
times. It asks the trigger whether to re-plan; if so it plans for the current workload, re-costs the
plan in force on the same workload, and applies the candidate only when the trigger's rule says the
move pays. The simulator and the real planning flow drive the same object.

An optional probe measures a plan's iteration time on recent trajectories (e.g. by replaying the
last steps through the rollout simulator, which sees routing, stragglers and the step-to-step spread
that the analytic cost model does not); the best-costed candidates and the plan in force are then
compared on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from libra.clock import Clock
from libra.errors import LibraError
from libra.planner.cost_model import CostModel
from libra.planner.planner import Plan, Planner, PlannerSettings, evaluate, recost
from libra.planner.rollout_search import GroupTimes
from libra.planner.training_search import TrainingTable
from libra.planner.trigger import (
    Decision,
    StepTimes,
    TriggerSettings,
    decide,
    drift_of,
    in_episode,
    replan_reason,
    streak,
)
from libra.planner.workload import Workload


@dataclass(frozen=True)
class PlanEvent:
    step: int
    reason: str  # why the planner ran: initial, periodic, pressure: ...
    candidate: Plan
    current_t_iter_s: float  # the plan in force, re-costed on this step's workload (inf if none)
    decision: Decision | None  # None for the initial plan
    applied: bool
    held: str = ""  # why a move that pays was not made (see `observe`'s hold); empty when none


class PlanController:
    def __init__(self, cost: CostModel, planner: PlannerSettings | None = None,
                 trigger: TriggerSettings | None = None, clock: Clock | None = None,
                 variants: Sequence[PlannerSettings] = (), probe: Callable[[Plan], float] | None = None,
                 probe_candidates: int = 2, prepare_probes: Callable[[Sequence[Plan]], None] | None = None) -> None:
        """`variants`: alternative planner settings searched side by side (the best plan wins), e.g.
        one per uniform instance size. `probe`: measures a plan's iteration seconds on recent
        trajectories; the `probe_candidates` plans ranked best (the cost model's T_iter times
        their variant's probe correction) with hybrids and as many without, the cost model's own
        best plan, and the plan in force, are compared on it instead, and
        each probed variant's correction learns probed / predicted, so variants whose plans
        disappoint make way for the others. `prepare_probes`: told every plan a planning will probe,
        in the order it probes them, before the first probe (a probe that can measure several at
        once, side by side, does so there; the probes then answer as they would have alone)."""
        self.cost = cost
        self.planner_settings = planner or PlannerSettings()
        self.variants = tuple(variants) or (self.planner_settings,)
        # measured / predicted rollout time of each variant's plans (1.0 until one of them has run)
        self.rollout_correction = [1.0] * len(self.variants)
        self.current_variant: int | None = None
        self.trigger = trigger or TriggerSettings()
        self.clock = clock
        self.current: Plan | None = None
        self.last_plan_step: int | None = None
        self.events: list[PlanEvent] = []
        self.probe = probe
        self.probe_candidates = probe_candidates
        self.prepare_probes = prepare_probes
        self.probe_correction = [1.0] * len(self.variants)
        self.fired_drift: float | None = None  # the drift pressure last fired at, in the episode under way
        self.streak: tuple[int | None, int] = (None, 0)  # (last step counted, `trigger.streak` there)
        # the plan in force as last weighed: costed on the workload of the last re-plan that kept it
        # (None: as it was made); pressure measures the drift from this prediction
        self.baseline: Plan | None = None
        # `due`'s last question (step, times, force, the plan in force) and its answer
        self._asked: tuple[tuple[int, StepTimes | None, bool, Plan | None], str | None] | None = None

    def __setstate__(self, state: dict) -> None:
        """Unpickling a controller checkpointed before drift episodes were tracked."""
        state.setdefault("fired_drift", None)
        state.setdefault("streak", (None, 0))
        state.setdefault("baseline", None)
        state.setdefault("_asked", None)
        state.setdefault("prepare_probes", None)
        self.__dict__.update(state)

    def due(self, step: int, times: StepTimes | None = None, force: bool = False) -> str | None:
        """Why to plan at `step` (the trigger's reason), or None. `force`: plan now if there is no
        plan yet, even during warm-up (a run must start somewhere)."""
        expected = 1.0
        base = self.baseline or self.current
        if base is not None and base.t_train_s > 0 and not math.isinf(base.t_train_s):
            assert self.current_variant is not None  # the prediction as corrected by the rollouts measured under it
            expected = corrected(base, self.rollout_correction[self.current_variant]).t_rollout_s / base.t_train_s
        question = (step, times, force, self.current)
        if self._asked is not None and self._asked[0][:3] == question[:3] and self._asked[0][3] is self.current:
            # asked again for the same step under the same plan (the planning flow, then `observe`);
            # a plan adopted in between (the run's own placement) asks anew
            return self._asked[1]
        drift = drift_of(times, expected)
        if not in_episode(drift, self.trigger):
            self.fired_drift = None  # the stages are back in balance: a later drift is a new episode
        counted, previous = self.streak
        if counted != step:  # each step counts once, however often it is asked about
            self.streak = (step, streak(previous, drift, self.trigger))
        reason = replan_reason(step, self.last_plan_step, times, self.trigger, expected, self.fired_drift,
                               abs(self.streak[1]))
        if reason is not None and reason.startswith("pressure"):
            self.fired_drift = drift
        if reason is None and self.current is None and force:
            reason = "initial"
        self._asked = (question, reason)
        return reason

    def observe(self, step: int, workload: Workload, times: StepTimes | None = None,
                force: bool = False, steps_left: int | None = None,
                hold: Callable[[Plan], str | None] | None = None) -> PlanEvent | None:
        """Plan at `step` if the trigger says so (`due`); the event says what was decided.
        `steps_left`: the run's steps from `step` on, when known (a move must pay off within them).
        `hold`: asked about a candidate the decision would move to; a reason it returns keeps the plan
        in force (e.g. the cost model is not calibrated yet, or the machine cannot place the plan),
        and the event is recorded unapplied with that reason."""
        reason = self.due(step, times, force)
        if reason is None:
            return None
        plans, refusals = [], []
        training = TrainingTable(self.cost, workload)  # the variants differ in rollout settings only
        group_times = GroupTimes(self.cost, workload)  # and cost the same instance groups
        for index, settings in enumerate(self.variants):
            p = Planner(self.cost, workload, settings, training, group_times)
            try:
                raw = p.plan(self.clock)
            except LibraError as exc:  # this variant has no feasible split
                refusals.append(str(exc))
                continue
            plans.append((corrected(raw, self.rollout_correction[index]), raw, p, index))
        if not plans:
            raise LibraError(f"no planner variant found a feasible plan for this workload: {'; '.join(dict.fromkeys(refusals))}")
        if self.probe is not None:
            ranked = sorted(plans, key=lambda item: item[1].t_iter_s * self.probe_correction[item[3]])
            # plans with and without hybrids are probed separately, so adding hybrid variants never
            # pushes the plans without them out of the probe
            with_hybrids = [item for item in ranked if self.variants[item[3]].max_hybrid_fraction > 0]
            without = [item for item in ranked if self.variants[item[3]].max_hybrid_fraction <= 0]
            probed = with_hybrids[: self.probe_candidates] + without[: self.probe_candidates]
            # the cost model's own favourite is probed too: a variant whose plans once probed badly
            # (e.g. length buckets before the router had learned anything) is given its chance again,
            # so its correction follows what it does now rather than what it did once
            favourite = min(plans, key=lambda item: item[1].t_iter_s)
            if all(item[3] != favourite[3] for item in probed):
                probed.append(favourite)
            if self.prepare_probes is not None:
                self.prepare_probes([item[1] for item in probed] + ([self.current] if self.current is not None else []))
            plans = []
            for _, raw, p, index in probed:
                measured = self.probe(raw)
                if raw.t_iter_s > 0 and math.isfinite(raw.t_iter_s):
                    self.probe_correction[index] = 0.5 * self.probe_correction[index] + 0.5 * measured / raw.t_iter_s
                plans.append((replace(raw, t_iter_s=measured), raw, p, index))
        candidate, raw, planner, variant = min(plans, key=lambda item: item[0].t_iter_s)
        self.last_plan_step = step
        if self.current is None:
            event = PlanEvent(step, reason, candidate, float("inf"), None, True)
        else:
            assert self.current_variant is not None
            if self.probe is not None:
                current_t = self.probe(self.current)
            else:
                current_t = evaluate(planner, corrected(self.current, self.rollout_correction[self.current_variant]))
            decision = decide(current_t, candidate, self.current, self.cost, self.trigger, steps_left)
            event = PlanEvent(step, reason, candidate, current_t, decision, decision.apply)
        if event.applied and self.current is not None and hold is not None and (held := hold(candidate)):
            event = replace(event, applied=False, held=held)
        if event.applied:
            self.current = raw  # kept as predicted; corrections are applied when plans are compared
            self.current_variant = variant
            self.baseline = None
        elif self.current is not None:  # kept: what it predicts for this workload is the new baseline, so a
            self.baseline = recost(planner, self.current)  # drift already planned for does not fire again
        self.fired_drift = None  # predicted anew
        self.streak = (step, 0)
        self.events.append(event)
        return event

    def adopt(self, plan: Plan, variant: int) -> None:
        """Take `plan` (of `variants[variant]`) as the plan in force without planning: a run that
        starts from a placement of its own. The first plan made after warm-up is then weighed
        against it like any later one, not applied unconditionally."""
        if not 0 <= variant < len(self.variants):
            raise ValueError(f"variant {variant} of {len(self.variants)}")
        self.current = plan
        self.current_variant = variant
        self.baseline = None

    def record(self, measured_rollout_s: float, predicted_rollout_s: float, weight: float = 0.5) -> None:
        """Fold a step's measured rollout time, against what the plan in force predicted for that
        same step, into the plan's variant's correction, so variants whose plans run slower than
        predicted (e.g. length buckets the router cannot fill as planned) lose to those that keep
        their promise."""
        if self.current_variant is None or measured_rollout_s <= 0:
            return
        if predicted_rollout_s > 0 and math.isfinite(predicted_rollout_s):
            i = self.current_variant
            self.rollout_correction[i] = (1 - weight) * self.rollout_correction[i] + weight * measured_rollout_s / predicted_rollout_s


def corrected(plan: Plan, factor: float) -> Plan:
    """A plan with its rollout time scaled by a measured correction (and T_iter recomputed)."""
    if factor == 1.0 or math.isinf(plan.t_iter_s):
        return plan
    t_rollout = plan.t_rollout_s * factor
    if plan.mode == "sync":
        t_iter = t_rollout + plan.t_train_s + (plan.t_iter_s - plan.t_rollout_s - plan.t_train_s)
    elif plan.mode == "one_step_off":
        t_iter = max(t_rollout, plan.t_train_s) + (plan.t_iter_s - max(plan.t_rollout_s, plan.t_train_s))
    else:
        t_iter = plan.t_iter_s + plan.t_rollout_s * (factor - 1)
    return replace(plan, t_rollout_s=t_rollout, t_iter_s=t_iter)
