"""A call's output and the disk: what a call does to the files it writes stays with the call (its
output is in memory, read back through the host's own open file), and direct I/O, which goes past
the page cache and the memory cgroup to the disk, is refused; so are the newest calls that reach
memory or mounts."""

import errno

import pytest

from libra.rollout import sandbox
from tests.libra.rollout.test_sandbox import attack, open_episode


@pytest.fixture
def episode(tmp_path, config):
    return open_episode("math", config, tmp_path / "work")


def test_setting_direct_io_on_its_output_is_refused_and_the_output_is_read(episode, host):
    # the red team's attack: the output file's flags belong to the open file the host reads through
    # too; O_DIRECT on a disk file made the host's read fail (EINVAL), and with it the trajectory
    # and its whole group, and direct writes reached the disk at gigabytes a second. Its output is
    # in memory now (a memfd refuses O_DIRECT even without the filter)
    code = ("import fcntl, os\nprint(1, flush=True)\n"
            "try:\n    fcntl.fcntl(1, fcntl.F_SETFL, os.O_DIRECT)\nexcept OSError as exc:\n    print('setfl', exc.errno)\n"
            "print(os.readlink('/proc/self/fd/1'))\n")
    output, status = attack(episode, host, code)
    assert status == "ok"
    one, refused, name = output.splitlines()
    assert (one, refused) == ("1", f"setfl {errno.EINVAL}")
    assert name.startswith("/memfd:libra-sandbox-stdout")  # in memory, and no host path in its name


def test_direct_io_on_its_own_files_is_refused_and_plain_io_works(episode, host):
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "for at in ('f', '/tmp/f'):  # its working directory, and its private /tmp\n"
            "    try:\n        os.open(at, os.O_CREAT | os.O_WRONLY | os.O_DIRECT)\n        print('opened')\n"
            "    except OSError as exc:\n        print(exc.errno)\n"
            "fd = os.open('f', os.O_CREAT | os.O_RDWR)\nprint(os.write(fd, b'plain'))\n"
            "import fcntl\ntry:\n    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_DIRECT)\n    print('direct')\n"
            "except OSError as exc:\n    print('setfl', exc.errno)\n"
            "try:\n    os.set_blocking(fd, False)\n    print('setfl', os.get_blocking(fd))\nexcept OSError as exc:\n    print(exc.errno)\n"
            "how = ctypes.create_string_buffer(24)\n"  # openat2: its flags are in a structure no filter reads
            "print(libc.syscall(437, -100, b'f', how, 24), ctypes.get_errno())\n")
    output, status = attack(episode, host, code)
    # each would succeed on these tmpfs and disk files without the filter (a memfd refuses O_DIRECT itself)
    assert output.splitlines() == [str(errno.EINVAL), str(errno.EINVAL), "5", f"setfl {errno.EINVAL}", "setfl False",
                                   f"-1 {errno.ENOSYS}"]


def test_output_that_cannot_be_read_is_said_so_and_fails_nothing():
    with sandbox._output_file("stdout") as out:
        out.write(b"x" * 100)
        out.flush()
        assert sandbox._read(out, 10) == ("x" * 10, True)
        assert sandbox._read(out, 100) == ("x" * 100, False)

    class Broken:
        def fileno(self) -> int:
            return 2**30  # no such descriptor: its /proc entry cannot be opened

    text, cut = sandbox._read(Broken(), 10)
    assert text == "[the call's output could not be read: No such file or directory]" and not cut


def test_secret_memory_and_the_newer_mount_calls_are_refused(episode, host):
    # memfd_secret splits the kernel's direct map; open_tree_attr was allowed where open_tree was not
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "buffer = ctypes.create_string_buffer(64)\n"
            "for args in ((447, 0), (467, -100, b'/', 1, None, 0), (457, buffer, buffer, 64, 0), (458, buffer, buffer, 4, 0)):\n"
            "    print(libc.syscall(*args), ctypes.get_errno())\n")
    output, status = attack(episode, host, code)
    assert output.splitlines() == [f"-1 {errno.EPERM}"] * 4


def test_the_files_of_a_server_calls_private_tmp_are_capped_in_number(episode, host, config):
    if not config.server:
        pytest.skip("bwrap's own tmpfs takes a size only; with root the call's memory cgroup counts the inodes")
    # empty files cost kernel memory a tmpfs's size does not count: a page of the cap a file
    code = ("import os\nmade = 0\ntry:\n    while made < 10_000:\n        os.close(os.open(f'/tmp/f{made}', os.O_CREAT | os.O_WRONLY))\n"
            "        made += 1\nexcept OSError as exc:\n    print(made, exc.errno)\n")
    output, status = attack(episode, host, code)
    made, error = map(int, output.split())
    assert error == errno.ENOSPC and made == 16 * 2**20 // 4096 - 1  # the directory itself is one


def test_flushing_the_host_and_dropping_its_cache_are_answered_as_done_without_running(episode, host):
    # each flushed the host's disk cache (26,026 flushes in 2.5 s from one call) and `sync` waited for
    # the whole host's writeback past the call's timeout; DONTNEED emptied the host's cache of the
    # system's files. On a descriptor that does not exist the kernel answers EBADF: 0 means the
    # filter answered without running them
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.sync()\n"
            "print(libc.fsync(9999), libc.fdatasync(9999), libc.syncfs(9999), libc.sync_file_range(9999, 0, 0, 0),"
            " libc.msync(ctypes.c_void_p(4096), 4096, 4))\n"
            "os.posix_fadvise(9999, 0, 0, os.POSIX_FADV_DONTNEED)\nprint('dontneed done')\n"
            "try:\n    os.posix_fadvise(9999, 0, 0, os.POSIX_FADV_WILLNEED)\nexcept OSError as exc:\n    print('willneed', exc.errno)\n"
            "print(open('/proc/self/oom_score_adj').read().strip())\n")
    output, status = attack(episode, host, code)
    # (the last: a machine out of memory kills a call's processes before Libra's)
    assert output.splitlines() == ["0 0 0 0 0", "dontneed done", f"willneed {errno.EBADF}", "1000"]
