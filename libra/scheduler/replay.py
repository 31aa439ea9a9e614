"""Replaying a per-turn trace through routers in RL order, and scoring their decisions.

Order: a step takes `prompts_per_step` prompts with all their samples (file order); `epochs:N`
visits the whole prompt set N times, as multi-epoch training does (a revisited prompt replays its
recorded trajectories). A step's finished trajectories become visible to the routers only when the
step ends. The first `warmup_fraction` of steps only teaches the routers; decisions are scored from
then on. A decision happens at a trajectory's start and at each tool return that is followed by
another turn; its truth is the remaining length from there (tokens generated or received after it).
A migration (bucket change at a return) re-prefills the whole context so far.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from libra.config import SchedulerConfig
from libra.errors import LibraError
from libra.scheduler.causal_tree import CausalTree, TrajectoryPath, path_from_turns
from libra.scheduler.keys import KeyScheme
from libra.scheduler.metrics import (
    DecisionRecord,
    accuracy,
    balanced_accuracy,
    quantile,
    rank_correlation,
)
from libra.scheduler.policies import (
    CMLFQ,
    MLFQ,
    AlwaysShortest,
    Buckets,
    LeastLoad,
    LengthPredictor,
    LibraRouter,
    Oracle,
    Router,
)
from libra.traces import group_by_step
from libra.types import Trajectory

POLICIES = ("libra", "cmlfq", "mlfq", "predictor", "predictor-repredict", "least-load", "always-shortest", "oracle")


def path_of(trajectory: Trajectory) -> TrajectoryPath:
    """The tree's view of a trajectory: remaining tokens at its start and after each tool return
    that is followed by another turn."""
    return path_from_turns(trajectory.prompt_id, trajectory.prompt_tokens, [
        (t.gen_tokens, t.tool_name, t.tool_payload_tokens, t.tool_status.value) for t in trajectory.turns])


def parse_order(order: str) -> int:
    """`group` -> 1 epoch; `epochs:N` -> N epochs."""
    if order == "group":
        return 1
    if order.startswith("epochs:"):
        try:
            epochs = int(order.split(":", 1)[1])
        except ValueError:
            epochs = 0
        if epochs >= 1:
            return epochs
    raise LibraError(f"order {order!r}: use 'group' or 'epochs:N' with N >= 1")


def rl_steps(trajectories: Sequence[Trajectory], prompts_per_step: int, epochs: int) -> list[list[Trajectory]]:
    one_epoch = list(group_by_step(trajectories, prompts_per_step).values())
    return [step for _ in range(epochs) for step in one_epoch]


def auto_buckets(warmup: Sequence[Trajectory]) -> Buckets:
    """Bounds at the p50 and p90 of the warm-up trajectories' lengths after the prompt."""
    lengths = sorted(t.gen_tokens + t.tool_payload_tokens for t in warmup)
    p50, p90 = quantile(lengths, 0.5), quantile(lengths, 0.9)
    bounds = sorted({max(1, int(p50)), max(2, int(p90))})
    return Buckets(tuple(bounds))


def make_router(name: str, buckets: Buckets, truth: dict[str, list[int]], settings: SchedulerConfig | None = None) -> Router:
    s = settings or SchedulerConfig()
    scheme = KeyScheme("fine", tuple(s.payload_bounds))
    factories: dict[str, Callable[[], Router]] = {
        "libra": lambda: LibraRouter(buckets, min_support=s.min_support, payoff=s.payoff,
                                     payload_bounds=tuple(s.payload_bounds), window=s.window, max_nodes=s.max_nodes),
        "cmlfq": lambda: CMLFQ(buckets, CausalTree(scheme, s.window, s.max_nodes)),
        "mlfq": lambda: MLFQ(buckets),
        "predictor": lambda: LengthPredictor(buckets),
        "predictor-repredict": lambda: LengthPredictor(buckets, repredict=True),
        "least-load": lambda: LeastLoad(buckets),
        "always-shortest": lambda: AlwaysShortest(buckets),
        "oracle": lambda: Oracle(buckets, truth),
    }
    if name not in factories:
        raise LibraError(f"unknown router {name!r}; routers: {', '.join(factories)}")
    return factories[name]()


@dataclass(frozen=True)
class PolicyResult:
    accuracy: float
    balanced_accuracy: float
    rank_correlation: float | None
    migrated_token_ratio: float
    decisions: int
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class ReplayResult:
    buckets: tuple[int, ...]
    steps: int
    warmup_steps: int
    policies: dict[str, PolicyResult]


def replay(
    trajectories: Sequence[Trajectory],
    *,
    prompts_per_step: int = 8,
    order: str = "group",
    bounds: Sequence[int] | None = None,
    policies: Sequence[str] = POLICIES,
    settings: SchedulerConfig | None = None,
    timer: Callable[[], int] | None = None,
) -> ReplayResult:
    """Replay `trajectories` through each router; `timer` (nanoseconds) measures decision latency."""
    settings = settings or SchedulerConfig()
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise LibraError(f"unknown router(s) {', '.join(unknown)}; routers: {', '.join(POLICIES)}")
    steps = rl_steps(trajectories, prompts_per_step, parse_order(order))
    warmup = math.ceil(len(steps) * settings.warmup_fraction)
    if warmup >= len(steps):
        raise LibraError(f"{len(steps)} steps leave none after warm-up; use fewer prompts per step or more epochs")
    buckets = Buckets(tuple(bounds)) if bounds else auto_buckets([t for s in steps[:warmup] for t in s])
    results = {}
    for name in policies:
        records = _run(name, steps, warmup, buckets, settings, timer)
        total_tokens = sum(t.total_tokens for s in steps[warmup:] for t in s)
        latencies = [r.latency_ns / 1000 for r in records]
        results[name] = PolicyResult(
            accuracy=accuracy(records),
            balanced_accuracy=balanced_accuracy(records, buckets.count),
            rank_correlation=rank_correlation(records),
            migrated_token_ratio=sum(r.migrated_tokens for r in records) / total_tokens,
            decisions=len(records),
            p50_us=quantile(latencies, 0.5) if timer else math.nan,
            p99_us=quantile(latencies, 0.99) if timer else math.nan,
        )
    return ReplayResult(buckets.bounds, len(steps), warmup, results)


def _run(name: str, steps: list[list[Trajectory]], warmup: int, buckets: Buckets, settings: SchedulerConfig,
         timer: Callable[[], int] | None) -> list[DecisionRecord]:
    records: list[DecisionRecord] = []
    clock = timer or (lambda: 0)
    truth: dict[str, list[int]] = {}
    router: Router | None = None
    for index, step in enumerate(steps):
        ids = [f"{index}/{t.trajectory_id}" for t in step]
        paths = [path_of(t) for t in step]
        for tid, path in zip(ids, paths, strict=True):
            truth[tid] = path.remaining_at_decisions
        if router is None:
            router = make_router(name, buckets, truth, settings)
        scored = index >= warmup
        # every trajectory of a step starts before any finishes (they run concurrently)
        buckets_now: dict[str, int] = {}
        for tid, trajectory, path in zip(ids, step, paths, strict=True):
            before = clock()
            decision = router.start(tid, trajectory.prompt_id, trajectory.prompt_tokens)
            elapsed = clock() - before
            buckets_now[tid] = decision.bucket
            if scored:
                records.append(DecisionRecord(decision.bucket, buckets.of(path.start_remaining), decision.estimate,
                                              path.start_remaining, 0, elapsed))
        for tid, trajectory, path in zip(ids, step, paths, strict=True):
            position = trajectory.prompt_tokens
            for (ret, remaining), turn in zip(path.returns, trajectory.turns, strict=False):
                position += turn.gen_tokens + turn.tool_payload_tokens
                before = clock()
                decision = router.on_return(tid, ret, position)
                elapsed = clock() - before
                migrated = position if decision.bucket != buckets_now[tid] else 0
                buckets_now[tid] = decision.bucket
                if scored:
                    records.append(DecisionRecord(decision.bucket, buckets.of(remaining), decision.estimate,
                                                  remaining, migrated, elapsed))
        for tid in ids:
            router.finish(tid)
        router.observe_step(paths, {t.prompt_id: t.prompt_tokens for t in step})
    return records
