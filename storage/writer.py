"""Parquet writer: every change to a run is staged as new files and published by one manifest commit.

Layout (see `storage.manifest`): a run's rows live in
`<root>/<table>/v<version>/run=<run>/step=<step:08d>/part-<generation:08d>-<shard:05d>.parquet`, and
the run is what its manifest `<root>/_runs/<run>.manifest` lists; readers read nothing else.

A change is a `RunTransaction`, made while holding the run's lock (`storage.manifest.RunLock`):

1. stage: each `write_step` writes the step's shards under the transaction's new generation
   number. No manifest lists them yet, so no reader sees them, and they never overwrite a file
   that the committed manifest lists.
2. commit: fsync the shards and the directories that gained entries (those start in the
   background as soon as the entries exist, while the shard is encoded), then write the new manifest
   into the manifest file's slot that is not in force, header last (`storage.manifest`). That
   write is the commit: the change (one step, or every table and step of an import) appears whole
   or not at all. Then the files the commit superseded are removed.
3. abort (an exception inside the transaction): the staged files are removed; the run stays as
   it was.

Modes: `update` (the default) starts from the committed run and replaces the steps it writes,
leaving the others; `create` refuses a run that exists (`RunExistsError`); `replace` publishes
only what it wrote, replacing the run whole.

Guarantees:
- A writer killed at any point (SIGKILL included) leaves the run as its last commit left it:
  absent if it was never committed, else complete. The next writer of the run removes what the
  killed one left (it finds the dead writer's record in the lock file, see `RunLock`); imports
  (`create`, `replace`) always remove every file of the run that the manifest does not list.
- `write_step` is a transaction of its own, for writers that add steps to a run one at a time (a
  training loop): the step's shards appear together when the step's commit writes the manifest;
  writing a step again replaces its rows, never adds to them. `write_run` publishes all the steps
  of its table in one commit. To publish several tables together (a step's trajectories and
  turns), write them inside one `transaction(run)`.
- One writer per run at a time: another one waits up to `lock_wait_s` for the lock, then gets a
  `RunLockedError` naming the holder. Readers never wait.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from libra.clock import unix_time
from libra.errors import LibraError
from storage.manifest import (
    RUN_NAME,
    ManifestUnreadable,
    RunExistsError,
    RunLock,
    RunManifest,
    StepFiles,
    check_store_root,
    fsync_paths,
    manifest_path,
    read_manifest,
    runs_dir,
    shard_name,
    step_dir,
    table_dir,
    table_key,
    walk_run_files,
    write_manifest,
)
from storage.schemas import TABLES, TableSchema, table_schema

TABLES_BY_KEY = {table_key(schema): schema for schema in TABLES.values()}
WriteMode = Literal["update", "create", "replace"]

__all__ = [
    "RUN_NAME", "RunTransaction", "StoreWriter", "WriteMode", "check_run_name", "conform",
    "ANOTHER", "REPLACE", "refuse_existing", "refuse_other_origin", "run_exists_error", "step_dir", "table_dir",
]


def check_run_name(run: str) -> str:
    if not RUN_NAME.match(run):
        raise LibraError(
            f"run name {run!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return run


REPLACE = "pass --replace to replace it whole"
ANOTHER = "name another run with --run NAME (this command adds to no run it did not start)"


def run_exists_error(root: str | Path, manifest: RunManifest, remedy: str = REPLACE) -> RunExistsError:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest.committed_at))
    return RunExistsError(
        f"run {manifest.run!r} already exists in store {root} ({manifest.origin}, committed {when}); {remedy}"
    )


def refuse_existing(root: str | Path, run: str, remedy: str = REPLACE) -> None:
    """`RunExistsError` if `run` is committed in the store at `root` (a writer that would create it
    checks early, before its work, and again under the run's lock); `remedy`: what to do instead."""
    check_store_root(root)
    existing = read_manifest(root, run)
    if existing is not None:
        raise run_exists_error(root, existing, remedy)


def refuse_other_origin(root: str | Path, run: str, origin: str, what: str, *, replacing: bool = False,
                        hint: str = "name the new run another way (--run NAME)") -> None:
    """`RunExistsError` if `run` is committed in the store at `root` by another writer than one whose
    origin begins with `origin` (`what` names the run about to be written, `hint` what to do): a
    training run of an imported trace's name would replace the import at its first step. An
    unreadable manifest is refused too (its origin is unknown), unless the run is `replacing` it whole."""
    check_store_root(root)
    try:
        existing = read_manifest(root, run)
    except ManifestUnreadable:
        if replacing:
            return
        raise
    if existing is not None and not written_by(existing, origin):
        raise other_origin_error(root, existing, what, hint)


def written_by(manifest: RunManifest, origin: str) -> bool:
    """Whether the run's origin begins with `origin` (an import's begins with the file's name, its
    settings follow)."""
    return manifest.origin.startswith(origin)


def other_origin_error(root: str | Path, existing: RunManifest, what: str, hint: str) -> RunExistsError:
    """The refusal of `refuse_other_origin`, also for a writer that finds the other run under the lock."""
    return RunExistsError(f"run {existing.run!r} already exists in store {root} ({existing.origin}) and is not {what}, "
                          f"which would replace it; {hint}")


def conform(schema: TableSchema, data: pa.Table | pa.RecordBatch, run: str, step: int | None) -> pa.Table:
    """Return `data` with exactly the schema's columns and types.

    Missing nullable columns are filled with nulls; `run` (and `step` when given) are filled in
    when absent and checked when present. Unknown columns, missing required columns, nulls in
    required columns and lossy casts raise ValueError.
    """
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    known = set(schema.column_names)
    unknown = [n for n in table.column_names if n not in known]
    if unknown:
        raise ValueError(f"{schema.name}: unknown column(s) {unknown}; schema v{schema.version} has {list(schema.column_names)}")
    n = table.num_rows
    arrays = []
    for column in schema.columns:
        if column.name in table.column_names:
            array = table.column(column.name)
            if not array.type.equals(column.type):
                array = array.cast(column.type, safe=True)
        elif column.name == "run":
            array = pa.chunked_array([pa.array([run] * n, pa.string())] if n else [], pa.string())
        elif column.name == "step" and step is not None:
            array = pa.chunked_array([pa.array([step] * n, pa.int64())] if n else [], pa.int64())
        elif column.nullable:
            array = pa.nulls(n, column.type)
        else:
            raise ValueError(f"{schema.name}: required column {column.name!r} is missing")
        if not column.nullable and array.null_count:
            raise ValueError(f"{schema.name}: required column {column.name!r} has {array.null_count} null(s)")
        arrays.append(array)
    out = pa.Table.from_arrays(arrays, schema=schema.arrow)
    if n and pc.any(pc.not_equal(out.column("run"), run)).as_py():
        raise ValueError(f"{schema.name}: rows for another run than {run!r}")
    if n and step is not None and pc.any(pc.not_equal(out.column("step"), step)).as_py():
        raise ValueError(f"{schema.name}: rows for another step than {step}")
    return out


class StoreWriter:
    """Writes conformed tables into a store root. Stateless apart from its settings."""

    def __init__(
        self,
        root: str | Path,
        *,
        compression: str = "zstd",
        row_group_rows: int = 1_048_576,
        fsync: bool = True,
        lock_wait_s: float = 60.0,
    ) -> None:
        self.root = Path(root)
        self.compression = None if compression == "none" else compression
        self.row_group_rows = row_group_rows
        self.fsync = fsync
        self.lock_wait_s = lock_wait_s

    @contextmanager
    def transaction(
        self, run: str, *, mode: WriteMode = "update", origin: str = "steps", wait_s: float | None = None
    ) -> Iterator[RunTransaction]:
        """Hold the run's lock, stage writes, and commit them together when the block ends
        (abort them if it raises). `origin` says what wrote the run (a refused import names it);
        `wait_s` overrides `lock_wait_s` (0: refuse at once when another writer holds the run)."""
        check_run_name(run)
        check_store_root(self.root)
        if mode not in ("update", "create", "replace"):
            raise ValueError(f"unknown write mode {mode!r}")
        purpose = f"{mode} ({origin})"
        lock = RunLock(self.root, run, purpose=purpose, wait_s=self.lock_wait_s if wait_s is None else wait_s)
        tx = RunTransaction(self, run, mode, origin, leftovers=lock.previous is not None)
        try:
            tx.begin()
            yield tx
            tx.commit()
        except BaseException:
            tx.abort()
            raise
        finally:
            lock.release(clean=not tx.dirty)

    def write_step(
        self, table: str, run: str, step: int, data: pa.Table | pa.RecordBatch, shard_rows: int | None = None
    ) -> list[Path]:
        """Replace step `step` of `run` in `table` with `data`, split into shards of `shard_rows`
        rows, in a commit of its own: readers see the step's old rows or all its new ones."""
        with self.transaction(run) as tx:
            return tx.write_step(table, step, data, shard_rows)

    def write_run(self, table: str, run: str, data: pa.Table, shard_rows: int | None = None) -> list[Path]:
        """Write rows of many steps (the `step` column decides), replacing each step they touch,
        in one commit."""
        with self.transaction(run) as tx:
            return tx.write_run(table, data, shard_rows)


class RunTransaction:
    """Writes to one run staged under one generation, published by `commit` (see the module
    docstring). Made by `StoreWriter.transaction`, which holds the run's lock around it."""

    def __init__(self, writer: StoreWriter, run: str, mode: WriteMode, origin: str, *, leftovers: bool) -> None:
        self.writer = writer
        self.root = writer.root
        self.run = run
        self.mode = mode
        self.origin = origin
        self.base: RunManifest | None = None
        self.generation = 0
        self.committed: RunManifest | None = None
        self._leftovers = leftovers  # a writer died holding the lock: its files may remain
        self._staged: dict[str, dict[int, StepFiles]] = {}
        self._pending: list[Path] = []  # staged files, until committed or removed
        self._early_syncs: list[threading.Thread] = []  # fsyncs of directories that gained entries
        self._early_errors: list[BaseException] = []

    @property
    def dirty(self) -> bool:
        """Whether files that no manifest lists may remain (the next writer then sweeps them)."""
        return self._leftovers or bool(self._pending)

    def begin(self) -> None:
        try:
            self.base = read_manifest(self.root, self.run)
        except ManifestUnreadable:
            if self.mode != "replace":
                raise
            self.base = None  # replaced whole: nothing of the unreadable run is kept (swept below)
        if self._leftovers or self.mode != "update" or self.base is None:
            self._sweep()
        if self.mode == "create" and self.base is not None:
            raise run_exists_error(self.root, self.base)
        self.generation = (self.base.generation if self.base else 0) + 1

    def write_step(self, table: str, step: int, data: pa.Table | pa.RecordBatch, shard_rows: int | None = None) -> list[Path]:
        """Stage step `step` of `table` (replacing what this transaction staged for it before)."""
        schema = table_schema(table)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self.committed is not None:
            raise RuntimeError("the transaction is already committed")
        conformed = conform(schema, data, self.run, step)
        staged = self._staged.setdefault(table_key(schema), {})
        directory = step_dir(self.root, schema, self.run, step)
        if step in staged:
            replaced = {directory / name for name in staged.pop(step).names()}
            self._remove(sorted(replaced))
            self._pending = [p for p in self._pending if p not in replaced]
        gained = self._makedirs(directory)  # directories that gained a subdirectory
        size = shard_rows or max(conformed.num_rows, 1)
        paths = []
        for shard, offset in enumerate(range(0, max(conformed.num_rows, 1), size)):
            path = directory / shard_name(self.generation, shard)
            self._pending.append(path)  # before writing: an abort removes a partial file too
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            self._sync_soon([directory, *gained])  # the new entries, while the shard is encoded
            gained = []
            pq.write_table(
                conformed.slice(offset, size), path, compression=self.writer.compression,
                row_group_size=self.writer.row_group_rows,
            )
            paths.append(path)
        staged[step] = StepFiles(self.generation, len(paths), conformed.num_rows)
        return paths

    def write_run(self, table: str, data: pa.Table, shard_rows: int | None = None) -> list[Path]:
        """Stage rows of many steps (the `step` column decides), each step replacing its rows."""
        if "step" not in data.column_names:
            raise ValueError(f"{table}: write_run needs a 'step' column")
        if data.num_rows == 0:
            return []
        steps = data.column("step")
        if steps.null_count:
            raise ValueError(f"{table}: 'step' has nulls")
        if not _is_sorted(steps):
            data = data.take(pc.sort_indices(steps))
            steps = data.column("step")
        values, counts = _run_lengths(steps)
        paths: list[Path] = []
        offset = 0
        for step, count in zip(values, counts, strict=True):
            paths += self.write_step(table, int(step), data.slice(offset, count), shard_rows)
            offset += count
        return paths

    def commit(self) -> RunManifest | None:
        """Publish what was staged (see the module docstring); returns the new manifest, or the
        committed one unchanged when an `update` staged nothing."""
        if self.committed is not None:
            return self.committed
        if not self._staged:
            if self.mode == "update":
                return self.base
            raise ValueError(f"run {self.run!r}: nothing staged to {self.mode}")
        keep_old = self.mode == "update" and self.base is not None
        tables = {key: dict(steps) for key, steps in self.base.tables.items()} if keep_old else {}
        for key, steps in self._staged.items():
            tables.setdefault(key, {}).update(steps)
        origin = self.base.origin if keep_old else self.origin
        manifest = RunManifest(self.run, self.generation, unix_time(), origin, tables)
        if self.writer.fsync:
            fsync_paths(self._pending)  # side by side with the directories' fsyncs still running
        self._join_early_syncs()
        write_manifest(self.root, manifest, fsync=self.writer.fsync)
        self.committed = manifest
        self._pending = []
        if self.base is not None:
            self._leftovers |= not self._remove(self._superseded(manifest))
        return manifest

    def abort(self) -> None:
        """Remove the staged files (nothing was published)."""
        try:
            self._join_early_syncs()
        except OSError:
            pass  # the files go anyway
        if self.committed is None and self._pending:
            if self._remove(self._pending):
                self._pending = []

    def _superseded(self, manifest: RunManifest) -> list[Path]:
        """Files of the previous manifest that `manifest` no longer lists. An update looks only at
        the steps it wrote, so a step's commit costs the same at step 10 and at step 10,000."""
        if self.mode != "update":
            live = set(_all_files(self.root, manifest))
            return [p for p in _all_files(self.root, self.base) if p not in live]
        out = []
        for key, steps in self._staged.items():
            old_steps = self.base.tables.get(key, {})
            schema = TABLES_BY_KEY.get(key)
            for step in steps:
                if schema is not None and step in old_steps:
                    directory = step_dir(self.root, schema, self.run, step)
                    out += [directory / name for name in old_steps[step].names()]
        return out

    def _sweep(self) -> None:
        """Remove every file under the run's directories that the committed manifest does not list."""
        keep = set(_all_files(self.root, self.base)) if self.base is not None else set()
        stray = [p for schema in TABLES.values() for p in walk_run_files(self.root, schema, self.run) if p not in keep]
        stray += list(runs_dir(self.root).glob(f".{manifest_path(self.root, self.run).name}.*.tmp"))
        if self._remove(stray):
            self._leftovers = False

    def _remove(self, paths: list[Path]) -> bool:
        """Unlink files, then the step and run directories they leave empty; False if any stays."""
        ok = True
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                ok = False
        for directory in sorted({p.parent for p in paths}, reverse=True):
            for empty in (directory, directory.parent):
                if empty.name.startswith(("step=", "run=")):
                    try:
                        empty.rmdir()
                    except OSError:  # not empty, or gone
                        pass
        return ok

    def _makedirs(self, directory: Path) -> list[Path]:
        """Create `directory` and its missing parents; returns the parents that gained an entry."""
        missing = []
        current = directory
        while not current.is_dir():
            missing.append(current)
            current = current.parent
        gained = []
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                continue
            gained.append(path.parent)
        return gained

    def _sync_soon(self, directories: list[Path]) -> None:
        """With fsync, make directories' new entries durable in a background thread, overlapping
        the encoding of the shard; `commit` waits for them before it writes the manifest. Each
        starts after the entries it must cover exist."""
        if not self.writer.fsync:
            return

        def work() -> None:
            try:
                fsync_paths(directories)
            except FileNotFoundError:
                pass  # removed since (a step staged again): the directory made again is synced anew
            except BaseException as exc:  # re-raised by _join_early_syncs
                self._early_errors.append(exc)

        thread = threading.Thread(target=work, name="libra-dir-fsync", daemon=True)
        thread.start()
        self._early_syncs.append(thread)

    def _join_early_syncs(self) -> None:
        for thread in self._early_syncs:
            thread.join()
        self._early_syncs = []
        if self._early_errors:
            raise self._early_errors[0]


def _all_files(root: Path, manifest: RunManifest) -> list[Path]:
    return [p for schema in TABLES.values() for p in manifest.files(root, schema)]


def _is_sorted(column: pa.ChunkedArray) -> bool:
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if len(array) < 2:
        return True
    return bool(pc.all(pc.greater_equal(array.slice(1), array.slice(0, len(array) - 1))).as_py())


def _run_lengths(column: pa.ChunkedArray) -> tuple[list[int], list[int]]:
    """Values and lengths of the runs of equal values in a sorted column."""
    encoded = pc.run_end_encode(column.combine_chunks())
    run_ends = encoded.run_ends.to_pylist()
    values = encoded.values.to_pylist()
    counts = [run_ends[0]] + [b - a for a, b in zip(run_ends, run_ends[1:], strict=False)]
    return values, counts

