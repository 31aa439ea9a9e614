"""Brute-force counterparts of the planner's solvers, for tests and for measuring the search space.

They share the cost model with the real solvers and nothing else: every configuration, every
instance-count vector and every monotone bucket assignment is evaluated. Only usable on small
instances.
"""

from __future__ import annotations

import itertools
import math

from libra.planner.cost_model import CostModel, TrainEstimate
from libra.planner.planner import Planner, PlannerSettings
from libra.planner.rollout_search import TP_CHOICES
from libra.planner.training_search import enumerate_configs
from libra.planner.workload import Workload


def best_training(cost: CostModel, gpus: int, workload: Workload) -> TrainEstimate | None:
    """Fastest feasible configuration on at most `gpus` GPUs."""
    best: TrainEstimate | None = None
    limit = cost.train_memory_limit_bytes()
    for g in range(1, gpus + 1):
        for config in enumerate_configs(cost, g):
            if cost.train_memory_bytes(config, workload.max_tokens) > limit:
                continue
            estimate = cost.train_time(config, workload)
            if best is None or estimate.seconds < best.seconds:
                best = estimate
    return best


def best_rollout(cost: CostModel, gpus: int, workload: Workload) -> float:
    """Smallest makespan over every instance layout using at most `gpus` GPUs and every
    assignment of the sorted buckets to groups in increasing TP order."""
    tps = cost.instance_tps(TP_CHOICES)
    buckets = workload.buckets
    best = math.inf
    for assignment in itertools.combinations_with_replacement(range(len(tps)), len(buckets)):
        used = sorted(set(assignment))
        ranges = {k: [i for i, a in enumerate(assignment) if a == k] for k in used}
        for counts in itertools.product(*(range(1, gpus // tps[k] + 1) for k in used)):
            if sum(tps[k] * c for k, c in zip(used, counts, strict=True)) > gpus:
                continue
            makespan = max(
                cost.group_time(tps[k], c, buckets[ranges[k][0]:ranges[k][-1] + 1])
                for k, c in zip(used, counts, strict=True)
            )
            best = min(best, makespan)
    return best


class ExhaustivePlanner(Planner):
    """The planner's objective over every split, with brute-force training and rollout."""

    def __init__(self, cost: CostModel, workload: Workload, settings: PlannerSettings | None = None) -> None:
        super().__init__(cost, workload, settings)
        self._train_times: dict[int, float] = {}
        self._rollout_times: dict[int, float] = {}

    def t_train(self, gpus: int) -> float:
        if gpus not in self._train_times:
            best = best_training(self.cost, gpus, self.workload) if gpus > 0 else None
            self._train_times[gpus] = math.inf if best is None else best.seconds
        return self._train_times[gpus]

    def t_rollout(self, gpus: int) -> float:
        if gpus not in self._rollout_times:
            self._rollout_times[gpus] = best_rollout(self.cost, gpus, self.workload) if gpus > 0 else math.inf
        return self._rollout_times[gpus]

    def _train_candidates(self, core: int, hybrid: int, share: float) -> list[int]:
        step = self.granularity()
        return list(range(step, core, step))
