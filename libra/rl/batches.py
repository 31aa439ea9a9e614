"""A batch's lifecycle in a training run, as an explicit state machine.

An iteration's batch is rolled out (its trajectories, their working directories, the engines'
timings), scored (rewards in: a `Batch` the update can train on), trained on (the update ran; the
iteration's record is still to be made) and then recorded, which ends it. With the one-step-off
pipeline batch k+1 is rolled out and scored while batch k waits for its update, so several batches
are alive at once, each in its own state:

    (none) --rolled_out--> ROLLED --scored--> SCORED --trained--> TRAINED --recorded--> (none)
                             |                                  +--discarded--> (none)   (an evaluation's, or a session that closes)

The held-out evaluation's batch is rolled out and scored like a training batch, at step -1, and
ends when it is scored (its reward is all the evaluation reads). `Batches.move` is the only way a state changes; a
move the table does not list raises `IllegalTransition`. The scored batches are what a checkpoint
keeps (`scored()`): a resumed run trains on them without rolling them out again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from libra.pools.states import IllegalTransition
from libra.rl.planning import EngineTiming
from libra.rl.records import Batch

if TYPE_CHECKING:
    from libra.rollout.agent import RolloutResult

EVALUATION = -1  # the step the held-out evaluation's batch is kept at


class BatchState(StrEnum):
    ROLLED = "rolled"  # trajectories out, rewards not yet; their working directories still on disk
    SCORED = "scored"  # rewards in; waits for its update
    TRAINED = "trained"  # the update ran on it; waits for the iteration's record


# (from, to) -> the event that causes the move (None: the batch is not, or no longer, alive)
TRANSITIONS: dict[tuple[BatchState | None, BatchState | None], str] = {
    (None, BatchState.ROLLED): "rolled_out",
    (BatchState.ROLLED, BatchState.SCORED): "scored",
    (BatchState.ROLLED, None): "discarded",
    (BatchState.SCORED, BatchState.TRAINED): "trained",
    (BatchState.SCORED, None): "evaluated",  # the evaluation's batch, once its reward is read
    (BatchState.TRAINED, None): "recorded",
}


@dataclass(frozen=True)
class Rolled:
    """A rolled-out batch awaiting its rewards."""

    result: RolloutResult
    workroot: Path  # the trajectories' working directories (the reward may read them)
    decode: tuple[EngineTiming, ...]  # the engines' decode steps while it rolled out
    stale_dropped: int = 0  # partial rollouts: suspended trajectories not continued, too stale


@dataclass
class Batches:
    """The run's live batches by step, each in one state of the table."""

    _rolled: dict[int, Rolled] = field(default_factory=dict)
    _scored: dict[int, Batch] = field(default_factory=dict)
    _trained: Batch | None = None  # the batch of the last update, until its iteration is recorded

    @classmethod
    def restored(cls, scored: dict[int, Batch] | None) -> Batches:
        """A resumed run's batches: those its checkpoint kept scored."""
        return cls(_scored=dict(scored or {}))

    def state(self, step: int) -> BatchState | None:
        if step in self._rolled:
            return BatchState.ROLLED
        if step in self._scored:
            return BatchState.SCORED
        if self._trained is not None and self._trained.step == step:
            return BatchState.TRAINED
        return None

    def move(self, step: int, to: BatchState | None) -> str:
        """Check that batch `step` may move to `to`; the event that moves it."""
        now = self.state(step)
        event = TRANSITIONS.get((now, to))
        if event is None:
            raise IllegalTransition(f"batch {step}: {now or 'none'} -> {to or 'none'} is not a move of its lifecycle")
        return event

    # -- the moves ---------------------------------------------------------------------------

    def rolled_out(self, step: int, rolled: Rolled) -> None:
        self.move(step, BatchState.ROLLED)
        self._rolled[step] = rolled

    def rolled_batch(self, step: int) -> Rolled:
        """Batch `step`, rolled out and awaiting its rewards (it stays so until `scored`)."""
        if self.state(step) is not BatchState.ROLLED:
            raise IllegalTransition(f"batch {step}: {self.state(step) or 'none'}, not rolled out: nothing to score")
        return self._rolled[step]

    def scored(self, batch: Batch) -> None:
        """Batch `batch.step` has its rewards: it waits for its update (the evaluation's ends here)."""
        self.move(batch.step, BatchState.SCORED)
        del self._rolled[batch.step]
        if batch.step != EVALUATION:
            self._scored[batch.step] = batch

    def take_for_update(self, step: int) -> Batch:
        self.move(step, BatchState.TRAINED)
        self._trained = self._scored.pop(step)
        return self._trained

    def recorded(self, step: int) -> Batch:
        """The trained batch of iteration `step` leaves for its record."""
        if self.state(step) is not BatchState.TRAINED:
            raise RuntimeError(f"iteration {step} has not been trained")
        self.move(step, None)
        batch, self._trained = self._trained, None
        assert batch is not None
        return batch

    def discard(self) -> tuple[Rolled, ...]:
        """Every batch still awaiting rewards leaves (the session closes): theirs to clean up."""
        for step in self._rolled:
            self.move(step, None)
        gone, self._rolled = tuple(self._rolled.values()), {}
        return gone

    # -- views ---------------------------------------------------------------------------------

    def waiting(self) -> dict[int, Batch]:
        """The scored batches not trained on yet (what a checkpoint keeps)."""
        return self._scored

    def awaiting_rewards(self) -> bool:
        return bool(self._rolled)
