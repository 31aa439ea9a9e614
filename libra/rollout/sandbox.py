"""Running model-generated code: a child process with hard limits.

Each call runs the tool's Python code in a process of its own session, in its own working directory, with
- wall time: the whole process tree is killed (SIGKILL to the group) when `timeout_s` passes;
- CPU time, address space (memory), file size and process count limits (`setrlimit`), so an
  infinite loop, a 10 GB allocation or a fork bomb fails inside the sandbox;
- no network: a new network namespace with only a down loopback (`unshare(CLONE_NEWNET)`, as root,
  or inside a new user namespace otherwise); where neither is allowed, Python code still runs with
  an audit hook that refuses sockets, and the result says which isolation applied;
- confinement: Python code runs under an audit hook that refuses opening files for writing, renaming,
  removing or creating directories outside the working directory (and `/dev/null`), and refuses
  spawning other programs and signalling processes other than its own;
- an output cap: stdout and stderr are cut at `max_output_bytes`.

How a call's process starts: by default it is forked from the sandbox server, a small interpreter
this process starts once (and again if it stops) that has already left the network namespace; the
child confines itself (session, working directory, descriptors, limits, environment, audit hook)
before the tool's code runs: about 2 ms a call. With `server=False`, or where the server cannot
start, a fresh interpreter is started by vfork and confines itself the same way first (about 16
ms). Neither forks the calling process itself: a fork that copies a rollout process's page tables
costs about 50 ms per GB it holds.

Results are `SandboxResult` records with a status the causal tree keys on: `ok`, `error` (non-zero
exit, including a refused operation) or `timeout`.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}

# How a sandboxed interpreter confines itself (defined in the fresh interpreter and in the server):
# leave the network namespace (ctypes is dropped again, so importing it later is refused by the
# hook), and set the limits on itself.
_SELF = r'''
import os, sys, resource
def _unshare(flags):
    import ctypes
    left = ctypes.CDLL(None, use_errno=True).unshare(flags) == 0
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]
    return left
def _limit(limits):
    for name, value in limits:
        resource.setrlimit(getattr(resource, name), tuple(value))
'''

# Runs first inside a fresh sandboxed interpreter (python -c), before the guard and the tool's code.
_CONFINE = _SELF + r'''
if %(flags)d and not _unshare(%(flags)d):
    sys.stderr.write("sandbox: could not leave the network namespace\n")
    os._exit(126)
_limit(%(limits)r)
del _unshare, _limit
'''

_GUARD = r'''
import os, sys
_root = os.path.realpath(os.getcwd())
_ok_paths = ("/dev/null",)
def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return p == _root or p.startswith(_root + os.sep) or p in _ok_paths
def _hook(event, args):
    if event == "open" and args and args[0] is not None and not isinstance(args[0], int):
        mode = args[1] or "r"
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if (any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)) and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {args[0]}")
    elif event in ("os.rename", "os.replace", "shutil.move", "shutil.copyfile"):
        for p in args[:2]:
            if not _inside(p):
                raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: {p}")
    elif event in ("os.remove", "os.unlink", "os.rmdir", "os.mkdir", "os.chmod", "os.symlink", "os.link", "os.truncate"):
        if args and not isinstance(args[0], int) and not _inside(args[0]):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: {args[0]}")
    elif event in ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto"):
        raise PermissionError("sandbox: network access is not allowed")
    elif event in ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.fork", "os.forkpty", "pty.spawn"):
        raise PermissionError(f"sandbox: starting processes is not allowed ({event})")
    elif event == "ctypes.dlopen":
        raise PermissionError("sandbox: loading native libraries is not allowed")
    elif (event == "os.kill" and args[0] not in (0, os.getpid())) or (event == "os.killpg" and args[0] != os.getpgid(0)):
        raise PermissionError(f"sandbox: signalling other processes is not allowed ({event} {args[0]})")
sys.addaudithook(_hook)
del _hook
'''


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall time for the whole process tree
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU)
    memory_bytes: int = 512 * 2**20  # address space (RLIMIT_AS)
    file_bytes: int = 16 * 2**20  # largest file it may write (RLIMIT_FSIZE)
    processes: int = 64  # RLIMIT_NPROC (applies per user; the sandbox runs few processes)
    max_output_bytes: int = 16_384  # stdout and stderr, each


@dataclass(frozen=True)
class SandboxResult:
    status: str  # ok | error | timeout
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    truncated: bool
    isolation: str  # netns | userns+netns | audit-hook

    @property
    def output(self) -> str:
        """What a tool returns to the model: stdout, then stderr, each already capped."""
        text = self.stdout + (("\n" if self.stdout and self.stderr else "") + self.stderr if self.stderr else "")
        if self.status == "timeout":
            text += f"\n[killed: time limit exceeded after {self.seconds:.1f} s]"
        return text.strip()


def _isolation() -> str:
    """Which network isolation this machine allows (probed once, in throwaway interpreters rather
    than forks of the caller, whose other threads may hold locks a forked child would wait on
    forever; callers on other threads wait for the probe rather than see a partial answer)."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is None:
            found = "audit-hook"
            for name, flags in (("netns", CLONE_NEWNET), ("userns+netns", CLONE_NEWUSER | CLONE_NEWNET)):
                probe = _SELF + f"sys.exit(0 if _unshare({flags}) else 1)"
                if subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, timeout=30).returncode == 0:
                    found = name
                    break
            _ISOLATION = found
        return _ISOLATION


_ISOLATION: str | None = None
_ISOLATION_LOCK = threading.Lock()


def _rlimits(limits: SandboxLimits) -> list[tuple[str, tuple[int, int]]]:
    return [("RLIMIT_CPU", (limits.cpu_s, limits.cpu_s + 1)), ("RLIMIT_AS", (limits.memory_bytes, limits.memory_bytes)),
            ("RLIMIT_FSIZE", (limits.file_bytes, limits.file_bytes)),
            ("RLIMIT_NPROC", (limits.processes, limits.processes)), ("RLIMIT_CORE", (0, 0))]


def _confinement(limits: SandboxLimits, unshare_flags: int) -> str:
    """The statements that isolate and limit the interpreter they run in."""
    return _CONFINE % {"flags": unshare_flags, "limits": _rlimits(limits)}


def run_python(code: str, workdir: str | Path, limits: SandboxLimits = SandboxLimits(), *,
               server: bool = True) -> SandboxResult:
    """Run Python source `code` in `workdir` under the limits (isolated mode, guarded by the audit
    hook): forked from the sandbox server (`server`, the default), or in a fresh interpreter."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise ValueError(f"sandbox working directory {workdir} does not exist")
    isolation = _isolation()
    flags = {"netns": CLONE_NEWNET, "userns+netns": CLONE_NEWUSER | CLONE_NEWNET}.get(isolation, 0)
    env = {**_ENV, "HOME": str(workdir), "TMPDIR": str(workdir)}
    began = time.monotonic()
    with tempfile.NamedTemporaryFile(prefix="libra-sandbox-") as out, \
            tempfile.NamedTemporaryFile(prefix="libra-sandbox-") as err:
        host = _server(flags) if server else None
        try:
            if host is not None:
                exit_code, timed_out = host.run(code, workdir, limits, env, out.name, err.name)
            else:
                exit_code, timed_out = _run_fresh(code, workdir, limits, env, flags, out, err)
        except ServerStopped as exc:  # the tool may or may not have run: report it, do not run it again
            return SandboxResult("error", None, "", f"sandbox: {exc}", time.monotonic() - began, False, isolation)
        seconds = time.monotonic() - began
        status = "timeout" if timed_out else "ok"
        if not timed_out and exit_code != 0:
            status = "timeout" if exit_code in (-signal.SIGXCPU, -signal.SIGKILL) and seconds >= limits.cpu_s * 0.9 else "error"
        stdout, cut_out = _read(out, limits.max_output_bytes)
        stderr, cut_err = _read(err, limits.max_output_bytes)
    return SandboxResult(status, None if status == "timeout" else exit_code, stdout, stderr, seconds,
                         cut_out or cut_err, isolation)


def _run_fresh(code: str, workdir: Path, limits: SandboxLimits, env: dict, flags: int, out, err) -> tuple[int, bool]:
    """(exit code, timed out) of the code in a fresh interpreter that confines itself first."""
    argv = [sys.executable, "-I", "-S", "-B", "-c",
            _confinement(limits, flags) + _GUARD + "\nexec(compile(sys.stdin.read(), '<tool>', 'exec'))"]
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                            start_new_session=True)
    timed_out = False
    try:
        proc.communicate(code.encode(), timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole tree, finished or not
        except ProcessLookupError:
            pass
        proc.wait()
    return proc.returncode, timed_out


def _read(handle, cap: int) -> tuple[str, bool]:
    handle.seek(0)
    data = handle.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


# -- the sandbox server ---------------------------------------------------------------------------
# A small interpreter (isolated mode, no site packages) that left the network namespace once; for
# each call it forks a child that starts its own session, enters the working directory, points
# stdin/stdout/stderr at /dev/null and the caller's files, closes every other descriptor, sets the
# limits, replaces the environment, installs the audit hook and only then runs the tool's code. A
# fork of this process takes about a millisecond; a fresh interpreter about ten. One JSON line per
# request on its stdin ({"id", "code", "workdir", "out", "err", "limits", "env"} or {"kill": id});
# on its stdout, {"id", "pid"} once a call's child runs and {"id", "status"} (the wait status) when
# it has finished. It kills whatever a
# finished child left in its process group before reaping it, and everything when its stdin closes.
_SERVE = _SELF + r'''
import json, select, signal, traceback
GUARD, flags = compile(sys.argv[1], "<sandbox guard>", "exec"), int(sys.argv[2])
if flags and not _unshare(flags):
    os.write(1, b'{"failed": "could not leave the network namespace"}\n')
    os._exit(1)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
children, pids = {}, {}
def send(message):
    os.write(1, (json.dumps(message) + "\n").encode())
def child(request):
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.chdir(request["workdir"])
        fds = [os.open(os.devnull, os.O_RDONLY), os.open(request["out"], os.O_WRONLY | os.O_TRUNC),
               os.open(request["err"], os.O_WRONLY | os.O_TRUNC)]
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        _limit(request["limits"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        exec(GUARD, {"__name__": "sandbox_guard"})
        exec(compile(request["code"], "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
def reap():
    while children:
        found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if found is None:
            return
        try:
            os.killpg(found.si_pid, signal.SIGKILL)  # not reaped yet: its process group is still its own
        except ProcessLookupError:
            pass
        _, status = os.waitpid(found.si_pid, 0)
        ident = children.pop(found.si_pid)
        pids.pop(ident, None)
        send({"id": ident, "status": status})
send({"ready": True})
pending = b""
while True:
    readable, _, _ = select.select([0, wake_r], [], [])
    if wake_r in readable:
        while True:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                break
    reap()
    if 0 not in readable:
        continue
    chunk = os.read(0, 1 << 16)
    if not chunk:
        for pid in children:
            os.killpg(pid, signal.SIGKILL)
        break
    pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        if "kill" in request:
            pid = pids.get(request["kill"])
            if pid in children:
                os.killpg(pid, signal.SIGKILL)
            continue
        pid = os.fork()
        if pid == 0:
            child(request)
        children[pid], pids[request["id"]] = request["id"], pid
        send({"id": request["id"], "pid": pid})
'''


class ServerStopped(RuntimeError):
    """The sandbox server went away during a call."""


class _Server:
    """The caller's side of the sandbox server: any thread may call `run`; one reader thread hands
    each finished call's status to the thread waiting for it."""

    def __init__(self, flags: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", _SERVE, _GUARD, str(flags)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_ENV, start_new_session=True)
        hello = self.proc.stdout.readline()
        if not hello.startswith(b'{"ready"'):
            self.proc.kill()
            self.proc.wait()
            raise ServerStopped(f"the sandbox server did not start: {hello.decode(errors='replace').strip()}")
        self.flags = flags
        self.owner = os.getpid()  # a forked copy of the caller must not share the pipes: it starts its own
        self.lock = threading.Lock()
        self.waiting: dict[int, queue.SimpleQueue] = {}
        self.running: dict[int, int] = {}  # call -> its child's pid, while it runs
        self.next_id = 0
        self.alive = True
        threading.Thread(target=self._read, name="libra-sandbox-server", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                message = json.loads(line)
                with self.lock:
                    if "pid" in message:
                        self.running[message["id"]] = message["pid"]
                        continue
                    self.running.pop(message["id"], None)
                    box = self.waiting.pop(message["id"], None)
                if box is not None:
                    box.put(message["status"])
        finally:
            self._gone()

    def _gone(self) -> None:
        """The server's output ended: stop what it left running and wake every caller."""
        with self.lock:
            self.alive = False
            boxes, self.waiting = list(self.waiting.values()), {}
            orphans, self.running = list(self.running.values()), {}
        if self.proc.poll() is None:  # its output broke off while it runs: it is not to be trusted
            self.proc.kill()
        for pid in orphans:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for box in boxes:
            box.put(None)

    def _send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def run(self, code: str, workdir: Path, limits: SandboxLimits, env: dict, out: str, err: str) -> tuple[int, bool]:
        """(exit code, timed out) of one call."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        with self.lock:
            if not self.alive:
                raise ServerStopped("the tool server stopped before the call; it restarts for the next one")
            ident, self.next_id = self.next_id, self.next_id + 1
            self.waiting[ident] = box
            try:
                self._send({"id": ident, "code": code, "workdir": str(workdir), "out": out, "err": err,
                            "limits": _rlimits(limits), "env": env})
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
                        self._send({"kill": ident})
                except OSError:  # it is going away: the reader reports that
                    pass
            try:
                status = box.get(timeout=30)  # the server reports the killed child (or its own end)
            except queue.Empty:
                raise ServerStopped("the tool server did not report a killed call") from None
        if status is None:
            raise ServerStopped("the tool server stopped during the call; it restarts for the next one")
        return os.waitstatus_to_exitcode(status), timed_out

    def close(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the server kills what is left and exits
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_SERVER: _Server | None = None
_SERVER_LOCK = threading.Lock()


def _server(flags: int) -> _Server | None:
    """This process's sandbox server (started on first use, restarted after it stopped); None where
    it cannot start (calls then start fresh interpreters)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive or _SERVER.owner != os.getpid() or _SERVER.flags != flags:
            if _SERVER is not None:
                _SERVER.close()
            try:
                _SERVER = _Server(flags)
            except (OSError, ServerStopped):
                _SERVER = None
            else:
                atexit.register(_SERVER.close)
        return _SERVER
