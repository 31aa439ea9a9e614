"""The caller's side of the sandbox server (`libra.rollout.sandbox_server.SERVE`): `Server`
starts it and hands it calls, from any thread; one reader thread hands each finished call's status
to the thread waiting for it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path


def start_kept(argv: list[str], **options) -> subprocess.Popen:
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


class Server:
    """The caller's side of the sandbox server: any thread may call `run`; one reader thread hands
    each finished call's status to the thread waiting for it."""

    def __init__(self, argv_for: Callable[[int], list[str]]) -> None:
        """Start the server with the command `argv_for(fd)`, `fd` being its end of the socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with tempfile.TemporaryFile(prefix="libra-sandbox-server-") as log:
            try:
                self.proc = start_kept(argv_for(theirs.fileno()), pass_fds=(theirs.fileno(),),
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
                raise ServerStopped(log.read(2000).decode(errors="replace").strip() or "no word from it")
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

    def run(self, code: str, rel: Path, rlimits: list, tmp_bytes: int, timeout_s: float, out, err,
            cgroup: str | None = None) -> tuple[int, bool]:
        """(exit code, timed out) of one call in the working directory `rel` under the root, with
        the resource limits `rlimits` ([(name, (soft, hard)), ...]), a /tmp of `tmp_bytes`, in the
        memory cgroup `cgroup` of the server's directory of calls (if any), killed after
        `timeout_s`; its stdout and stderr go to the files `out` and `err`."""
        source = os.memfd_create("libra-tool-code", os.MFD_CLOEXEC)  # the server never holds the code
        try:
            os.write(source, code.encode())
            os.lseek(source, 0, os.SEEK_SET)
            return self._call(source, rel, rlimits, tmp_bytes, timeout_s, out, err, cgroup)
        finally:
            os.close(source)

    def _call(self, source: int, rel: Path, rlimits: list, tmp_bytes: int, timeout_s: float, out, err,
              cgroup: str | None) -> tuple[int, bool]:
        box: queue.SimpleQueue = queue.SimpleQueue()
        with self.lock:
            if not self.alive:
                raise ServerStopped("the tool server stopped before the call; it restarts for the next one")
            ident, self.next_id = self.next_id, self.next_id + 1
            self.waiting[ident] = box
            request = {"id": ident, "rel": str(rel), "limits": rlimits, "tmp_bytes": tmp_bytes, "cgroup": cgroup}
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [source, out.fileno(), err.fileno()])
            except OSError as exc:
                self.waiting.pop(ident, None)
                raise ServerStopped(f"the tool server stopped ({exc}); it restarts for the next one") from exc
        timed_out = False
        try:
            status = box.get(timeout=timeout_s)
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
