"""Cgroups per tool call: the memory, the CPU time and the processes of all of a call's processes
together are capped, not only each process's.

Where Libra runs as root and the memory controller is writable (cgroup v1's memory hierarchy, or
cgroup v2 where this process may enable the controller for a subtree of its own), a process makes
one directory for its calls (`libra-sandbox-<pid>-<n>`, beside or under its own cgroup) in each
hierarchy it uses, and in each one cgroup per call, whose limits it writes before the call starts
(as root: the call cannot change them):

- memory (required): all the call's processes together, swap capped too where the kernel counts it;
- CPU, where the controller is at hand (v1's `cpu`, or v2's): a CFS quota of the call's cores, so a
  call that starts as many busy processes as it may cannot take the machine's other cores from the
  engines and the trainer;
- processes and threads (`pids`), where at hand: the call's own cap, whichever kernel counts the
  per-user process limit across calls.

The call joins its cgroups before any of its code runs, so every process it starts is counted:

- a bwrap per call: the command starts with a shell that moves itself there, then execs bwrap;
- the sandbox server: each of the call's cgroups' `cgroup.procs` (that file only) is given to the
  sandbox's uid, the server sees the directories of calls (under `sandbox_server.CGROUPS`), and the
  call's first process moves itself in before it makes its namespaces, then covers `CGROUPS` so the
  code never sees it.

When a call ends its cgroups are removed (its processes are gone by then); a call the kernel's OOM
killer ended inside its cgroup is reported as such. A process killed with SIGKILL leaves its
directories behind: the next process to make them removes those whose process is gone.

Where the memory cgroup is not possible (not root, no writable memory controller),
`CallCgroups.open` raises and the sandbox says once which guarantee holds instead: each process's
address space (RLIMIT_AS) times the process limit, and CPU time per process. Where only the CPU or
process controller is missing, `CallCgroups.missing` says why, and the sandbox says that once too.
"""
from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from libra.clock import Clock, Deadline, sleep
from libra.files import owner_gone

PREFIX = "libra-sandbox-"  # then the making process's pid, a dash and the `CallCgroups` it holds
_OPENED = itertools.count()  # `CallCgroups` opened by this process (each has directories of its own)
CONTROLLERS = ("memory", "cpu", "pids")  # what a call's cgroups may cap (memory first: required)
CPU_PERIOD_US = 100_000  # the CFS period a call's CPU quota is given in
MACHINERY = 3  # processes of a call that are not its code's: what starts it and its namespace's init


@dataclass(frozen=True)
class Hierarchy:
    """Where a call's cgroups can be made: cgroup `version` (1 or 2), the directory of this
    process's own cgroup in it, and which of `CONTROLLERS` it carries."""

    version: int
    own: Path
    controllers: tuple[str, ...] = ("memory",)


def find_hierarchies(proc_cgroup: str, mountinfo: str) -> tuple[Hierarchy, ...]:
    """The hierarchies of `CONTROLLERS` from /proc/self/cgroup and /proc/self/mountinfo, the memory
    controller's first: cgroup v1's where its `memory` controller is mounted (then also its `cpu`
    and `pids`, each where mounted), else the v2 hierarchy (which may offer all three); none if
    neither holds the memory controller."""
    v1_paths: dict[str, str] = {}  # controller -> this process's path in its hierarchy
    v2_path = None
    for line in proc_cgroup.splitlines():
        ident, controllers, path = line.split(":", 2)
        for controller in set(controllers.split(",")) & set(CONTROLLERS):
            v1_paths[controller] = path
        if ident == "0" and controllers == "":
            v2_path = path
    v1_mounts: dict[str, Path] = {}
    v2_mount = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        if tail[0] == "cgroup":
            for controller in set(tail[2].split(",")) & set(CONTROLLERS):
                v1_mounts[controller] = Path(fields[4])
        elif tail[0] == "cgroup2":
            v2_mount = Path(fields[4])
    v1 = {c: v1_mounts[c] / v1_paths[c].lstrip("/") for c in CONTROLLERS if c in v1_paths and c in v1_mounts}
    if "memory" in v1:
        # co-mounted controllers (cpu,cpuacct with pids, say) share one hierarchy
        return tuple(Hierarchy(1, own, tuple(c for c in CONTROLLERS if v1.get(c) == own))
                     for own in dict.fromkeys(v1.values()))
    if v2_path is not None and v2_mount is not None:
        return (Hierarchy(2, v2_mount / v2_path.lstrip("/"), CONTROLLERS),)
    return ()


class CgroupUnavailable(OSError):
    """This machine does not let this process make memory cgroups (the message says why)."""


@dataclass(frozen=True)
class _Tree:
    """This process's directory of calls (`top`) in one hierarchy, for `controllers` of it."""

    hierarchy: Hierarchy
    top: Path
    controllers: tuple[str, ...]


class CallCgroups:
    """This process's directories of per-call cgroups, one per hierarchy (the memory controller's
    first); safe to use from many threads. `missing` names the controllers calls do not get."""

    def __init__(self, trees: tuple[_Tree, ...], uid: int, clock: Clock, missing: dict[str, str] | None = None) -> None:
        self.trees, self.uid, self.clock = trees, uid, clock
        self.missing = dict(missing or {})  # controller -> why calls do not get it
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._live = 0  # calls made and not yet removed

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(c for tree in self.trees for c in tree.controllers)

    @property
    def tops(self) -> tuple[Path, ...]:
        """The directories of calls, the memory controller's first."""
        return tuple(tree.top for tree in self.trees)

    @classmethod
    def open(cls, uid: int, clock: Clock, proc_cgroup: str | None = None, mountinfo: str | None = None,
             total_bytes: int | None = None) -> CallCgroups:
        """Make this process's directories of calls (removing those of processes that are gone), the
        memory of all its calls together capped at `total_bytes` (None: uncapped), or raise
        `CgroupUnavailable` saying why it cannot make memory cgroups. A CPU or process-count
        controller that cannot be used is named in `missing`, with the reason."""
        if os.geteuid() != 0:
            raise CgroupUnavailable("cgroups for tool calls need Libra to run as root")
        hierarchies = find_hierarchies(
            proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text(),
            mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
        if not hierarchies:
            raise CgroupUnavailable("no memory cgroup hierarchy is mounted")
        trees: list[_Tree] = []
        missing: dict[str, str] = {}
        name = f"{PREFIX}{os.getpid()}-{next(_OPENED)}"
        try:
            for hierarchy in hierarchies:
                try:
                    trees.append(_open_tree(hierarchy, name, total_bytes))
                except CgroupUnavailable as exc:
                    if "memory" in hierarchy.controllers:
                        raise
                    missing.update((c, str(exc)) for c in hierarchy.controllers)
        except CgroupUnavailable:
            for tree in trees:
                _rmdir(tree.top)
            raise
        at_hand = {c for tree in trees for c in tree.controllers}
        missing.update((c, "its controller is not mounted or not offered here") for c in CONTROLLERS
                       if c not in at_hand and c not in missing)
        return cls(tuple(trees), uid, clock, missing)

    def make(self, memory_bytes: int, cpus: float | None = None, processes: int | None = None,
             joiner_uid: int | None = None) -> str:
        """A new call's cgroups: its memory capped at `memory_bytes` (swap included) and, where
        their controllers are at hand, its CPU time at `cpus` cores and its processes and threads at
        `processes` plus the `MACHINERY` that starts the call (None: uncapped); its name. With
        `joiner_uid`, that uid may move processes into them (their `cgroup.procs` only)."""
        with self._lock:
            name = f"call-{next(self._names)}"
            self._live += 1
            self._weigh()
        made: list[Path] = []
        try:
            for tree in self.trees:
                path = tree.top / name
                path.mkdir()
                made.append(path)
                v1 = tree.hierarchy.version == 1
                if "memory" in tree.controllers:
                    if v1:
                        _write(path / "memory.limit_in_bytes", str(memory_bytes))
                        if (path / "memory.memsw.limit_in_bytes").exists():
                            _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
                    else:
                        _write(path / "memory.max", str(memory_bytes))
                        if (path / "memory.swap.max").exists():
                            _write(path / "memory.swap.max", "0")
                if "cpu" in tree.controllers and cpus is not None:
                    quota = cpu_quota_us(cpus)
                    if v1:
                        _write(path / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                        _write(path / "cpu.cfs_quota_us", str(quota))
                    else:
                        _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
                if "pids" in tree.controllers and processes is not None:
                    _write(path / "pids.max", str(processes + MACHINERY))
                if joiner_uid is not None:
                    os.chown(path / "cgroup.procs", joiner_uid, joiner_uid)
        except OSError:
            for path in made:
                _rmdir(path)
            self._ended()
            raise
        return name

    def _weigh(self) -> None:
        """Give the directory of calls the CPU weight of its calls in flight, each a default one
        (call with the lock held). The scheduler weighs a group as a whole: under one directory of
        the default weight, 16 calls in flight weighed together as one process would against the
        engines' and the agent loop's, where each had weighed as much as they did on its own (its
        own session's group); the math agent loop fell from 0.63 to 0.46 of straight decoding."""
        for tree in self.trees:
            if "cpu" in tree.controllers:
                live = max(1, self._live)
                if tree.hierarchy.version == 1:
                    _write(tree.top / "cpu.shares", str(min(262_144, 1_024 * live)))
                else:
                    _write(tree.top / "cpu.weight", str(min(10_000, 100 * live)))

    def _ended(self) -> None:
        with self._lock:
            self._live -= 1
            self._weigh()

    def procs(self, name: str) -> tuple[Path, ...]:
        """The files a process writes "0" to, to join the call's cgroups (the memory one first)."""
        return tuple(top / name / "cgroup.procs" for top in self.tops)

    def oom_killed(self, name: str) -> bool:
        """Whether the kernel killed a process of the call for its memory limit."""
        tree = self.trees[0]
        events = tree.top / name / ("memory.oom_control" if tree.hierarchy.version == 1 else "memory.events")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except OSError:
            pass
        return False

    def remove(self, name: str, wait_s: float = 2.0) -> bool:
        """Remove the call's cgroups once its processes are gone (waiting up to `wait_s`); whether
        they were all removed. The memory cgroup gives back what is still charged to it first
        (`_release`)."""
        deadline = Deadline(self.clock, wait_s)
        left = list(self.tops)
        try:
            while True:
                left = [top for top in left if not (_release(self.trees[0], top / name) and _rmdir(top / name))]
                if not left:
                    return True
                if deadline.left() <= 0:
                    return False
                sleep(self.clock, 0.01)
        finally:
            self._ended()

    def close(self) -> None:
        """Remove the directories of calls and what is left in them."""
        for top in self.tops:
            if top.is_dir():
                for child in top.iterdir():
                    if child.is_dir():
                        _rmdir(child)
                _rmdir(top)


def cpu_quota_us(cpus: float) -> int:
    """The CFS quota per `CPU_PERIOD_US` that gives `cpus` cores (at least 1 ms, the kernel's floor)."""
    if not cpus > 0:
        raise ValueError(f"a call's CPU cap must be above 0 cores, not {cpus}")
    return max(1_000, round(cpus * CPU_PERIOD_US))


def _open_tree(hierarchy: Hierarchy, name: str, total_bytes: int | None = None) -> _Tree:
    """This process's directory of calls (`name`) in `hierarchy`, with the hierarchy's controllers that can
    be used (v2: those it can enable for the directory; the memory controller is required), the
    memory of every call below it capped at `total_bytes` (each call is capped alone as well: 16
    calls in flight of 1 GiB each had held what they liked together, and a machine out of memory
    ends its largest process, Libra's)."""
    # v2 allows no process in a cgroup whose controllers its children use: the directory goes
    # beside this process's cgroup; v1 has no such rule and it goes below
    parent = hierarchy.own if hierarchy.version == 1 else hierarchy.own.parent
    if not os.access(parent, os.W_OK):
        raise CgroupUnavailable(f"{parent} is not writable")
    remove_orphaned(parent)
    top = parent / name
    controllers = hierarchy.controllers
    try:
        top.mkdir(exist_ok=True)
        if hierarchy.version == 2:
            offered = (parent / "cgroup.controllers").read_text().split()
            controllers = tuple(c for c in controllers if c in offered)
            if "memory" not in controllers:
                raise CgroupUnavailable(f"the memory controller is not offered under {parent}")
            for controller in controllers:
                if controller not in (parent / "cgroup.subtree_control").read_text().split():
                    _write(parent / "cgroup.subtree_control", f"+{controller}")
                _write(top / "cgroup.subtree_control", f"+{controller}")
        if total_bytes is not None and "memory" in controllers:
            _write(top / ("memory.limit_in_bytes" if hierarchy.version == 1 else "memory.max"), str(total_bytes))
    except OSError as exc:
        _rmdir(top)
        if isinstance(exc, CgroupUnavailable):
            raise
        raise CgroupUnavailable(f"could not make {'/'.join(controllers)} cgroups under {parent}: {exc.strerror or exc}") from None
    return _Tree(hierarchy, top, controllers)


def remove_orphaned(parent: Path) -> list[Path]:
    """Remove the directories of calls under `parent` whose process is gone; those removed."""
    removed = []
    for top in parent.glob(f"{PREFIX}*"):
        if not owner_gone(top.name, PREFIX) or not top.is_dir():
            continue
        for child in top.iterdir():
            if child.is_dir():
                _rmdir(child)
        if _rmdir(top):
            removed.append(top)
    return removed


def _release(memory: _Tree, path: Path) -> bool:
    """Reclaim what is still charged to a call's memory cgroup `path` (in the memory controller's
    tree `memory`; any other path: nothing to do) once its processes are gone; False while some
    are left. Pages of the page cache a call read in first (a file under /usr) stay charged to its
    cgroup after it ends: removed, the cgroup lingers in the kernel as long as they stay cached,
    which is for good on a machine without memory pressure, and the kernel makes at most 65,535 of
    them. A call that read a fresh page of a large system file each time left one behind per call.
    Reclaimed first, it goes when it is removed (the pages are read again when next needed). The
    working directory's files (tmpfs, no swap) cannot be reclaimed: they hold the cgroup only until
    the trajectory's working directory goes."""
    if path.parent != memory.top:
        return True
    try:
        if (path / "cgroup.procs").read_text().strip():
            return False
        if memory.hierarchy.version == 1:
            _write(path / "memory.force_empty", "0")
        elif (path / "memory.reclaim").exists():  # cgroup v2, Linux 5.19 and later
            _write(path / "memory.reclaim", (path / "memory.current").read_text().strip() or "0")
    except FileNotFoundError:
        return True  # removed already
    except OSError:
        pass  # what could not be reclaimed keeps the cgroup a while longer; the removal goes on
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
