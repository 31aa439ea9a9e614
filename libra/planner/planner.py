"""The global plan: how many GPUs train, roll out and float (hybrid), minimising iteration time.

    one_step_off:  T_iter = max(T_rollout, T_train) + T_sync   (rollout of step k+1 overlaps training of step k)
    sync:          T_iter = T_rollout + T_train + T_sync
    colocated:     every GPU rolls out, then every GPU trains: T_rollout(N) + T_train(N) + T_sync + offload

Hybrid GPUs time-share: a fraction x of the iteration in rollout, the rest in training, paying
`hybrid_switch_s` once per iteration. Their contribution is modelled fluidly: a stage's time at a
fractional GPU count interpolates its throughput between the two neighbouring whole counts.
T_train(n) and T_rollout(n) are the best times using at most n GPUs, so both are non-increasing.

The search visits splits at `granularity` GPUs (1 up to 64 GPUs, else a node); for each hybrid size
and share it finds the train/rollout crossing by bisection (one_step_off) or scans every split
(sync), with training and rollout solutions cached per GPU count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import Field

from libra.clock import Clock
from libra.errors import LibraError
from libra.planner.cost_model import CostModel, TrainEstimate
from libra.planner.rollout_search import INFEASIBLE, GroupTimes, RolloutLayout, RolloutSearch
from libra.planner.settings import Settings
from libra.planner.training_search import TrainingTable
from libra.planner.workload import Workload

Mode = Literal["one_step_off", "sync", "colocated"]
PlanProgress = Callable[[int, int], None]  # told (pools searched, pools) as the search goes


class SearchDials(Settings):
    """The search's dials a config sets: `planner.mode` .. `planner.granularity`."""

    mode: Mode = Field("one_step_off", description="pipelining the plan assumes: one_step_off overlaps rollout k+1 "
                       "with training k (a config's planner.mode is the one `libra plan` plans for; a training run's is "
                       "trainer.pipeline, or placement.strategy colocated)")
    max_hybrid_fraction: float = Field(0.25, ge=0.0, le=1.0, description="largest share of GPUs in the hybrid pool")
    hybrid_shares: int = Field(4, ge=2, le=64, description="rollout share of hybrids searched on 1/k .. (k-1)/k")
    hybrid_switch_s: float = Field(10.0, ge=0.0, le=3600.0, description="a hybrid's join + leave per iteration")
    granularity: int = Field(0, ge=0, le=1024, description="split step in GPUs (0 = 1 up to 64 GPUs, else a node)")


class PlannerSettings(SearchDials):
    """The search's settings: its dials, and what callers set in code (`PlannerSettings.of(config.planner)`
    takes the dials from a config)."""

    offload_s: float = Field(20.0, ge=0.0, description="colocated mode: offload/onload between stages per iteration")
    rollout_tps: tuple[int, ...] = Field((1, 2, 4, 8), description="instance sizes the rollout layout may use")


@dataclass(frozen=True)
class SearchStats:
    splits: int  # (train, rollout, hybrid, share) points evaluated
    train_enumerated: int
    train_memory_pruned: int
    train_costed: int
    rollout_solves: int  # rollout GPU counts solved
    rollout_dp_evaluations: int
    rollout_group_evaluations: int


@dataclass(frozen=True)
class Plan:
    train: TrainEstimate | None
    train_gpus: int  # core training pool
    rollout: RolloutLayout
    rollout_gpus: int  # core rollout pool
    hybrid_gpus: int
    hybrid_rollout_share: float  # fraction of the iteration hybrids spend in rollout
    t_train_s: float
    t_rollout_s: float
    t_sync_s: float
    t_iter_s: float
    mode: Mode
    search_ms: float = 0.0
    stats: SearchStats | None = field(default=None, compare=False)
    idle_gpus: int = 0  # GPUs neither pool can use without a longer iteration, counted in neither

    @property
    def gpus(self) -> int:
        return self.train_gpus + self.rollout_gpus + self.hybrid_gpus


def _fractional(time_at: Callable[[int], float], gpus: float) -> float:
    """Time at a fractional GPU count: throughput (1/time) interpolated between whole counts."""
    lo = math.floor(gpus)
    if lo == gpus:
        return time_at(lo)
    t_lo, t_hi = time_at(lo), time_at(lo + 1)
    if math.isinf(t_lo) or math.isinf(t_hi):  # no credit for a fraction of a pool that cannot run at all
        return math.inf
    rate = (1 / t_lo) * (lo + 1 - gpus) + (1 / t_hi) * (gpus - lo)
    return 1 / rate


class Planner:
    """Plans for one (cost model, workload). Reuses its caches across calls with other settings."""

    def __init__(self, cost: CostModel, workload: Workload, settings: PlannerSettings | None = None,
                 training: TrainingTable | None = None, group_times: GroupTimes | None = None) -> None:
        """`training`: a table of training configurations for the same cost model and workload to
        share (planners that differ only in their rollout settings search training once);
        `group_times`: the same for the rollout search's instance groups."""
        self.cost = cost
        self.workload = workload
        self.settings = settings or PlannerSettings()
        if training is not None and (training.cost is not cost or training.workload is not workload):
            raise ValueError("a shared training table must be for the same cost model and workload")
        self.training = training or TrainingTable(cost, workload)
        self.rollout_search = RolloutSearch(cost, workload, self.settings.rollout_tps, group_times)
        self._rollout: dict[int, RolloutLayout] = {}

    # cached per-count solutions ---------------------------------------------------------------
    def rollout(self, gpus: int) -> RolloutLayout:
        if gpus not in self._rollout:
            self._rollout[gpus] = self.rollout_search.solve(gpus) if gpus > 0 else INFEASIBLE
        return self._rollout[gpus]

    def t_rollout(self, gpus: int) -> float:
        return self.rollout(gpus).seconds

    def t_train(self, gpus: int) -> float:
        best = self.training.best(gpus)
        return math.inf if best is None else best.seconds

    # the objective (`iteration_seconds`) -----------------------------------------------------------
    def iteration_time(self, train_gpus: int, rollout_gpus: int, hybrid_gpus: int, share: float) -> tuple[float, float, float]:
        """(T_iter, T_train, T_rollout) of a split; hybrids spend `share` of their time in rollout."""
        s = self.settings
        sync = self.cost.weight_sync_s()
        if s.mode == "colocated":
            gpus = train_gpus + rollout_gpus + hybrid_gpus
            t_train, t_rollout = self.t_train(gpus), self.t_rollout(gpus)
            return iteration_seconds(s, t_rollout, t_train, sync), t_train, t_rollout
        core_train, core_rollout = self.t_train(train_gpus), self.t_rollout(rollout_gpus)
        if math.isinf(core_train) or math.isinf(core_rollout):
            return math.inf, core_train, core_rollout  # hybrids extend a core pool that must work on its own
        t_rollout = _fractional(self.t_rollout, rollout_gpus + share * hybrid_gpus)
        t_train = _fractional(self.t_train, train_gpus + (1 - share) * hybrid_gpus)
        return iteration_seconds(s, t_rollout, t_train, sync, hybrid_gpus, share), t_train, t_rollout

    def granularity(self) -> int:
        if self.settings.granularity:
            return self.settings.granularity
        return 1 if self.cost.cluster.gpus <= 64 else self.cost.cluster.gpus_per_node

    def hybrid_sizes(self) -> list[int]:
        total, step = self.cost.cluster.gpus, self.granularity()
        limit = int(total * self.settings.max_hybrid_fraction)
        return [h for h in range(0, limit + 1, step)]

    def shares(self) -> list[float]:
        """Interior shares only: a hybrid that never switches is simply a core GPU."""
        k = self.settings.hybrid_shares
        return [i / k for i in range(1, k)]

    # the search ------------------------------------------------------------------------------
    def plan(self, clock: Clock | None = None, progress: PlanProgress | None = None) -> Plan:
        """The best plan the search finds; `progress` hears (pools searched, pools) after each
        hybrid pool and rollout share (a large cluster's search takes minutes)."""
        start = clock.now() if clock else 0.0
        total = self.cost.cluster.gpus
        best: tuple[float, float, int, int, float] | None = None  # (T_iter, T_train + T_rollout, train, hybrid, share)
        splits = 0
        if self.settings.mode == "colocated":
            t_iter, t_train, t_rollout = self.iteration_time(total, 0, 0, 0.0)
            best = (t_iter, t_train + t_rollout, total, 0, 0.0)
            splits = 1
        else:
            pools = [(hybrid, share) for hybrid in self.hybrid_sizes() for share in (self.shares() if hybrid else [0.0])]
            for searched, (hybrid, share) in enumerate(pools, 1):
                core = total - hybrid
                for candidate in self._train_candidates(core, hybrid, share):
                    train = self._used(candidate)  # what training leaves of its pool goes to rollout
                    splits += 1
                    t_iter, t_train, t_rollout = self.iteration_time(train, core - train, hybrid, share)
                    key = (t_iter, t_train + t_rollout, train, hybrid, share)
                    if best is None or key < best:
                        best = key
                if progress is not None:
                    progress(searched, len(pools))
        if best is None:
            raise LibraError(
                f"no train/rollout split of {total} GPUs at a granularity of {self.granularity()} GPUs; "
                "use mode colocated, more GPUs or a finer granularity"
            )
        return self._build(best, clock, start, splits)

    def plan_at(self, train: int, hybrid: int = 0, share: float = 0.0) -> Plan:
        """The plan for a given split (training GPUs, hybrid GPUs and their rollout share)."""
        if not 0 < train < self.cost.cluster.gpus - hybrid:
            raise LibraError(f"a split needs 1 to {self.cost.cluster.gpus - hybrid - 1} training GPUs, got {train}")
        t_iter, t_train, t_rollout = self.iteration_time(train, self.cost.cluster.gpus - train - hybrid, hybrid, share)
        return self._build((t_iter, t_train + t_rollout, train, hybrid, share), None, 0.0, 1)

    def _used(self, train: int) -> int:
        """The GPUs the best training configuration on `train` GPUs uses (fewer where that is faster:
        the rest then roll out rather than idle)."""
        best = self.training.best(train)
        return train if best is None else best.config.gpus

    def _train_candidates(self, core: int, hybrid: int, share: float) -> list[int]:
        """Train-pool sizes to evaluate: every multiple of the granularity (sync), or the two around
        the point where training stops being slower than rollout (one_step_off, found by bisection)."""
        step = self.granularity()
        counts = list(range(step, core, step))
        if self.settings.mode == "sync" or not counts:
            return counts

        def train_slower(index: int) -> bool:
            train = counts[index]
            _, t_train, t_rollout = self.iteration_time(train, core - train, hybrid, share)
            return t_train > t_rollout

        lo, hi = 0, len(counts)  # first index where training is no longer slower
        while lo < hi:
            mid = (lo + hi) // 2
            if train_slower(mid):
                lo = mid + 1
            else:
                hi = mid
        return sorted({counts[i] for i in (lo - 1, lo) if 0 <= i < len(counts)})

    def _build(self, best: tuple[float, float, int, int, float], clock: Clock | None, start: float, splits: int) -> Plan:
        t_iter, _, train, hybrid, share = best
        rollout = self.cost.cluster.gpus - train - hybrid
        _, t_train, t_rollout = self.iteration_time(train, rollout, hybrid, share)
        colocated = self.settings.mode == "colocated"
        train_estimate = self.training.best(train)
        layout = self.rollout(train if colocated else rollout)
        idle = 0 if colocated else rollout - layout.gpus
        if idle and not hybrid:  # GPUs no rollout instance can use: training takes them where it can, at no loss
            whole = self.training.exact(train + idle)
            if whole is not None:
                t_whole = iteration_seconds(self.settings, layout.seconds, whole.seconds, self.cost.weight_sync_s())
                if t_whole <= t_iter * (1 + 1e-12):
                    train, rollout, train_estimate, t_train, t_iter = train + idle, rollout - idle, whole, whole.seconds, t_whole
                    idle = 0
        rollout -= idle  # what is left idle is counted in neither pool
        stats = SearchStats(
            splits, self.training.stats.enumerated, self.training.stats.memory_pruned, self.training.stats.costed,
            len(self._rollout), self.rollout_search.dp_evaluations, self.rollout_search.group_evaluations,
        )
        elapsed_ms = (clock.now() - start) * 1000 if clock else 0.0
        return Plan(
            train=train_estimate, train_gpus=train, rollout=layout, rollout_gpus=0 if colocated else rollout,
            hybrid_gpus=hybrid, hybrid_rollout_share=share, t_train_s=t_train, t_rollout_s=t_rollout,
            t_sync_s=self.cost.weight_sync_s(), t_iter_s=t_iter, mode=self.settings.mode, search_ms=elapsed_ms,
            stats=stats, idle_gpus=idle,
        )


def iteration_seconds(settings: PlannerSettings, t_rollout: float, t_train: float, sync: float, hybrid_gpus: int = 0,
                      share: float = 0.0) -> float:
    """An iteration's time from its stages': colocated and sync run rollout and training one after the
    other (colocated also offloads between them), one-step-off side by side; then the weight sync, and
    the hybrids' switches where `hybrid_gpus` spend a `share` of their time in rollout."""
    if settings.mode == "colocated":
        return t_rollout + t_train + sync + settings.offload_s
    switch = settings.hybrid_switch_s if hybrid_gpus and 0 < share < 1 else 0.0
    if settings.mode == "sync":
        return t_rollout + t_train + sync + switch
    return max(t_rollout, t_train) + sync + switch


def plan(cost: CostModel, workload: Workload, settings: PlannerSettings | None = None, clock: Clock | None = None) -> Plan:
    return Planner(cost, workload, settings).plan(clock)


def evaluate(planner: Planner, current: Plan) -> float:
    """T_iter of an existing plan on the planner's (new) workload: the same split, the same training
    configuration and the same instances, with buckets re-assigned to the instance groups."""
    return recost(planner, current).t_iter_s


def recost(planner: Planner, current: Plan) -> Plan:
    """`current` with its stage times and T_iter costed on the planner's (new) workload (`evaluate`);
    every time infinite when its training no longer fits memory."""
    cost, workload, settings = planner.cost, planner.workload, planner.settings
    if current.train is None or (cost.train_memory_bytes(current.train.config, workload.max_tokens)
                                 > cost.train_memory_limit_bytes()):
        return replace(current, t_rollout_s=math.inf, t_train_s=math.inf, t_iter_s=math.inf)
    config = current.train.config
    base_train = cost.train_time(config, workload).seconds
    base_rollout = fixed_layout_time(cost, workload, current.rollout.instance_counts)
    sync = cost.weight_sync_s()
    settings = settings.model_copy(update={"mode": current.mode})  # the plan's own mode
    if current.mode == "colocated":
        return replace(current, t_rollout_s=base_rollout, t_train_s=base_train,
                       t_iter_s=iteration_seconds(settings, base_rollout, base_train, sync))
    # hybrids speed each stage up by the factor the plan's own search credited them with
    share, hybrid = current.hybrid_rollout_share, current.hybrid_gpus
    t_train = base_train * current.t_train_s / current.train.seconds
    t_rollout = base_rollout * current.t_rollout_s / current.rollout.seconds
    return replace(current, t_rollout_s=t_rollout, t_train_s=t_train,
                   t_iter_s=iteration_seconds(settings, t_rollout, t_train, sync, hybrid, share))


def fixed_layout_time(cost: CostModel, workload: Workload, counts: dict[int, int]) -> float:
    """Makespan of fixed instance counts per TP, with the sorted buckets assigned to the groups in
    increasing TP order by dynamic programming (min over splits of the max group time)."""
    groups = sorted((tp, c) for tp, c in counts.items() if c > 0)
    buckets = workload.buckets
    n = len(buckets)
    # best[i]: smallest makespan covering buckets[0:i] with the groups seen so far
    best = [0.0] + [math.inf] * n
    for tp, count in groups:
        new = list(best)
        for i in range(1, n + 1):
            for j in range(i):
                if best[j] < math.inf:
                    new[i] = min(new[i], max(best[j], cost.group_time(tp, count, buckets[j:i])))
        best = new
    return best[n]
