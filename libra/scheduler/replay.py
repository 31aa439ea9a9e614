"""Replaying a per-turn trace through routers in RL order, and scoring their decisions.

Order: a step takes `prompts_per_step` prompts with all their samples (file order); `epochs:N`
visits the whole prompt set N times, as multi-epoch training does (a revisited prompt replays its
recorded trajectories). A step's finished trajectories become visible to the routers only when the
step ends. The first `warmup_fraction` of steps only teaches the routers; decisions are scored from
then on. A decision happens at a trajectory's start and at each tool return that is followed by
another turn; its truth is the remaining length from there (tokens generated or received after it).
Within a step the trajectories run concurrently: their returns and ends are replayed in token time
(tokens since the trajectory's start), interleaved across trajectories.
A migration (bucket change at a return) re-prefills the whole context so far.

Libra's router keeps its migrations within a budget (`scheduler.migration_budget`, 7% of tokens by
default); `libra-tree` is that router without its prompt-length model (the ablation); `NAME@budget`
runs a baseline under the same budget, and `clairvoyant_bound` is the best balanced accuracy that
any router within that budget could reach (it knows every length).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from libra.clock import Clock, SimClock
from libra.config import SchedulerConfig
from libra.errors import LibraError
from libra.scheduler.causal_tree import CausalTree, path_of
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.libra_router import LibraRouter
from libra.scheduler.metrics import (
    DecisionRecord,
    accuracy,
    balanced_accuracy,
    quantile,
    rank_correlation,
)
from libra.scheduler.routers import (
    CMLFQ,
    MLFQ,
    AlwaysShortest,
    Buckets,
    Budgeted,
    Lane,
    LeastLatency,
    LeastLoad,
    LengthPredictor,
    Oracle,
    Router,
)
from libra.traces import group_by_step
from libra.types import Trajectory

ROUTERS = ("libra", "libra-tree", "cmlfq", "mlfq", "predictor", "predictor-repredict", "least-load", "always-shortest", "oracle",
            "cmlfq@budget", "mlfq@budget", "predictor-repredict@budget")
LIVE_ROUTERS = tuple(r for r in ROUTERS if r != "oracle")  # the oracle reads lengths no live run knows


def check_routers(names: Sequence[str], known: Sequence[str] = ROUTERS, setting: str = "router") -> None:
    """A LibraError naming the routers in `names` that are not `known` (`setting`: how the caller
    names the choice), with the ones there are."""
    unknown = [r for r in names if r not in known]
    if unknown:
        raise LibraError(f"{setting}: unknown router{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"routers: {', '.join(known)}")


def parse_order(order: str, name: str = "order") -> int:
    """`group` -> 1 epoch; `epochs:N` -> N epochs (`name`: the setting as the caller spells it)."""
    if order == "group":
        return 1
    if order.startswith("epochs:"):
        try:
            epochs = int(order.split(":", 1)[1])
        except ValueError:
            epochs = 0
        if epochs >= 1:
            return epochs
    raise LibraError(f"{name} {order!r}: use 'group' or 'epochs:N' with N >= 1")


def rl_steps(trajectories: Sequence[Trajectory], prompts_per_step: int, epochs: int) -> list[list[Trajectory]]:
    one_epoch = list(group_by_step(trajectories, prompts_per_step).values())
    return [step for _ in range(epochs) for step in one_epoch]


def auto_buckets(warmup: Sequence[Trajectory]) -> Buckets:
    """Bounds at the p50 and p90 of the warm-up trajectories' lengths after the prompt."""
    lengths = sorted(t.gen_tokens + t.tool_payload_tokens for t in warmup)
    p50, p90 = quantile(lengths, 0.5), quantile(lengths, 0.9)
    bounds = sorted({max(1, int(p50)), max(2, int(p90))})
    return Buckets(tuple(bounds))


def _need(lanes: Sequence[Lane] | None) -> Sequence[Lane]:
    assert lanes is not None
    return lanes


def make_router(name: str, buckets: Buckets, truth: Mapping[str, Sequence[int]], settings: SchedulerConfig | None = None,
                measure: str = "remaining", prior_shares: Sequence[float] | None = None,
                lanes: Sequence[Lane] | None = None) -> Router:
    """A router by name. `measure`: what the buckets are ranges of (`remaining` tokens, as traces
    are scored, or the `total` length, as the simulator and the planner size instance groups);
    `prior_shares`: the planned share of trajectories per bucket (Libra's router places
    trajectories it knows nothing about by them); `lanes`: the instances serving each bucket (Libra's
    router then routes for their makespan)."""
    s = settings or SchedulerConfig()
    scheme = KeyScheme("fine", tuple(s.payload_bounds))
    def libra(prompt_lengths: bool) -> Router:
        return LibraRouter(buckets, min_support=s.min_support, migration_budget=s.migration_budget,
                           payload_bounds=tuple(s.payload_bounds), window=s.window, max_nodes=s.max_nodes,
                           prompt_lengths=prompt_lengths, measure=measure, prior_shares=prior_shares, lanes=lanes)

    factories: dict[str, Callable[[], Router]] = {
        "libra": lambda: libra(True),
        "libra-tree": lambda: libra(False),  # ablation: the causal tree alone, no prompt-length model
        "cmlfq": lambda: CMLFQ(buckets, CausalTree(scheme, s.window, s.max_nodes), measure=measure),
        "mlfq": lambda: MLFQ(buckets, measure=measure),
        "predictor": lambda: LengthPredictor(buckets, measure=measure),
        "predictor-repredict": lambda: LengthPredictor(buckets, repredict=True, measure=measure),
        "least-load": lambda: LeastLoad(buckets, measure=measure),
        "least-latency": lambda: LeastLatency(buckets, _need(lanes), measure=measure),
        "always-shortest": lambda: AlwaysShortest(buckets, measure=measure),
        "oracle": lambda: Oracle(buckets, truth, measure=measure),
    }
    if name == "least-latency" and lanes is None:
        raise LibraError("router least-latency needs the instances serving each bucket (lanes); "
                         "it routes simulated or real instances, not a trace replay")
    base = name.removesuffix("@budget")
    if name.endswith("@budget") and base in factories and not base.startswith("libra"):
        return Budgeted(factories[base](), s.migration_budget)
    if name not in factories:
        raise LibraError(f"unknown router {name!r}; routers: {', '.join(factories)}")
    return factories[name]()


@dataclass(frozen=True)
class RouterResult:
    accuracy: float
    balanced_accuracy: float
    rank_correlation: float | None
    migrated_token_ratio: float
    decisions: int
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class Bound:
    """What a clairvoyant router within the migration budget can do on the scored decisions."""

    budget: float  # re-prefilled tokens / all tokens allowed
    balanced_accuracy: float  # no router within the budget scores higher (Lagrangian dual bound)
    achieved: float  # a clairvoyant schedule within the budget reaches this
    migrated_token_ratio: float  # what that schedule re-prefills


@dataclass(frozen=True)
class ReplayResult:
    buckets: tuple[int, ...]
    steps: int
    warmup_steps: int
    routers: dict[str, RouterResult]
    bound: Bound | None = None


def replay(
    trajectories: Sequence[Trajectory],
    *,
    prompts_per_step: int = 8,
    order: str = "group",
    bounds: Sequence[int] | None = None,
    routers: Sequence[str] = ROUTERS,
    settings: SchedulerConfig | None = None,
    clock: Clock | None = None,
    with_bound: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
) -> ReplayResult:
    """Replay `trajectories` through each router; `clock` (a `WallClock`) times each decision's latency;
    `with_bound=False` skips the clairvoyant bound; `progress` hears (router, steps replayed, steps)
    after each step."""
    settings = settings or SchedulerConfig()
    check_routers(routers)
    steps = rl_steps(trajectories, prompts_per_step, parse_order(order))
    warmup = math.ceil(len(steps) * settings.warmup_fraction)
    if warmup >= len(steps):
        raise LibraError(f"{len(steps)} steps leave none after warm-up; use fewer prompts per step or more epochs")
    if not warmup and not bounds:
        raise LibraError("scheduler.warmup_fraction 0 leaves no warm-up steps to set the buckets from; give the bucket "
                         "bounds (--buckets) or a warmup_fraction above 0")
    buckets = Buckets(tuple(bounds)) if bounds else auto_buckets([t for s in steps[:warmup] for t in s])
    results = {}
    for name in routers:
        records = _run(name, steps, warmup, buckets, settings, clock, progress)
        total_tokens = sum(t.total_tokens for s in steps[warmup:] for t in s)
        latencies = [r.latency_ns / 1000 for r in records]
        results[name] = RouterResult(
            accuracy=accuracy(records),
            balanced_accuracy=balanced_accuracy(records, buckets.count),
            rank_correlation=rank_correlation(records),
            migrated_token_ratio=sum(r.migrated_tokens for r in records) / total_tokens,
            decisions=len(records),
            p50_us=quantile(latencies, 0.5) if clock else math.nan,
            p99_us=quantile(latencies, 0.99) if clock else math.nan,
        )
    bound = (clairvoyant_bound([t for s in steps[warmup:] for t in s], buckets, settings.migration_budget)
             if with_bound else None)
    return ReplayResult(buckets.bounds, len(steps), warmup, results, bound)


def clairvoyant_bound(trajectories: Sequence[Trajectory], buckets: Buckets, budget: float) -> Bound:
    """The best balanced accuracy over `trajectories`' decisions of any routing that re-prefills at
    most `budget` of their tokens, knowing every remaining length.

    A decision's weight is 1 / (buckets that occur x decisions of its true bucket), so the weights of
    the right decisions sum to the balanced accuracy. For a price p on migrated tokens, a dynamic
    program over (decision, bucket) finds each trajectory's best schedule (the start is free, a move
    costs the context); S(p) - p (M(p) - budget) bounds every schedule within the budget from above
    (weak duality), and bisection on p finds a schedule within the budget that is nearly as good."""
    items, counts, total = [], [0] * buckets.count, 0
    for t in trajectories:
        path = path_of(t)
        truths = [buckets.of(r) for r in path.remaining_at_decisions]
        positions, position = [0], t.prompt_tokens
        for turn in t.turns[: len(truths) - 1]:
            position += turn.gen_tokens + turn.tool_payload_tokens
            positions.append(position)
        items.append((truths, positions))
        total += t.total_tokens
        for b in truths:
            counts[b] += 1
    present = sum(1 for c in counts if c)
    if not present or total == 0:
        return Bound(budget, math.nan, math.nan, 0.0)
    weight = [1 / (present * c) if c else 0.0 for c in counts]

    def solve(price: float) -> tuple[float, float]:
        score = migrated = 0.0
        for truths, positions in items:
            # per bucket: (objective, score, migrated share) of the best schedule ending there
            best = [(g, g, 0.0) for g in (weight[truths[0]] if b == truths[0] else 0.0 for b in range(buckets.count))]
            for truth, position in zip(truths[1:], positions[1:], strict=True):
                move = position / total
                stay_or_move = max(range(buckets.count), key=lambda a: best[a][0])
                nxt = []
                for b in range(buckets.count):
                    gain = weight[truth] if b == truth else 0.0
                    stay = best[b]
                    moved = best[stay_or_move]
                    if stay_or_move != b and moved[0] - price * move > stay[0]:
                        nxt.append((moved[0] - price * move + gain, moved[1] + gain, moved[2] + move))
                    else:
                        nxt.append((stay[0] + gain, stay[1] + gain, stay[2]))
                best = nxt
            _, s, m = max(best)
            score += s
            migrated += m
        return score, migrated

    # (price, (score, migrated share)): `high` always within the budget, `low` over it (or free)
    low, high = (0.0, solve(0.0)), (1.0, solve(1.0))
    while high[1][1] > budget:
        low, high = high, (high[0] * 4, solve(high[0] * 4))
    for _ in range(30):
        middle = (low[0] + high[0]) / 2
        found = (middle, solve(middle))
        if found[1][1] > budget:
            low = found
        else:
            high = found
    achieved, migrated = high[1]
    upper = min(s - p * (m - budget) for p, (s, m) in (low, high))
    return Bound(budget, min(1.0, upper), achieved, migrated)


def _run(name: str, steps: list[list[Trajectory]], warmup: int, buckets: Buckets, settings: SchedulerConfig,
         clock: Clock | None, progress: Callable[[str, int, int], None] | None = None) -> list[DecisionRecord]:
    records: list[DecisionRecord] = []
    watch = clock or SimClock()  # (no clock: every latency 0)
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
        # the step's trajectories run concurrently: all start, then their tool returns and ends
        # happen in token time (tokens generated or received since the start), interleaved
        buckets_now: dict[str, int] = {}
        events: list[tuple[int, int, int, str, ToolReturn | None, int, int]] = []
        for order, (tid, trajectory, path) in enumerate(zip(ids, step, paths, strict=True)):
            before = watch.now()
            decision = router.start(tid, trajectory.prompt_id, trajectory.prompt_tokens)
            elapsed = round((watch.now() - before) * 1e9)
            buckets_now[tid] = decision.bucket
            if scored:
                records.append(DecisionRecord(decision.bucket, buckets.of(path.start_remaining), decision.estimate,
                                              path.start_remaining, 0, elapsed))
            for ret, remaining in path.returns:
                spent = path.start_remaining - remaining
                events.append((spent, 0, order, tid, ret, trajectory.prompt_tokens + spent, remaining))
            events.append((path.start_remaining, 1, order, tid, None, trajectory.prompt_tokens + path.start_remaining, 0))  # its end
        for _, _, _, tid, ret, position, remaining in sorted(events, key=lambda e: e[:3]):
            if ret is None:
                router.finish(tid, position)
                continue
            before = watch.now()
            decision = router.on_return(tid, ret, position)
            elapsed = round((watch.now() - before) * 1e9)
            migrated = position if decision.bucket != buckets_now[tid] else 0
            buckets_now[tid] = decision.bucket
            if scored:
                records.append(DecisionRecord(decision.bucket, buckets.of(remaining), decision.estimate,
                                              remaining, migrated, elapsed))
        router.observe_step(paths, {t.prompt_id: t.prompt_tokens for t in step})
        if progress:
            progress(name, index + 1, len(steps))
    return records
