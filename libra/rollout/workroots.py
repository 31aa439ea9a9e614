"""Where trajectories' working directories live: one base per process (mode 711, a shared mount where
the process may mount, removed when it exits, and removed by the next process when it died without
removing it), with a directory per run or episode made in it (`make_workroot`). The sandbox server
sees the base whole and shows each call only its own working directory (`libra.rollout.sandbox`).
Where they are tmpfs mounts (Libra runs as root), the memory they may pin together is budgeted
(`sandbox.workdirs_bytes`): checked for a run's planned trajectories before it starts
(`check_workdirs`) and for each one as it is mounted (`check_room`)."""

from __future__ import annotations

import atexit
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from libra.config import SandboxConfig
from libra.devices import machine_memory_bytes
from libra.errors import LibraError
from libra.files import discard_tree, owner_gone
from libra.mounts import MountError, can_mount, share, workdir_bytes_held

_BASE: tuple[int, Path, bool] | None = None  # (the process that made it, the directory, whether it is a shared mount)
BASE_PREFIX = "libra-sandbox-"  # then the making process's pid and a dash
_BASE_LOCK = threading.Lock()


def workroot_base() -> Path:
    """The directory under which this process makes working directories (mode 711, removed when
    the process exits): the sandbox server sees it whole, and shows each call only its own. Its name
    carries the process's pid, so the first one a process makes removes those of processes that
    died without removing theirs (a training killed with SIGKILL). Where this process may mount, it
    is a shared mount, so that trajectories' own filesystems mounted in it later reach the server."""
    global _BASE
    with _BASE_LOCK:
        if _BASE is None or _BASE[0] != os.getpid():
            remove_orphaned_bases(Path(tempfile.gettempdir()))
            base = Path(tempfile.mkdtemp(prefix=f"{BASE_PREFIX}{os.getpid()}-")).resolve()
            os.chmod(base, 0o711)
            atexit.register(discard_tree, base)
            shared = False
            if can_mount():
                try:
                    share(base)
                    shared = True
                except MountError as exc:
                    warn_once(f"working directories stay on the host's filesystem ({exc}): a tool's files are not "
                               "on a nosuid,nodev filesystem and the bytes a trajectory writes are capped per file only")
            _BASE = (os.getpid(), base, shared)
        return _BASE[1]


def base_shared() -> bool:
    """Whether `workroot_base` is a shared mount (trajectories' own filesystems mounted in it reach the server)."""
    workroot_base()
    assert _BASE is not None
    return _BASE[2]


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("libra").warning("%s", message)


def remove_orphaned_bases(directory: Path) -> list[Path]:
    """Remove the working-directory bases in `directory` whose process is gone; those removed."""
    removed = []
    for base in directory.glob(f"{BASE_PREFIX}*-*"):
        if not owner_gone(base.name, BASE_PREFIX) or not base.is_dir() or base.is_symlink():
            continue
        discard_tree(base)
        removed.append(base)
    return removed


@contextmanager
def temporary_workroot(prefix: str = "libra-work-") -> Iterator[Path]:
    """`make_workroot` for the length of a `with` block (removed after it)."""
    root = make_workroot(prefix)
    try:
        yield root
    finally:
        discard_tree(root)


def make_workroot(prefix: str = "libra-work-") -> Path:
    """A new directory for working directories, which a sandbox's uid can reach (mode 711) and the
    sandbox server can serve: make working directories inside it."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=workroot_base()))
    os.chmod(root, 0o711)
    return root


class WorkdirsFull(LibraError):
    """Another working directory's tmpfs would let them all pin more memory than `sandbox.workdirs_bytes`."""


def check_workdirs(sandbox: SandboxConfig, trajectories: int) -> None:
    """Refused before any work where the working directories are tmpfs mounts (Libra runs as root):
    `trajectories` open at once whose caps pass sandbox.workdirs_bytes (each would be refused as it
    opened, the rollout with it)."""
    allowed, named = workdirs_budget(sandbox)
    if sandbox.isolation == "bwrap" and can_mount() and trajectories * sandbox.workdir_bytes > allowed:
        raise WorkdirsFull(f"{trajectories} trajectories at once, each with a working directory of sandbox.workdir_bytes "
                           f"{sandbox.workdir_bytes / 2**20:,.0f} MiB, may hold "
                           f"{trajectories * sandbox.workdir_bytes / 2**20:,.0f} MiB of files in memory, past {named}; "
                           f"{WORKDIRS_REMEDY}")


def workdirs_budget(sandbox: SandboxConfig) -> tuple[int, str]:
    """The bytes the working directories open at once may pin (sandbox.workdirs_bytes, 0: a quarter
    of this machine's memory), and the budget in words."""
    allowed = sandbox.workdirs_bytes or machine_memory_bytes() // 4
    return allowed, (f"sandbox.workdirs_bytes {allowed / 2**20:,.0f} MiB"
                     f"{'' if sandbox.workdirs_bytes else ' (a quarter of this machine memory)'}")


WORKDIRS_REMEDY = ("lower sandbox.workdir_bytes (a task's files need a few KiB) or the trajectories in flight, or raise "
                   "sandbox.workdirs_bytes")


def check_room(sandbox: SandboxConfig) -> None:
    """Refused: another working directory of `sandbox.workdir_bytes` beside those mounted on this
    machine now (every Libra process's, read from the mount table) past the budget. Call it with
    the mounting lock held: two threads must not both fit in the last room."""
    held, size = workdir_bytes_held(Path("/proc/self/mountinfo").read_text()), sandbox.workdir_bytes
    allowed, named = workdirs_budget(sandbox)
    if held + size > allowed:
        raise WorkdirsFull(f"the working directories open now on this machine (every Libra process's) may hold "
                           f"{held / 2**20:,.0f} MiB of files in memory, and another of sandbox.workdir_bytes "
                           f"{size / 2**20:,.0f} MiB would pass {named}; {WORKDIRS_REMEDY}")
