"""The sandbox between calls: a call learns nothing of the other calls in flight (not from its own
memory, the frames it was forked from, its mount table or the kernel's key lists), and nothing it
leaves in flight stops the others. Both ways a call can start (see `test_sandbox.py`)."""

import os
import re
import threading
import time
from pathlib import Path

import pytest

from libra.config import SandboxConfig
from libra.rollout.envs import make_env
from libra.rollout.sandbox import Sandbox, SandboxLimits
from tests.libra.rollout.test_sandbox import open_episode


@pytest.fixture(params=[True, False], ids=["server", "bwrap-per-call"])
def config(request):
    return SandboxConfig(server=request.param)


MEMORY_SCAN = r"""
import re
found = set()
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        span, perms = line.split()[:2]
        low, high = (int(x, 16) for x in span.split('-'))
        if 'r' not in perms or high - low > 1 << 28:
            continue
        for at in range(low, high, 1 << 20):
            try:
                mem.seek(at)
                found.update(m.decode() for m in re.findall(rb'leaky-[a-z]+', mem.read(min(1 << 20, high - at) + 64)))
            except (OSError, ValueError, OverflowError):
                pass
import __main__
print(sorted(found), sorted(k for k in vars(__main__) if k in ('pids', 'children', 'request', 'message', 'waiting')))
"""


def test_a_call_holds_nothing_of_the_other_calls_in_flight_in_its_memory(tmp_path, config):
    """Every byte a call's process can read of itself (/proc/self/mem) while another call is in
    flight: the server's requests (the other's working directory) are nowhere in it, because the
    process was forked before any request came (it reads only its own). The directories are
    trajectories' own file systems (as root), made before the server starts, as a rollout makes
    them: the server never reads its mount table, which would list them all."""
    box = Sandbox(config)
    limits = SandboxLimits(timeout_s=10.0, cpu_s=8, memory_bytes=512 * 2**20)
    other, mine, third = tmp_path / "leaky-alpha", tmp_path / "leaky-bravo", tmp_path / "leaky-charlie"
    for d in (other, mine, third):
        d.mkdir()
        box.prepare(d)
    waiting = threading.Thread(target=box.run, args=("import time\ntime.sleep(3)", other, limits))
    waiting.start()
    time.sleep(1.0)
    result = box.run(MEMORY_SCAN, mine, limits)
    waiting.join()
    assert result.status == "ok", result.output
    assert result.output in ("['leaky-bravo'] []", "[] []")  # its own name at most (the server's request)


FRAMES = r"""
import sys, __main__
seen, frame = [], sys._getframe().f_back
while frame is not None:
    seen.append((frame.f_code.co_name, {k: v for k, v in frame.f_locals.items() if isinstance(v, (int, str, bytes, list, dict, tuple))}))
    frame = frame.f_back
print(repr(seen), repr({k: v for k, v in vars(__main__).items() if isinstance(v, (int, str, bytes, list, dict, tuple))}))
"""


def test_the_frames_it_was_forked_from_hold_nothing_of_another_call(tmp_path, config):
    """What the interpreter that forked the call held (every frame below the code's, and its
    globals) names no other call: not one in flight, not the exit code of one that ended."""
    box = Sandbox(config)
    limits = SandboxLimits(timeout_s=10.0, cpu_s=8)
    ended, other, mine = tmp_path / "leaky-delta", tmp_path / "leaky-alpha", tmp_path / "leaky-bravo"
    for d in (ended, other, mine):
        d.mkdir()
    assert box.run("import sys\nsys.exit(173)", ended, limits).exit_code == 173
    waiting = threading.Thread(target=box.run, args=("import time\ntime.sleep(3)", other, limits))
    waiting.start()
    time.sleep(1.0)
    results = [box.run(FRAMES, mine, limits) for _ in range(3)]  # (the first may have been forked ahead of the end)
    waiting.join()
    for result in results:
        assert result.status == "ok", result.output
        assert "leaky-alpha" not in result.output and "leaky-delta" not in result.output  # its own request names itself
        assert not re.search(r"\b(173|44288)\b", result.output)  # the exit code, or its wait status


def test_the_kernels_key_lists_show_nothing_of_the_other_calls(tmp_path, config):
    """Every call's session keyring belongs to the one sandbox uid: /proc/keys listed the others'
    in flight and /proc/key-users counted them. Both read empty (the server) or are refused (a bwrap
    of its own binds them without devices)."""
    box = Sandbox(config)
    limits = SandboxLimits(timeout_s=10.0)
    others = [tmp_path / f"o{i}" for i in range(3)]
    for d in [*others, tmp_path / "mine"]:
        d.mkdir()
    waiting = [threading.Thread(target=box.run, args=("import time\ntime.sleep(2.5)", d, limits)) for d in others]
    for t in waiting:
        t.start()
    time.sleep(1.0)
    code = ("for path in ('/proc/keys', '/proc/key-users'):\n    try:\n        print(repr(open(path).read()))\n"
            "    except PermissionError:\n        print('refused')")
    result = box.run(code, tmp_path / "mine", limits)
    for t in waiting:
        t.join()
    assert result.output == ("''\n''" if config.server else "refused\nrefused")


def test_its_mount_table_names_no_other_working_directory(tmp_path, config):
    """Each trajectory's working directory is a file system of its own (as root): a call's mount
    table lists its own at /workspace, the system and its private mounts, and nothing of the
    others' (the server's calls get a root of their own, the server's detached)."""
    others = [open_episode("math", config, tmp_path / f"leaky-{name}") for name in ("alpha", "charlie")]
    mine = open_episode("math", config, tmp_path / "leaky-bravo")
    output, status = mine.call("python", "print(sorted({l.split()[4] for l in open('/proc/self/mountinfo')}))")
    assert status == "ok" and "leaky" not in output and "/roots" not in output and "/workspace" in output
    assert all(episode.call("python", "print(1)") == ("1", "ok") for episode in others)


IN_FLIGHT = r"""
import os, resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fd, keep, sent = os.open("/dev/null", os.O_RDONLY), [], 0
try:
    while True:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        a.setblocking(False)
        keep.append((a, b))
        while True:
            try:
                socket.send_fds(a, [b"x"], [fd] * 250)
                sent += 250
            except BlockingIOError:
                break
except OSError as exc:
    print(hard, sent, exc.errno, flush=True)
time.sleep(4)
"""


def test_descriptors_a_call_leaves_in_flight_do_not_stop_the_others(tmp_path, config):
    """Descriptors sent over unix sockets and not yet received are counted per host uid, which the
    calls and the sandbox server share; a process may send none past its own RLIMIT_NOFILE. A call
    that fills that count (its limit raised to its hard one) stopped the server, and every call in
    flight with it; now the server's limit is above any call's, and a call started meanwhile runs."""
    box = Sandbox(config)
    limits = SandboxLimits(timeout_s=10.0)
    attacker, victim = tmp_path / "attacker", tmp_path / "victim"
    attacker.mkdir()
    victim.mkdir()
    results = {}
    attack = threading.Thread(target=lambda: results.setdefault("attack", box.run(IN_FLIGHT, attacker, limits)))
    attack.start()
    time.sleep(2.5)
    results["victim"] = box.run("print('fine')", victim, limits)
    attack.join()
    hard, sent, refused = results["attack"].output.split()
    assert int(hard) == limits.open_files and int(sent) > int(hard) and int(refused) == 109  # ETOOMANYREFS
    assert (results["victim"].status, results["victim"].output) == ("ok", "fine")


def memory_cgroups() -> int:
    """The memory cgroups the kernel holds, those removed but still charged included."""
    for line in open("/proc/cgroups"):
        if line.startswith("memory\t"):
            return int(line.split()[2])
    return 0


def test_a_call_that_reads_system_files_leaves_no_memory_cgroup_behind(tmp_path, config):
    """Each call reads a page of a system file that nothing had cached, so the page is charged to
    the call's memory cgroup. Left at that, every removed cgroup lingered in the kernel while its
    page stayed cached (for good, without memory pressure), one per call, towards the kernel's
    limit of 65,535; the call's cgroup gives its pages back before it is removed."""
    env = make_env("math", config)
    env.limits = SandboxLimits(timeout_s=30.0, cpu_s=5, memory_bytes=256 * 2**20)  # 20 calls, on a busy machine too
    (tmp_path / "work").mkdir()
    episode = env.open(env.tasks(1, seed=0)[0], tmp_path / "work")
    if Sandbox(config).cgroups() is None:
        pytest.skip("calls get memory cgroups only as root, where the controller is writable")
    output, _ = episode.call("python", "import os\np = os.path.join(os.path.dirname(os.__file__), '_pydecimal.py')\n"
                                       "print(p, os.stat(p).st_ino)")
    path, inode = output.rsplit(" ", 1)  # the calls' interpreter's standard library: the host's own file
    source = Path(path)
    if not source.is_file() or source.stat().st_ino != int(inode):
        pytest.skip(f"the calls' {path} is not the host's file")
    pages = 20
    assert source.stat().st_size > pages * 4096
    before = memory_cgroups()
    for page in range(pages):
        with open(source, "rb") as handle:  # this page leaves the page cache, to be read in by the call
            os.posix_fadvise(handle.fileno(), page * 4096, 4096, os.POSIX_FADV_DONTNEED)
        code = (f"import os\nfd = os.open({path!r}, os.O_RDONLY)\nos.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)\n"
                f"print(len(os.pread(fd, 1, {page * 4096})))")
        assert episode.call("python", code) == ("1", "ok")
    assert memory_cgroups() - before < pages // 2  # calls of another test in flight beside may count
