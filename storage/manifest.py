"""Run manifests and run locks: what a committed run is made of, and who may change it.

A run is exactly what its manifest lists. The manifest `<root>/_runs/<run>.json` names, for each
table (and schema version) and each step, the generation that wrote the step, its number of shards
and rows; the files themselves are

    <root>/<table>/v<version>/run=<run>/step=<step:08d>/part-<generation:08d>-<shard:05d>.parquet

Readers (`storage.catalog`) read only the files a manifest lists, so a file that no manifest
lists (a shard of an import that is still running, or was killed, or was replaced) is never read.
A writer publishes a change by writing a whole new manifest under a temporary name, fsyncing it
and renaming it over the old one: the rename is the commit, so every change (one step, a whole
import of many steps and tables) becomes visible at once or not at all. Every commit takes a new
generation number, so the files of a commit never overwrite files that a committed manifest lists.

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
import json
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from libra.errors import LibraError
from storage.schemas import TableSchema

RUNS_DIR = "_runs"
MANIFEST_FORMAT = 1
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RunExistsError(LibraError):
    """An import into a run that already exists, without asking to replace it."""


class RunLockedError(LibraError):
    """Another process is writing the run."""


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
    origin: str  # what wrote the run ("import data/x.csv (prompts_per_step=8)", "steps", ...)
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
    return runs_dir(root) / f"{run}.json"


def lock_path(root: str | Path, run: str) -> Path:
    return runs_dir(root) / f"{run}.lock"


def read_manifest(root: str | Path, run: str) -> RunManifest | None:
    """The run's committed manifest, or None when the run has never been committed."""
    path = manifest_path(root, run)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        manifest = RunManifest.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise LibraError(f"run {run!r}: manifest {path} is unreadable ({exc}); re-import the run with --replace") from None
    if manifest.run != run:
        raise LibraError(f"run {run!r}: manifest {path} is for run {manifest.run!r}")
    return manifest


def write_manifest(root: str | Path, manifest: RunManifest, *, fsync: bool, before_rename: Sequence[Path] = ()) -> None:
    """Commit `manifest`: write it under a temporary name, fsync it together with `before_rename`
    (the new shards and the directories that gained entries), rename it over the run's manifest,
    then fsync the directory that holds it."""
    final = manifest_path(root, manifest.run)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(manifest.to_json())
        if fsync:
            fsync_paths([tmp, *before_rename])
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_paths([final.parent])


def committed_runs(root: str | Path) -> list[str]:
    """Names of the runs that have a committed manifest, sorted."""
    base = runs_dir(root)
    if not base.is_dir():
        return []
    return sorted(p.name[: -len(".json")] for p in base.iterdir() if p.name.endswith(".json") and RUN_NAME.match(p.name[:-5]))


def manifests_signature(root: str | Path, run: str | None) -> tuple:
    """Changes whenever a commit replaces the manifest of `run` (of any run when None): each commit
    renames a new file into place, so its inode and modification time change."""
    paths = [manifest_path(root, run)] if run is not None else [manifest_path(root, r) for r in committed_runs(root)]
    out = []
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out.append((path.name, st.st_ino, st.st_mtime_ns, st.st_size))
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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Holder:
    """Who holds a run's lock, as recorded in the lock file."""

    pid: int
    purpose: str
    since: float

    def describe(self) -> str:
        return f"pid {self.pid}, {self.purpose}, since {time.strftime('%H:%M:%S', time.localtime(self.since))}"

    @staticmethod
    def parse(raw: bytes) -> Holder | None:
        try:
            data = json.loads(raw.decode())
            return Holder(int(data["pid"]), str(data["purpose"]), float(data["since"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return Holder(0, "unknown writer", 0.0) if raw.strip() else None


class RunLock:
    """An exclusive lock on one run, held by one writer at a time (see the module docstring).

    `previous` is the record a holder that died mid-write left behind (None after a clean
    release). Locks are per open file, so two `RunLock`s on one run exclude each other even in
    one process: do not nest them.
    """

    def __init__(self, root: str | Path, run: str, *, purpose: str, wait_s: float) -> None:
        self.path = lock_path(root, run)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._acquire(run, wait_s)
            self.previous = Holder.parse(os.pread(self._fd, 4096, 0))
            record = json.dumps({"pid": os.getpid(), "purpose": purpose, "since": time.time()}).encode()
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, record, 0)
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def _acquire(self, run: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                holder = Holder.parse(os.pread(self._fd, 4096, 0))
                who = f" ({holder.describe()})" if holder else ""
                waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
                raise RunLockedError(
                    f"run {run!r} is being written by another process{who}; try again when it has finished{waited}"
                )
            time.sleep(min(0.05, left))

    def release(self, *, clean: bool = True) -> None:
        """Release the lock; `clean=False` keeps this holder's record, so that the next holder
        cleans up after it."""
        if self._fd is None:
            return
        try:
            if clean:
                os.ftruncate(self._fd, 0)
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
