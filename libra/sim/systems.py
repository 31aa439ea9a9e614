"""The simulated systems: whole-system variants over one shared physics. Each decides, step by step,
the GPU split, the training configuration, the rollout instances and how trajectories are routed.
None of them changes how instances, tools or training behave (that is `rollout` and the cost model).

    verl-colocated        every GPU rolls out, then every GPU trains (offload/onload between), synchronous
    static-uniform        half the GPUs train, half roll out on uniform-TP instances, least-load routing
                          (the baselines' instance size is tuned: the uniform TP the cost model says
                          rolls the first step's workload out soonest)
    +planner              the planner's split and training layout, uniform-TP instances, re-planned by the trigger
    +hetero-tp            + heterogeneous TP instances for length buckets (routing by tokens spent: MLFQ);
                          each stage's planner probes plans with the stage's own router
    +cmlfq                + Libra's causal router
    +elastic = libra      + hybrid GPUs that roll out, then join training as extra replicas for the tail
    greedy-heuristic      uniform TP; every 10 steps moves a node from the faster stage to the slower one
    areal-static-optimal  the best static plan for the first step's workload, then frozen (asynchronous)
    oracle                knows every step's trajectories: plans each step on them with Libra's planner
                          variants, runs the best candidates in the physics and picks the sequence of
                          plans that finishes the run soonest, switches for free, routes on true
                          remaining lengths (the limit)

Not a system a user picks: `FixedSplit`, any hand-set split (static-uniform is the half/half one),
which `benchmarks/bench_headroom.py` sweeps; its probes of a partial run's room are in
`libra.sim.probes` and `libra.sim.relaxation`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from libra.errors import InfeasibleError, LibraError
from libra.planner.controller import PlanController
from libra.planner.cost_model import CostModel, TrainConfig
from libra.planner.planner import Plan, Planner, PlannerSettings, fixed_layout_time
from libra.planner.rollout_search import GroupTimes
from libra.planner.training_search import TrainingTable
from libra.planner.trigger import StepTimes, TriggerSettings
from libra.planner.workload import Workload, close_of, close_quantile
from libra.scheduler.libra_router import LibraRouter
from libra.scheduler.routers import MLFQ, Buckets, LeastLoad, Oracle, Router
from libra.sim.forked import forked_map
from libra.sim.modes import RolloutMode
from libra.sim.rollout import (
    Close,
    InstanceSpec,
    Progress,
    RolloutResult,
    RolloutSim,
    lanes,
    mean_context,
    path_of,
)
from libra.sim.training import lengths_of, train_seconds, with_hybrids, workload_of
from libra.sim.workloads import SimTrajectory

PROBE_STEPS = 2  # steps of recent trajectories a plan's rollout is probed on
# a probe's replay: (step, its batch, the instances, their bounds, the buckets' shares)
_ReplayJob = tuple[int, list[SimTrajectory], tuple[InstanceSpec, ...], tuple[int, ...], tuple[float, ...]]

SYSTEMS = ("verl-colocated", "static-uniform", "+planner", "+hetero-tp", "+cmlfq", "libra",
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


def full_context_tps(cost: CostModel) -> tuple[int, ...]:
    """The instance sizes (within a node) that hold the engine's longest context."""
    return tuple(tp for tp in cost.instance_tps((1, 2, 4, 8)) if cost.instance_fits(tp, cost.rollout.max_context_tokens))


def best_uniform_tp(cost: CostModel, gpus: int, workload: Workload) -> int:
    """The instance size a tuned static configuration would use: among the sizes that hold the
    engine's longest context, the one the cost model says rolls `workload` out soonest on `gpus`."""
    sizes = [tp for tp in full_context_tps(cost) if tp <= gpus]
    if not sizes:
        raise InfeasibleError(f"no instance size of at most {gpus} GPUs holds {cost.rollout.max_context_tokens} tokens")
    return min(sizes, key=lambda tp: (cost.group_time(tp, gpus // tp, workload.buckets), tp))


def uniform_layout(cost: CostModel, gpus: int, workload: Workload) -> tuple[InstanceSpec, ...]:
    tp = best_uniform_tp(cost, gpus, workload)
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


def planner_variants(cost: CostModel, settings: PlannerSettings, *, uniform: bool, hybrids: bool) -> list[PlannerSettings]:
    """The planner settings a system searches side by side: one per uniform instance size, or
    heterogeneous instances with those as fallbacks (when buckets do not pay off), each also without
    hybrids when hybrids are allowed (when leaving the rollout tail costs more than it gives)."""
    tps = [tp for tp in (1, 2, 4, 8) if tp <= cost.cluster.gpus_per_node]
    variants = [settings.model_copy(update={"rollout_tps": (tp,)}) for tp in tps]
    if not uniform:
        variants = [settings] + variants
    if hybrids:
        variants += [v.model_copy(update={"max_hybrid_fraction": 0.0}) for v in variants]
    return variants


class System:
    """Base: a fixed configuration and a least-load router."""

    name = "system"
    hybrid_leave_fraction = 0.0
    join_s: float | None = None  # seconds a hybrid takes to join training (None: the pool's, `join_seconds`)

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                 mode: RolloutMode | None = None, group_size: int = 1) -> None:
        self.cost = cost
        self.group_size = group_size  # samples per prompt (where a partial rollout closes depends on it)
        self.planner_settings = planner
        self.trigger = trigger
        self.mode = mode or RolloutMode()
        self.config: StepConfig | None = None
        self._router: Router | None = None

    def configure(self, step: int, previous: list[SimTrajectory], upcoming: list[SimTrajectory],
                  times: StepTimes | None) -> StepConfig:
        """Step `step`'s configuration. `previous`: the last step's trajectories, whole (the
        warm-up batch before step 0; under partial rollouts the groups it completed for training,
        with the samples that kept them open, or what it finished if it completed none);
        `upcoming`: the step's new batch; `times`: the last step's measured stage times."""
        raise NotImplementedError

    def planned_workload(self, trajectories: list[SimTrajectory], steps: int = 1) -> Workload:
        """The planner's view of `trajectories` in this system's mode: under partial rollouts the
        batch closes at the `close_quantile` trajectory, so no rollout is planned to wait for longer
        ones (`Workload.closing_at`)."""
        workload = workload_of(trajectories, steps)
        if not self.mode.partial or not trajectories:
            return workload
        groups = max(1, round(len({t.prompt_id for t in trajectories}) / steps))  # a step's
        close = close_of(lengths_of(trajectories), close_quantile(self.group_size, self.mode.overprovision, groups))
        return workload.closing_at(close)

    def router(self, config: StepConfig, upcoming: list[SimTrajectory]) -> Router:
        if self._router is None or self._router.buckets.bounds != config.bounds:
            self._router = LeastLoad(Buckets(config.bounds), measure="total")
        return self._router

    def rollout(self, step: int, config: StepConfig, batch: list[SimTrajectory],
                resume: dict[str, Progress] | None = None, close: Close | None = None) -> RolloutResult:
        """The step's rollout under `config`, routed by this system's router (`resume`, `close`: a
        partial rollout's, `RolloutSim.run`)."""
        return RolloutSim(self.cost, config.layout, self.router(config, batch),
                          self.hybrid_leave_fraction).run(batch, resume, close)

    def forget(self, trajectory_ids: tuple[str, ...]) -> None:
        """Suspended trajectories dropped as too stale: the router forgets them, learning nothing."""
        if self._router is not None:
            for tid in trajectory_ids:
                self._router.drop(tid)

    def plan_ahead(self, batches: list[list[SimTrajectory]]) -> None:
        """Called once before the run with every step's batch; only a clairvoyant system looks."""

    def observe(self, trajectories: list[SimTrajectory]) -> None:
        if self._router is not None:
            self._router.observe_step([path_of(t) for t in trajectories],
                                      {t.prompt_id: t.prompt_tokens for t in trajectories})

    def _best_train(self, workload: Workload, gpus: int) -> TrainConfig:
        best = Planner(self.cost, workload, self.planner_settings).training.best(gpus)
        if best is None:
            raise InfeasibleError(f"no training configuration fits {gpus} GPUs")
        return best.config


class VerlColocated(System):
    name = "verl-colocated"

    def configure(self, step, previous, upcoming, times):
        workload = self.planned_workload(previous)
        gpus = self.cost.cluster.gpus
        if self.config is None or step % self.trigger.period_steps == 0:
            self.config = StepConfig("colocated", gpus, self._best_train(workload, gpus),
                                     uniform_layout(self.cost, gpus, workload), ())
        return self.config


class FixedSplit(System):
    """`train_gpus` GPUs train and the rest roll out on uniform instances of the tuned size
    (`best_uniform_tp`), never moved: a fixed split set by hand."""

    name = "fixed-split"

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                 mode: RolloutMode | None = None, group_size: int = 1, *, train_gpus: int) -> None:
        super().__init__(cost, planner, trigger, mode, group_size)
        if not 0 < train_gpus < cost.cluster.gpus:
            raise ValueError(f"a fixed split trains on 1 to {cost.cluster.gpus - 1} of {cost.cluster.gpus} GPUs, "
                             f"got {train_gpus}")
        self.train_gpus = train_gpus

    def configure(self, step, previous, upcoming, times):
        if self.config is None:
            workload = self.planned_workload(previous)
            self.config = StepConfig("one_step_off", self.train_gpus, self._best_train(workload, self.train_gpus),
                                     self.layout(workload), ())
        return self.config

    def layout(self, workload: Workload) -> tuple[InstanceSpec, ...]:
        """The rollout's instances, set once from the first workload: uniform, of the tuned size."""
        return uniform_layout(self.cost, self.cost.cluster.gpus - self.train_gpus, workload)


class StaticUniform(FixedSplit):
    """Half the GPUs train, half roll out on uniform instances of the tuned size."""

    name = "static-uniform"

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                 mode: RolloutMode | None = None, group_size: int = 1) -> None:
        super().__init__(cost, planner, trigger, mode, group_size, train_gpus=cost.cluster.gpus // 2)


class GreedyHeuristic(System):
    """Every K steps move one node's GPUs from the stage that finished first to the slower one."""

    name = "greedy-heuristic"

    def configure(self, step, previous, upcoming, times):
        gpus = self.cost.cluster.gpus
        quantum = self.cost.cluster.gpus_per_node
        if self.config is None:
            train = gpus // 2
        else:
            train = self.config.train_gpus
            if times is not None and times.t_train_s > 0 and step % self.trigger.period_steps == 0:
                if times.t_rollout_s > times.t_train_s:
                    train = max(quantum, train - quantum)
                elif times.t_train_s > times.t_rollout_s:
                    train = min(gpus - quantum, train + quantum)
        if self.config is None or train != self.config.train_gpus:
            cost_s = 0.0 if self.config is None else self.trigger.switch_base_s + self.trigger.engine_start_s
            workload = self.planned_workload(previous)
            self.config = StepConfig("one_step_off", train, self._best_train(workload, train),
                                     uniform_layout(self.cost, gpus - train, workload), (),
                                     cost_s, "greedy move" if cost_s else "initial")
        elif self.config.switch_cost_s:
            self.config = replace(self.config, switch_cost_s=0.0, plan_reason="")
        return self.config


class Planned(System):
    """The planner-driven family: +planner, +hetero-tp, +cmlfq, libra, areal-static-optimal."""

    def __init__(self, cost, planner, trigger, mode=None, group_size=1, *, name: str, uniform: bool, router: str,
                 hybrids: bool, frozen: bool = False) -> None:
        settings = planner if hybrids else planner.model_copy(update={"max_hybrid_fraction": 0.0})
        super().__init__(cost, settings.model_copy(update={"mode": "one_step_off"}), trigger, mode, group_size)
        self.name = name
        self.uniform = uniform
        self.router_kind = router
        self.frozen = frozen
        self.hybrid_leave_fraction = 0.2 if hybrids else 0.0
        variants = planner_variants(cost, self.planner_settings, uniform=uniform, hybrids=hybrids)
        self.recent: deque[tuple[int, list[SimTrajectory]]] = deque(maxlen=PROBE_STEPS)  # (step, batch)
        self.replays: dict[tuple, tuple[float, list[tuple[int, float]]]] = {}  # probe cache
        self.controller = PlanController(self.cost, self.planner_settings, trigger, variants=variants,
                                         probe=None if frozen else self.probe,
                                         prepare_probes=None if frozen else self.prepare_probes)
        self.context = 1.0  # mean context of the last batch (prices the router's lanes)
        self.batch_size = 0  # trajectories a step trains (a partial rollout's probe trains that many)
        # step -> (its measured rollout and training seconds, the instances, bounds and shares it ran on)
        self.ran: dict[int, tuple[float, float, tuple[InstanceSpec, ...], tuple[int, ...], tuple[float, ...]]] = {}
        self._routed_layout: tuple[InstanceSpec, ...] = ()

    def probe(self, plan: Plan) -> float:
        """A plan's mean iteration time over the last `PROBE_STEPS` steps' trajectories: each batch's
        rollout replayed through the rollout simulator with this stage's own router as it stands
        (least-load, MLFQ, or Libra's with what it has learned, on a detached copy so the replay
        teaches it nothing), and its training from the cost model, sped up by the hybrids that
        rollout releases. Replays are cached per (step, instances) while the step is recent.

        Under partial rollouts the replay closes at the batch's share of its groups (1 /
        overprovision of them, the rest cut), as the step's rollout would, and what is trained is a
        step's batch shaped as the replayed trajectories (as many as a step trains). A replay starts
        every group afresh, while a step continues the groups it carried, which complete early: its
        rollout times are scaled by the recent steps' measured rollout over their replay on the
        instances they ran on (`_calibration`)."""
        layout, bounds = plan_layout(plan)
        assert plan.train is not None
        factor = self._calibration()
        seconds = []
        for step, batch in self.recent:
            makespan, released = self._replay(step, batch, layout, bounds, plan_shares(plan, workload_of(batch)))
            released = [(gpus, at * factor) for gpus, at in released]
            train_s, train_config = train_seconds(self.cost, plan.train.config, plan.train_gpus, batch,
                                                  self.planner_settings, self.batch_size if self.mode.partial else None)
            train_s, _ = with_hybrids(self.cost, train_s, train_config, released)
            seconds.append(max(makespan * factor, train_s) + self.cost.weight_sync_s())
        return sum(seconds) / len(seconds)

    def _replay(self, step: int, batch: list[SimTrajectory], layout: tuple[InstanceSpec, ...], bounds: tuple[int, ...],
                shares: tuple[float, ...]) -> tuple[float, list[tuple[int, float]]]:
        """(makespan, hybrids' release) of `batch` (step `step`'s) rolled out on `layout` (cached)."""
        key = (step, layout, bounds)
        if key not in self.replays:
            self.replays[key] = self._replayed((step, batch, layout, bounds, shares))
        return self.replays[key]

    def _replayed(self, job: _ReplayJob) -> tuple[float, list[tuple[int, float]]]:
        """A replay computed (`_replay` without the cache): a function of the job and of what the
        router has learned, which a replay leaves as it was (its router is a detached copy)."""
        _, batch, layout, bounds, shares = job
        router = self._make_router(layout, bounds, shares, detached=True)
        rollout = RolloutSim(self.cost, layout, router, self.hybrid_leave_fraction).run(
            batch, close=self._probe_close(batch))
        return rollout.makespan_s, rollout.hybrid_released_s

    def prepare_probes(self, plans: Sequence[Plan]) -> None:
        """Every replay the probes of `plans` will ask for (`PlanController`'s hook), computed at once
        and shared with a second core (`forked_map`), listed in the order the probes would ask: the
        calibration's, then each plan's recent steps. A replay is a function of its job alone, so
        the probes then answer as they would have without this, to the bit."""
        if not plans:
            return
        jobs: dict[tuple, _ReplayJob] = {}
        for step, batch in self._calibrated():  # each probe starts with these: the first asks for them
            _, _, layout, bounds, shares = self.ran[step]
            if (step, layout, bounds) not in self.replays:
                jobs.setdefault((step, layout, bounds), (step, batch, layout, bounds, shares))
        for plan in plans:
            layout, bounds = plan_layout(plan)
            for step, batch in self.recent:
                key = (step, layout, bounds)
                if key not in self.replays and key not in jobs:  # the first to ask sets the shares (as `_replay`)
                    jobs[key] = (step, batch, layout, bounds, plan_shares(plan, workload_of(batch)))
        self.replays.update(zip(jobs, forked_map(self._replayed, list(jobs.values())), strict=True))

    def _calibration(self) -> float:
        """Under partial rollouts, the recent steps' measured rollout seconds over their replay on the
        instances each ran on (1 with nothing measured yet, and without partial rollouts, where a
        replay runs the step's own trajectories from their start). In the asynchronous mode a
        rollout goes on until the update beside it is done: a step whose rollout lasted no longer
        than its training may have been held, and says nothing of where it closed."""
        measured = replayed = 0.0
        for step, batch in self._calibrated():
            rollout_s, _, layout, bounds, shares = self.ran[step]
            measured += rollout_s
            replayed += self._replay(step, batch, layout, bounds, shares)[0]
        return measured / replayed if measured > 0 and replayed > 0 else 1.0

    def _calibrated(self) -> list[tuple[int, list[SimTrajectory]]]:
        """The recent steps `_calibration` compares with their replays (none without partial rollouts)."""
        if not self.mode.partial:
            return []
        return [(step, batch) for step, batch in self.recent if step in self.ran
                and not (self.mode.name == "async" and self.ran[step][0] <= self.ran[step][1])]

    def _probe_close(self, batch: list[SimTrajectory]) -> Close | None:
        """A replay's close under partial rollouts: at the batch's groups over the overprovision."""
        if not self.mode.partial:
            return None
        groups = {t.trajectory_id: t.prompt_id for t in batch}
        return Close(groups, max(1, round(len(set(groups.values())) / self.mode.overprovision)))

    def _make_router(self, layout: tuple[InstanceSpec, ...], bounds: tuple[int, ...], shares: tuple[float, ...], *,
                     detached: bool) -> Router:
        """This stage's router for `layout`'s buckets; Libra's is told the layout's lanes (it routes
        for their makespan) and keeps what the live one learned (`detached`: on its own copy, for a
        probe)."""
        buckets = Buckets(bounds)
        if self.router_kind != "libra":
            return {"least-load": LeastLoad, "mlfq": MLFQ}[self.router_kind](buckets, measure="total")
        served = lanes(self.cost, layout, self.context)
        if isinstance(self._router, LibraRouter):
            return self._router.carried_to(buckets, shares or None, lanes=served, detached=detached)
        return LibraRouter(buckets, measure="total", prior_shares=shares or None, lanes=served)

    def configure(self, step, previous, upcoming, times):
        if self.frozen and self.config is not None:
            return replace(self.config, switch_cost_s=0.0, plan_reason="")
        plan = self.controller.current
        if times is not None and plan is not None and previous:
            predicted = (fixed_layout_time(self.cost, self.planned_workload(previous), plan.rollout.instance_counts)
                         * plan.t_rollout_s / plan.rollout.seconds)
            self.controller.record(times.t_rollout_s, predicted)
        if times is not None and self.config is not None:
            self.ran[step - 1] = (times.t_rollout_s, times.t_train_s, self.config.layout, self.config.bounds,
                                  self.config.shares)
        self.context = mean_context(previous)
        self.batch_size = len(upcoming)
        self.recent.append((step - 1, previous))
        self.replays = {k: v for k, v in self.replays.items() if k[0] >= self.recent[0][0]}
        self.ran = {k: v for k, v in self.ran.items() if k >= self.recent[0][0]}
        # plan for the recent steps' mean workload, not the last batch alone (whose size and longest
        # trajectory vary from step to step)
        workload = self.planned_workload([t for _, batch in self.recent for t in batch], steps=len(self.recent))
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
        if (self._router is None or self._router.buckets.bounds != config.bounds
                or (isinstance(self._router, LibraRouter) and config.layout != self._routed_layout)):
            self._router = self._make_router(config.layout, config.bounds, config.shares, detached=False)
            self._routed_layout = config.layout
        elif isinstance(self._router, LibraRouter) and config.shares:
            self._router.prior = list(config.shares)
        return self._router


class OracleSystem(System):
    """Knows every step's trajectories before the run. For each step it plans on that step's batch
    with every planner variant Libra searches, keeps the `candidates` distinct plans the cost model
    ranks best, and runs each through the rollout physics (routing on true lengths, hybrids leaving
    for the tail). Then a dynamic program over the steps picks one plan per step minimising the
    whole run's time as the runner counts it (step k = max(rollout k, training of batch k-1 sped up
    by the hybrids step k releases), plus the last batch's training); switching is free."""

    name = "oracle"
    hybrid_leave_fraction = 0.2
    candidates = 3

    def __init__(self, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                 mode: RolloutMode | None = None, group_size: int = 1) -> None:
        super().__init__(cost, planner.model_copy(update={"mode": "one_step_off"}), trigger, mode, group_size)
        self.variants = planner_variants(cost, self.planner_settings, uniform=False, hybrids=True)
        self.schedule: list[StepConfig] = []
        self.planned: list[RolloutResult] = []  # the scheduled plan's rollout per step, as plan_ahead ran it

    def _candidates(self, batch: list[SimTrajectory]) -> list[StepConfig]:
        """The `candidates` best distinct plans of the variants (by the cost model), and the best one
        with one and two nodes' GPUs moved between training and rollout (for steps where a straggler
        decides the rollout and more rollout GPUs would not help)."""
        workload = workload_of(batch)
        training, group_times = TrainingTable(self.cost, workload), GroupTimes(self.cost, workload)
        plans, refusals = [], []
        for settings in self.variants:
            try:
                plans.append((Planner(self.cost, workload, settings, training, group_times).plan(), settings))
            except LibraError as exc:  # no feasible split for this variant
                refusals.append(str(exc))
                continue
        if not plans:
            raise LibraError("no planner variant found a feasible plan for this step's trajectories: "
                             + "; ".join(dict.fromkeys(refusals)))
        plans.sort(key=lambda item: item[0].t_iter_s)
        configs: dict[tuple, StepConfig] = {}
        for plan, _ in plans:
            if len(configs) < self.candidates:
                self._add(configs, plan)
        best, settings = plans[0]
        planner = Planner(self.cost, workload, settings, training)
        node = self.cost.cluster.gpus_per_node
        for moved in (-2 * node, -node, node, 2 * node):
            try:
                self._add(configs, planner.plan_at(best.train_gpus + moved, best.hybrid_gpus, best.hybrid_rollout_share))
            except LibraError:  # off the ends
                continue
        return list(configs.values())

    @staticmethod
    def _add(configs: dict[tuple, StepConfig], plan: Plan) -> None:
        if plan.train is None or math.isinf(plan.t_iter_s):
            return
        layout, bounds = plan_layout(plan)
        config = StepConfig("one_step_off", plan.train_gpus, plan.train.config, layout, bounds, 0.0, "oracle")
        configs.setdefault((config.train_gpus, config.train_config, layout, bounds), config)

    def plan_ahead(self, batches: list[list[SimTrajectory]]) -> None:
        # per step, per candidate: (config, its rollout of the batch, training of the batch); the
        # rollouts are independent (each routed on its own batch's true lengths): half on a second core
        candidates = [(k, config) for k, batch in enumerate(batches) for config in self._candidates(batch)]
        rollouts = iter(forked_map(lambda job: System.rollout(self, job[0], job[1], batches[job[0]]), candidates))
        steps: list[list[tuple[StepConfig, RolloutResult, float, TrainConfig]]] = [[] for _ in batches]
        for k, config in candidates:
            train_s, train_config = train_seconds(self.cost, config.train_config, config.train_gpus, batches[k],
                                                  self.planner_settings)
            steps[k].append((config, next(rollouts), train_s, train_config))
        # best[c]: (time of the run so far ending with candidate c, the choices)
        best = [(o[1].makespan_s, [i]) for i, o in enumerate(steps[0])]
        for before, options in zip(steps, steps[1:], strict=False):
            nxt = []
            for c, (_, rollout, _, _) in enumerate(options):
                times = []
                for p, (_, _, train_s, train_config) in enumerate(before):
                    trained_s, _ = with_hybrids(self.cost, train_s, train_config, rollout.hybrid_released_s)
                    times.append(best[p][0] + max(rollout.makespan_s, trained_s))
                p = min(range(len(times)), key=times.__getitem__)
                nxt.append((times[p], best[p][1] + [c]))
            best = nxt
        final = min(range(len(best)), key=lambda c: best[c][0] + steps[-1][c][2])
        chosen = [steps[k][c] for k, c in enumerate(best[final][1])]
        self.schedule = [config for config, _, _, _ in chosen]
        self.planned = [rollout for _, rollout, _, _ in chosen]

    def rollout(self, step, config, batch, resume=None, close=None):
        if close is None and step < len(self.schedule) and config is self.schedule[step]:
            return self.planned[step]  # already run by plan_ahead (routing is exact)
        return super().rollout(step, config, batch, resume, close)

    def configure(self, step, previous, upcoming, times):
        if step >= len(self.schedule):  # not planned ahead: the cost model's best plan for this batch
            self.config = self._candidates(upcoming)[0]
        else:
            self.config = self.schedule[step]
        return self.config

    def router(self, config, upcoming):
        truth = {t.trajectory_id: path_of(t).remaining_at_decisions for t in upcoming}
        self._router = Oracle(Buckets(config.bounds), truth, measure="total")
        return self._router


def make_system(name: str, cost: CostModel, planner: PlannerSettings, trigger: TriggerSettings,
                mode: RolloutMode | None = None, group_size: int = 1) -> System:
    planned = {
        "+planner": dict(uniform=True, router="least-load", hybrids=False),
        "+hetero-tp": dict(uniform=False, router="mlfq", hybrids=False),
        "+cmlfq": dict(uniform=False, router="libra", hybrids=False),
        "libra": dict(uniform=False, router="libra", hybrids=True),
        "areal-static-optimal": dict(uniform=True, router="least-load", hybrids=False, frozen=True),
    }
    if name in planned:
        return Planned(cost, planner, trigger, mode, group_size, name=name, **planned[name])
    simple = {"verl-colocated": VerlColocated, "static-uniform": StaticUniform, "greedy-heuristic": GreedyHeuristic,
              "oracle": OracleSystem}
    if name not in simple:
        raise ValueError(f"unknown system {name!r}")
    return simple[name](cost, planner, trigger, mode, group_size)
