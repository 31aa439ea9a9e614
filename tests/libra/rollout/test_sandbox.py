"""Each escape attempt is stopped and reported, and the next call works."""

import os
import signal
import threading
import time

import pytest

from libra.rollout import sandbox
from libra.rollout.sandbox import SandboxLimits

FAST = SandboxLimits(timeout_s=3.0, cpu_s=2, memory_bytes=256 * 2**20)


@pytest.fixture(params=[True, False], ids=["server", "fresh"])
def run_python(request):
    """Every test runs both ways: forked from the sandbox server and in a fresh interpreter."""
    def run(code, workdir, limits=None):
        return sandbox.run_python(code, workdir, limits or SandboxLimits(), server=request.param)
    return run


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def test_plain_code_runs_and_returns_its_output(run_python, workdir):
    result = run_python("print(sum(range(10)))", workdir, FAST)
    assert (result.status, result.exit_code, result.output) == ("ok", 0, "45")


def test_an_infinite_loop_is_killed(run_python, workdir):
    result = run_python("while True:\n    pass", workdir, FAST)
    assert result.status == "timeout" and result.seconds < 5
    assert run_python("print('next')", workdir, FAST).output == "next"


def test_a_fork_bomb_is_refused(run_python, workdir):
    result = run_python("import os\nwhile True:\n    os.fork()", workdir, FAST)
    assert result.status == "error" and "starting processes is not allowed" in result.stderr


def test_a_subprocess_is_refused(run_python, workdir):
    result = run_python("import subprocess\nsubprocess.run(['ls', '/'])", workdir, FAST)
    assert result.status == "error" and "starting processes is not allowed" in result.stderr


def test_a_10_gb_allocation_fails(run_python, workdir):
    result = run_python("x = bytearray(10 * 2**30)\nprint('allocated')", workdir, FAST)
    assert result.status == "error" and "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_the_network_is_unreachable(run_python, workdir):
    code = "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))\nprint('connected')"
    result = run_python(code, workdir, FAST)
    assert result.status == "error" and "connected" not in result.stdout
    assert "network access is not allowed" in result.stderr
    assert result.isolation in ("netns", "userns+netns", "audit-hook")
    if result.isolation != "audit-hook":  # the interpreter left the caller's network namespace
        inside = run_python("import os\nprint(os.readlink('/proc/self/ns/net'))", workdir, FAST)
        assert inside.status == "ok" and inside.output != os.readlink("/proc/self/ns/net")


def test_limits_are_set_before_the_tools_code_runs(run_python, workdir):
    code = "import os, resource\nprint(resource.getrlimit(resource.RLIMIT_AS)[0], os.getsid(0) == os.getpid())"
    assert run_python(code, workdir, FAST).output == f"{FAST.memory_bytes} True"  # and in its own session


def test_writes_outside_the_directory_are_refused(run_python, workdir, tmp_path):
    outside = tmp_path / "outside.txt"
    result = run_python(f"open({str(outside)!r}, 'w').write('x')", workdir, FAST)
    assert result.status == "error" and "outside the working directory" in result.stderr
    assert not outside.exists()
    inside = run_python("open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())", workdir, FAST)
    assert inside.output == "ok" and (workdir / "inside.txt").read_text() == "ok"


def test_output_is_capped(run_python, workdir):
    result = run_python("print('x' * 100000)", workdir, SandboxLimits(max_output_bytes=1000))
    assert result.truncated and len(result.stdout) == 1000


def test_native_escapes_are_refused(run_python, workdir):
    result = run_python("import ctypes\nctypes.CDLL(None).system(b'echo hi')", workdir, FAST)
    assert result.status == "error" and "native libraries" in result.stderr


def test_signalling_other_processes_is_refused(run_python, workdir):
    result = run_python("import os\nos.kill(os.getppid(), 0)", workdir, FAST)  # signal 0: harmless if let through
    assert result.status == "error" and "signalling other processes is not allowed" in result.stderr
    assert run_python("print('still here')", workdir, FAST).output == "still here"


def test_concurrent_calls_each_get_their_own_output(workdir, monkeypatch):
    monkeypatch.setattr(sandbox, "_ISOLATION", None)  # the first calls of a process race to probe it
    outputs, isolated = {}, {}
    here = os.readlink("/proc/self/ns/net")

    def call(i):
        result = sandbox.run_python(f"import os\nprint({i} * {i})\nprint(os.readlink('/proc/self/ns/net'))", workdir, FAST)
        outputs[i], namespace = result.output.splitlines()
        isolated[i] = result.isolation == "audit-hook" or namespace != here

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs == {i: str(i * i) for i in range(12)}
    assert all(isolated.values())  # none ran before the probe had decided (it once let early calls through)


def test_a_call_in_flight_when_the_server_dies_is_reported_and_the_next_one_restarts_it(workdir):
    assert sandbox.run_python("print('up')", workdir, FAST).output == "up"
    server = sandbox._SERVER
    killer = threading.Timer(0.5, lambda: os.kill(server.proc.pid, signal.SIGKILL))
    killer.start()
    began = time.monotonic()
    result = sandbox.run_python("open('ran.txt', 'a').write('x')\nwhile True:\n    pass", workdir, FAST)
    killer.join()
    assert result.status == "error" and "tool server stopped" in result.stderr
    assert time.monotonic() - began < FAST.timeout_s + 1
    assert (workdir / "ran.txt").read_text() == "x"  # it ran once and is not run again
    assert not server.running  # its process was stopped with the server
    assert sandbox.run_python("print('again')", workdir, FAST).output == "again"
    assert sandbox._SERVER is not server
