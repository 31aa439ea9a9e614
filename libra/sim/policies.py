"""Whole-system policies over one shared physics: each decides, step by step, the GPU split, the
training configuration, the rollout instances and how trajectories are routed. None of them changes
how instances, tools or training behave (that is `rollout` and the cost model).

    verl-colocated        every GPU rolls out, then every GPU trains (offload/onload between), synchronous
    static-uniform        half the GPUs train, half roll out on uniform-TP instances, least-load routing
    +planner              the planner's split and training layout, uniform-TP instances, re-planned by the trigger
    +hetero-tp            + heterogeneous TP instances for length buckets (routing by tokens spent: MLFQ)
    +cmlfq                + Libra's causal router
    +elastic = libra      + hybrid GPUs that roll out, then join training as extra replicas for the tail
    greedy-heuristic      uniform TP; every 10 steps moves a node from the faster stage to the slower one
    areal-static-optimal  the best static plan for the first step's workload, then frozen (asynchronous)
    oracle                knows each step's trajectories: plans every step on them, switches for free,
                          routes on true remaining lengths (the limit)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from libra.planner.controller import PlanController
from libra.planner.cost_model import CostModel, TrainConfig
from libra.planner.planner import Plan, Planner, PlannerSettings, fixed_layout_time
from libra.planner.trigger import StepTimes, TriggerSettings
from libra.planner.workload import TrajectoryLength, Workload, build_workload
from libra.scheduler.policies import MLFQ, Buckets, LeastLoad, LibraRouter, Oracle, Router
from libra.sim.rollout import InstanceSpec, path_of
from libra.sim.workloads import SimTrajectory

POLICIES = ("verl-colocated", "static-uniform", "+planner", "+hetero-tp", "+cmlfq", "libra",
            "greedy-heuristic", "areal-static-optimal", "oracle")


@dataclass(frozen=True)
class StepConfig:
    mode: Literal["colocated", "one_step_off"]
    train_gpus: int
    train_config: TrainConfig
    layout: tuple[InstanceSpec, ...]
    bounds: tuple[int, ...]  # router bucket bounds (total tokens)
    switch_cost_s: float = 0.0  # paid this step for reconfiguring
    plan_reason: str = ""
    shares: tuple[float, ...] = ()  # planned share of trajectories per bucket

    @property
    def rollout_gpus(self) -> int:
        return sum(i.tp for i in self.layout if not i.hybrid)

    @property
    def hybrid_gpus(self) -> int:
        return sum(i.tp for i in self.layout if i.hybrid)


def workload_of(trajectories: list[SimTrajectory]) -> Workload:
    lengths = [TrajectoryLength(t.prompt_tokens, t.gen_tokens, sum(u.payload_tokens for u in t.turns), len(t.turns),
                                sum(u.tool_latency_s for u in t.turns)) for t in trajectories]
    return build_workload(lengths)


def smallest_fitting_tp(cost: CostModel, max_tokens: int) -> int:
    for tp in (1, 2, 4, 8):
        if tp <= cost.cluster.gpus_per_node and cost.instance_fits(tp, max_tokens):
            return tp
    raise ValueError(f"no instance size holds {max_tokens} tokens")


def uniform_layout(cost: CostModel, gpus: int, max_tokens: int) -> tuple[InstanceSpec, ...]:
    tp = smallest_fitting_tp(cost, max_tokens)
    return tuple(InstanceSpec(tp, 0) for _ in range(max(1, gpus // tp)))


def plan_shares(plan: Plan, workload: Workload) -> tuple[float, ...]:
    """The share of the planned workload's trajectories each instance group serves."""
    total = workload.trajectories or 1.0
    return tuple(sum(b.count for b in workload.buckets[g.first_bucket:g.last_bucket + 1]) / total
                 for g in plan.rollout.groups)


def plan_layout(plan: Plan) -> tuple[tuple[InstanceSpec, ...], tuple[int, ...]]:
    """A plan's instance groups as instances (bucket = group index) plus its hybrid instances, and
    the router bounds (each group's longest trajectory)."""
    groups = plan.rollout.groups
    layout = [InstanceSpec(g.tp, b) for b, g in enumerate(groups) for _ in range(g.count)]
    if plan.hybrid_gpus:
        tp = groups[0].tp
        layout += [InstanceSpec(tp, 0, hybrid=True) for _ in range(plan.hybrid_gpus // tp)]
    bounds = tuple(sorted({g.max_tokens for g in groups[:-1]}))
    return tuple(layout), bounds


class SystemPolicy:
    """Base: a fixed configuration and a least-load router."""

    name = "policy"
    hybrid_leave_fraction = 0.0

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings) -> None:
        self.cost = cost
        self.planner_settings = planner
        self.trigger = trigger
        self.config: StepConfig | None = None
        self._router: Router | None = None

    def configure(self, step: int, previous: list[SimTrajectory], upcoming: list[SimTrajectory],
                  times: StepTimes | None) -> StepConfig:
        raise NotImplementedError

    def router(self, config: StepConfig, upcoming: list[SimTrajectory]) -> Router:
        if self._router is None or self._router.buckets.bounds != config.bounds:
            self._router = LeastLoad(Buckets(config.bounds), measure="total")
        return self._router

    def observe(self, trajectories: list[SimTrajectory]) -> None:
        if self._router is not None:
            self._router.observe_step([path_of(t) for t in trajectories],
                                      {t.prompt_id: t.prompt_tokens for t in trajectories})

    def _best_train(self, workload: Workload, gpus: int) -> TrainConfig:
        best = Planner(self.cost, workload, self.planner_settings).training.best(gpus)
        if best is None:
            raise ValueError(f"no training configuration fits {gpus} GPUs")
        return best.config


class VerlColocated(SystemPolicy):
    name = "verl-colocated"

    def configure(self, step, previous, upcoming, times):
        workload = workload_of(previous)
        gpus = self.cost.cluster.gpus
        if self.config is None or step % self.trigger.period_steps == 0:
            self.config = StepConfig("colocated", gpus, self._best_train(workload, gpus),
                                     uniform_layout(self.cost, gpus, self.cost.rollout.max_context_tokens), ())
        return self.config


class StaticUniform(SystemPolicy):
    name = "static-uniform"

    def configure(self, step, previous, upcoming, times):
        if self.config is None:
            gpus = self.cost.cluster.gpus
            train = gpus // 2
            self.config = StepConfig("one_step_off", train, self._best_train(workload_of(previous), train),
                                     uniform_layout(self.cost, gpus - train, self.cost.rollout.max_context_tokens), ())
        return self.config


class GreedyHeuristic(SystemPolicy):
    """Every K steps move one node's GPUs from the stage that finished first to the slower one."""

    name = "greedy-heuristic"

    def configure(self, step, previous, upcoming, times):
        gpus = self.cost.cluster.gpus
        quantum = self.cost.cluster.gpus_per_node
        if self.config is None:
            train = gpus // 2
        else:
            train = self.config.train_gpus
            if times is not None and step % self.trigger.period_steps == 0:
                if times.t_rollout_s > times.t_train_s:
                    train = max(quantum, train - quantum)
                elif times.t_train_s > times.t_rollout_s:
                    train = min(gpus - quantum, train + quantum)
        if self.config is None or train != self.config.train_gpus:
            cost_s = 0.0 if self.config is None else self.trigger.switch_base_s + self.trigger.engine_start_s
            self.config = StepConfig("one_step_off", train, self._best_train(workload_of(previous), train),
                                     uniform_layout(self.cost, gpus - train, self.cost.rollout.max_context_tokens), (),
                                     cost_s, "greedy move" if cost_s else "initial")
        elif self.config.switch_cost_s:
            self.config = replace(self.config, switch_cost_s=0.0, plan_reason="")
        return self.config


class Planned(SystemPolicy):
    """The planner-driven family: +planner, +hetero-tp, +cmlfq, libra, areal-static-optimal."""

    def __init__(self, cost, planner, trigger, *, name: str, uniform: bool, router: str, hybrids: bool,
                 frozen: bool = False) -> None:
        settings = planner if hybrids else replace(planner, max_hybrid_fraction=0.0)
        super().__init__(cost, replace(settings, mode="one_step_off"), trigger)
        self.name = name
        self.uniform = uniform
        self.router_kind = router
        self.frozen = frozen
        self.hybrid_leave_fraction = 0.2 if hybrids else 0.0
        tps = [tp for tp in (1, 2, 4, 8) if tp <= cost.cluster.gpus_per_node]
        variants = [replace(self.planner_settings, rollout_tps=(tp,)) for tp in tps] if uniform else [self.planner_settings]
        if not uniform:  # Libra's stages may also fall back to uniform instances when buckets do not pay off
            variants += [replace(self.planner_settings, rollout_tps=(tp,)) for tp in tps]
        if hybrids:  # ... and to plans without hybrids when leaving the rollout tail costs more than it gives
            variants += [replace(v, max_hybrid_fraction=0.0) for v in variants]
        self.controller = PlanController(cost, self.planner_settings, trigger, variants=variants)

    def configure(self, step, previous, upcoming, times):
        if self.frozen and self.config is not None:
            return replace(self.config, switch_cost_s=0.0, plan_reason="")
        plan = self.controller.current
        if times is not None and plan is not None and previous:
            predicted = (fixed_layout_time(self.cost, workload_of(previous), plan.rollout.instance_counts)
                         * plan.t_rollout_s / plan.rollout.seconds)
            self.controller.record(times.t_rollout_s, predicted)
        workload = workload_of(previous)
        event = self.controller.observe(step, workload, times, force=True)
        if self.config is not None and (event is None or not event.applied):
            return replace(self.config, switch_cost_s=0.0, plan_reason="")
        plan = self.controller.current
        layout, bounds = plan_layout(plan)
        switch = event.decision.switch_cost_s if event is not None and event.decision is not None else 0.0
        self.config = StepConfig("one_step_off", plan.train_gpus, plan.train.config, layout, bounds, switch,
                                 event.reason if event else "", plan_shares(plan, workload))
        return self.config

    def router(self, config, upcoming):
        if self._router is None or self._router.buckets.bounds != config.bounds:
            buckets = Buckets(config.bounds)
            old = self._router
            if self.router_kind == "libra":
                self._router = LibraRouter(buckets, measure="total", prior_shares=config.shares or None)
            else:
                self._router = {"least-load": LeastLoad, "mlfq": MLFQ}[self.router_kind](buckets, measure="total")
            if isinstance(old, LibraRouter) and isinstance(self._router, LibraRouter):
                self._router.trees, self._router.score = old.trees, old.score  # keep what the tree learned
        elif isinstance(self._router, LibraRouter) and config.shares:
            self._router.prior = list(config.shares)
        return self._router


class OraclePolicy(SystemPolicy):
    """Plans every step on the trajectories it is about to run, switches for free, routes on truth."""

    name = "oracle"
    hybrid_leave_fraction = 0.2

    def configure(self, step, previous, upcoming, times):
        plan = Planner(self.cost, workload_of(upcoming), replace(self.planner_settings, mode="one_step_off")).plan()
        layout, bounds = plan_layout(plan)
        self.config = StepConfig("one_step_off", plan.train_gpus, plan.train.config, layout, bounds, 0.0, "oracle")
        return self.config

    def router(self, config, upcoming):
        truth = {t.trajectory_id: path_of(t).remaining_at_decisions for t in upcoming}
        self._router = Oracle(Buckets(config.bounds), truth, measure="total")
        return self._router


def make_policy(name: str, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings) -> SystemPolicy:
    planned = {
        "+planner": dict(uniform=True, router="least-load", hybrids=False),
        "+hetero-tp": dict(uniform=False, router="mlfq", hybrids=False),
        "+cmlfq": dict(uniform=False, router="libra", hybrids=False),
        "libra": dict(uniform=False, router="libra", hybrids=True),
        "areal-static-optimal": dict(uniform=True, router="least-load", hybrids=False, frozen=True),
    }
    if name in planned:
        return Planned(cost, planner, trigger, name=name, **planned[name])
    simple = {"verl-colocated": VerlColocated, "static-uniform": StaticUniform, "greedy-heuristic": GreedyHeuristic,
              "oracle": OraclePolicy}
    if name not in simple:
        raise ValueError(f"unknown policy {name!r}")
    return simple[name](cost, planner, trigger)
