"""Rollout search: a heterogeneous layout of tensor-parallel instances for the rollout GPUs, and
which length buckets each instance group serves.

Space: instance groups of TP 1, 2, 4 and 8 (those whose weights fit), any number of instances each,
using at most the rollout GPUs; buckets, sorted by length, are split into contiguous ranges served
by groups in increasing TP order (longer trajectories go to larger instances, which hold more KV
cache and decode each sequence faster). A group is infeasible for a range if the range's longest
trajectory does not fit its KV cache. Makespan = the slowest group.

Solver: parametric search on the makespan T. For a given T, dynamic programming over the sorted
buckets gives the fewest GPUs that finish every bucket by T:

    need[k][i] = min( need[k-1][i],                                  TP type k unused
                      min_j need[k-1][j] + tp_k * instances(j..i, tp_k, T) )

where instances() is the fewest instances of TP tp_k whose group time for buckets j..i is <= T
(group time is non-increasing in the instance count, so it is found by bisection). The smallest T
with need <= GPUs is found by bisection on T; the layout is the DP's argmin at that T, and GPUs it
leaves unused go, one instance at a time, to the slowest group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from libra.planner.cost_model import CostModel
from libra.planner.workload import Workload

TP_CHOICES = (1, 2, 4, 8)
_REL_TOL = 1e-9


@dataclass(frozen=True)
class InstanceGroup:
    tp: int
    count: int  # instances
    first_bucket: int  # index into the workload's buckets (inclusive)
    last_bucket: int  # inclusive
    max_tokens: int  # longest trajectory this group serves
    seconds: float  # the group's makespan

    @property
    def gpus(self) -> int:
        return self.tp * self.count


@dataclass(frozen=True)
class RolloutLayout:
    groups: tuple[InstanceGroup, ...]  # in bucket order
    seconds: float  # makespan (inf if the workload cannot be served)

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def instance_counts(self) -> dict[int, int]:
        """Instances per TP size."""
        counts: dict[int, int] = {}
        for group in self.groups:
            counts[group.tp] = counts.get(group.tp, 0) + group.count
        return counts


INFEASIBLE = RolloutLayout((), math.inf)


@dataclass
class GroupTimes:
    """The cost model's makespan of each group (first bucket, last bucket, TP, instances) of one
    workload, filled as searches ask for them."""

    cost: CostModel
    workload: Workload
    seconds: dict[tuple[int, int, int, int], float] = field(default_factory=dict)


class RolloutSearch:
    """Solves rollout layouts for one (cost model, workload); caches group times across calls."""

    def __init__(self, cost: CostModel, workload: Workload, tps: tuple[int, ...] = TP_CHOICES,
                 times: GroupTimes | None = None) -> None:
        """`times`: group times of the same cost model and workload to share (searches that differ
        only in their TP sizes cost each group once)."""
        if times is not None and (times.cost is not cost or times.workload is not workload):
            raise ValueError("shared group times must be for the same cost model and workload")
        self.cost = cost
        self.workload = workload
        self.buckets = workload.buckets
        self.tps = cost.instance_tps(tps)
        self._times = (times or GroupTimes(cost, workload)).seconds
        self.dp_evaluations = 0
        self.group_evaluations = 0

    def group_time(self, first: int, last: int, tp: int, count: int) -> float:
        key = (first, last, tp, count)
        if key not in self._times:
            self.group_evaluations += 1
            self._times[key] = self.cost.group_time(tp, count, self.buckets[first:last + 1])
        return self._times[key]

    def _instances(self, first: int, last: int, tp: int, limit: int, target: float) -> int | None:
        """Fewest instances (<= limit) finishing buckets first..last within `target` seconds."""
        if limit < 1 or self.group_time(first, last, tp, limit) > target:
            return None
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi) // 2
            if self.group_time(first, last, tp, mid) <= target:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def need(self, gpus: int, target: float) -> tuple[int, tuple[tuple[int, int, int, int], ...]] | None:
        """Fewest GPUs (<= gpus) finishing everything within `target`, with its groups as
        (tp, count, first, last); None if impossible."""
        self.dp_evaluations += 1
        n = len(self.buckets)
        inf = math.inf
        # best[i]: (gpus, groups) covering buckets[0:i] with the TP types seen so far
        best: list[tuple[float, tuple]] = [(0, ())] + [(inf, ())] * n
        for tp in self.tps:
            new = list(best)
            for i in range(1, n + 1):
                for j in range(i):
                    if best[j][0] == inf:
                        continue
                    room = (gpus - best[j][0]) // tp
                    count = self._instances(j, i - 1, tp, int(room), target)
                    if count is None:
                        continue
                    used = best[j][0] + tp * count
                    if used < new[i][0]:
                        new[i] = (used, best[j][1] + ((tp, count, j, i - 1),))
            best = new
        used, groups = best[n]
        return None if used == inf else (int(used), groups)

    def solve(self, gpus: int) -> RolloutLayout:
        """The layout with the smallest makespan using at most `gpus` GPUs."""
        if gpus < 1 or not self.tps:
            return INFEASIBLE
        upper = self._feasible_upper(gpus)
        if upper is None:
            return INFEASIBLE
        lo, hi = 0.0, upper
        solution = self.need(gpus, hi)
        while hi - lo > _REL_TOL * hi:
            mid = (lo + hi) / 2
            found = self.need(gpus, mid)
            if found is None:
                lo = mid
            else:
                hi, solution = mid, found
        assert solution is not None
        return self._fill(self._layout(solution[1]), gpus)

    def _fill(self, layout: RolloutLayout, gpus: int) -> RolloutLayout:
        """Give GPUs the optimum left unused to the slowest group that can take an instance (more
        instances never slow a group down, and usually shorten its tail); GPUs fewer than any group's
        TP open a group of their own, of the largest TP they make, for the first group's shortest
        bucket where that makes the makespan no longer. The layout then uses all `gpus` wherever an
        instance size fits in what is left."""
        groups = list(layout.groups)
        spare = gpus - layout.gpus
        while groups and spare:
            takers = [i for i, g in enumerate(groups) if g.tp <= spare]
            if takers:
                i = max(takers, key=lambda k: (groups[k].seconds, -groups[k].tp))
                g = groups[i]
                groups[i] = InstanceGroup(g.tp, g.count + 1, g.first_bucket, g.last_bucket, g.max_tokens,
                                          self.group_time(g.first_bucket, g.last_bucket, g.tp, g.count + 1))
                spare -= g.tp
                continue
            split = self._split_first(groups, spare, layout.seconds)
            if split is None:
                break
            groups, spare = split, spare - split[0].gpus
        return RolloutLayout(tuple(groups), max((g.seconds for g in groups), default=0.0))

    def _split_first(self, groups: list[InstanceGroup], spare: int, makespan: float) -> list[InstanceGroup] | None:
        """The groups with a new group of the largest TP that `spare` GPUs make (as many instances
        as fit) serving the first group's shortest bucket, if that group keeps another bucket and
        both finish within `makespan`; else None."""
        first = groups[0]
        if first.first_bucket == first.last_bucket:
            return None
        bucket = first.first_bucket
        for tp in sorted((tp for tp in self.tps if tp <= spare and tp < first.tp), reverse=True):
            count = spare // tp
            seconds = self.group_time(bucket, bucket, tp, count)
            rest_seconds = self.group_time(bucket + 1, first.last_bucket, first.tp, first.count)
            if max(seconds, rest_seconds) <= makespan:
                rest = InstanceGroup(first.tp, first.count, bucket + 1, first.last_bucket, first.max_tokens, rest_seconds)
                new = InstanceGroup(tp, count, bucket, bucket, self.buckets[bucket].max_tokens, seconds)
                return [new, rest, *groups[1:]]
        return None

    def _feasible_upper(self, gpus: int) -> float | None:
        """A makespan some layout achieves: the best single-group layout, or None."""
        best = math.inf
        last = len(self.buckets) - 1
        for tp in self.tps:
            if gpus // tp >= 1:
                best = min(best, self.group_time(0, last, tp, gpus // tp))
        if best == math.inf:  # no single TP can serve everything: try the DP at a huge target
            found = self.need(gpus, 1e30)
            if found is None:
                return None
            best = self._layout(found[1]).seconds
        return best

    def _layout(self, groups: tuple[tuple[int, int, int, int], ...]) -> RolloutLayout:
        built = tuple(
            InstanceGroup(tp, count, first, last, self.buckets[last].max_tokens if self.buckets else 0,
                          self.group_time(first, last, tp, count))
            for tp, count, first, last in groups
        )
        return RolloutLayout(built, max((g.seconds for g in built), default=0.0))
