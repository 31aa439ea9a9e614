"""Running the simulated systems (`systems`) over the same simulated workload and reporting what they
achieve.

Every system sees the same trajectories at every step (same seed). A step rolls out its batch on the
system's instances with its router; its training time comes from the planner's cost model for the
system's training configuration and the step's tokens. Pipelining:

    colocated     step = reconfiguration + rollout(k) + offload/onload + train(k) + weight sync (the
                  planner settings' `offload_s`); a step that switches from one-step-off first trains
                  the batch rolled out ahead
    one_step_off  step = max(rollout(k) + reconfiguration, train(k-1)) + weight sync; hybrid instances
                  leave the rollout for its tail and join train(k-1) as extra data-parallel replicas
                  after fetching a snapshot, which speeds the rest of that training up; a step that
                  switches from colocated has nothing to train yet

Non-oracle systems plan on the previous step's trajectories (step 0 on a separate warm-up batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from libra.planner.cost_model import CostModel, TrainConfig
from libra.planner.planner import PlannerSettings
from libra.planner.trigger import StepTimes, TriggerSettings
from libra.sim.systems import SYSTEMS, StepConfig, System, make_system
from libra.sim.training import train_seconds, with_hybrids
from libra.sim.workloads import SimTrajectory, WorkloadGenerator, WorkloadSpec


@dataclass(frozen=True)
class StepRecord:
    step: int
    rollout_s: float
    train_s: float  # training of the batch trained in this step (after hybrid speed-up)
    step_s: float
    trained_tokens: int
    gen_tokens: int
    train_gpus: int
    rollout_gpus: int
    hybrid_gpus: int
    idle_rollout_gpu_s: float
    idle_train_gpu_s: float
    migrated_tokens: int
    switch_cost_s: float
    plan_reason: str
    train_config: TrainConfig
    instances: tuple[tuple[int, int], ...]  # (tp, count) of core rollout instances
    hybrid_events: tuple[tuple[float, str, int], ...]  # (time in step, event, GPUs)


@dataclass
class SystemRun:
    name: str
    steps: list[StepRecord] = field(default_factory=list)
    tail_train_s: float = 0.0  # one_step_off: training of the last batch after the last rollout

    @property
    def total_time_s(self) -> float:
        return sum(s.step_s for s in self.steps) + self.tail_train_s

    @property
    def trained_tokens(self) -> int:
        return sum(s.trained_tokens for s in self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def step_time_quantile(self, q: float) -> float:
        ordered = sorted(s.step_s for s in self.steps)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan

    @property
    def step_time_mean_s(self) -> float:
        return sum(s.step_s for s in self.steps) / len(self.steps) if self.steps else math.nan

    @property
    def idle_gpu_s(self) -> dict[str, float]:
        return {"rollout": sum(s.idle_rollout_gpu_s for s in self.steps),
                "train": sum(s.idle_train_gpu_s for s in self.steps)}


def simulate(spec: WorkloadSpec, cost: CostModel, steps: int, systems: list[str], seed: int = 0,
             planner: PlannerSettings | None = None, trigger: TriggerSettings | None = None,
             progress: Callable[[str, int], None] | None = None) -> dict[str, SystemRun]:
    """Every system over the same `steps` batches of `spec` (drawn with `seed`)."""
    unknown = [p for p in systems if p not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; systems: {', '.join(SYSTEMS)}")
    cost = simulation_cost(spec, cost)
    batches, warmup = workload_batches(spec, steps, seed)
    return {name: simulate_system(name, cost, batches, warmup, planner, trigger, progress) for name in systems}


def simulation_cost(spec: WorkloadSpec, cost: CostModel) -> CostModel:
    """The cost model a simulation of `spec` plans with: training must hold the longest sequence
    the generation cap allows, not just the ones seen so far."""
    floor = min(spec.max_tokens, cost.rollout.max_context_tokens)
    return replace(cost, training=cost.training.model_copy(update={"min_sequence_tokens": floor}))


def workload_batches(spec: WorkloadSpec, steps: int, seed: int) -> tuple[list[list[SimTrajectory]], list[SimTrajectory]]:
    """The steps' trajectories, and the warm-up batch the planning systems plan step 0 on."""
    generator = WorkloadGenerator(spec, seed)
    return [generator.step(k) for k in range(steps)], generator.step(-1)


def simulate_system(name: str, cost: CostModel, batches: list[list[SimTrajectory]], warmup: list[SimTrajectory],
                    planner: PlannerSettings | None = None, trigger: TriggerSettings | None = None,
                    progress: Callable[[str, int], None] | None = None) -> SystemRun:
    """One system over `batches` (`cost` from `simulation_cost`)."""
    planner = planner or PlannerSettings()
    system = make_system(name, cost, planner, trigger or TriggerSettings())
    system.plan_ahead(batches)
    return run_system(system, cost, batches, warmup, planner, progress)


def run_system(system: System, cost: CostModel, batches: list[list[SimTrajectory]],
               warmup: list[SimTrajectory], planner: PlannerSettings,
               progress: Callable[[str, int], None] | None = None) -> SystemRun:
    run = SystemRun(system.name)
    sync_s = cost.weight_sync_s()
    previous = warmup
    pending: tuple[StepConfig, list[SimTrajectory]] | None = None  # batch waiting to be trained
    times: StepTimes | None = None
    for k, batch in enumerate(batches):
        config = system.configure(k, previous, batch, times)
        rollout = system.rollout(k, config, batch)
        system.observe(batch)
        if config.mode == "colocated":
            train_s, train_config = train_seconds(cost, config.train_config, config.train_gpus, batch, planner)
            trained, events = batch, []
            if pending is not None:  # switched from one-step-off: the batch rolled out ahead is trained first
                ahead_s, _ = train_seconds(cost, pending[0].train_config, pending[0].train_gpus, pending[1], planner)
                train_s, trained, pending = train_s + ahead_s, pending[1] + batch, None
            step_s = config.switch_cost_s + rollout.makespan_s + planner.offload_s + train_s + sync_s
            idle_rollout = rollout.idle_gpu_s
            idle_train = 0.0
        else:
            train_s, events = 0.0, []
            train_config = config.train_config
            trained = []
            if pending is not None:
                base_s, train_config = train_seconds(cost, pending[0].train_config, pending[0].train_gpus, pending[1], planner)
                train_s, events = with_hybrids(cost, base_s, train_config, rollout.hybrid_released_s)
                trained = pending[1]
            rollout_side = rollout.makespan_s + config.switch_cost_s
            step_s = max(rollout_side, train_s) + sync_s
            idle_rollout = rollout.idle_gpu_s + config.rollout_gpus * (step_s - rollout.makespan_s)
            idle_train = config.train_gpus * (step_s - train_s)
            pending = (config, batch)
        released = tuple((t, "leave_rollout", g) for g, t in rollout.hybrid_released_s)
        run.steps.append(StepRecord(
            k, rollout.makespan_s, train_s, step_s, sum(t.total_tokens for t in trained), rollout.gen_tokens,
            config.train_gpus, config.rollout_gpus, config.hybrid_gpus, idle_rollout, idle_train,
            rollout.migrated_tokens, config.switch_cost_s, config.plan_reason, train_config,
            _instances(config), released + tuple(events),
        ))
        times = StepTimes(k, rollout.makespan_s, train_s if train_s > 0 else rollout.makespan_s)
        previous = batch
        if progress:
            progress(system.name, k)
    if pending is not None:
        run.tail_train_s, _ = train_seconds(cost, pending[0].train_config, pending[0].train_gpus, pending[1], planner)
        last = run.steps[-1]
        run.steps[-1] = StepRecord(**{**last.__dict__, "trained_tokens": last.trained_tokens
                                      + sum(t.total_tokens for t in pending[1])})
    return run


def _instances(config: StepConfig) -> tuple[tuple[int, int], ...]:
    counts: dict[int, int] = {}
    for spec in config.layout:
        if not spec.hybrid:
            counts[spec.tp] = counts.get(spec.tp, 0) + 1
    return tuple(sorted(counts.items()))
