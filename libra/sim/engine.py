"""A discrete-event core: a heap of (time, order, callback) and a `SimClock` it advances.

Callbacks run in time order (ties in scheduling order). Cancelling is lazy: a handle's `cancelled`
flag makes the loop skip it. Small enough to read in one sitting, like SimPy's core.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from libra.clock import SimClock


class Event:
    """A scheduled callback; `cancelled` makes the loop skip it."""

    __slots__ = ("time", "callback", "cancelled")

    def __init__(self, time: float, callback: Callable[[], None]) -> None:
        self.time = time
        self.callback = callback
        self.cancelled = False


class EventLoop:
    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self._heap: list[tuple[float, int, Event]] = []  # (time, order, event): tuples compare in C
        self._order = 0
        self.processed = 0
        self.now = self.clock.now()  # the clock's time, read as a field (callbacks read it millions of times)

    def at(self, time: float, callback: Callable[[], None]) -> Event:
        if time < self.now:
            raise ValueError(f"cannot schedule in the past: {time} < {self.now}")
        self._order += 1
        event = Event(time, callback)
        heapq.heappush(self._heap, (time, self._order, event))
        return event

    def after(self, delay: float, callback: Callable[[], None]) -> Event:
        return self.at(self.now + max(0.0, delay), callback)

    def stop(self) -> None:
        """Drop every scheduled event: `run` returns once the current callback does."""
        self._heap.clear()

    def run(self, until: float = float("inf")) -> None:
        """Process events in time order until none are left or the next is after `until`."""
        heap = self._heap
        pop = heapq.heappop
        advance = self.clock.advance_to
        while heap and heap[0][0] <= until:
            time, _, event = pop(heap)
            if event.cancelled:
                continue
            advance(time)
            self.now = float(time)
            self.processed += 1
            event.callback()
