"""Run manifests and run locks: what a committed run is made of, and who may change it.

A run is exactly what its manifest lists. The manifest names, for each table (and schema
version) and each step, the generation that wrote the step, its number of shards and rows; the
files themselves are

    <root>/<table>/v<version>/run=<run>/step=<step:08d>/part-<generation:08d>-<shard:05d>.parquet

Readers (`storage.catalog`) read only the files a manifest lists, so a file that no manifest
lists (a shard of an import that is still running, or was killed, or was replaced) is never read.
Every commit takes a new generation number, so the files of a commit never overwrite files that
a committed manifest lists.

The manifest file `<root>/_runs/<run>.manifest` holds two slots (double buffering, as LMDB keeps
two meta pages). A slot is a 64-byte header (magic, format, slot capacity, generation, payload
length, SHA-256 of all of them and the payload) followed by the manifest as JSON; the committed
manifest is the valid slot with the highest generation. A writer commits by writing the new
manifest into the other slot, payload first and header last, then (with fsync) one fdatasync: a
writer killed mid-write, or a power loss, leaves that slot invalid and the previous manifest in
force, and a reader that reads while a slot is being written finds it invalid and takes the other
one. So every change (one step, or every table and step of an import) becomes visible at once or
not at all. The run's first commit, and a manifest outgrowing its slots, write a whole new file
(with twice the room the manifest needs) under a temporary name and rename it into place. With fsync the new shards
and the directories that gained entries are fsynced before the slot is written, so a committed
manifest never lists a file a power loss could take away; a commit then costs one fsync round
for the data and one for the slot, as a shard renamed into place did before manifests.

One writer at a time changes a run: it holds an exclusive `flock` on `<root>/_runs/<run>.lock`.
The kernel releases the lock when its holder dies (even by SIGKILL), so a dead writer never blocks
the next one. While it holds the lock a writer records who it is in the lock file and clears the
record when it releases the lock cleanly; a record found by the next holder means the previous one
died mid-write, and the next holder removes the files it left (see `StoreWriter`).

A manifest holds a few dozen bytes per step and is rewritten whole by each commit, so a commit
costs O(steps of the run) bytes; at 10,000 steps in two tables that is about 0.5 MB.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import struct
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from libra.clock import Clock, Deadline, WallClock, sleep, unix_time
from libra.errors import LibraError
from libra.files import fsync_path as _fsync
from storage.schemas import TableSchema

RUNS_DIR = "_runs"
MANIFEST_FORMAT = 1
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # (\Z: `$` lets a trailing newline through)


class RunExistsError(LibraError):
    """An import into a run that already exists, without asking to replace it."""


class RunLockedError(LibraError):
    """Another process is writing the run."""


class ManifestUnreadable(LibraError):
    """A run's manifest that cannot be read (torn in both slots, foreign, not a file): the run can
    only be replaced whole."""


@dataclass(frozen=True)
class StepFiles:
    """The shards of one step of one table: written by commit `generation`, `shards` files."""

    generation: int
    shards: int
    rows: int

    def names(self) -> list[str]:
        return [shard_name(self.generation, shard) for shard in range(self.shards)]


@dataclass(frozen=True)
class RunManifest:
    """A committed run: per table key (`turns/v1`), per step, the files that hold its rows."""

    run: str
    generation: int  # the commit that wrote this manifest; 1 for a run's first commit
    committed_at: float  # Unix time of the commit
    origin: str  # what wrote the run: "import of x.csv, prompts_per_step=8", "steps", ...
    tables: Mapping[str, Mapping[int, StepFiles]] = field(default_factory=dict)

    def steps(self, schema: TableSchema) -> Mapping[int, StepFiles]:
        return self.tables.get(table_key(schema), {})

    def files(self, root: str | Path, schema: TableSchema) -> list[Path]:
        """The table's shard paths, by step then shard."""
        steps = self.steps(schema)
        return [
            step_dir(root, schema, self.run, step) / name for step in sorted(steps) for name in steps[step].names()
        ]

    def rows(self, schema: TableSchema) -> int:
        return sum(s.rows for s in self.steps(schema).values())

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "run": self.run,
                "generation": self.generation,
                "committed_at": self.committed_at,
                "origin": self.origin,
                "tables": {
                    key: {str(step): [f.generation, f.shards, f.rows] for step, f in sorted(steps.items())}
                    for key, steps in sorted(self.tables.items())
                },
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str) -> RunManifest:
        raw = json.loads(text)
        if raw.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"manifest format {raw.get('format')!r}, this Libra reads format {MANIFEST_FORMAT}")
        tables = {
            key: {int(step): StepFiles(*entry) for step, entry in steps.items()} for key, steps in raw["tables"].items()
        }
        return RunManifest(raw["run"], raw["generation"], raw["committed_at"], raw["origin"], tables)


def table_key(schema: TableSchema) -> str:
    return f"{schema.name}/v{schema.version}"


def table_dir(root: str | Path, schema: TableSchema) -> Path:
    return Path(root) / schema.name / f"v{schema.version}"


def run_dir(root: str | Path, schema: TableSchema, run: str) -> Path:
    return table_dir(root, schema) / f"run={run}"


def step_dir(root: str | Path, schema: TableSchema, run: str, step: int) -> Path:
    return run_dir(root, schema, run) / f"step={step:08d}"


def shard_name(generation: int, shard: int) -> str:
    return f"part-{generation:08d}-{shard:05d}.parquet"


def runs_dir(root: str | Path) -> Path:
    return Path(root) / RUNS_DIR


def manifest_path(root: str | Path, run: str) -> Path:
    return runs_dir(root) / f"{run}.manifest"


def lock_path(root: str | Path, run: str) -> Path:
    return runs_dir(root) / f"{run}.lock"


_MAGIC = b"LIBRAMAN"
_HEADER = struct.Struct("<8sIQQI32s")  # magic, format, capacity, generation, length, sha256
_PAGE = 4096


def _slot_digest(capacity: int, generation: int, payload: bytes) -> bytes:
    head = _HEADER.pack(_MAGIC, MANIFEST_FORMAT, capacity, generation, len(payload), b"\0" * 32)
    return hashlib.sha256(head + payload).digest()


def _slot(capacity: int, generation: int, payload: bytes) -> tuple[bytes, bytes]:
    """(header, payload) of a slot."""
    digest = _slot_digest(capacity, generation, payload)
    return _HEADER.pack(_MAGIC, MANIFEST_FORMAT, capacity, generation, len(payload), digest), payload


def _parse_slot(data: bytes, index: int) -> tuple[int, bytes] | None:
    """(generation, payload) of a valid slot, None for a torn, empty or foreign one."""
    capacity = len(data) // 2
    offset = index * capacity
    if capacity < _HEADER.size or len(data) % _PAGE:
        return None
    magic, fmt, cap, generation, length, digest = _HEADER.unpack_from(data, offset)
    if magic != _MAGIC or fmt != MANIFEST_FORMAT or cap != capacity or length > capacity - _HEADER.size:
        return None
    payload = data[offset + _HEADER.size: offset + _HEADER.size + length]
    if _slot_digest(capacity, generation, payload) != digest:
        return None
    return generation, payload


def _newest_slot(data: bytes) -> tuple[int, int, bytes] | None:
    """(index, generation, payload) of the committed slot."""
    slots = [(i, *slot) for i in (0, 1) if (slot := _parse_slot(data, i)) is not None]
    return max(slots, key=lambda s: s[1]) if slots else None


# what wrote a run: its manifest's origin, which says how to write it again
TRAIN_ORIGIN = "train"  # a training run's rows (a run of another origin is never replaced by one)
IMPORT_ORIGIN = "import of "  # every import's origin begins so (the file's name and settings follow)
SIMULATION_ORIGIN = "simulation of "  # every simulation's (what it simulated follows)


def import_origin(name: str) -> str:
    """How an import of the trace file `name` begins its run's origin (its settings follow)."""
    return f"{IMPORT_ORIGIN}{name}, "


def simulation_origin(description: str) -> str:
    """A simulation's origin: what it simulated (unique to the simulation, so a retry knows its own commit)."""
    return f"{SIMULATION_ORIGIN}{description}"


def rewrite_hint(run: str, origin: str | None = None) -> str:
    """What to do about a run whose files cannot be read: write it again whole with the command that
    wrote it (`origin`: its manifest's, where that could be read)."""
    if origin is not None and origin.startswith(IMPORT_ORIGIN):
        name = origin.removeprefix(IMPORT_ORIGIN).split(", ")[0]
        return f"import it again whole: libra traces import {name} --run {run} --replace"
    if origin == TRAIN_ORIGIN:
        return f"train it again whole: libra train --run {run} --restart"
    if origin is not None and origin.startswith(SIMULATION_ORIGIN):
        return f"simulate it again whole: libra simulate ... --run {run} --replace"
    return (f"write it again whole with the command that wrote it (libra traces import FILE --run {run} --replace; "
            f"libra train --run {run} --restart; libra simulate ... --run {run} --replace)")


def read_manifest(root: str | Path, run: str) -> RunManifest | None:
    """The run's committed manifest, or None when the run has never been committed."""
    path = manifest_path(root, run)
    for attempt in range(20):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ManifestUnreadable(f"run {run!r}: manifest {path} cannot be read ({exc.strerror or exc}); "
                                     + rewrite_hint(run)) from None
        newest = _newest_slot(data)
        if newest is not None:
            break
        sleep(WallClock(), 0.01 * (attempt + 1))  # two commits overlapped this read: read again
    else:
        raise ManifestUnreadable(f"run {run!r}: manifest {path} has no valid slot; " + rewrite_hint(run))
    try:
        manifest = RunManifest.from_json(newest[2].decode())
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestUnreadable(f"run {run!r}: manifest {path} is unreadable ({exc}); " + rewrite_hint(run)) from None
    if manifest.run != run or manifest.generation != newest[1]:
        raise ManifestUnreadable(f"run {run!r}: manifest {path} is for run {manifest.run!r}, generation "
                                 f"{manifest.generation}; " + rewrite_hint(run))
    return manifest


def write_manifest(root: str | Path, manifest: RunManifest, *, fsync: bool, before: Sequence[Path] = ()) -> None:
    """Commit `manifest` (see the module docstring). With `fsync`, the files and directories in
    `before` (the new shards, the directories that gained entries) are made durable first."""
    path = manifest_path(root, manifest.run)
    payload = manifest.to_json().encode()
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        fd = None
    if fd is not None:
        try:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            newest = _newest_slot(data)
            capacity = len(data) // 2
            if newest is not None and _HEADER.size + len(payload) <= capacity:
                if fsync:
                    fsync_paths(before)
                header, body = _slot(capacity, manifest.generation, payload)
                offset = (1 - newest[0]) * capacity  # the slot that is not in force
                _pwrite_all(fd, body, offset + _HEADER.size)
                _pwrite_all(fd, header, offset)  # last: until it is whole, the slot is invalid
                if fsync:
                    os.fdatasync(fd)
                return
        finally:
            os.close(fd)
    # the run's first commit, or a manifest that outgrew its slots: a new file, renamed into place
    capacity = -(-2 * (_HEADER.size + len(payload)) // _PAGE) * _PAGE
    header, body = _slot(capacity, manifest.generation, payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(header + body + b"\0" * (2 * capacity - len(header) - len(body)))
        if fsync:
            fsync_paths([tmp, *before])
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_paths([path.parent])


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def check_store_root(root: str | Path) -> None:
    """A LibraError if `root`, or the nearest of its folders that exists, is not a directory (a store
    that does not exist yet is empty, and is made where its folder can hold it)."""
    path = Path(root)
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    if os.path.lexists(path) and not path.is_dir():
        where = "" if path == Path(root) else f" ({path} is a file)"
        raise LibraError(f"store {root} is not a directory{where}; give a store directory (--store DIR or store.root)")


def committed_runs(root: str | Path) -> list[str]:
    """Names of the runs that have a committed manifest, sorted."""
    check_store_root(root)
    base = runs_dir(root)
    if not base.is_dir():
        return []
    suffix = ".manifest"
    return sorted(p.name[: -len(suffix)] for p in base.iterdir()
                  if p.name.endswith(suffix) and RUN_NAME.match(p.name[: -len(suffix)]))


def manifests_signature(root: str | Path, run: str | None) -> tuple:
    """Changes whenever a commit changes the manifest of `run` (of any run when None): a commit
    writes a slot's header last, or renames a new file into place."""
    paths = [manifest_path(root, run)] if run is not None else [manifest_path(root, r) for r in committed_runs(root)]
    out = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            capacity = st.st_size // 2
            out.append((path.name, st.st_ino, os.pread(fd, _HEADER.size, 0), os.pread(fd, _HEADER.size, capacity)))
        finally:
            os.close(fd)
    return tuple(out)


def fsync_paths(paths: Sequence[Path]) -> None:
    """fsync files and directories. The calls run side by side in short-lived threads (at most 16):
    the file system then flushes them in one journal commit instead of one each."""
    paths = list(dict.fromkeys(paths))
    if len(paths) <= 1:
        for path in paths:
            _fsync(path)
        return
    import threading

    workers = min(16, len(paths))
    errors: list[BaseException] = []

    def work(chunk: list[Path]) -> None:
        try:
            for path in chunk:
                _fsync(path)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(paths[i::workers],), daemon=True) for i in range(1, workers)]
    for thread in threads:
        thread.start()
    work(paths[0::workers])
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]



@dataclass(frozen=True)
class Holder:
    """Who holds a run's lock, as recorded in the lock file (blanks when nobody does)."""

    pid: int
    purpose: str
    since: float

    def describe(self) -> str:
        return f"pid {self.pid}, {self.purpose}, since {time.strftime('%H:%M:%S', time.localtime(self.since))}"

    def record(self) -> bytes:
        purpose = self.purpose
        while True:  # a record fills exactly _RECORD_BYTES: shorten a long purpose
            raw = json.dumps({"pid": self.pid, "purpose": purpose, "since": self.since}).encode()
            if len(raw) <= _RECORD_BYTES:
                return raw.ljust(_RECORD_BYTES)
            purpose = purpose[: len(purpose) // 2]

    @staticmethod
    def parse(raw: bytes) -> Holder | None:
        raw = raw.strip(b" \0\n")
        if not raw:
            return None
        try:
            data = json.loads(raw.decode())
            return Holder(int(data["pid"]), str(data["purpose"]), float(data["since"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return Holder(0, "unknown writer", 0.0)


_RECORD_BYTES = 512  # the lock file keeps this size: records are rewritten in place, never truncated


class RunLock:
    """An exclusive lock on one run, held by one writer at a time (see the module docstring).

    `previous` is the record a holder that died mid-write left behind (None after a clean
    release). Locks are per open file, so two `RunLock`s on one run exclude each other even in
    one process: do not nest them.
    """

    def __init__(self, root: str | Path, run: str, *, purpose: str, wait_s: float, clock: Clock | None = None) -> None:
        self.clock = clock or WallClock()
        self.path = lock_path(root, run)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._acquire(run, wait_s)
            self.previous = Holder.parse(os.pread(self._fd, _RECORD_BYTES, 0))
            os.pwrite(self._fd, Holder(os.getpid(), purpose, unix_time()).record(), 0)
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def _acquire(self, run: str, wait_s: float) -> None:
        deadline = Deadline(self.clock, wait_s)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            left = deadline.left()
            if left <= 0:
                holder = Holder.parse(os.pread(self._fd, _RECORD_BYTES, 0))
                who = f" ({holder.describe()})" if holder else ""
                waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
                raise RunLockedError(
                    f"run {run!r} is being written by another process{who}; try again when it has finished{waited}"
                )
            sleep(self.clock, min(0.05, left))

    def release(self, *, clean: bool = True) -> None:
        """Release the lock; `clean=False` keeps this holder's record, so that the next holder
        cleans up after it."""
        if self._fd is None:
            return
        try:
            if clean:
                os.pwrite(self._fd, b" " * _RECORD_BYTES, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.release(clean=exc_type is None)


def walk_run_files(root: str | Path, schema: TableSchema, run: str) -> Iterator[Path]:
    """Every file under the run's directory of `schema` (committed or not)."""
    base = run_dir(root, schema, run)
    if not base.is_dir():
        return
    for step in sorted(base.iterdir()):
        if step.is_dir():
            yield from sorted(p for p in step.iterdir() if not p.is_dir())
        else:
            yield step
