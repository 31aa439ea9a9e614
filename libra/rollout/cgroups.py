"""A memory cgroup per tool call: the memory of all of a call's processes together is capped, not
only each process's address space.

Where Libra runs as root and the memory controller is writable (cgroup v1's memory hierarchy, or
cgroup v2 where this process may enable the controller for a subtree of its own), a process makes
one directory for its calls (`libra-sandbox-<pid>`, beside or under its own cgroup) and in it one
cgroup per call, whose limit it writes before the call starts (as root: the call cannot change it),
with swap capped too where the kernel counts it. The call joins its cgroup before any of its code
runs, so every process it starts is counted:

- a bwrap per call: the command starts with a shell that moves itself there, then execs bwrap;
- the sandbox server: the call's cgroup's `cgroup.procs` (that file only) is given to the sandbox's
  uid, the server sees the directory of calls (at `sandbox_server.CGROUPS`), and the call's first process moves itself
  in before it makes its namespaces, then covers `CGROUPS` so the code never sees it.

When a call ends its cgroup is removed (its processes are gone by then); a call the kernel's OOM
killer ended inside its cgroup is reported as such. A process killed with SIGKILL leaves its directory
behind: the next process to make one removes those whose process is gone.

Where none of this is possible (not root, no writable memory controller), `CallCgroups.open`
returns None and the sandbox says once which guarantee holds instead: each process's address space
(RLIMIT_AS) times the process limit.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from libra.clock import Clock, Deadline, sleep

PREFIX = "libra-sandbox-"  # then the making process's pid


@dataclass(frozen=True)
class Hierarchy:
    """Where memory cgroups can be made: cgroup `version` (1 or 2) and the directory of this
    process's own cgroup in it."""

    version: int
    own: Path


def find_hierarchy(proc_cgroup: str, mountinfo: str) -> Hierarchy | None:
    """The memory hierarchy from /proc/self/cgroup and /proc/self/mountinfo: v1's `memory`
    controller if mounted, else the v2 hierarchy if it offers the memory controller; None if
    neither is mounted."""
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        ident, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1_path = path
        elif ident == "0" and controllers == "":
            v2_path = path
    v1_mount = v2_mount = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup" and "memory" in tail[2].split(",") and fields[3] == "/":
            v1_mount = Path(fields[4])
        elif tail[0] == "cgroup2" and fields[3] == "/":
            v2_mount = Path(fields[4])
    if v1_path is not None and v1_mount is not None:
        return Hierarchy(1, v1_mount / v1_path.lstrip("/"))
    if v2_path is not None and v2_mount is not None:
        return Hierarchy(2, v2_mount / v2_path.lstrip("/"))
    return None


class CgroupUnavailable(OSError):
    """This machine does not let this process make memory cgroups (the message says why)."""


class CallCgroups:
    """This process's directory of per-call memory cgroups; safe to use from many threads."""

    def __init__(self, hierarchy: Hierarchy, top: Path, uid: int, clock: Clock) -> None:
        self.hierarchy, self.top, self.uid, self.clock = hierarchy, top, uid, clock
        self._names = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, uid: int, clock: Clock, proc_cgroup: str | None = None, mountinfo: str | None = None) -> CallCgroups:
        """Make this process's directory of calls (removing those of processes that are gone), or
        raise `CgroupUnavailable` saying why it cannot."""
        if os.geteuid() != 0:
            raise CgroupUnavailable("cgroups for tool calls need Libra to run as root")
        hierarchy = find_hierarchy(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text(),
                                   mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
        if hierarchy is None:
            raise CgroupUnavailable("no memory cgroup hierarchy is mounted")
        # v2 allows no process in a cgroup whose controllers its children use: the directory goes
        # beside this process's cgroup; v1 has no such rule and it goes below
        parent = hierarchy.own if hierarchy.version == 1 else hierarchy.own.parent
        if not os.access(parent, os.W_OK):
            raise CgroupUnavailable(f"{parent} is not writable")
        remove_orphaned(parent)
        top = parent / f"{PREFIX}{os.getpid()}"
        try:
            top.mkdir(exist_ok=True)
            if hierarchy.version == 2:
                if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                    _write(parent / "cgroup.subtree_control", "+memory")
                _write(top / "cgroup.subtree_control", "+memory")
        except OSError as exc:
            _rmdir(top)
            raise CgroupUnavailable(f"could not make memory cgroups under {parent}: {exc.strerror or exc}") from None
        return cls(hierarchy, top, uid, clock)

    def make(self, memory_bytes: int, joiner_uid: int | None = None) -> str:
        """A new call's cgroup capped at `memory_bytes` (swap included); its name. With
        `joiner_uid`, that uid may move processes into it (its `cgroup.procs` only)."""
        with self._lock:
            name = f"call-{next(self._names)}"
        path = self.top / name
        path.mkdir()
        try:
            if self.hierarchy.version == 1:
                _write(path / "memory.limit_in_bytes", str(memory_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():
                    _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
            else:
                _write(path / "memory.max", str(memory_bytes))
                if (path / "memory.swap.max").exists():
                    _write(path / "memory.swap.max", "0")
            if joiner_uid is not None:
                os.chown(path / "cgroup.procs", joiner_uid, joiner_uid)
        except OSError:
            _rmdir(path)
            raise
        return name

    def procs(self, name: str) -> Path:
        """The file a process writes "0" to, to join the call's cgroup."""
        return self.top / name / "cgroup.procs"

    def oom_killed(self, name: str) -> bool:
        """Whether the kernel killed a process of the call for its memory limit."""
        events = self.top / name / ("memory.oom_control" if self.hierarchy.version == 1 else "memory.events")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except OSError:
            pass
        return False

    def remove(self, name: str, wait_s: float = 2.0) -> bool:
        """Remove the call's cgroup once its processes are gone (waiting up to `wait_s`); whether it
        was removed."""
        deadline = Deadline(self.clock, wait_s)
        while True:
            if _rmdir(self.top / name):
                return True
            if deadline.left() <= 0:
                return False
            sleep(self.clock, 0.01)

    def close(self) -> None:
        """Remove the directory of calls and what is left in it."""
        if self.top.is_dir():
            for child in self.top.iterdir():
                if child.is_dir():
                    _rmdir(child)
            _rmdir(self.top)


def remove_orphaned(parent: Path) -> list[Path]:
    """Remove the directories of calls under `parent` whose process is gone; those removed."""
    removed = []
    for top in parent.glob(f"{PREFIX}*"):
        pid = top.name[len(PREFIX):]
        if not pid.isdigit() or _alive(int(pid)) or not top.is_dir():
            continue
        for child in top.iterdir():
            if child.is_dir():
                _rmdir(child)
        if _rmdir(top):
            removed.append(top)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _rmdir(path: Path) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:  # busy: processes still in it
        return False
