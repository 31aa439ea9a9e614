"""Clocks: the only way code in `libra/` reads time.

Policies take a `Clock` so that the simulator (SimClock, advanced by the event loop) and real runs
(WallClock) drive the same objects. Nothing else in `libra/` calls `time.time()`, `time.monotonic()`,
`time.perf_counter()` or `time.sleep()` (tests/libra/test_clock.py checks): measurements take a
`Stopwatch`, polled waits a `Deadline` and `sleep` on a clock.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary, fixed origin; never decreases."""
        ...


class WallClock:
    """Monotonic wall time, for real runs."""

    def now(self) -> float:
        return time.monotonic()


class EpochClock:
    """Wall-clock seconds since `t0` (epoch seconds): one origin that several processes share (the
    elastic pool's events are timed from its start). Follows the system clock, so it may step if
    the system clock is set."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0

    def now(self) -> float:
        return time.time() - self.t0


class SimClock:
    """Simulated time, moved forward only by its owner (the discrete-event loop or a test)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def advance_to(self, t_s: float) -> None:
        if t_s < self._now:
            raise ValueError(f"simulated time cannot go back: {t_s} < {self._now}")
        self._now = float(t_s)

    def advance(self, dt_s: float) -> None:
        self.advance_to(self._now + dt_s)


def unix_time() -> float:
    """Seconds since the Unix epoch, for stamps that say when something happened (a commit, a metric,
    a lock taken), never for durations (`Stopwatch`) or waits (`Deadline`)."""
    return time.time()


# -- waiting and measuring on a clock ---------------------------------------------------------------


def sleep(clock: Clock, seconds: float) -> None:
    """Let `seconds` pass on `clock`: a `SimClock` moves forward at once; any other clock waits that
    long in real time."""
    if isinstance(clock, SimClock):
        clock.advance(seconds)
    else:
        time.sleep(seconds)


class Deadline:
    """A time `seconds` after it was made, on `clock`: for waits that poll until then."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock = clock
        self.at = clock.now() + seconds

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.at - self.clock.now()


class Stopwatch:
    """Seconds since it was made, on `clock` (monotonic wall time by default): for measurements."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or WallClock()
        self.began = self.clock.now()

    def seconds(self) -> float:
        return self.clock.now() - self.began
