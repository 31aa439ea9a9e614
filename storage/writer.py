"""Append-only Parquet writer, partitioned by table version, run and step.

Layout: `<root>/<table>/v<version>/run=<run>/step=<step:08d>/part-<shard:05d>.parquet`.

Guarantees:
- A shard appears atomically: it is written to a hidden temporary name in the same directory,
  (optionally) fsynced, then renamed over its final name. A writer killed at any point leaves
  either the previous shard or the new one visible, never a partial file; readers only match
  `part-*.parquet`, so stray temporaries are invisible and are removed when the step is rewritten.
- Shard names are deterministic, so writing the same step again replaces its rows instead of
  adding to them: re-running an import or a step never duplicates rows.
- `write_step` replaces a step as a whole: after its shards are in place, shards of an earlier,
  larger write of that step are removed.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from libra.errors import LibraError
from storage.schemas import TableSchema, table_schema

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHARD_GLOB = "part-*.parquet"


def check_run_name(run: str) -> str:
    if not RUN_NAME.match(run):
        raise LibraError(
            f"run name {run!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return run


def table_dir(root: str | Path, schema: TableSchema) -> Path:
    return Path(root) / schema.name / f"v{schema.version}"


def step_dir(root: str | Path, schema: TableSchema, run: str, step: int) -> Path:
    return table_dir(root, schema) / f"run={run}" / f"step={step:08d}"


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
    ) -> None:
        self.root = Path(root)
        self.compression = None if compression == "none" else compression
        self.row_group_rows = row_group_rows
        self.fsync = fsync

    def write_step(
        self, table: str, run: str, step: int, data: pa.Table | pa.RecordBatch, shard_rows: int | None = None
    ) -> list[Path]:
        """Replace step `step` of `run` in `table` with `data`, split into shards of `shard_rows`."""
        schema = table_schema(table)
        check_run_name(run)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        conformed = conform(schema, data, run, step)
        directory = step_dir(self.root, schema, run, step)
        directory.mkdir(parents=True, exist_ok=True)
        size = shard_rows or max(conformed.num_rows, 1)
        paths = []
        for shard, offset in enumerate(range(0, max(conformed.num_rows, 1), size)):
            paths.append(self._write_shard(directory, shard, conformed.slice(offset, size)))
        keep = {p.name for p in paths}
        for stale in directory.iterdir():
            if stale.name not in keep and (stale.name.startswith("part-") or stale.name.endswith(".tmp")):
                stale.unlink(missing_ok=True)
        return paths

    def write_run(self, table: str, run: str, data: pa.Table, shard_rows: int | None = None) -> list[Path]:
        """Write rows of many steps (the `step` column decides), replacing each step they touch."""
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
            paths += self.write_step(table, run, int(step), data.slice(offset, count), shard_rows)
            offset += count
        return paths

    def _write_shard(self, directory: Path, shard: int, table: pa.Table) -> Path:
        final = directory / f"part-{shard:05d}.parquet"
        tmp = directory / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            pq.write_table(table, tmp, compression=self.compression, row_group_size=self.row_group_rows)
            if self.fsync:
                _fsync_path(tmp)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.fsync:
            _fsync_path(directory)
        return final


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
