"""Training search: the fastest parallel configuration for `gpus` training GPUs.

Space: TP in {1, 2, 4, 8} within a node and dividing the model's query and key/value heads (a
tensor-parallel rank holds whole heads and whole key/value groups: megatron-core refuses any other
split), PP over divisors of the layer count, DP = gpus / (TP*PP),
EP over divisors of the expert count that divide TP*DP (MoE only; 1 for dense models), micro-batch in
{1, 2, 4, 8}. Configurations that exceed GPU memory are pruned before they are costed. A
configuration may leave GPUs idle only if none uses them all (`best_training(..., exact=False)`
then tries smaller counts), so the best time is non-increasing in the GPU count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from libra.planner.cost_model import CostModel, TrainConfig, TrainEstimate
from libra.planner.workload import Workload

TP_CHOICES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4, 8)


@dataclass(frozen=True)
class TrainSearchStats:
    enumerated: int  # configurations in the space
    memory_pruned: int  # dropped because they do not fit
    costed: int  # configurations whose time was computed


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_configs(cost: CostModel, gpus: int) -> Iterator[TrainConfig]:
    """Every configuration using exactly `gpus` GPUs, in a fixed order."""
    m = cost.model
    for tp in TP_CHOICES:
        if tp > cost.cluster.gpus_per_node or gpus % tp or m.heads % tp or m.kv_heads % tp:
            continue
        for pp in _divisors(m.layers):
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            eps = [e for e in _divisors(m.experts) if (tp * dp) % e == 0] if m.is_moe else [1]
            for ep in eps:
                for micro_batch in MICRO_BATCHES:
                    yield TrainConfig(tp, pp, dp, ep, micro_batch)


def search_exact(cost: CostModel, gpus: int, workload: Workload) -> tuple[TrainEstimate | None, TrainSearchStats]:
    """The fastest feasible configuration on exactly `gpus` GPUs (None if none fits)."""
    limit = cost.train_memory_limit_bytes()
    best: TrainEstimate | None = None
    enumerated = pruned = costed = 0
    for config in enumerate_configs(cost, gpus):
        enumerated += 1
        if cost.train_memory_bytes(config, workload.max_tokens) > limit:
            pruned += 1
            continue
        costed += 1
        estimate = cost.train_time(config, workload)
        if best is None or _better(estimate, best):
            best = estimate
    return best, TrainSearchStats(enumerated, pruned, costed)


def _better(a: TrainEstimate, b: TrainEstimate) -> bool:
    """Faster wins; ties go to the configuration with less memory, then fewer GPUs, then a fixed order."""
    key_a = (a.seconds, a.memory_bytes, a.config.gpus, a.config.tp, a.config.pp, a.config.ep, a.config.micro_batch)
    key_b = (b.seconds, b.memory_bytes, b.config.gpus, b.config.tp, b.config.pp, b.config.ep, b.config.micro_batch)
    return key_a < key_b


class TrainingTable:
    """Best training estimate for every GPU count up to a limit, computed lazily and cached;
    `best(n)` may use fewer than n GPUs when that is faster, so it is non-increasing in n."""

    def __init__(self, cost: CostModel, workload: Workload) -> None:
        self.cost = cost
        self.workload = workload
        self._exact: dict[int, TrainEstimate | None] = {}
        self._best: dict[int, TrainEstimate | None] = {}
        self.stats = TrainSearchStats(0, 0, 0)

    def exact(self, gpus: int) -> TrainEstimate | None:
        if gpus not in self._exact:
            estimate, stats = search_exact(self.cost, gpus, self.workload)
            self._exact[gpus] = estimate
            self.stats = TrainSearchStats(
                self.stats.enumerated + stats.enumerated,
                self.stats.memory_pruned + stats.memory_pruned,
                self.stats.costed + stats.costed,
            )
        return self._exact[gpus]

    def best(self, gpus: int) -> TrainEstimate | None:
        """Fastest over 1..gpus GPUs."""
        if gpus < 1:
            return None
        if gpus not in self._best:
            start = max((g for g in self._best if g < gpus), default=0)
            current = self._best.get(start)
            for g in range(start + 1, gpus + 1):
                candidate = self.exact(g)
                if candidate is not None and (current is None or candidate.seconds < current.seconds):
                    current = candidate
                self._best[g] = current
        return self._best[gpus]
