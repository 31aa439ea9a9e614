"""Mounts the sandbox's working directories need, made and undone through the kernel's own calls.

Where Libra runs as root, each trajectory's working directory is a tmpfs of its own, mounted
`nosuid,nodev` with a size and an inode cap: a tool's files can never gain privileges on the host
(a setuid copy of an interpreter stays inert, whoever runs it), and the bytes a trajectory's calls
write are capped as a whole, not per file. The directory that holds them (a process's working-
directory base) is bound onto itself and made a shared mount, so that the sandbox server, started
before the trajectories' directories exist, sees each one as it is mounted (its copy of the base is
a slave of it).

Removing a tree unmounts what is mounted below it first (`unmount_below`), deepest first, so that
the removal never empties a mount another namespace still uses nor fails on a busy mount point.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

MS_NOSUID, MS_NODEV, MS_BIND, MS_SHARED = 0x2, 0x4, 0x1000, 1 << 20
WORKDIR_SOURCE = "libra-work"  # the source every working directory's tmpfs is mounted with
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)


class MountError(OSError):
    """A mount or an unmount the kernel refused (errno and the path in the message)."""


def can_mount() -> bool:
    """Whether this process may mount (root; a container may still refuse: `mount_tmpfs` says so)."""
    return os.geteuid() == 0


def mount_tmpfs(path: Path, size_bytes: int, inodes: int, uid: int, mode: int = 0o700) -> None:
    """Mount a tmpfs at the directory `path`: nosuid, nodev, at most `size_bytes` and `inodes`
    files, its root owned by `uid` with `mode`."""
    options = f"size={size_bytes},nr_inodes={inodes},mode={mode:o},uid={uid},gid={uid}"
    _call(_libc.mount(WORKDIR_SOURCE.encode(), os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()),
          f"mount a tmpfs at {path}")


def share(path: Path) -> None:
    """Bind the directory `path` onto itself and make it a shared mount: mounts made below it later
    reach the namespaces that copied it (as slaves) after this."""
    _call(_libc.mount(os.fsencode(path), os.fsencode(path), None, MS_BIND, None), f"bind {path} onto itself")
    _call(_libc.mount(None, os.fsencode(path), None, MS_SHARED, None), f"make {path} a shared mount")


def unmount_below(top: str | Path, mountinfo: str | None = None) -> list[Path]:
    """Detach every mount at or below `top` (deepest first); the mount points detached. Without
    the right to unmount, nothing is tried (there is then nothing this process mounted)."""
    if not can_mount():
        return []
    points = mounts_below(top, mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
    for point in points:
        _call(_libc.umount2(os.fsencode(point), MNT_DETACH), f"unmount {point}")
    return points


class _Mount(NamedTuple):
    """One line of /proc/PID/mountinfo: the filesystem's device, where it is mounted, and (after the
    ` - ` separator) its type, source and superblock options ("" where a line has none)."""

    device: str
    point: Path
    fstype: str
    source: str
    options: str


def _mounts(mountinfo: str) -> Iterator[_Mount]:
    """The mounts of a /proc/PID/mountinfo text, in its order (lines too short to name a mount point skipped)."""
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        fstype, source, options = ((line.split(" - ", 1)[1].split(" ") if " - " in line else []) + ["", "", ""])[:3]
        yield _Mount(fields[2], Path(_unescape(fields[4])), fstype, source, options)


def mounts_below(top: str | Path, mountinfo: str) -> list[Path]:
    """The mount points at or below `top` in a /proc/PID/mountinfo text, deepest first, each once."""
    top = Path(os.path.realpath(top))
    found: list[Path] = []
    for mount in _mounts(mountinfo):
        if (mount.point == top or mount.point.is_relative_to(top)) and mount.point not in found:
            found.append(mount.point)
    return sorted(found, key=lambda p: (-len(p.parts), str(p)))


def workdir_bytes_held(mountinfo: str) -> int:
    """The bytes the working directories' tmpfs mounts of this mount namespace may hold together
    (their `size=` caps; each counted once, however many times it is seen), from a
    /proc/PID/mountinfo text. A tmpfs keeps its pages in memory whoever wrote them, so this is the
    host memory they can pin."""
    held: dict[str, int] = {}  # by device: one filesystem seen at several points counts once
    for mount in _mounts(mountinfo):
        if mount.fstype == "tmpfs" and mount.source == WORKDIR_SOURCE:
            size = next((o[len("size="):] for o in mount.options.split(",") if o.startswith("size=")), "")
            held[mount.device] = _size_bytes(size)
    return sum(held.values())


def _size_bytes(size: str) -> int:
    """mountinfo's tmpfs `size=` option (kibibytes with a `k`, or bytes) in bytes; 0 when unreadable."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    if size[-1:].lower() in units and size[:-1].isdigit():
        return int(size[:-1]) * units[size[-1].lower()]
    return int(size) if size.isdigit() else 0


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise MountError(errno, f"could not {what}: {os.strerror(errno)}")
