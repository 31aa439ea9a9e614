"""When a hybrid that asked to join training enters it: a pure policy on an injected clock.

A join goes: requested (the leader snapshots the core's state) -> the hybrid loads the snapshot and
reports the step its state is at -> while it is more than `enter_gap` steps behind and getting
closer, it replays the updates it missed from a file, off the core's path, and reports again ->
it enters at a step boundary (the updates it still misses come over the new group at entry). A
join that has not entered `join_timeout_s` after it was requested is abandoned.

    decide(progress, step, now_s, settings) -> JoinAction

The pool's leader (`libra/pools/leader.py`) asks it at every step boundary for every join in
progress, with its clock's reading; the simulator (`libra/sim/training.py`) asks it when a
released hybrid has fetched its snapshot, on simulated time. Nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from libra.config import PoolConfig


@dataclass(frozen=True)
class JoinSettings:
    """The join policy's dials: `pool.enter_gap` and `pool.join_timeout_s`, with the config's defaults."""

    enter_gap: int = PoolConfig.model_fields["enter_gap"].default  # a hybrid enters once at most this many updates behind
    join_timeout_s: float = PoolConfig.model_fields["join_timeout_s"].default  # a join not entered this long after its request is abandoned

    def __post_init__(self) -> None:
        if self.enter_gap < 0 or not self.join_timeout_s > 0:
            raise ValueError(f"enter_gap must be >= 0 and join_timeout_s > 0, got {self.enter_gap}, {self.join_timeout_s}")


@dataclass(frozen=True)
class JoinProgress:
    """Where one join stands."""

    started_s: float  # when it was requested, on the policy's clock
    synced: int | None = None  # the step its state is at (before it); None while it fetches or replays
    last_gap: int | None = None  # steps it was behind when last sent updates to replay
    entered: int | None = None  # the step it entered at


class JoinAction(StrEnum):
    WAIT = "wait"  # fetching or replaying (or already entered): nothing to do at this boundary
    TIMED_OUT = "timed_out"  # abandoned: the hybrid goes back to rollout
    ENTER = "enter"  # enters now and takes its shard of this step (a short replay at entry)
    ENTER_IDLE = "enter_idle"  # no longer getting closer: enters now, replays the rest at entry, this step's shard 0
    REPLAY = "replay"  # too far behind: replay the missed updates from a file, then report again


def decide(progress: JoinProgress, step: int, now_s: float, settings: JoinSettings) -> JoinAction:
    """What to do with a join at the boundary before `step`, at time `now_s`."""
    if progress.entered is not None:
        return JoinAction.WAIT
    if now_s - progress.started_s > settings.join_timeout_s:
        return JoinAction.TIMED_OUT
    if progress.synced is None:
        return JoinAction.WAIT
    gap = step - progress.synced
    if gap <= settings.enter_gap:
        return JoinAction.ENTER
    if progress.last_gap is not None and gap >= progress.last_gap:
        return JoinAction.ENTER_IDLE
    return JoinAction.REPLAY
