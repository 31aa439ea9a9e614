"""The planner's view of a workload: one RL step's trajectories summarised into length buckets.

Buckets are ordered by length; each carries the counts and token means the cost model needs, plus
the longest trajectory in it (its KV footprint decides which instances may serve the bucket, and its
own decode time is a floor on any rollout). Built from trajectory records, whether they come from
the store, a trace file or the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from libra.errors import LibraError
from libra.types import Trajectory


@dataclass(frozen=True)
class TrajectoryLength:
    """What the planner needs of one trajectory."""

    prompt_tokens: int
    gen_tokens: int
    payload_tokens: int  # tool results appended to the context
    turns: int  # model generations
    tool_time_s: float = 0.0  # wall time spent in tools

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.gen_tokens + self.payload_tokens


@dataclass(frozen=True)
class LengthBucket:
    max_tokens: int  # longest trajectory in the bucket (total tokens)
    count: float  # trajectories per step in this bucket
    prompt_tokens: float  # means over the bucket's trajectories
    gen_tokens: float
    payload_tokens: float
    turns: float
    tool_time_s: float
    total_tokens_sq: float  # mean of total_tokens**2 (attention cost grows with it)
    longest_gen_tokens: int  # generated tokens of the longest trajectory
    longest_turns: int
    longest_tool_time_s: float
    # total tokens of the trajectory whose own time floors the bucket's rollout (0: the longest);
    # shorter under partial rollouts, which close before the longest trajectories end (`Workload.closing_at`)
    straggler_tokens: int = 0

    @property
    def total_tokens(self) -> float:
        return self.prompt_tokens + self.gen_tokens + self.payload_tokens

    @property
    def straggler_total_tokens(self) -> int:
        return self.straggler_tokens or self.max_tokens


@dataclass(frozen=True)
class Workload:
    buckets: tuple[LengthBucket, ...]  # sorted by max_tokens

    @property
    def trajectories(self) -> float:
        return sum(b.count for b in self.buckets)

    @property
    def tokens(self) -> float:
        """Total tokens of a step (what training processes)."""
        return sum(b.count * b.total_tokens for b in self.buckets)

    @property
    def max_tokens(self) -> int:
        return max(b.max_tokens for b in self.buckets)

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.trajectories

    def scaled(self, factor: float) -> Workload:
        """The same shape with every length multiplied by `factor` (for drift and what-if studies)."""
        return Workload(tuple(
            LengthBucket(
                max(1, round(b.max_tokens * factor)), b.count, b.prompt_tokens * factor, b.gen_tokens * factor,
                b.payload_tokens * factor, b.turns, b.tool_time_s, b.total_tokens_sq * factor**2,
                max(1, round(b.longest_gen_tokens * factor)), b.longest_turns, b.longest_tool_time_s,
                round(b.straggler_tokens * factor),
            )
            for b in self.buckets
        ))

    def closing_at(self, close: TrajectoryLength) -> Workload:
        """The workload as a partial rollout runs it: the batch closes when `close` ends (the
        trajectories longer than it are suspended and continued in a later step), so no bucket's
        rollout waits for a trajectory longer than `close`. Counts, means and the longest
        trajectory's KV footprint (which instances may serve a bucket) are unchanged."""
        return Workload(tuple(
            replace(b, longest_gen_tokens=close.gen_tokens, longest_turns=close.turns,
                    longest_tool_time_s=close.tool_time_s, straggler_tokens=close.total_tokens)
            if close.total_tokens < b.straggler_total_tokens else b
            for b in self.buckets
        ))


def close_quantile(group_size: int, overprovision: float, groups: int) -> float:
    """Where a partial rollout closes, in the steady state of a run, in the distribution of
    trajectory lengths. A step keeps `overprovision` (o) x k groups in flight, k = `groups` being
    the batch's: the (o - 1) x k it carried, which had a step's head start and complete first, and
    k fresh ones. So the batch closes once (2 - o) x k of the fresh groups are complete (at least
    one of them). A group is complete when its slowest sample is, and P(the slowest of G samples
    <= x) = F(x)^G, so F(x) = (2 - o)^(1 / G) (0.958 for 16 samples at 1.5x): the close is about
    that quantile trajectory's end.

    Taken as given: every carried group completes before the fresh ones that close the batch (most
    do, not all), which puts the close a little early; a group's samples are independent, which
    puts it a little late when they are alike. The first step carries nothing and closes later, at
    F(x) = (1 / o)^(1 / G); a plan is made for the steps after it."""
    if group_size < 1 or overprovision < 1 or groups < 1:
        raise ValueError(f"group_size, groups >= 1 and overprovision >= 1, got {group_size}, {groups} and {overprovision}")
    fresh = max(2.0 - overprovision, 1.0 / groups)
    return fresh ** (1.0 / group_size)


def close_of(trajectories: Sequence[TrajectoryLength], quantile: float) -> TrajectoryLength:
    """The trajectory at `quantile` of total tokens (`close_quantile`)."""
    if not trajectories:
        raise LibraError("no trajectories to find a partial rollout's close in")
    ordered = sorted(trajectories, key=lambda t: (t.total_tokens, t.gen_tokens))
    return ordered[min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))]


def lengths_from_rows(rows: Sequence[dict]) -> list[TrajectoryLength]:
    """Rows with prompt_tokens, gen_tokens, tool_payload_tokens, num_turns and optionally
    tool_time_s (the store's `trajectory_lengths` query) -> planner records."""
    return [
        TrajectoryLength(int(r["prompt_tokens"]), int(r["gen_tokens"]), int(r["tool_payload_tokens"]),
                         int(r["num_turns"]), float(r.get("tool_time_s") or 0.0))
        for r in rows
    ]


def lengths_from_trajectories(trajectories: Sequence[Trajectory]) -> list[TrajectoryLength]:
    """Trace or rollout trajectories -> planner records (no tool timing in traces)."""
    return [TrajectoryLength(t.prompt_tokens, t.gen_tokens, t.tool_payload_tokens, len(t.turns)) for t in trajectories]


def geometric_bounds(max_tokens: int, smallest: int = 512, ratio: float = 2.0, limit: int = 12) -> list[int]:
    """Bucket upper bounds smallest, smallest*ratio, ... covering `max_tokens` (at most `limit`)."""
    bounds = [smallest]
    while bounds[-1] < max_tokens and len(bounds) < limit:
        bounds.append(int(bounds[-1] * ratio))
    bounds[-1] = max(bounds[-1], max_tokens)
    return bounds


def build_workload(
    trajectories: Sequence[TrajectoryLength], batch_trajectories: int | None = None, bounds: Sequence[int] | None = None
) -> Workload:
    """Bucket trajectories by total tokens. With `batch_trajectories`, counts are rescaled so the
    step has that many trajectories (the shape of the sample, the size of a real step)."""
    if not trajectories:
        raise LibraError("no trajectories to plan for: import a trace or run some steps first")
    longest = max(t.total_tokens for t in trajectories)
    edges = sorted(bounds) if bounds else geometric_bounds(longest)
    if edges[-1] < longest:
        edges = [*edges, longest]
    scale = (batch_trajectories / len(trajectories)) if batch_trajectories else 1.0
    groups: list[list[TrajectoryLength]] = [[] for _ in edges]
    for t in trajectories:
        groups[_bucket_index(edges, t.total_tokens)].append(t)
    buckets = []
    for members in groups:
        if not members:
            continue
        n = len(members)
        top = max(members, key=lambda t: (t.total_tokens, t.gen_tokens))
        buckets.append(LengthBucket(
            max_tokens=top.total_tokens,
            count=n * scale,
            prompt_tokens=sum(t.prompt_tokens for t in members) / n,
            gen_tokens=sum(t.gen_tokens for t in members) / n,
            payload_tokens=sum(t.payload_tokens for t in members) / n,
            turns=sum(t.turns for t in members) / n,
            tool_time_s=sum(t.tool_time_s for t in members) / n,
            total_tokens_sq=sum(t.total_tokens**2 for t in members) / n,
            longest_gen_tokens=top.gen_tokens,
            longest_turns=top.turns,
            longest_tool_time_s=top.tool_time_s,
        ))
    return Workload(tuple(buckets))


def _bucket_index(edges: Sequence[int], tokens: int) -> int:
    lo, hi = 0, len(edges) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if tokens <= edges[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def uniform_workload(trajectories: int, prompt_tokens: int, gen_tokens: int, payload_tokens: int = 0,
                     turns: int = 1, tool_time_s: float = 0.0) -> Workload:
    """Every trajectory the same length: the workload of scaling studies."""
    total = prompt_tokens + gen_tokens + payload_tokens
    return Workload((LengthBucket(total, float(trajectories), prompt_tokens, gen_tokens, payload_tokens, turns,
                                  tool_time_s, float(total) ** 2, gen_tokens, turns, tool_time_s),))


