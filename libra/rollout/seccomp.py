"""The system-call filter every tool call runs under: the kernel refuses (EPERM) the calls that
container runtimes' default profiles refuse, and a few more that reach state outside the call.

The program is compiled once per process by libseccomp (the library container runtimes use;
`libseccomp.so.2`, which Linux distributions ship), not written by hand: it checks the
architecture first (a call from another ABI, x32 or 32-bit x86 included, kills the process), then
refuses the listed calls and allows the rest. The tool runner loads it into the call's own process
right before the code runs (`prctl(PR_SET_SECCOMP)`, after `no_new_privs`), in both sandbox modes,
and every process the code starts inherits it; nothing can remove a filter once loaded.

What the list covers, by what it would reach:
- kernel keyrings (`keyctl`, `add_key`, `request_key`): the keyring of the process that launched
  the sandbox, and keys another call (another trajectory) planted; every call also gets a fresh
  session keyring of its own before the filter loads;
- kernel attack surface with a history of escapes: io_uring, bpf, userfaultfd, perf events;
- other processes' memory and the host's mounts: ptrace, process_vm_*, kcmp, mount and the new mount
  API, pivot_root, unshare and setns (namespaces are the sandbox's to make, never the code's);
- the machine itself: kernel modules, kexec, reboot, swap, clocks, accounting, quotas, syslog,
  raw I/O ports, file handles (open_by_handle_at reads files by inode, past the mount namespace);
- resources outside the call's limits (`REFUSED`, with the answer programs fall back on): disk
  space reserved by fallocate, which RLIMIT_FSIZE does not see, inotify instances, which every
  call shares through the sandbox's host uid, and Linux AIO contexts, one count for the host;
- the page cache of the shared read-only system, which a call could read without a sound and so
  pass data to a later call (`mincore`, `cachestat`, `preadv2`/`pwritev2` with `RWF_NOWAIT`);
- the disk, past the page cache: direct I/O (`O_DIRECT` at open or by `fcntl`, and `openat2`);
- the host's disk cache and writeback: the flushing calls (`sync`, `fsync`, ...) and dropping
  cached pages (`posix_fadvise` DONTNEED) are answered as done without running (`PRETENDED`);
- sockets of every family but unix (`ALLOWED_FAMILIES`; EAFNOSUPPORT): inet, netlink and the rest,
  whose buffers the call's memory cgroup does not see and whose kernel modules a socket loads.
"""

from __future__ import annotations

import ctypes
import errno
import os
import tempfile
from functools import lru_cache

from libra.errors import LibraError

DENIED = (
    # kernel keyrings
    "keyctl", "add_key", "request_key",
    # io_uring, eBPF, userfaultfd, performance events
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "userfaultfd", "perf_event_open",
    # other processes, mounts and namespaces
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "unshare", "setns",
    # the machine
    "init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
    "syslog", "settimeofday", "clock_settime", "clock_adjtime", "iopl", "ioperm", "vhangup",
    "lookup_dcookie", "open_by_handle_at", "name_to_handle_at", "nfsservctl", "uselib", "ustat", "sysfs",
    "_sysctl", "fanotify_init",
    # secret memory (unmapped from the kernel's direct map, which each one splits) and the mount calls
    # added since open_tree: a call needs none of them
    "memfd_secret", "open_tree_attr", "statmount", "listmount",
)

# calls refused with another answer than EPERM, one that programs read as "not here" and work around
REFUSED = {
    # fallocate(FALLOC_FL_KEEP_SIZE) takes disk space without growing the file, past RLIMIT_FSIZE (on
    # ext4 and xfs; a call's working directory is on the host's disk where Libra runs without root):
    # glibc's posix_fallocate writes the zeros instead on EOPNOTSUPP, and those writes are capped
    "fallocate": errno.EOPNOTSUPP,
    # inotify instances are counted per host uid across namespaces, and every call runs as the same
    # uid: one call holding them all would leave the other trajectories' calls none (watchers poll
    # instead where inotify is ENOSYS)
    "inotify_init": errno.ENOSYS, "inotify_init1": errno.ENOSYS,
    # Linux AIO contexts are one host-wide count (fs.aio-max-nr): one call's io_setup took them all,
    # and io_setup failed for every process of the host, root's included (libaio users fall back)
    "io_setup": errno.ENOSYS,
    # the page cache of the read-only system is one for the whole host: these say without a sound
    # which pages of a file it holds, so one call reading chosen pages of a large system file and a
    # later call probing them passed a number between two trajectories (see `PAGE_CACHE_PROBES`)
    "mincore": errno.ENOSYS, "cachestat": errno.ENOSYS,
    # openat2 carries its flags in a structure a filter cannot read, so O_DIRECT could pass there (see
    # O_DIRECT below); glibc and Python open with openat
    "openat2": errno.ENOSYS,
}

# calls answered as done without running (0): what they would do reaches past the call to the host.
# Durability: a call's files are a tmpfs (or, without root, the host reads them through the same page
# cache after the call) and its output is in memory, so flushing means nothing to it; but each of
# these flushes the host's disk cache (26,026 flushes in 2.5 s from one call, the host's own fsyncs
# 2-8x slower meanwhile), and `sync` waits for the whole host's writeback in uninterruptible sleep,
# which outlasted a call's timeout (SIGKILL cannot end it) while the host wrote a checkpoint.
PRETENDED = ("sync", "syncfs", "fsync", "fdatasync", "sync_file_range", "sync_file_range2", "msync")

# calls missing from older libseccomp tables, by number (the same on x86-64 and arm64: calls added
# since Linux 5.1 have one number on every architecture)
NUMBERS = {"cachestat": 451, "openat2": 437, "memfd_secret": 447, "statmount": 457, "listmount": 458, "open_tree_attr": 467}

# preadv2/pwritev2 with RWF_NOWAIT fail rather than wait for the disk: the other probe of the page
# cache. Refused with the answer a file system without it gives (EOPNOTSUPP); the flags are the
# sixth argument. What is left is timing a read, which a call cannot be kept from.
RWF_NOWAIT = 0x8
PAGE_CACHE_PROBES = ("preadv2", "pwritev2")

# posix_fadvise(POSIX_FADV_DONTNEED) drops the host's cached pages of a file, the shared read-only
# system's included (the interpreter's own library, which the host then reads from the disk again):
# answered as done (0) without dropping anything; the advice is the fourth argument
FADV_DONTNEED = 4
FADVISE_CALLS = ("fadvise64", "fadvise64_64", "arm_fadvise64_64")

# direct I/O (O_DIRECT) goes past the page cache and the memory cgroup to the disk at the disk's
# speed: a call rewriting one block of a file in its working directory (on the host's disk where
# Libra runs without root) wrote gigabytes a second, RLIMIT_FSIZE capping only the file's size.
# Refused where a program asks for it: opening with the flag (EINVAL, what a file system without
# direct I/O answers; programs retry without it) and setting it later (fcntl F_SETFL); openat2 is
# refused whole (`REFUSED`).
O_DIRECT = os.O_DIRECT  # this architecture's bit (0x4000 on x86-64, 0x10000 on arm64)
F_SETFL = 4
DIRECT_OPENS = {"open": 1, "openat": 2}  # the call, and which argument holds the flags

# socket families: only unix sockets are made (asyncio, multiprocessing); every other family is
# refused (EAFNOSUPPORT) with the answer programs read as "no such network". The call's network
# namespace reaches nothing anyway, and the others reach past its limits: netlink and TCP socket
# buffers are not charged to the call's memory cgroup (a call capped at 64 MiB held 3 GiB in netlink
# queues, and 2.2 GiB over its own loopback in a bwrap of its own); vsock is not namespaced; packet
# sockets read raw traffic; and creating a socket of a family loads its kernel module (ALG, CAN,
# RDS, TIPC, ...: families with a history of local privilege escalations). An allowlist, so a
# family a newer kernel adds is refused too: every number below FAMILY_LIMIT but these (the
# kernel itself refuses a family at or above its AF_MAX, 46 in Linux 6.x). The kernel reads the
# family as an int, so only the argument's low 32 bits are compared: a family with high bits set
# is the same family to the kernel (compared whole, `AF_INET | 1 << 32` had passed the filter).
# socketpair() creates its sockets the same way and is filtered alike.
ALLOWED_FAMILIES = {"AF_UNIX": 1}
FAMILY_LIMIT = 128
FAMILY_CALLS = ("socket", "socketpair")
LOW_32_BITS = 0xFFFF_FFFF

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO = 0x00050000
SCMP_CMP_MASKED_EQ = 7


class _ArgCmp(ctypes.Structure):  # libseccomp's struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(LibraError):
    """libseccomp cannot be loaded or cannot compile the filter (the message says what to do)."""


def refused_families() -> list[int]:
    """The socket family numbers a call may not create sockets of (see ALLOWED_FAMILIES)."""
    return [family for family in range(FAMILY_LIMIT) if family not in ALLOWED_FAMILIES.values()]


def _masked(arg: int, mask: int, value: int) -> _ArgCmp:
    """Argument `arg` (from 0), its bits in `mask`, equal to `value`."""
    return _ArgCmp(arg, SCMP_CMP_MASKED_EQ, mask, value)


def _rules() -> list[tuple[str, int, tuple[_ArgCmp, ...], bool]]:
    """Every rule of the filter: (call, the errno it answers (0: done), the argument comparisons that
    must all hold, whether the call must exist here)."""
    return [
        *((name, errno.EPERM, (), False) for name in DENIED),
        *((name, answer, (), False) for name, answer in REFUSED.items()),
        *((name, 0, (), False) for name in PRETENDED),
        *((name, errno.EAFNOSUPPORT, (_masked(0, LOW_32_BITS, family),), True)
          for name in FAMILY_CALLS for family in refused_families()),
        *((name, errno.EOPNOTSUPP, (_masked(5, RWF_NOWAIT, RWF_NOWAIT),), True) for name in PAGE_CACHE_PROBES),
        *((name, 0, (_masked(3, LOW_32_BITS, FADV_DONTNEED),), False) for name in FADVISE_CALLS),
        *((name, errno.EINVAL, (_masked(arg, O_DIRECT, O_DIRECT),), False) for name, arg in DIRECT_OPENS.items()),
        ("fcntl", errno.EINVAL, (_masked(1, LOW_32_BITS, F_SETFL), _masked(2, O_DIRECT, O_DIRECT)), True),
    ]


@lru_cache(maxsize=1)
def filter_program() -> bytes:
    """The filter as a classic BPF program (8 bytes an instruction), for `prctl(PR_SET_SECCOMP)`."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        raise SeccompUnavailable("tool calls run under a system-call filter compiled by libseccomp, which is not "
                                 "installed; install it (Debian/Ubuntu: apt-get install libseccomp2)") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    context = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not context:
        raise SeccompUnavailable("libseccomp could not start a filter (seccomp_init failed)")
    try:
        for name, answer, compares, required in _rules():
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a call of this architecture (32-bit only, removed, or another name here)
                number = NUMBERS.get(name, -1)
                if number < 0:
                    if required:
                        raise SeccompUnavailable(f"libseccomp does not know the call {name}")
                    continue
            array = (_ArgCmp * len(compares))(*compares)
            if lib.seccomp_rule_add_array(context, SCMP_ACT_ERRNO | answer, number, len(compares), array) != 0:
                raise SeccompUnavailable(f"libseccomp refused the rule for {name}"
                                         + (f" (arguments {[(c.arg, c.datum_b) for c in compares]})" if compares else ""))
        with tempfile.TemporaryFile() as out:
            if lib.seccomp_export_bpf(context, out.fileno()) != 0:
                raise SeccompUnavailable("libseccomp could not export the filter")
            out.seek(0)
            program = out.read()
    finally:
        lib.seccomp_release(context)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported {len(program)} bytes, not a BPF program")
    return program
