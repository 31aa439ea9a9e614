"""Independent simulations on a second core: a list's items split between this process and a
forked copy of it.

A forked child starts with this process's state exactly (the routers' trees, the cost model's
caches, the drawn trajectories), so what it computes for an item is what this process would have
computed: the results are the same to the bit, only sooner. It is used where the items are
independent and each is costly (the planner's probe replays, each a whole step's rollout).

Forking is skipped, and everything runs here, where it would be unsafe or pointless: no `fork`
(not POSIX), one usable core, another thread running (a fork copies only the calling thread, and
a lock another thread holds would never be released in the child), or `LIBRA_FORK=0`. A child
that fails for any reason is not trusted: its share is computed here too.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

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
    return (hasattr(os, "fork") and os.environ.get("LIBRA_FORK", "1") != "0" and usable_cores() >= 2
            and not other_threads())


def other_threads() -> bool:
    """Whether a thread besides this one is running."""
    return threading.active_count() > 1


def forked_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`[fn(item) for item in items]`, the odd-numbered items computed in a forked child while this
    process computes the others. `fn`'s results must pickle; `fn` must not depend on side effects of
    the other items (the child's are lost with it, and this process never sees them)."""
    if len(items) < MIN_ITEMS or not can_fork():
        return [fn(item) for item in items]
    theirs_items = items[1::2]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute its share, hand it back, and leave without running any cleanup
        status = 1
        try:
            os.close(read_fd)
            data = pickle.dumps([fn(item) for item in theirs_items], protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        try:
            mine = [fn(item) for item in items[0::2]]
            data = pipe.read()
        except BaseException:
            _end(pid)
            raise
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already (SIGCHLD ignored): whole results say it finished
        status = 0
    theirs: list[R] | None = None
    if status == 0 and data:
        try:
            loaded = pickle.loads(data)
        except Exception:  # noqa: BLE001 (a child cut short: its share is computed here)
            loaded = None
        if isinstance(loaded, list) and len(loaded) == len(theirs_items):
            theirs = loaded
    if theirs is None:
        theirs = [fn(item) for item in theirs_items]
    out: list[R] = []
    for i in range(len(items)):
        out.append(mine[i // 2] if i % 2 == 0 else theirs[i // 2])
    return out


def _end(pid: int) -> None:
    """Stop a child whose results are no longer wanted and reap it."""
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
