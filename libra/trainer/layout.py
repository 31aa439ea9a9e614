"""The trainer's parallel layout: how many ranks split the model (tensor and pipeline parallel) and
how many replicas split the batch (data parallel). A pure record, shared by whoever decides a layout
(the config, the planner's plan: `libra.rl.cluster.placement_of`) and whoever runs one
(`libra.trainer.megatron_trainer`), and by the run's timing samples, which the cost model is fitted
to in the planner's own terms (`libra.rl.planning.timing_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libra.errors import LibraError


@dataclass(frozen=True)
class Layout:
    """`tp` x `pp` model-parallel ranks per replica, `dp` replicas: `world` rank processes."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp) < 1:
            raise LibraError(f"a training layout's degrees are at least 1: tp={self.tp} pp={self.pp} dp={self.dp}")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp}"


def rank_units(layout: Layout, units: Sequence[int], what: str = "workers' cores") -> tuple[tuple[int, ...], ...]:
    """The trainer's `units` (its workers' cores, in order) shared among the layout's ranks: rank r
    takes the r-th of `world` equal runs (a remainder goes to no rank). A layout with more ranks than
    units is refused: a rank process must have a core (or GPU) of its own."""
    if layout.world > len(units):
        raise LibraError(f"the training layout {layout} needs {layout.world} rank processes, each on a unit of its "
                         f"own, but the trainer has {len(units)} {what}; use a layout of at most {len(units)} ranks "
                         "(trainer.tp x pp x dp) or give the trainer more workers")
    share = len(units) // layout.world
    return tuple(tuple(units[r * share:(r + 1) * share]) for r in range(layout.world))
