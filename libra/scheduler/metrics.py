"""Routing metrics over a replay's decisions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    bucket: int  # what the router chose
    true_bucket: int  # the bucket of the true remaining length
    estimate: float | None  # the router's remaining-length estimate
    true_remaining: int
    migrated_tokens: int  # context re-prefilled because the bucket changed (0 if not)
    latency_ns: int  # time the decision took (0 when not measured)


def accuracy(records: Sequence[DecisionRecord]) -> float:
    return sum(r.bucket == r.true_bucket for r in records) / len(records) if records else math.nan


def balanced_accuracy(records: Sequence[DecisionRecord], buckets: int) -> float:
    """Mean over true buckets (that occur) of the share of their decisions routed right."""
    recalls = []
    for b in range(buckets):
        group = [r for r in records if r.true_bucket == b]
        if group:
            recalls.append(sum(r.bucket == b for r in group) / len(group))
    return sum(recalls) / len(recalls) if recalls else math.nan


def _ranks(values: Sequence[float]) -> list[float]:
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) < 2:
        return math.nan
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else math.nan


def rank_correlation(records: Sequence[DecisionRecord]) -> float | None:
    """Spearman between estimates and truth over decisions that had an estimate; None if none had."""
    pairs = [(r.estimate, r.true_remaining) for r in records if r.estimate is not None]
    if not pairs:
        return None
    return spearman([p[0] for p in pairs], [p[1] for p in pairs])


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
