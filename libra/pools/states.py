"""Roles and the lifecycle of a pool worker, as an explicit state machine.

A worker is a unit of GPUs (one data-parallel replica of the training layout). Core workers keep
their role for the whole run; a hybrid moves between rollout and training:

    rollout --join_requested--> joining --activated--> training --leave_requested--> leaving
       ^                          |  |                    |                              |
       |<--cancelled/rolled_back--+  |                    +--rolled_back--> rollout      |
       |<------------------------------------------------------------released-----------+
    any live state --died/timed_out--> failed --restarted--> rollout

Every transition goes through `Worker.move`, which refuses moves the table does not list
(`IllegalTransition`) and hands a `PoolEvent` to the sink (the pool's event log, written to the
store's `pool_events` table). Progress inside a state (snapshot written, snapshot loaded) is a
`note`: an event whose from and to states are equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from libra.errors import LibraError


class Role(StrEnum):
    CORE_TRAINING = "core-training"
    CORE_ROLLOUT = "core-rollout"
    HYBRID = "hybrid"


class State(StrEnum):
    ROLLOUT = "rollout"
    JOINING = "joining"
    TRAINING = "training"
    LEAVING = "leaving"
    FAILED = "failed"


# (from, to) -> the events allowed to cause that move
TRANSITIONS: dict[tuple[State, State], frozenset[str]] = {
    (State.ROLLOUT, State.JOINING): frozenset({"join_requested"}),
    (State.JOINING, State.TRAINING): frozenset({"activated"}),
    (State.JOINING, State.ROLLOUT): frozenset({"cancelled", "rolled_back", "join_timed_out"}),
    (State.TRAINING, State.LEAVING): frozenset({"leave_requested"}),
    (State.TRAINING, State.ROLLOUT): frozenset({"rolled_back"}),
    (State.LEAVING, State.ROLLOUT): frozenset({"released"}),
    (State.ROLLOUT, State.FAILED): frozenset({"died"}),
    (State.JOINING, State.FAILED): frozenset({"died"}),
    (State.TRAINING, State.FAILED): frozenset({"died"}),
    (State.LEAVING, State.FAILED): frozenset({"died"}),
    (State.FAILED, State.ROLLOUT): frozenset({"restarted"}),
}

# the states each role may be in
ROLE_STATES: dict[Role, frozenset[State]] = {
    Role.CORE_TRAINING: frozenset({State.TRAINING, State.FAILED}),
    Role.CORE_ROLLOUT: frozenset({State.ROLLOUT, State.FAILED}),
    Role.HYBRID: frozenset(State),
}


class IllegalTransition(LibraError):
    """A state change the lifecycle table does not allow."""


@dataclass(frozen=True, slots=True)
class PoolEvent:
    """One row of the store's `pool_events` table (run and step are added when it is written)."""

    step: int
    time_s: float
    worker_id: str
    gpus: int
    from_state: str
    to_state: str
    event: str
    detail: str = ""


class Worker:
    """One worker's role and state; `move` is the only way to change the state."""

    def __init__(self, worker_id: str, role: Role, gpus: int, sink: Callable[[PoolEvent], None],
                 clock: Callable[[], float]) -> None:
        self.worker_id = worker_id
        self.role = role
        self.gpus = gpus
        self.state = State.TRAINING if role is Role.CORE_TRAINING else State.ROLLOUT
        self._sink = sink
        self._clock = clock

    def move(self, to: State, event: str, step: int, detail: str = "") -> PoolEvent:
        allowed = TRANSITIONS.get((self.state, to), frozenset())
        if event not in allowed or to not in ROLE_STATES[self.role]:
            raise IllegalTransition(
                f"worker {self.worker_id} ({self.role}) cannot go {self.state} -> {to} on {event!r}; "
                f"allowed from {self.state}: {allowed_from(self.state, self.role)}")
        record = PoolEvent(step, self._clock(), self.worker_id, self.gpus, self.state, to, event, detail)
        self.state = to
        self._sink(record)
        return record

    def note(self, event: str, step: int, detail: str = "") -> PoolEvent:
        """Progress within the current state (e.g. snapshot loaded)."""
        record = PoolEvent(step, self._clock(), self.worker_id, self.gpus, self.state, self.state, event, detail)
        self._sink(record)
        return record


def allowed_from(state: State, role: Role) -> str:
    moves = [f"{event} -> {to}" for (a, to), events in TRANSITIONS.items() if a == state and to in ROLE_STATES[role]
             for event in sorted(events)]
    return ", ".join(moves) or "nothing"
