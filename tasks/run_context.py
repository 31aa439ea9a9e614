"""What a training run's tasks act on in this process: the run's live session (its engines, trainer
and batches) and who hears of the run's progress. The training flow makes one per flow run and
passes it to every task of the run; nothing of it lives in a module.

A plain class, not a dataclass: Prefect passes it to tasks and subflows as it is (it does not look
inside, hash or store it; the tasks take no cache key), so the session is never copied or walked.
"""

from __future__ import annotations

from collections.abc import Callable

from libra.rl.records import IterationRecord
from libra.rl.session import TrainingSession

Listener = Callable[[IterationRecord], None]  # told of each recorded iteration (the CLI's progress lines)
PolicyProgress = Callable[[int, int, float], None]  # told (step, steps, loss) while the local policy is built


class RunContext:
    """One training flow run's live objects: the session once it is open, and its listeners."""

    __slots__ = ("_session", "listeners", "policy_progress")

    def __init__(self, listeners: tuple[Listener, ...] = (), policy_progress: PolicyProgress | None = None) -> None:
        self._session: TrainingSession | None = None
        self.listeners = tuple(listeners)
        self.policy_progress = policy_progress

    @property
    def session(self) -> TrainingSession:
        """The open session; a RuntimeError before the run is opened or after it is closed."""
        if self._session is None:
            raise RuntimeError("the run has no open session in this flow run")
        return self._session

    @property
    def is_open(self) -> bool:
        return self._session is not None

    def hold(self, session: TrainingSession) -> None:
        """Keep `session` as the run's (the one held before, if any, is closed first)."""
        self.close()
        self._session = session

    def release(self) -> TrainingSession:
        """The open session, no longer held (the caller closes it)."""
        session, self._session = self.session, None
        return session

    def close(self) -> None:
        """Close the session held, if any."""
        if self._session is not None:
            self.release().close()

    def announce(self, record: IterationRecord) -> None:
        """Tell the listeners of a recorded iteration."""
        for listener in self.listeners:
            listener(record)

    def policy_built(self, step: int, steps: int, loss: float) -> None:
        """Tell the policy-progress listener of a step of building the local policy."""
        if self.policy_progress is not None:
            self.policy_progress(step, steps, loss)
