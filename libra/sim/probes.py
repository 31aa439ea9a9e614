"""Probes of how much room a partial run leaves over the best fixed split: fixed splits that a user
does not pick, each measuring what one mechanism could add (`benchmarks/bench_headroom.py`).

- `HybridSplit`: a fixed split with hybrid GPUs that roll out, then leave the rollout's tail to join
  training as extra replicas; its joins cost what the pool's do, or nothing (`join_s` 0.0: the
  ceiling of what hybrids could give).
- `ClairvoyantClose`: a fixed split whose partial rollouts know every trajectory's future and set
  the groups that will close the batch apart on instances of their own (`GroupLanes`). No one can
  run it; it measures what such a placement could give.

The relaxation, each stage given the whole cluster at once, is `libra.sim.relaxation`.
"""

from __future__ import annotations

import math

from libra.planner.cost_model import CostModel
from libra.planner.planner import PlannerSettings
from libra.planner.trigger import TriggerSettings
from libra.planner.workload import Workload
from libra.scheduler.routers import GroupLanes
from libra.sim.modes import RolloutMode
from libra.sim.rollout import InstanceSpec, Progress, RolloutSim
from libra.sim.systems import FixedSplit, uniform_layout
from libra.sim.workloads import SimTrajectory


class HybridSplit(FixedSplit):
    """A fixed split with `hybrid_gpus` more GPUs that roll out (on instances of the tuned size) until
    the rollout is down to its tail (`leave_fraction` of the groups it still needs), then join
    training as extra replicas; `join_s` 0.0 makes every join free."""

    name = "hybrid-split"

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                 mode: RolloutMode | None = None, group_size: int = 1, *, train_gpus: int, hybrid_gpus: int,
                 leave_fraction: float, join_s: float | None = None) -> None:
        super().__init__(cost, planner, trigger, mode, group_size, train_gpus=train_gpus)
        if not 0 < hybrid_gpus < cost.cluster.gpus - train_gpus:
            raise ValueError(f"hybrids take 1 to {cost.cluster.gpus - train_gpus - 1} of the "
                             f"{cost.cluster.gpus - train_gpus} GPUs training leaves, got {hybrid_gpus}")
        if not 0 < leave_fraction < 1:
            raise ValueError(f"hybrids leave at a share of the rollout between 0 and 1, got {leave_fraction}")
        self.hybrid_gpus = hybrid_gpus
        self.hybrid_leave_fraction = leave_fraction
        self.join_s = join_s

    def layout(self, workload: Workload) -> tuple[InstanceSpec, ...]:
        core = uniform_layout(self.cost, self.cost.cluster.gpus - self.train_gpus - self.hybrid_gpus, workload)
        tp = core[0].tp
        if self.hybrid_gpus % tp:
            raise ValueError(f"{self.hybrid_gpus} hybrid GPUs do not make instances of TP{tp}, the rollout's size")
        return core + tuple(InstanceSpec(tp, 0, hybrid=True) for _ in range(self.hybrid_gpus // tp))


def alone_s(cost: CostModel, tp: int, trajectory: SimTrajectory, progress: Progress | None = None) -> float:
    """Seconds `trajectory` has left (from `progress`, else from its start) decoding alone on an
    instance of TP `tp`: each turn's tokens at a batch of one at its context, each tool result
    prefilled, each tool call's latency (a suspended one's time left)."""
    first, done = (progress.turn, progress.done) if progress is not None else (0, 0)
    context = progress.context(trajectory) if progress is not None else trajectory.prompt_tokens
    seconds = progress.tool_left_s if progress is not None else 0.0
    for index in range(first, len(trajectory.turns)):
        turn = trajectory.turns[index]
        gen = turn.gen_tokens - (done if index == first else 0)
        seconds += gen * cost.decode_step_s(tp, 1, context + gen / 2)
        context += gen
        if index < len(trajectory.turns) - 1:
            seconds += turn.tool_latency_s + cost.prefill_s(tp, turn.payload_tokens, context)
            context += turn.payload_tokens
    return seconds


class ClairvoyantClose(FixedSplit):
    """A fixed split whose partial rollouts know every trajectory's future: the `margin` x needed
    groups in flight that would complete first alone (their slowest sample's `alone_s`) run on
    instances of their own (`lane`: count x TP, bucket 0), every other group on the rest (`rest`,
    bucket 1)."""

    name = "clairvoyant-close"

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                 mode: RolloutMode | None = None, group_size: int = 1, *, train_gpus: int,
                 lane: tuple[int, int], rest: tuple[int, int], margin: float = 1.0) -> None:
        super().__init__(cost, planner, trigger, mode, group_size, train_gpus=train_gpus)
        if not self.mode.partial:
            raise ValueError("a clairvoyant close needs partial rollouts (a batch that closes at its groups)")
        rollout = lane[0] * lane[1] + rest[0] * rest[1]
        if min(*lane, *rest) < 1 or rollout > cost.cluster.gpus - train_gpus:
            raise ValueError(f"lanes of {lane[0]} x TP{lane[1]} and {rest[0]} x TP{rest[1]} need {rollout} GPUs; "
                             f"training leaves {cost.cluster.gpus - train_gpus}")
        if margin < 1:
            raise ValueError(f"the lanes hold at least the groups the batch needs (margin >= 1), got {margin}")
        self.lane, self.rest, self.margin = lane, rest, margin

    def layout(self, workload: Workload) -> tuple[InstanceSpec, ...]:
        return tuple([InstanceSpec(self.lane[1], 0)] * self.lane[0] + [InstanceSpec(self.rest[1], 1)] * self.rest[0])

    def rollout(self, step, config, batch, resume=None, close=None):
        if close is None:  # nothing closes this rollout early: every group is needed
            return super().rollout(step, config, batch, resume, close)
        resume = resume or {}
        slowest: dict[str, float] = {}
        for t in batch:
            left = alone_s(self.cost, self.lane[1], t, resume.get(t.trajectory_id))
            group = close.groups[t.trajectory_id]
            slowest[group] = max(slowest.get(group, 0.0), left)
        first = sorted(slowest, key=lambda g: (slowest[g], g))[:math.ceil(close.needed * self.margin)]
        router = GroupLanes(close.groups, frozenset(first))
        return RolloutSim(self.cost, config.layout, router).run(batch, resume, close)
