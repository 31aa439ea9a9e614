"""The sandbox against deliberate escape.

Every attempt runs through an environment's real tool path (the math environment's `python` tool,
or the repo environment's `edit` then `test`), as a policy's code would, both ways a call can start
(from the sandbox server, and in a bwrap of its own). Each is stopped, the same episode's next call
works, and nothing outside the working directory changed on the host (a sentinel directory beside
it, with a secret file, is compared before and after)."""

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from libra.config import SandboxConfig
from libra.rollout import sandbox
from libra.rollout.envs import make_env
from libra.rollout.sandbox import Sandbox, SandboxLimits, SandboxUnavailable

FAST = SandboxLimits(timeout_s=3.0, cpu_s=2, memory_bytes=256 * 2**20)
AS_ROOT = os.geteuid() == 0


def open_episode(name: str, config: SandboxConfig, workdir: Path):
    env = make_env(name, config)
    env.limits = FAST
    workdir.mkdir()
    return env.open(env.tasks(1, seed=0)[0], workdir)


@pytest.fixture
def episode(tmp_path, config):
    return open_episode("math", config, tmp_path / "work")


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None,
                                            p.stat(follow_symlinks=False).st_mode)
            for p in sorted(directory.rglob("*"))}


def attack(episode, host: Path, code: str) -> tuple[str, str]:
    """Run the attack through the tool, then check the host and that the episode carries on."""
    before = snapshot(host.parent / "sentinel")
    output, status = episode.call("python", code)
    assert snapshot(host.parent / "sentinel") == before
    assert episode.call("python", "print(6 * 7)") == ("42", "ok")
    return output, status


# -- what the code sees --------------------------------------------------------------------------


def test_plain_code_runs_and_returns_its_output(episode):
    assert episode.call("python", "print(sum(range(10)))") == ("45", "ok")


def test_it_runs_as_an_unprivileged_user_with_no_capabilities(episode, host):
    output, status = attack(episode, host, "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
                                           "print([l for l in open('/proc/self/status') if l.startswith(('CapEff', 'NoNewPrivs'))])")
    ids, caps = output.splitlines()
    assert status == "ok" and ids == "65534 65534 []"
    assert "CapEff:\\t0000000000000000" in caps and "NoNewPrivs:\\t1" in caps


def test_only_the_system_the_interpreter_and_the_working_directory_are_visible(episode, host):
    output, _ = attack(episode, host, "import os\nprint(sorted(os.listdir('/')))\nprint(os.getcwd())\n"
                                      "print(sorted(os.environ))")
    root, cwd, env = output.splitlines()
    assert set(eval(root)) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "proc", "dev", "tmp", "workspace",
                               "root", "home", "opt", "roots", "cgroups"}  # root/home/opt only on the way to the interpreter; roots, cgroups empty
    assert "etc" not in root and cwd == "/workspace"
    assert set(eval(env)) == {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "HOME", "TMPDIR", "PWD"}


def test_its_cgroups_are_its_namespaces_root_and_name_nothing_of_the_host(episode, host):
    output, _ = attack(episode, host, "print(open('/proc/self/cgroup').read().strip())")
    assert output and all(line.endswith(":/") for line in output.splitlines())  # no host pid, no call counter


def test_no_process_it_can_see_names_a_host_path(episode, host):
    """The command lines and environments of every process in its namespace (its init included:
    with a bwrap per call that is bwrap, which reads its options from a descriptor) hold no path of
    the host's: not the working directory's, not the directory above it."""
    code = ("import os\nseen = []\nfor pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
            "    for name in ('cmdline', 'environ'):\n"
            "        try:\n            seen.append(open(f'/proc/{pid}/{name}', 'rb').read())\n"
            "        except OSError:\n            pass\n"
            "print(len(seen), b'\\0'.join(seen).decode(errors='replace'))")
    output, status = attack(episode, host, code)
    assert status == "ok" and int(output.split()[0]) >= 2  # its init's and its own, at least
    assert str(host.parent) not in output and "--bind" not in output


# -- files ---------------------------------------------------------------------------------------


def test_files_outside_the_working_directory_cannot_be_read(episode, host):
    for path in ["/etc/shadow", "/etc/passwd", str(host / "secret.txt"), "../sentinel/secret.txt", "/root/.bashrc",
                 f"/proc/1/root{host}/secret.txt"]:
        output, status = attack(episode, host, f"print(open({path!r}).read())")
        assert status == "error" and "31337" not in output and ("No such file" in output or "Permission" in output), path


def test_dir_fd_and_relative_writes_stay_inside(episode, host):
    code = ("import os\nfd = os.open('/', os.O_RDONLY)\n"
            "for name in ['pwned', 'tmp/pwned', 'workspace/../pwned']:\n"
            "    try:\n        os.close(os.open(name, os.O_WRONLY | os.O_CREAT, dir_fd=fd)); print('made', name)\n"
            "    except OSError as e:\n        print('refused', name, e.errno)\n"
            f"open({str(host / 'secret.txt')!r}, 'w')")
    output, status = attack(episode, host, code)
    assert status == "error" and "FileNotFoundError" in output
    assert not (host.parent / "pwned").exists() and not Path("/pwned").exists() and not Path("/tmp/pwned").exists()


def test_the_system_is_read_only_and_tmp_is_private_and_capped(episode, host):
    output, status = attack(episode, host, "open('/usr/pwned', 'w')")
    assert status == "error" and "Read-only file system" in output
    output, status = attack(episode, host, "open('/tmp/big', 'wb').write(b'x' * (64 * 2**20))")
    assert status == "error" and ("No space left" in output or "File too large" in output)
    episode.call("python", "open('/tmp/mark', 'w').write('x')")
    assert episode.call("python", "import os\nprint(os.path.exists('/tmp/mark'))") == ("False", "ok")  # a fresh /tmp per call


# -- processes -----------------------------------------------------------------------------------


def test_programs_it_starts_are_confined_too(episode, host):
    code = ("import _posixsubprocess, os, subprocess\n"
            "print(subprocess.run(['/bin/sh', '-c', 'id -u; cat /etc/shadow; touch /pwned-sh; echo x > "
            f"{host}/pwned'], capture_output=True, text=True))")
    output, status = attack(episode, host, code)
    assert status == "ok" and "65534" in output and not (host / "pwned").exists() and not Path("/pwned-sh").exists()


def test_a_child_in_a_new_session_dies_with_the_call(episode, host, tmp_path):
    # the grandchild writes 5 s after the fork: the call must have ended (and killed it) by then,
    # with room for a loaded machine (at 1.5 s a busy CI machine let it write once)
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(5.0)\n        open('late.txt', 'w').write('survived')\n    os._exit(0)\nprint('left')")
    assert attack(episode, host, code) == ("left", "ok")
    time.sleep(6.0)
    assert not (tmp_path / "work" / "late.txt").exists()


def test_processes_outside_cannot_be_seen_signalled_or_traced(episode, host):
    sleeper = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "60"]
                               if AS_ROOT else ["sleep", "60"])
    try:
        code = (f"import os, ctypes, signal\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint(len(pids))\n"
                f"for pid in ({sleeper.pid}, {os.getpid()}):\n"
                "    try:\n        os.kill(pid, signal.SIGKILL); print('killed', pid)\n"
                "    except ProcessLookupError:\n        print('none', pid)\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                f"print('ptrace', libc.ptrace(16, {sleeper.pid}, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH
                "try:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass")
        output, status = episode.call("python", code)
        assert sleeper.poll() is None  # alive, and so is this test
        assert f"none {sleeper.pid}" in output or f"killed {sleeper.pid}" not in output
        assert "ptrace -1 1" in output  # EPERM: the system-call filter refuses ptrace (the PID namespace hides the process too)
        assert int(output.splitlines()[0]) <= 3  # its own processes only (bwrap's init, itself)
        assert episode.call("python", "print(6 * 7)") == ("42", "ok")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_limits_bind_and_cannot_be_raised(episode, host):
    output, status = attack(episode, host, "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6))")
    assert status == "error" and "not allowed to raise" in output
    output, status = attack(episode, host, "import resource\nprint(*(resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) "
                                           "for n in ('AS', 'NPROC', 'NOFILE', 'MSGQUEUE', 'CORE', 'RTPRIO', "
                                           "'NICE', 'RTTIME')))")
    # a core limit of 1, not 0: the kernel ignores 0 where dumps go to a helper program (started as
    # root on the host with the call's memory); 1 stops it. No real-time priority, no lower nice
    # value, whatever the limits Libra was started with
    assert output == (f"{(FAST.memory_bytes,) * 2} {(FAST.processes,) * 2} {(FAST.open_files,) * 2} (0, 0) (1, 1) "
                      f"(0, 0) (0, 0) {(FAST.cpu_s * 10**6,) * 2}")
    output, status = attack(episode, host, "import os\ntry:\n    os.open('/dev/ptmx', os.O_RDWR)\n    print('pty')\n"
                                           "except OSError as e:\n    print(e.errno)")
    assert output in ("2", "13", "30")  # no pseudo-terminal (one count for every namespace but the host's)


def test_a_fork_bomb_is_stopped_by_the_process_limit(episode, host):
    output, status = attack(episode, host, "import os\nwhile True:\n    os.fork()")
    assert status == "error" and "Resource temporarily unavailable" in output


def test_an_infinite_loop_is_killed(episode, host):
    output, status = attack(episode, host, "while True:\n    pass")
    assert status == "timeout" and "time limit" in output


def test_a_10_gb_allocation_fails(episode, host):
    output, status = attack(episode, host, "x = bytearray(10 * 2**30)\nprint('allocated')")
    assert status == "error" and "MemoryError" in output


def test_its_init_ignores_its_signals(episode, host):
    output, status = attack(episode, host, "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('init alive')")
    assert (output, status) == ("init alive", "ok")  # a namespace's init takes no signal from inside


def test_no_mounts_namespaces_or_kernel_interfaces(episode, host):
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"
            "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
            "print(libc.unshare(0x00020000), ctypes.get_errno())\n"  # CLONE_NEWNS
            "print(libc.setuid(0), ctypes.get_errno())\n"
            "print(libc.chroot(b'/tmp'), ctypes.get_errno())")
    output, status = attack(episode, host, code)
    mount, userns, mountns, setuid, chroot = output.splitlines()
    assert mount.startswith("-1 ") and userns.startswith("-1 ") and mountns.startswith("-1 ")
    assert setuid.startswith("-1 ") and chroot.startswith("-1 ")


KEYRING = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
           "def show(r):\n    print(r, ctypes.get_errno() if r < 0 else 0)\n"
           # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0): the session keyring's id
           "show(libc.syscall(250, 0, -3, 0, 0, 0))\n"
           # add_key("user", "planted", "secret", 6, KEY_SPEC_SESSION_KEYRING)
           "show(libc.syscall(248, b'user', b'planted', b'secret', 6, -3))\n"
           # request_key("user", "planted", NULL, 0)
           "show(libc.syscall(249, b'user', b'planted', None, 0))\n")


def test_the_kernel_keyring_can_be_neither_read_nor_planted_and_no_key_reaches_the_next_call(episode, host):
    first, status = attack(episode, host, KEYRING)
    assert status == "ok" and first.splitlines() == ["-1 1", "-1 1", "-1 1"]  # EPERM, all three
    again, _ = attack(episode, host, KEYRING)
    assert again == first
    # and the host's own session keyring holds no key of a tool's
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    assert libc.syscall(249, b"user", b"planted", None, 0) < 0


def test_io_uring_bpf_userfaultfd_and_ptrace_are_refused(episode, host):
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "params = ctypes.create_string_buffer(120)\n"
            "for args in ((425, 8, params), (321, 0, None, 0), (323, 0), (101, 16, 1, 0, 0)):\n"
            "    print(libc.syscall(*args), ctypes.get_errno())\n")
    output, status = attack(episode, host, code)
    assert output.splitlines() == ["-1 1"] * 4  # io_uring_setup, bpf, userfaultfd, ptrace(ATTACH): EPERM


def test_disk_space_past_the_file_size_limit_and_inotify_instances_are_refused(episode, host):
    # fallocate(KEEP_SIZE) on the call's own output file reserved 2 GiB of the host's disk past a
    # 16 MiB RLIMIT_FSIZE; posix_fallocate falls back to writes, which the limit caps; inotify
    # instances are counted per host uid, which every call shares
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
            "print(libc.fallocate(1, 1, 0, 2**31), ctypes.get_errno())\n"
            "fd = os.open('f', os.O_CREAT | os.O_RDWR)\nos.posix_fallocate(fd, 0, 4096)\nprint(os.fstat(fd).st_size)\n"
            "try:\n    os.posix_fallocate(fd, 0, 2**31)\nexcept OSError as exc:\n    print(exc.errno)\n"
            "print(libc.inotify_init1(0), ctypes.get_errno())\n"
            # Linux AIO contexts: one count for the whole host (one call's io_setup took them all)
            "ctx = ctypes.c_ulong(0)\nprint(libc.syscall(206, 1, ctypes.byref(ctx)), ctypes.get_errno())\n")
    output, status = attack(episode, host, code)
    assert output.splitlines() == ["-1 95", "4096", "27", "-1 38", "-1 38"]  # EOPNOTSUPP, written, EFBIG, ENOSYS x2
    assert (host.parent / "work" / "f").stat().st_blocks * 512 <= FAST.file_bytes  # what the writes reached


def test_the_page_cache_cannot_be_read_without_a_sound(episode, host):
    # the system's page cache is one for the host: a call that read chosen pages of a large system
    # file passed a number to a later call, which probed them with preadv2(RWF_NOWAIT) (a red team);
    # mincore and cachestat say the same of a file's pages. A plain read still works.
    code = ("import ctypes, mmap, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "fd = os.open(sys.executable, os.O_RDONLY)\nbuffer = bytearray(1)\n"
            "try:\n    os.preadv(fd, [buffer], 0, os.RWF_NOWAIT)\nexcept OSError as exc:\n    print(exc.errno)\n"
            "print(os.preadv(fd, [buffer], 0), buffer == bytearray(b'\\x7f'))\n"
            "own = mmap.mmap(-1, 4096)\nstart = ctypes.addressof(ctypes.c_char.from_buffer(own))\n"  # a page of its own
            "vec = ctypes.create_string_buffer(1)\n"
            "print(libc.syscall(27, ctypes.c_void_p(start), 4096, vec), ctypes.get_errno())\n"  # mincore
            "stat = ctypes.create_string_buffer(64)\nrange_ = (ctypes.c_uint64 * 2)(0, 4096)\n"
            "print(libc.syscall(451, fd, range_, stat, 0), ctypes.get_errno())\n")  # cachestat
    output, status = attack(episode, host, code)
    assert output.splitlines() == ["95", "1 True", "-1 38", "-1 38"], output  # EOPNOTSUPP, read, ENOSYS x2


def test_the_filter_is_libseccomps_and_checks_the_architecture_first():
    from libra.rollout.seccomp import DENIED, filter_program

    program = filter_program()
    assert len(program) % 8 == 0 and len(program) // 8 > len(DENIED) // 2
    # the first instruction loads seccomp_data.arch (offset 4): a call of another ABI never reaches the rules
    code, _, _, k = program[0:2], program[2], program[3], int.from_bytes(program[4:8], "little")
    assert int.from_bytes(code, "little") == 0x20 and k == 4  # BPF_LD | BPF_W | BPF_ABS, offset 4


def test_what_a_tool_leaves_cannot_break_the_hosts_cleanup(tmp_path, config):
    from libra.files import remove_tree

    episode = open_episode("math", config, tmp_path / "work")
    code = ("import os\nfor _ in range(3000):\n    os.mkdir('d'); os.chdir('d')\n"
            "os.mkfifo('fifo')\nos.chdir('/workspace')\nos.mkdir('locked'); open('locked/f', 'w').write('x')\n"
            "os.chmod('locked/f', 0); os.chmod('locked', 0)\nos.chmod('.', 0o500)\nprint('built')")
    assert episode.call("python", code) == ("built", "ok")
    remove_tree(tmp_path / "work")
    assert not (tmp_path / "work").exists()


@pytest.mark.skipif(not AS_ROOT, reason="a working directory of its own (a tmpfs) is mounted only where Libra runs as root")


def test_a_setuid_file_a_tool_leaves_gives_no_privilege_on_the_host(tmp_path, config):
    episode = open_episode("math", config, tmp_path / "work")
    code = "import os, shutil, sys\nshutil.copy(sys.executable, 'py')\nos.chmod('py', 0o4755)\nprint(oct(os.stat('py').st_mode))"
    assert episode.call("python", code) == ("0o104755", "ok")
    work = tmp_path / "work"
    assert os.statvfs(work).f_flag & os.ST_NOSUID and os.statvfs(work).f_flag & os.ST_NODEV
    os.chmod(work, 0o755)  # let another host user reach it, as a careless host script might
    ran = subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", str(work / "py"), "-I", "-S", "-c",
                          "import os; print(os.geteuid())"], capture_output=True, text=True, timeout=30)
    assert ran.stdout.strip() == "1000"  # not the sandbox's uid 65534: the setuid bit does nothing there


@pytest.mark.skipif(not AS_ROOT, reason="a working directory of its own (a tmpfs) is mounted only where Libra runs as root")


def test_the_bytes_a_trajectory_writes_are_capped_as_a_whole(tmp_path, config):
    config = config.model_copy(update={"workdir_bytes": 4 * 2**20})
    episode = open_episode("math", config, tmp_path / "work")
    code = ("n = 0\ntry:\n    for i in range(10):\n        open(f'f{i}', 'wb').write(b'x' * 3 * 2**19)\n        n += 1\n"
            "except OSError as exc:\n    print('stopped', exc.errno)\nprint('files', n)")
    output, status = episode.call("python", code)
    assert (output, status) == ("stopped 28\nfiles 2", "ok")  # ENOSPC in the third file of 1.5 MiB (of a 4 MiB cap)
    assert sum(p.stat().st_size for p in (tmp_path / "work").iterdir()) <= 4 * 2**20
    assert episode.call("python", "import os; os.remove('f0'); print(6 * 7)") == ("42", "ok")


@pytest.mark.skipif(not AS_ROOT, reason="a working directory of its own (a tmpfs) is mounted only where Libra runs as root")
def test_the_working_directories_open_at_once_pin_no_more_than_their_budget(tmp_path, config):
    """A tmpfs keeps what a call wrote in memory after the call's cgroup is gone: 256 MiB a
    trajectory, with nothing adding them up, let a batch's trajectories pin more than the machine."""
    from libra.files import discard_tree
    from libra.mounts import workdir_bytes_held
    from libra.rollout.workroots import WorkdirsFull

    before = workdir_bytes_held(Path("/proc/self/mountinfo").read_text())
    box = Sandbox(config.model_copy(update={"workdir_bytes": 2**20, "workdirs_bytes": before + 3 * 2**20}))
    dirs = [tmp_path / f"w{i}" for i in range(4)]
    for d in dirs:
        d.mkdir()
    assert [box.prepare(d) for d in dirs[:3]] == [True] * 3
    with pytest.raises(WorkdirsFull, match=r"would pass sandbox.workdirs_bytes .*lower sandbox.workdir_bytes"):
        box.prepare(dirs[3])
    assert not any(dirs[3].iterdir()) and os.statvfs(dirs[3]).f_blocks != os.statvfs(dirs[0]).f_blocks
    discard_tree(dirs[0])
    assert box.prepare(dirs[3])  # one closed, one more fits
    for d in dirs[1:]:
        discard_tree(d)
    assert workdir_bytes_held(Path("/proc/self/mountinfo").read_text()) == before


def test_the_memory_of_all_a_calls_processes_is_capped_together(episode, host, config):
    if Sandbox(config).cgroups() is None:
        pytest.skip("this machine gives tool calls no memory cgroup (not root, or no writable memory controller)")
    episode.limits = SandboxLimits(timeout_s=20.0, cpu_s=10, call_memory_bytes=256 * 2**20)
    code = ("import os, time\nkids = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
            "        block = bytearray(200 * 2**20)\n        block[::4096] = b'x' * len(block[::4096])\n"
            "        time.sleep(2)\n        os._exit(0)\n    kids.append(pid)\n"
            "print([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids])")
    output, status = attack(episode, host, code)  # each child is far below its own address-space limit (512 MiB)
    codes = eval(output.splitlines()[0])  # noqa: S307 - a list of ints the test's own code printed
    assert status == "error" and codes.count(0) <= 1 and codes.count(-9) >= 2
    assert output.endswith("[killed: the call's processes held more than 268435456 bytes together]")


def test_the_cores_all_a_calls_processes_keep_busy_are_capped_together(episode, host, config):
    cgroups = Sandbox(config).cgroups()
    if cgroups is None or "cpu" not in cgroups.controllers:
        pytest.skip("this machine gives tool calls no CPU cgroup (not root, or no writable cpu controller)")
    episode.limits = SandboxLimits(timeout_s=20.0, cpu_s=10, call_cpus=0.5)
    # two processes spin for 1.5 s of wall time: 3 CPU seconds uncapped (on two free cores)
    code = ("import os, time\nstart = time.monotonic()\nkids = []\nfor _ in range(2):\n    pid = os.fork()\n"
            "    if pid == 0:\n        while time.monotonic() - start < 1.5:\n            pass\n        os._exit(0)\n"
            "    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)\ntimes = os.times()\n"
            "print(times.children_user + times.children_system, time.monotonic() - start)")
    output, status = attack(episode, host, code)
    cpu_s, wall_s = map(float, output.split())
    assert status == "ok" and wall_s >= 1.5
    assert cpu_s <= 0.5 * wall_s + 0.1  # half a core for the wall time, and a CFS period's slack


# -- output, concurrency, configuration -------------------------------------------------------------


def test_output_is_capped(tmp_path, config):
    box = Sandbox(config)
    work = tmp_path / "w"
    work.mkdir()
    result = box.run("print('x' * 100000)", work, SandboxLimits(max_output_bytes=1000))
    assert result.truncated and len(result.stdout) == 1000
    result = box.run("import sys\nsys.stdout.write('y' * (64 * 2**20))", work, SandboxLimits(file_bytes=2**20))
    assert result.status == "error" and result.truncated  # the file-size limit stops the flood itself


def test_concurrent_calls_each_get_their_own_sandbox(tmp_path, config):
    box = Sandbox(config)
    outputs = {}

    def call(i):
        work = tmp_path / f"w{i}"
        work.mkdir()
        (work / "mine.txt").write_text(str(i))
        code = ("import os\nprint(open('mine.txt').read(), [d for d in os.listdir('/') if d.startswith('w')], os.getpid(),"
                " os.listdir('/roots') if os.path.exists('/roots') else [])")
        outputs[i] = box.run(code, work, FAST).output

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # none sees another's directory; its own PID namespace: the code is pid 2 under the server's
    # init, pid 1 itself in a bwrap of its own (no bwrap init beside it)
    assert outputs == {i: f"{i} ['workspace'] {2 if config.server else 1} []" for i in range(12)}


def test_no_isolation_is_refused_loudly_and_none_only_when_asked(tmp_path, monkeypatch):
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.setattr(sandbox, "bwrap_binary", lambda: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap.*sandbox.isolation: none"):
        Sandbox().run("print(1)", work, FAST)
    with pytest.raises(SandboxUnavailable, match="could not start a sandbox|bubblewrap"):
        Sandbox(SandboxConfig(python="/nonexistent/python3")).run("print(1)", work, FAST)
    monkeypatch.undo()
    with pytest.raises(SandboxUnavailable, match="could not start a sandbox"):
        Sandbox(SandboxConfig(python="/nonexistent/python3")).run("print(1)", work, FAST)
    result = Sandbox(SandboxConfig(isolation="none")).run("import os\nprint(os.getcwd() == os.environ['HOME'])", work, FAST)
    assert result.isolation == "none" and result.output == "True"


def test_an_agent_loop_tool_never_hides_a_missing_sandbox(tmp_path, monkeypatch):
    from libra.rollout.agent import _act
    from libra.rollout.protocol import parse

    monkeypatch.setattr(sandbox, "bwrap_binary", lambda: None)
    env = make_env("math", SandboxConfig(uid=65533))  # a configuration of its own: probed anew
    task = env.tasks(1, seed=0)[0]
    work = tmp_path / "w"
    work.mkdir()
    with pytest.raises(SandboxUnavailable):
        _act(env.open(task, work), parse("<tool>python: print(1)</tool>", env.tools))
    shutil.rmtree(work)


def test_a_call_in_flight_when_the_server_dies_is_reported_and_the_next_one_restarts_it(tmp_path):
    box = Sandbox(SandboxConfig(uid=65532))  # a server of its own
    work = tmp_path / "w"
    work.mkdir()
    assert box.run("print('up')", work, FAST).output == "up"
    server = box._host
    killer = threading.Timer(0.5, lambda: os.killpg(server.proc.pid, 9))
    killer.start()
    began = time.monotonic()
    result = box.run("open('ran.txt', 'a').write('x')\nwhile True:\n    pass", work, FAST)
    killer.join()
    assert result.status == "error" and "tool server stopped" in result.stderr
    assert time.monotonic() - began < FAST.timeout_s + 1
    assert (work / "ran.txt").read_text() == "x"  # it ran once and is not run again
    assert box.run("print('again')", work, FAST).output == "again"
    assert box._host is not server


def test_working_directories_outside_the_servers_root_get_a_bwrap_of_their_own(tmp_path):
    outside = Path(tempfile.mkdtemp(prefix="libra-outside-"))
    try:
        os.chmod(outside, 0o711)
        (outside / "w").mkdir()
        result = Sandbox().run("import os\nprint(os.path.exists('/roots'), os.getcwd())", outside / "w", FAST)
        assert result.output == "False /workspace"  # the same isolation, started by bwrap for the call
    finally:
        shutil.rmtree(outside)


def test_long_code_runs_too(episode):
    code = "x = 0\n" + "x += 1\n" * 100_000 + "print(x)"  # about 700 KB
    assert episode.call("python", code) == ("100000", "ok")


# -- found by review: shared state between calls, processes after a timeout, forged test reports --


def test_calls_share_no_writable_file_system(episode, host):
    for target in ["/persist.txt", "/dev/x"]:
        output, status = attack(episode, host, f"open({target!r}, 'w').write('x')")
        assert status == "error" and "Read-only file system" in output
    output, status = attack(episode, host, "import os\nos.rename('/bin', '/bin.orig')")
    assert status == "error" and "Read-only file system" in output
    assert episode.call("python", "open('/dev/shm/x', 'w').write('from A')\nprint('ok')") == ("ok", "ok")
    output = episode.call("python", "import os\nprint(os.listdir('/dev/shm'), os.listdir('/dev/pts'))")
    assert output in (("[] []", "ok"), ("[] ['ptmx']", "ok"))  # the server covers /dev/pts; a bwrap has its own


def test_nothing_runs_after_a_timed_out_call_returns(tmp_path, config):
    work = tmp_path / "w"
    work.mkdir()
    code = ("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        break\n"
            "while True:\n    with open(f'beat-{os.getpid()}', 'a') as f:\n        f.write('.')")
    result = Sandbox(config).run(code, work, SandboxLimits(timeout_s=1.0, cpu_s=5, processes=8))
    assert result.status == "timeout"
    sizes = {p.name: p.stat().st_size for p in work.iterdir()}
    time.sleep(0.3)
    assert {p.name: p.stat().st_size for p in work.iterdir()} == sizes and sizes


def test_code_that_clears_its_parent_death_signal_still_ends_with_its_call(tmp_path, config):
    """In a bwrap of its own the code is its namespace's init, tied to bwrap by the parent-death
    signal alone, which prctl can clear: the call's end kills the init itself (it ran on, on the
    host, past the call and past Libra)."""
    work = tmp_path / "w"
    work.mkdir()
    code = ("import ctypes, os, time\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\nos.setsid() if os.getpid() != 1 else None\n"
            "while True:\n    with open('beat', 'a') as f:\n        f.write('.')\n    time.sleep(0.01)")
    began = time.monotonic()
    result = Sandbox(config).run(code, work, SandboxLimits(timeout_s=1.0, cpu_s=5))
    assert result.status == "timeout" and time.monotonic() - began < 5
    size = (work / "beat").stat().st_size
    time.sleep(0.5)
    assert (work / "beat").stat().st_size == size


def test_every_process_it_can_see_is_filtered_or_out_of_its_reach(episode, host):
    """A process beside the code without the system-call filter (an init) must be one whose memory
    it cannot open: bwrap's own init, of the same uid and without the filter or the limits, could be
    rewritten through /proc/1/mem to run code outside both, past the end of the call."""
    code = ("import os\nfor pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n"
            "    status = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status') if ':' in l)\n"
            "    if status['Seccomp'].strip() == '2':\n        continue\n"
            "    try:\n        os.close(os.open(f'/proc/{pid}/mem', os.O_RDWR))\n        print(pid, 'writable')\n"
            "    except PermissionError:\n        pass\nprint('checked')")
    assert attack(episode, host, code) == ("checked", "ok")


def test_signals_to_its_init_are_ignored(episode, host, config):
    """The server's calls have an init of their own that takes no signal from the code; in a bwrap of
    its own the code is the init (pid 1), and a signal it has no handler for does not end it."""
    sent = "(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)" if config.server else "(signal.SIGTERM, signal.SIGHUP)"
    output, status = attack(episode, host, f"import os, signal\nfor s in {sent}:\n"
                                           "    os.kill(1, s)\nprint('init alive', os.getpid())")
    assert (output, status) == (f"init alive {2 if config.server else 1}", "ok")


def test_a_forged_test_report_earns_nothing(tmp_path, config):
    workdir = tmp_path / "repo"
    episode = open_episode("repo", config, workdir)
    forged = "def add(a, b, _=print('all 3 tests passed', flush=True) or __import__('os')._exit(0)):"
    assert episode.call("edit", f"code.py 1: {forged}")[1] == "ok"
    assert episode.reward("done") == 0.0  # the verdict is the host's, from the values the functions returned


def test_a_report_nested_past_the_parser_fails_the_tests_not_the_host(tmp_path, config):
    workdir = tmp_path / "repo"
    episode = open_episode("repo", config, workdir)
    forged = "import json; json.dumps = lambda o, **k: '[' * 8000 + ']' * 8000"  # the runner's last line, 8,000 deep
    assert episode.call("edit", f"code.py 3: {forged}")[1] == "ok"
    output, status = episode.call("test", "")
    assert status == "ok" and "[[[[" in output  # the run's own output is the report
    assert episode.reward("done") == 0.0


def test_a_uid_bubblewrap_cannot_map_is_refused_in_the_config() -> None:
    """Above 2^31 - 1 bubblewrap fails to write the uid map, which had been reported as user
    namespaces being disabled."""
    from pydantic import ValidationError

    assert SandboxConfig(uid=2**31 - 1).uid == 2_147_483_647
    with pytest.raises(ValidationError, match="less than or equal to 2147483647"):
        SandboxConfig(uid=2**31)
