"""Running model-generated code: a child process with hard limits.

Each call runs one Python interpreter in a fresh process group, in its own working directory, with
- wall time: the whole process tree is killed (SIGKILL to the group) when `timeout_s` passes;
- CPU time, address space (memory), file size and process count limits (`setrlimit`), so an
  infinite loop, a 10 GB allocation or a fork bomb fails inside the sandbox;
- no network: a new network namespace with only a down loopback (`unshare(CLONE_NEWNET)`, as root,
  or inside a new user namespace otherwise); where neither is allowed, Python code still runs with
  an audit hook that refuses sockets, and the result says which isolation applied;
- confinement: Python code runs under an audit hook that refuses opening files for writing, renaming,
  removing or creating directories outside the working directory (and `/dev/null`), and refuses
  spawning other programs;
- an output cap: stdout and stderr are cut at `max_output_bytes`.

The interpreter is started without running anything in the forked child (so the fork is a cheap
vfork even from a rollout process holding gigabytes: a fork that copies the parent's page tables
costs about 50 ms per GB); its first statements, before any of the tool's code, leave the network
namespace and set the limits on itself, then install the audit hook.

Results are `SandboxResult` records with a status the causal tree keys on: `ok`, `error` (non-zero
exit, including a refused operation) or `timeout`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000

# Runs first inside the sandboxed interpreter (python -c), before the tool's code: the isolation and
# limits (ctypes is dropped again, so importing it later is refused by the hook), then the guard.
_CONFINE = r'''
import os, sys, resource
def _confine(unshare_flags, limits):
    if unshare_flags:
        import ctypes
        failed = ctypes.CDLL(None, use_errno=True).unshare(unshare_flags) != 0
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
            del sys.modules[name]
        if failed:
            sys.stderr.write("sandbox: could not leave the network namespace\n")
            os._exit(126)
    for name, value in limits:
        resource.setrlimit(getattr(resource, name), value)
_confine(%(flags)d, %(limits)r)
del _confine
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
    """Which network isolation this machine allows (probed once, in a throwaway child)."""
    global _ISOLATION
    if _ISOLATION is None:
        _ISOLATION = "audit-hook"
        for name, flags in (("netns", CLONE_NEWNET), ("userns+netns", CLONE_NEWUSER | CLONE_NEWNET)):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                libc = ctypes.CDLL(None, use_errno=True)
                os._exit(0 if libc.unshare(flags) == 0 else 1)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) == 0:
                _ISOLATION = name
                break
    return _ISOLATION


_ISOLATION: str | None = None


def _confinement(limits: SandboxLimits, unshare_flags: int) -> str:
    """The statements that isolate and limit the interpreter they run in."""
    rlimits = [("RLIMIT_CPU", (limits.cpu_s, limits.cpu_s + 1)), ("RLIMIT_AS", (limits.memory_bytes, limits.memory_bytes)),
               ("RLIMIT_FSIZE", (limits.file_bytes, limits.file_bytes)), ("RLIMIT_NPROC", (limits.processes, limits.processes)),
               ("RLIMIT_CORE", (0, 0))]
    return _CONFINE % {"flags": unshare_flags, "limits": rlimits}


def run_python(code: str, workdir: str | Path, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run Python source `code` in `workdir` under the limits (isolated mode, guarded by the audit hook)."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise ValueError(f"sandbox working directory {workdir} does not exist")
    isolation = _isolation()
    flags = {"netns": CLONE_NEWNET, "userns+netns": CLONE_NEWUSER | CLONE_NEWNET}.get(isolation, 0)
    argv = [sys.executable, "-I", "-S", "-B", "-c",
            _confinement(limits, flags) + _GUARD + "\nexec(compile(sys.stdin.read(), '<tool>', 'exec'))"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    began = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                start_new_session=True)
        status = "ok"
        try:
            proc.communicate(code.encode(), timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole tree, finished or not
            except ProcessLookupError:
                pass
            proc.wait()
        seconds = time.monotonic() - began
        code = proc.returncode
        if status == "ok" and code != 0:
            status = "timeout" if code in (-signal.SIGXCPU, -signal.SIGKILL) and seconds >= limits.cpu_s * 0.9 else "error"
        stdout, cut_out = _read(out, limits.max_output_bytes)
        stderr, cut_err = _read(err, limits.max_output_bytes)
    return SandboxResult(status, None if status == "timeout" else code, stdout, stderr, seconds,
                         cut_out or cut_err, isolation)


def _read(handle, cap: int) -> tuple[str, bool]:
    handle.seek(0)
    data = handle.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap
