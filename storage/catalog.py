"""DuckDB catalog: read-only SQL over the committed runs of a store.

A `Catalog` exposes one view per table over one run's (or every run's) shards, and nothing else:

- Views read exactly the files the runs' manifests list (`storage.manifest`), so a run appears
  only once its import or step is committed, and shards that a running, killed or replaced writer
  left are never read. The file list is given to `read_parquet` with the `run=`/`step=` directories
  as typed hive partitions, so a filter on `step` (or `run`) skips whole files. A table with no
  shards is an empty table with the right columns, so every query works on every run. Each step's
  shards must hold the rows its manifest counts (their Parquet footers, read once per catalog): a
  shard missing, unreadable or copied in from elsewhere is refused in one line, never read.
- The connection may only read those files: after the views are defined, DuckDB's external access
  is disabled with the listed shards as its only `allowed_paths`, and the configuration is locked,
  so a query cannot read other files (`read_csv('/etc/passwd')`), write any (`COPY ... TO`),
  attach databases, install or load extensions, or turn any of that back on.
- Only reading statements run: `query` asks DuckDB's parser for the statement's type and refuses
  everything but one SELECT (WITH, FROM-first, VALUES, DESCRIBE, SHOW and SUMMARIZE are SELECTs to
  DuckDB) or an EXPLAIN of one, with a one-line `QueryRefused`: an allow-list, so statement types
  DuckDB adds later are refused too.
- A query may run for `timeout_s` at most: then DuckDB is interrupted and `QueryTimeout` says so.
- Each query reads the runs as last committed: when a commit has changed a manifest since the
  views were defined, the catalog defines them again on a fresh connection first (and retries a
  query whose files a concurrent commit removed mid-query).
"""

from __future__ import annotations

import re
import tempfile
import threading
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from libra.errors import LibraError, first_line
from storage.manifest import (
    RunManifest,
    check_store_root,
    committed_runs,
    manifests_signature,
    read_manifest,
    rewrite_hint,
    step_dir,
    table_dir,
)
from storage.schemas import TABLES, TableSchema
from storage.writer import check_run_name

_EXPLAIN = re.compile(r"^\s*explain\s+(?:\([^()]*\)\s*)?(?:analy[sz]e\s+)?", re.IGNORECASE)
_RETRIES = 3


class QueryRefused(LibraError):
    """A statement that would change state, or more than one statement."""


class QueryTimeout(LibraError):
    """A query that ran past the catalog's time limit (DuckDB was interrupted)."""


def list_runs(root: str | Path) -> list[str]:
    """Runs whose data is committed (a manifest exists), sorted."""
    return committed_runs(root)


def uncommitted_runs(root: str | Path) -> list[str]:
    """Runs that have files but no committed manifest, sorted: an import still running or killed
    before its commit, or a store written before manifests existed. Nothing reads them."""
    committed = set(committed_runs(root))
    found = {d.name.removeprefix("run=") for schema in TABLES.values() if (base := table_dir(root, schema)).is_dir()
             for d in base.glob("run=*") if d.is_dir()}
    return sorted(found - committed)


def no_such_run(root: str | Path, run: str) -> LibraError:
    """The error for a run with nothing committed in the store at `root`, naming the runs there are."""
    known = committed_runs(root)
    hint = f"runs in the store: {', '.join(known)}" if known else "the store is empty; import or run something first"
    return LibraError(f"no run named {run!r} in store {root}; {hint}")


def check_read_only(sql: str) -> None:
    """Refuse `sql` unless it is exactly one SELECT, or an EXPLAIN of one (DuckDB parses it)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise LibraError(f"query failed: {first_line(exc)}") from None
    if not statements:
        raise QueryRefused("query refused: no SQL statement given; give one SELECT (e.g. select count(*) as n from turns) "
                           "or a named query (libra query --list)")
    if len(statements) != 1:
        raise QueryRefused(f"query refused: give exactly one SQL statement, got {len(statements)}")
    statement = statements[0]
    kind = _kind(statement)
    if kind == duckdb.StatementType.EXPLAIN:
        match = _EXPLAIN.match(statement.query)
        try:
            inner = duckdb.extract_statements(statement.query[match.end():]) if match else []
        except duckdb.Error:
            inner = []
        if len(inner) == 1 and _kind(inner[0]) == duckdb.StatementType.SELECT:
            return
        raise QueryRefused("query refused: EXPLAIN is allowed of a SELECT only; the store is read-only here")
    if kind != duckdb.StatementType.SELECT:
        word = re.match(r"\s*([A-Za-z]+)", statement.query)
        label = word.group(1).upper() if word else kind.name if kind is not None else "UNKNOWN"
        raise QueryRefused(
            f"query refused: {label} statements are not allowed; the store is read-only here "
            "(run a SELECT, or EXPLAIN SELECT)"
        )


def _kind(statement: duckdb.Statement) -> duckdb.StatementType | None:
    """The statement's type, or None for a type this DuckDB's Python module cannot name (statements
    newer than its enum, such as UPDATE EXTENSIONS): only the types named as reads are allowed."""
    try:
        return statement.type
    except ValueError:
        return None


class Catalog:
    """Read-only SQL over a store. `run=None` exposes every run (the `run` column tells them apart)."""

    def __init__(self, root: str | Path, run: str | None = None, *, threads: int = 2,
                 timeout_s: float | None = None) -> None:
        self.root = Path(root)
        if any(c in str(self.root.absolute()) for c in "*?["):
            raise LibraError(f"store {root}: its path holds one of *?[, which DuckDB reads as a pattern (another "
                             "store's files could be read for this one's); move or rename the store")
        check_store_root(self.root)
        self.run = run
        self.threads = threads
        self.timeout_s = timeout_s  # a query's time limit (None: none; the project's own queries)
        if run is not None:
            check_run_name(run)
        self._signature: tuple | None = None
        self._shard_rows: dict[tuple[Path, int, int, int], int] = {}  # the shards' footers read so far
        self.con: duckdb.DuckDBPyConnection | None = None
        self._open()

    def _manifests(self) -> list[RunManifest]:
        if self.run is None:
            found = [read_manifest(self.root, r) for r in committed_runs(self.root)]
            return [m for m in found if m is not None]
        manifest = read_manifest(self.root, self.run)
        if manifest is None:
            raise no_such_run(self.root, self.run)
        return [manifest]

    def _open(self) -> None:
        """(Re)define the views on a fresh, locked connection from the manifests as committed now."""
        signature = manifests_signature(self.root, self.run)  # before reading: a later commit shows as a change
        manifests = self._manifests()
        root = self.root.absolute()  # the views keep working if the process changes directory
        files: dict[str, list[Path]] = {name: [] for name in TABLES}
        for m in manifests:
            for name, schema in TABLES.items():
                for step, listed in sorted(m.steps(schema).items()):
                    paths = [step_dir(root, schema, m.run, step) / shard for shard in listed.names()]
                    rows = sum(self._rows(m, name, path) for path in paths)
                    if rows != listed.rows:
                        raise LibraError(f"run {m.run!r}: {name} step {step} has {rows:,} rows in its shards, its "
                                         f"manifest says {listed.rows:,} (files copied or changed inside the store); "
                                         + rewrite_hint(m.run, m.origin))
                    files[name].extend(paths)
        con = duckdb.connect(
            database=":memory:",
            config={
                "threads": self.threads,
                "python_enable_replacements": False,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
        try:
            spill = Path(tempfile.gettempdir()) / f"libra-duckdb-{uuid.uuid4().hex}"
            con.execute("SET temp_directory = $dir", {"dir": str(spill)})  # created on demand, removed on close
            con.execute("SET allowed_paths = $paths", {"paths": [str(p) for paths in files.values() for p in paths]})
            for name, schema in TABLES.items():
                _define_view(con, schema, files[name])
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except BaseException:
            con.close()
            raise
        if self.con is not None:
            self.con.close()
        self.con = con
        self._signature = signature

    def _rows(self, manifest: RunManifest, table: str, path: Path) -> int:
        """The rows of a listed shard, from its Parquet footer (each file read once per catalog: a
        committed shard is never rewritten in place, a replaced one is another file)."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise LibraError(f"run {manifest.run!r}: {table} shard {path} listed by its manifest is missing; "
                             + rewrite_hint(manifest.run, manifest.origin)) from None
        key = (path, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key not in self._shard_rows:
            try:
                self._shard_rows[key] = pq.read_metadata(path).num_rows
            except (OSError, pa.ArrowException) as exc:
                raise LibraError(f"run {manifest.run!r}: {table} shard {path} is not a readable Parquet file "
                                 f"({first_line(exc)}); " + rewrite_hint(manifest.run, manifest.origin)) from None
        return self._shard_rows[key]

    def query(self, sql: str, params: list | dict | None = None) -> pa.Table:
        """Run one reading statement; a refused statement or a SQL mistake is a one-line LibraError."""
        check_read_only(sql)
        for attempt in range(_RETRIES):
            if manifests_signature(self.root, self.run) != self._signature:
                self._open()
            timer = threading.Timer(self.timeout_s, self.con.interrupt) if self.timeout_s else None
            try:
                if timer is not None:
                    timer.start()
                relation = self.con.sql(sql, params=params)
                if relation is None:  # a statement with no result set
                    return pa.table({})
                return relation.to_arrow_table()
            except duckdb.InterruptException:
                raise QueryTimeout(f"query stopped after {self.timeout_s:g} s (store.query_timeout_s): narrow it (a "
                                   "WHERE on step, a LIMIT) or raise the limit") from None
            except (duckdb.IOException, duckdb.PermissionException) as exc:
                # a commit removed files this query was about to read (DuckDB then looks for a
                # directory of that name, which the locked configuration refuses): read the new manifests
                if attempt + 1 < _RETRIES and manifests_signature(self.root, self.run) != self._signature:
                    continue
                raise LibraError(f"query failed: {first_line(exc)}") from None
            except duckdb.Error as exc:
                raise LibraError(f"query failed: {first_line(exc)}") from None
            finally:
                if timer is not None:
                    timer.cancel()
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.con is not None:
            self.con.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _define_view(con: duckdb.DuckDBPyConnection, schema: TableSchema, files: list[Path]) -> None:
    if files:
        listed = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
        con.execute(
            f"CREATE VIEW {schema.name} AS SELECT * FROM read_parquet([{listed}], "
            "hive_partitioning = true, hive_types = {'run': VARCHAR, 'step': BIGINT}"
            f"{', union_by_name = true' if schema.grown else ''})"
        )
    else:  # an empty table with the schema's columns, so that queries of it work on every run
        con.register(f"_empty_{schema.name}", pa.Table.from_batches([], schema=schema.arrow))
        con.execute(f"CREATE TABLE {schema.name} AS SELECT * FROM _empty_{schema.name}")
        con.unregister(f"_empty_{schema.name}")


