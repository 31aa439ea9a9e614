"""The reconciler: turns the planner's desired number of training hybrids into joins and leaves.

`reconcile` is pure: from the desired count and each hybrid's state (plus the requests already in
flight, which the pool has sent but whose effect it has not seen yet) it returns the actions that
move the pool toward the target. Joins take the lowest-numbered hybrids in rollout; leaves cancel
pending joins first (they cost nothing yet), then release the highest-numbered training hybrids;
failed hybrids are restarted when the target cannot be met without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from libra.pools.states import State


@dataclass(frozen=True, slots=True)
class Action:
    op: Literal["join", "leave", "restart"]
    worker_id: str


def reconcile(desired: int, states: Mapping[str, State], in_flight: Mapping[str, str] | None = None) -> list[Action]:
    if desired < 0:
        raise ValueError(f"desired hybrid count must be >= 0, got {desired}")
    in_flight = in_flight or {}
    ids = sorted(states, key=_order)
    counted = [h for h in ids if _counts(states[h], in_flight.get(h))]
    actions: list[Action] = []
    if len(counted) < desired:
        need = desired - len(counted)
        idle = [h for h in ids if states[h] is State.ROLLOUT and h not in in_flight]
        actions += [Action("join", h) for h in idle[:need]]
        need -= min(need, len(idle))
        failed = [h for h in ids if states[h] is State.FAILED and h not in in_flight]
        actions += [Action("restart", h) for h in failed[:need]]
    elif len(counted) > desired:
        surplus = len(counted) - desired
        joining = [h for h in reversed(counted) if states[h] is State.JOINING or in_flight.get(h) == "join"]
        training = [h for h in reversed(counted) if h not in joining]
        actions += [Action("leave", h) for h in (joining + training)[:surplus]]
    return actions


def _counts(state: State, pending: str | None) -> bool:
    """Whether a hybrid counts toward the target: training or on its way there."""
    if pending == "leave":
        return False
    if pending == "join":
        return True
    return state in (State.JOINING, State.TRAINING)


def _order(worker_id: str) -> tuple[str, int]:
    head = worker_id.rstrip("0123456789")
    tail = worker_id[len(head):]
    return head, int(tail) if tail else -1
