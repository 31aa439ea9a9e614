"""File-system helpers: durability shared by the store and the trainer's checkpoints, where a
relative SQLite tracking database lies, and removing a tree that untrusted code wrote."""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO


@contextmanager
def replacing(path: str | Path, *, durable: bool = False) -> Iterator[BinaryIO]:
    """A new file that replaces `path` whole when the block ends (`os.replace`), or leaves it as it was
    and removes itself when the block raises. It is written under a fresh name beside `path`, made
    with O_EXCL: nothing planted there (a link, an old temporary file) is followed or written through.
    `durable`: fsynced before the rename."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(name, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(name)
        raise


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes its new entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def absolute_tracking_uri(uri: str, create: bool = True) -> str:
    """`sqlite:///relative.db` -> `sqlite:////abs/relative.db` (MLflow needs an absolute path); with
    `create`, the database's directory is created."""
    prefix = "sqlite:///"
    if uri.startswith(prefix):
        path = Path(uri[len(prefix):]).resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


def owner_gone(name: str, prefix: str) -> bool:
    """Whether `name`, a directory named `prefix` + the pid of the process that made it (then, maybe,
    a dash and more), belongs to a process that is gone: what may then be removed. False for a name
    that carries no pid (ASCII digits)."""
    pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
    if not (pid.isascii() and pid.isdigit()):
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's
        return False
    return False


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(top: str | Path) -> None:
    """Remove `top` and everything in it, whatever a tool call left there: trees of any depth (no
    recursion, one directory descriptor open at a time, names never joined into long paths),
    directories without write or search permission (made the owner's again first), FIFOs, sockets,
    devices, links (removed, never followed) and files of any mode. Nothing outside `top` is touched:
    the walk goes down by name under the directory it holds open and comes back up through `..`,
    checked to be the directory it came from. Mounts at or below `top` (a trajectory's own tmpfs)
    are detached first, never emptied."""
    from libra.mounts import unmount_below

    if os.path.isdir(top) and not os.path.islink(top):
        unmount_below(top)
    try:
        info = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(top)
        return
    _own(top, info)
    fd = os.open(top, _DIRECTORY)
    trail: list[tuple[str, tuple[int, int], list[str]]] = []  # per level below top: its name, identity, subdirectories left
    here, left = (info.st_dev, info.st_ino), _clear_files(fd)
    try:
        while True:
            if left:
                name = left.pop()
                child_info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(child_info.st_mode):  # replaced since it was listed
                    os.unlink(name, dir_fd=fd)
                    continue
                _own(name, child_info, fd)
                child = os.open(name, _DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = child
                trail.append((name, here, left))
                here, left = (child_info.st_dev, child_info.st_ino), _clear_files(fd)
                continue
            if not trail:
                break
            name, above, left = trail.pop()
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            parent_info = os.fstat(parent)
            if (parent_info.st_dev, parent_info.st_ino) != above:
                os.close(parent)
                raise OSError(f"{top}: a directory moved while it was removed; stopped")
            os.close(fd)
            fd, here = parent, above
            os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(top)


def _own(path: str | Path, info: os.stat_result, dir_fd: int | None = None) -> None:
    """Give a directory its owner's read, write and search permission back (a tool may have taken them)."""
    if info.st_mode & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(info.st_mode) | 0o700, dir_fd=dir_fd)


def _clear_files(fd: int) -> list[str]:
    """Unlink everything but directories in the directory open at `fd`; the directories' names."""
    with os.scandir(fd) as listing:
        entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, directory in entries:
        if not directory:
            os.unlink(name, dir_fd=fd)
    return [name for name, directory in entries if directory]


def discard_tree(top: str | Path) -> None:
    """`remove_tree` where a cleanup must not fail what it follows (a rollout, a closing session): a
    tree that cannot be removed is logged with the reason, not raised."""
    try:
        remove_tree(top)
    except OSError as exc:
        logging.getLogger("libra").warning("could not remove %s: %s", top, exc)
