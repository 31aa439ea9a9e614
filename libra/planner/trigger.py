"""When to re-plan, and whether to apply the new plan.

Re-plan after warm-up every `period_steps` steps (and at its end, when a run had to start on a plan
made before it), and earlier on pressure: when the measured ratio
of the stages' times has drifted by `pressure_ratio` from the one the plan in force predicted
(corrected by what its rollouts have measured) for `pressure_steps` steps in a row the same way
(one slow step, a straggler, is noise, not a drift), once per drift episode. A new plan is applied
only if it differs from the current one, the gain per step times the steps it can still pay off (until
the next periodic plan, or the end of the run when that comes first) exceeds the cost of moving, and the relative gain passes `min_relative_gain` (hysteresis: noise
does not move GPUs back and forth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from libra.planner.cost_model import CostModel
from libra.planner.planner import Plan
from libra.planner.settings import Settings

CHECKPOINT_BANDWIDTH = 2e9  # bytes/s per GPU for re-sharding training state


class TriggerSettings(Settings):
    """The trigger's dials: `planner.period_steps` .. `planner.engine_start_s` of a config."""

    period_steps: int = Field(10, ge=1, le=100_000, description="periodic re-plan interval")
    warmup_steps: int = Field(2, ge=0, le=100_000, description="no planning before this step (statistics still settling)")
    pressure_ratio: float = Field(1.25, ge=1.0, le=100.0, description="stage-time imbalance that forces a re-plan: "
                                  "max(T_rollout, T_train) / min(...), against the plan's own")
    pressure_steps: int = Field(2, ge=1, le=1000, description="steps in a row the imbalance must last, the same "
                                "stage slower, before it forces a re-plan (one straggler-bound step is not a drift)")
    min_relative_gain: float = Field(0.05, ge=0.0, le=1.0, description="relative gain a new plan must bring "
                                     "(gain / current T_iter)")
    switch_base_s: float = Field(15.0, ge=0.0, le=3600.0, description="fixed cost of moving GPUs (drain, re-route, "
                                 "bookkeeping)")
    engine_start_s: float = Field(20.0, ge=0.0, le=3600.0, description="restarting rollout engines (when the "
                                  "instance layout changes)")


@dataclass(frozen=True)
class StepTimes:
    """Measured stage times of one step."""

    step: int
    t_rollout_s: float
    t_train_s: float


@dataclass(frozen=True)
class Decision:
    apply: bool
    reason: str
    gain_per_step_s: float  # current T_iter - candidate T_iter, on the current workload
    switch_cost_s: float
    horizon_steps: int  # steps the gain is counted over


def drift_of(times: StepTimes | None, expected_ratio: float) -> float | None:
    """A step's measured rollout/train time ratio over the one the plan in force predicted (> 1:
    rollout slower than planned), or None when it cannot be measured."""
    if times is None or min(times.t_rollout_s, times.t_train_s) <= 0 or not 0 < expected_ratio < math.inf:
        return None  # (a plan whose rollout cannot run predicts no ratio: its drift had been 0, then 1 / 0)
    drift = (times.t_rollout_s / times.t_train_s) / expected_ratio
    return drift if 0 < drift < math.inf else None


def replan_reason(step: int, last_plan_step: int | None, times: StepTimes | None, settings: TriggerSettings,
                  expected_ratio: float = 1.0, fired_drift: float | None = None, persisted: int = 1) -> str | None:
    """Why to re-plan at `step`, or None. Pressure compares the measured rollout/train time ratio with
    `expected_ratio`, the one the plan in force predicted (a plan may be unbalanced on purpose, e.g.
    in sync mode); it needs the drift to have lasted `settings.pressure_steps` steps, the same stage
    slower each time (`persisted`: how many it has, this one included), and fires once per drift
    episode: `fired_drift` is the drift it last fired at in the episode still under way (None:
    none), and it fires again only when the drift has moved another `pressure_ratio` from there (a
    drift that persists is planned for once, not every step)."""
    if step < settings.warmup_steps:
        return None
    if last_plan_step is None:
        return "initial"
    if last_plan_step < settings.warmup_steps:  # a plan forced before the statistics settled (a run must
        return "warm-up over"  # start somewhere) is made again once they have
    if step - last_plan_step >= settings.period_steps:
        return "periodic"
    drift = drift_of(times, expected_ratio)
    if drift is not None and max(drift, 1 / drift) >= settings.pressure_ratio and persisted >= settings.pressure_steps:
        moved = drift if fired_drift is None else drift / fired_drift
        if max(moved, 1 / moved) >= settings.pressure_ratio:
            slow = "rollout" if drift > 1 else "train"
            return f"pressure: {slow} {max(drift, 1 / drift):.2f}x slower than planned"
    return None


def in_episode(drift: float | None, settings: TriggerSettings) -> bool:
    """Whether a step's drift keeps a drift episode going (it is beyond the pressure ratio)."""
    return drift is not None and max(drift, 1 / drift) >= settings.pressure_ratio


def streak(previous: int, drift: float | None, settings: TriggerSettings) -> int:
    """Steps in a row the drift has been beyond the pressure ratio, this one included: positive while
    the rollout is the slower stage, negative while training is, 0 in balance (`previous`: the count
    up to the step before). A drift that swings from one stage to the other starts a new count."""
    if not in_episode(drift, settings):
        return 0
    assert drift is not None
    if drift > 1:
        return previous + 1 if previous > 0 else 1
    return previous - 1 if previous < 0 else -1


def same_plan(a: Plan, b: Plan) -> bool:
    return (
        a.train_gpus == b.train_gpus
        and a.rollout_gpus == b.rollout_gpus
        and a.hybrid_gpus == b.hybrid_gpus
        and a.hybrid_rollout_share == b.hybrid_rollout_share
        and (a.train.config if a.train else None) == (b.train.config if b.train else None)
        and a.rollout.instance_counts == b.rollout.instance_counts
    )


def switch_cost_s(cost: CostModel, old: Plan, new: Plan, settings: TriggerSettings) -> float:
    """Seconds lost moving from `old` to `new`: a fixed part, engine restarts if the instance layout
    changes, and re-sharding weights and optimizer state if the training layout changes."""
    if same_plan(old, new):
        return 0.0
    seconds = settings.switch_base_s
    if old.rollout.instance_counts != new.rollout.instance_counts:
        seconds += settings.engine_start_s
    if (old.train.config if old.train else None) != (new.train.config if new.train else None):
        state_bytes = 16 * cost.model.total_params  # bf16 weights + fp32 master and Adam moments
        seconds += state_bytes / (max(new.train_gpus, 1) * CHECKPOINT_BANDWIDTH)
    return seconds


def decide(current_t_iter_s: float, candidate: Plan, current: Plan, cost: CostModel, settings: TriggerSettings,
           steps_left: int | None = None) -> Decision:
    """Apply `candidate` instead of `current`? `current_t_iter_s` is the current plan re-costed on
    the current workload (`planner.evaluate`). `steps_left`: the run's steps still to come, when it
    knows them: a move pays off over at most those."""
    horizon = settings.period_steps if steps_left is None else max(0, min(settings.period_steps, steps_left))
    if same_plan(current, candidate):
        return Decision(False, "same plan", 0.0, 0.0, horizon)
    switch = switch_cost_s(cost, current, candidate, settings)
    if math.isinf(candidate.t_iter_s):
        return Decision(False, "no feasible candidate plan", 0.0, switch, horizon)
    gain = current_t_iter_s - candidate.t_iter_s
    if math.isinf(current_t_iter_s):
        return Decision(True, "current plan no longer fits the workload", gain, switch, horizon)
    relative = gain / current_t_iter_s
    if gain * horizon <= switch:
        return Decision(False, f"gain {gain:.1f} s/step x {horizon} steps <= switch cost {switch:.1f} s", gain, switch, horizon)
    if relative < settings.min_relative_gain:
        return Decision(False, f"relative gain {relative:.1%} < {settings.min_relative_gain:.0%}", gain, switch, horizon)
    return Decision(True, f"gain {gain:.1f} s/step ({relative:.1%}) over {horizon} steps beats switch cost {switch:.1f} s",
                    gain, switch, horizon)
