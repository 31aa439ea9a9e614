"""What a training run asks of its trainer, as protocols the trainers meet structurally.

- `Trainer`: every trainer (`PolicyTrainer`, `MegatronTrainer`, `PooledTrainer`): one update per
  call, the weights and the optimizer state out (and the state back in, to resume), the update
  count (the version of the weights held), its threads, and closing.
- `ShardedTrainer`: a trainer whose ranks hold shards of the policy in a parallel layout
  (`MegatronTrainer`): resharded into another layout, or its ranks moved to other cores or GPUs,
  when a plan moves the trainer.
- `ElasticTrainer`: a trainer whose ranks are an elastic pool's core, beside hybrids that join and
  leave training (`PooledTrainer`): where its core ranks and hybrids run, and how many hybrids train.

The torch trainer has neither of the narrower two: its threads are its placement (`set_threads`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from libra.trainer.layout import Layout
from libra.trainer.samples import TrainingSample
from libra.trainer.trainer import UpdateStats

if TYPE_CHECKING:
    from libra.trainer.pooled import PoolSite


@runtime_checkable
class Trainer(Protocol):
    updates: int  # updates applied: the version of the weights held

    def train_step(self, samples: Sequence[TrainingSample]) -> UpdateStats:
        """One GRPO update on the step's samples."""
        ...

    def save_weights(self, directory: str | Path) -> None:
        """The weights in HF format (safetensors and config), loadable by vLLM and transformers."""
        ...

    def optimizer_state(self) -> dict:
        """AdamW's state in the torch trainer's layout and the update count, for a checkpoint."""
        ...

    def load_optimizer_state(self, state: dict) -> None:
        """Resume from a checkpoint's `optimizer_state` (of any trainer)."""
        ...

    def threads(self) -> int:
        """This process's intra-op threads."""
        ...

    def set_threads(self, count: int) -> None:
        """The trainer's share of the cores, as intra-op threads."""
        ...

    def close(self) -> None:
        """Stop whatever the trainer runs beside this process."""
        ...


@runtime_checkable
class ShardedTrainer(Trainer, Protocol):
    layout: Layout  # the parallel layout the ranks run in
    units: tuple[int, ...]  # the cores or GPUs the ranks are on (empty: unpinned)

    def relayout(self, layout: Layout, units: Sequence[int] = ()) -> float:
        """Train in `layout` on `units` from now on, with the same weights and optimizer state; seconds taken."""
        ...

    def place(self, units: Sequence[int]) -> float:
        """The same layout on other `units`; seconds taken."""
        ...


@runtime_checkable
class ElasticTrainer(Trainer, Protocol):
    def arrange(self, core: Sequence[int], hybrids: Sequence[Sequence[int]]) -> None:
        """The CPU cores of the core rank and of each hybrid."""
        ...

    def arrange_ranks(self, core: Sequence[Sequence[int]], hybrids: Sequence[Sequence[int]]) -> None:
        """The CPU cores of each core rank and of each hybrid (a core of several ranks)."""
        ...

    def set_desired(self, hybrids: int) -> None:
        """How many hybrids should train."""
        ...

    def relocate(self, site: Callable[[], PoolSite]) -> None:
        """Run the next pools where `site` says (the running one ends after its last update)."""
        ...
