"""A trajectory interrupted when its batch closed (partial rollouts), as a record that outlives the
rollout: its tokens with their behaviour log-probs and weights versions, an interrupted turn's
tokens so far, and the files of its working directory. Checkpoints keep these records, so a run
killed while trajectories are suspended continues them after its resume, each once.

The working directory is kept as data, never as a directory: its plain files and folders are read
when the trajectory is suspended (links, devices and FIFOs that sandboxed code may have made are
not followed, and fail the suspension), and written into the new working directory of the rollout
that continues it, with their modes and owners.
"""

from __future__ import annotations

import copy
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from libra.files import remove_tree
from libra.partial import oldest_version
from libra.rollout.trajectory import TrajectoryRun


@dataclass(frozen=True)
class WorkFile:
    """One entry of a working directory: a folder (`data` None) or a plain file."""

    path: str  # relative, '/'-separated
    mode: int  # permission bits
    uid: int
    gid: int
    data: bytes | None


class WorkdirTooLarge(Exception):
    """A working directory that cannot be kept for a suspended trajectory (why, as its message)."""


@dataclass(frozen=True)
class Suspended:
    """A suspended trajectory: `run` as it stood (without its episode), its files, the seconds it
    had run (its trajectory time limit counts them)."""

    run: TrajectoryRun
    files: tuple[WorkFile, ...]
    active_s: float

    @classmethod
    def of(cls, run: TrajectoryRun, files: tuple[WorkFile, ...], active_s: float) -> Suspended:
        kept = _copied(run)
        kept.episode = None
        kept.workdir = Path()
        return cls(kept, files, active_s)

    @property
    def trajectory_id(self) -> str:
        return self.run.trajectory_id

    @property
    def prompt_id(self) -> str:
        return self.run.prompt_id

    @property
    def oldest_version(self) -> int:
        """The weights version of its oldest policy token (its own version if it has none yet)."""
        partial = self.run.partial.versions if self.run.partial is not None else ()
        return oldest_version((*self.run.versions, *partial), self.run.model_version)

    def reopened(self) -> TrajectoryRun:
        """A live copy to continue (the caller opens its episode and working directory)."""
        run = _copied(self.run)
        run.suspended = False
        run.suspensions += 1
        run.new_tokens = 0
        return run


def _copied(run: TrajectoryRun) -> TrajectoryRun:
    """A copy of `run` whose token and turn lists are its own (the record and the live run grow apart)."""
    out = copy.copy(run)
    for name in ("ids", "mask", "logprobs", "versions", "turns"):
        setattr(out, name, list(getattr(run, name)))
    return out


MAX_ENTRIES = 10_000  # folders and files a kept working directory may hold
MAX_DEPTH = 64  # folders deep
MAX_PATH = 1_024  # characters of a relative path (the new working directory's own path comes before it)
ENTRY_BYTES = 128  # what an entry costs a snapshot beside its path and data (its record, pickled): counted in the limit


def snapshot_files(workdir: Path, limit: int) -> tuple[WorkFile, ...]:
    """The folders and plain files under `workdir`, at most `limit` bytes in all: their data, their
    paths and `ENTRY_BYTES` an entry (10,000 empty files of long names had pickled to 10 MB under a
    limit of 0). Links
    and special files are refused (`WorkdirTooLarge`), never followed; so are more than
    `MAX_ENTRIES` entries, folders more than `MAX_DEPTH` deep, paths longer than `MAX_PATH`, and
    anything that cannot be read (a tool's code shapes this tree: whatever it made, the trajectory
    fails with the reason, never the rollout)."""
    try:
        return _snapshot(workdir, limit)
    except OSError as exc:
        raise WorkdirTooLarge(f"its working directory could not be read: {exc.strerror or exc}") from None


def _snapshot(workdir: Path, limit: int) -> tuple[WorkFile, ...]:
    out: list[WorkFile] = []
    total = 0
    pending = [("", 0)]  # folders to read: (relative path, depth), read in name order
    while pending:
        folder, depth = pending.pop()
        listed = []
        for name in os.listdir(workdir / folder):
            rel = f"{folder}/{name}" if folder else name
            if len(rel) > MAX_PATH:
                raise WorkdirTooLarge(f"its working directory holds a path of more than {MAX_PATH:,} characters")
            listed.append((rel, os.lstat(workdir / rel)))
            total += len(rel.encode("utf-8", "surrogateescape")) + ENTRY_BYTES
            if total > limit:
                raise WorkdirTooLarge(f"its working directory holds more than {limit:,} bytes of files, names "
                                      "and entries (rollout.suspend_bytes)")
        listed.sort(key=lambda entry: (not stat.S_ISDIR(entry[1].st_mode), entry[0]))  # its folders, then the rest
        subfolders = []
        for rel, info in listed:
            path = workdir / rel
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 > MAX_DEPTH:
                    raise WorkdirTooLarge(f"its working directory holds folders more than {MAX_DEPTH} deep")
                out.append(WorkFile(rel, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, None))
                subfolders.append(rel)
            elif stat.S_ISREG(info.st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as handle:
                    data = handle.read(max(0, limit - total) + 1)
                total += len(data)
                if total > limit:
                    raise WorkdirTooLarge(f"its working directory holds more than {limit:,} bytes of files, names "
                                          "and entries (rollout.suspend_bytes)")
                out.append(WorkFile(rel, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, data))
            else:
                raise WorkdirTooLarge(f"its working directory holds {rel!r}, which is neither a folder nor a "
                                               "plain file (a link, a FIFO or a device) and is not kept")
            if len(out) > MAX_ENTRIES:
                raise WorkdirTooLarge(f"its working directory holds more than {MAX_ENTRIES:,} entries")
        pending += [(sub, depth + 1) for sub in reversed(subfolders)]
    return tuple(out)


def restore_files(workdir: Path, files: tuple[WorkFile, ...]) -> None:
    """Write `files` (a `snapshot_files`) into `workdir`, a new working directory its environment has
    just opened: what stands there under the same name is replaced. Owners are kept where this
    process may set them (it runs as root); paths that leave the directory are refused."""
    owner = os.geteuid() == 0
    for entry in files:
        rel = PurePosixPath(entry.path)
        if rel.is_absolute() or ".." in rel.parts or "\0" in entry.path or not rel.parts:
            raise ValueError(f"a suspended trajectory's file {entry.path!r} is not a path inside its working directory")
        path = workdir.joinpath(*rel.parts)
        if entry.data is None:
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                path.unlink()  # a folder where the environment wrote a file: the folder is what was kept
            path.mkdir(exist_ok=True)
            os.chmod(path, entry.mode, follow_symlinks=False)
        else:
            if path.is_dir() and not path.is_symlink():
                remove_tree(path)
            elif path.is_symlink() or path.exists():
                path.unlink()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(entry.data)
                os.fchmod(handle.fileno(), entry.mode)
                if owner:
                    os.fchown(handle.fileno(), entry.uid, entry.gid)
        if owner and entry.data is None:
            os.chown(path, entry.uid, entry.gid, follow_symlinks=False)
