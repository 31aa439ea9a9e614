"""Routing judged by what it buys: the rollout makespan of one fixed heterogeneous layout under each
router, step after step, in the rollout physics.

Every router sees the same batches on the same instances; each learns from the steps it has
finished (RL order: a step's trajectories become visible when it ends), as it would in a run.
The oracle routes on true lengths. Accuracy on traces (`scheduler.replay`) says how often a router
names the right bucket; this says what its mistakes cost: a long trajectory on a small instance is
the step's straggler, and a bucket sent more than its instances hold queues.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libra.planner.cost_model import CostModel
from libra.scheduler.replay import make_router
from libra.scheduler.routers import Buckets
from libra.sim.rollout import InstanceSpec, RolloutSim, lanes, mean_context, path_of
from libra.sim.workloads import SimTrajectory


@dataclass(frozen=True)
class RoutedRollouts:
    router: str
    makespans_s: tuple[float, ...]  # per scored step
    migrated_tokens: int
    total_tokens: int

    @property
    def mean_makespan_s(self) -> float:
        return sum(self.makespans_s) / len(self.makespans_s)

    @property
    def migrated_share(self) -> float:
        return self.migrated_tokens / self.total_tokens if self.total_tokens else 0.0


def bucket_shares(trajectories: Sequence[SimTrajectory], buckets: Buckets) -> tuple[float, ...]:
    """The share of `trajectories` whose total length falls in each bucket (what a planner sizes
    its instance groups for)."""
    counts = [0] * buckets.count
    for t in trajectories:
        counts[buckets.of(t.total_tokens)] += 1
    return tuple(c / max(1, len(trajectories)) for c in counts)


def compare_routers(cost: CostModel, layout: Sequence[InstanceSpec], bounds: tuple[int, ...],
                    batches: Sequence[Sequence[SimTrajectory]], routers: Sequence[str],
                    warmup_steps: int = 0, prior_shares: Sequence[float] | None = None) -> dict[str, RoutedRollouts]:
    """Each router over every batch on `layout` (instance bucket i serves lengths up to bounds[i]);
    the first `warmup_steps` steps teach the routers and are not scored. Libra's router is told the
    layout's lanes (as the planner that made the layout tells it), priced at the first batch's mean
    context."""
    if not 0 <= warmup_steps < len(batches):
        raise ValueError(f"warmup_steps must leave a step to score: {warmup_steps} of {len(batches)}")
    buckets = Buckets(bounds)
    truth = {t.trajectory_id: list(path_of(t).remaining_at_decisions) for batch in batches for t in batch}
    served = lanes(cost, layout, mean_context(batches[0]))
    results = {}
    for name in routers:
        router = make_router(name, buckets, truth, measure="total", prior_shares=prior_shares, lanes=served)
        makespans, migrated, total = [], 0, 0
        for k, batch in enumerate(batches):
            result = RolloutSim(cost, layout, router).run(batch)
            router.observe_step([path_of(t) for t in batch], {t.prompt_id: t.prompt_tokens for t in batch})
            if k >= warmup_steps:
                makespans.append(result.makespan_s)
                migrated += result.migrated_tokens
                total += result.total_tokens
        results[name] = RoutedRollouts(name, tuple(makespans), migrated, total)
    return results
