"""Independent simulations on a second core: a list's items split between this process and a
forked copy of it.

A forked child starts with this process's state exactly (the routers' trees, the cost model's
caches, the drawn trajectories), so what it computes for an item is what this process would have
computed: the results are the same to the bit, only sooner. It is used where the items are
independent and each is costly: the planner's probe replays and the oracle's look-ahead (each a
whole step's rollout), and the systems of one simulation (`libra.sim.runner.simulate`).

Forking is skipped, and everything runs here, where it would be unsafe or pointless: no `fork`
(not POSIX), one usable core, another thread running (a fork copies only the calling thread, and
a lock another thread holds would never be released in the child), a split already under way
(both cores are busy), or `LIBRA_FORK=0`. A child that fails for any reason is not trusted: what
it took is computed here too.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from libra.switches import switch

T = TypeVar("T")
R = TypeVar("R")

MIN_ITEMS = 2  # fewer items than this run here: a fork costs a few milliseconds


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether `forked_map` would split its work (see the module's docstring)."""
    return (hasattr(os, "fork") and switch("LIBRA_FORK", True) and usable_cores() >= 2
            and not other_threads())


def other_threads() -> bool:
    """Whether a thread besides this one is running."""
    return threading.active_count() > 1


def forked_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`[fn(item) for item in items]`, computed by this process and a forked child side by side:
    each takes the next item from a shared pipe of tickets whenever it is free (so a few long items
    do not leave one core idle), and the child hands its results back when the tickets run out.
    `fn`'s results must pickle, and `fn` must not depend on side effects of the other items (which
    process computes an item depends on timing). A `forked_map` inside another one, in either
    process, runs its items where it is called: two cores are busy already."""
    global _splitting
    if len(items) < MIN_ITEMS or len(items) > MAX_ITEMS or _splitting or not can_fork():
        return [fn(item) for item in items]
    _splitting = True
    try:
        return _split(fn, items)
    finally:
        _splitting = False


MAX_ITEMS = 4_000  # every ticket (4 bytes) is written before the fork: they must fit a pipe's buffer (16 KiB at least)
_splitting = False  # a `forked_map` is under way in this process (and in its child)


def _split(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    tickets, write_tickets = os.pipe()
    os.write(write_tickets, b"".join(i.to_bytes(4, "little") for i in range(len(items))))
    os.close(write_tickets)
    results, write_results = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: take tickets until none are left, hand the results back, leave without cleanup
        status = 1
        try:
            os.close(results)
            done = [(i, fn(items[i])) for i in _taken(tickets)]
            with os.fdopen(write_results, "wb") as pipe:
                pipe.write(pickle.dumps(done, protocol=pickle.HIGHEST_PROTOCOL))
            status = 0
        finally:
            os._exit(status)
    os.close(write_results)
    with os.fdopen(results, "rb") as pipe:
        try:
            mine = {i: fn(items[i]) for i in _taken(tickets)}
            data = pipe.read()
        except BaseException:
            _end(pid)
            raise
        finally:
            os.close(tickets)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already (SIGCHLD ignored): whole results say it finished
        status = 0
    theirs: dict[int, R] = {}
    if status == 0 and data:
        try:
            loaded = pickle.loads(data)
        except Exception:  # noqa: BLE001 (a child cut short: what it took is computed here)
            loaded = None
        if isinstance(loaded, list) and all(isinstance(entry, tuple) and len(entry) == 2 for entry in loaded):
            theirs = {i: result for i, result in loaded if isinstance(i, int) and 0 <= i < len(items) and i not in mine}
    # an item the child took and did not hand back (it failed) is computed here
    return [mine[i] if i in mine else theirs[i] if i in theirs else fn(item) for i, item in enumerate(items)]


def _taken(tickets: int) -> Iterator[int]:
    """The items this process takes, one ticket at a time, until none are left. A pipe is read under
    its lock, and every read here takes 4 bytes from whole 4-byte records, so each ticket is taken
    once and whole."""
    while ticket := os.read(tickets, 4):
        yield int.from_bytes(ticket, "little")


def _end(pid: int) -> None:
    """Stop a child whose results are no longer wanted and reap it."""
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
