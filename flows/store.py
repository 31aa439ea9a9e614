"""The store's operations that run outside a flow run: import a per-turn trace file as a run, run a
read-only query (SQL or a named one), list the runs, describe the tables and the named queries.

`libra traces import`, `libra query`, `libra runs` and `libra schema` call these. They are plain
functions, not Prefect flows: each is one call into `storage/` that takes milliseconds to seconds
and starts no Prefect server and no MLflow run (`flows.trace_analysis` imports and tracks traces as
a flow).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from libra.config import StoreConfig
from storage.catalog import Catalog
from storage.ingest import ImportSummary
from storage.queries import NAMED_QUERIES, NamedQuery
from storage.schemas import TABLES, TableSchema


def import_trace(path: str | Path, run: str, store: StoreConfig, prompts_per_step: int, replace: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> ImportSummary:
    """Validate the trace file and write its turns and trajectories as run `run`, whole or not at
    all (`storage.ingest.import_trace`); `progress` hears of the bytes read so far and in all."""
    from storage.ingest import import_trace as ingest

    return ingest(path, run, store, prompts_per_step, replace=replace, progress=progress)


def open_catalog(store: StoreConfig, run: str | None) -> Catalog:
    """The read-only catalog over the run's tables (every run's when `run` is None); a LibraError
    for a run the store does not hold. Use it as a context manager."""
    from storage.catalog import Catalog

    return Catalog(store.root, run, threads=store.duckdb_threads, timeout_s=store.query_timeout_s)


def query(catalog: Catalog, sql: str | None = None, named: str | None = None,
          params: dict[str, int] | None = None) -> pa.Table:
    """One read-only query over the catalog: the SQL, or the named query with its parameters."""
    from storage.queries import run_named

    if named is not None:
        return run_named(catalog, named, **(params or {}))
    return catalog.query(sql)


def named_queries() -> tuple[NamedQuery, ...]:
    """The named queries, with their parameters' defaults and what each answers."""
    return tuple(NAMED_QUERIES.values())


def runs(store: StoreConfig) -> tuple[list[str], list[str], dict[str, str]]:
    """The runs whose data is committed (what queries see), those with none committed yet, and why
    each committed run whose manifest cannot be read is unreadable (queries over it fail)."""
    from storage.catalog import list_runs, uncommitted_runs
    from storage.manifest import ManifestUnreadable, read_manifest

    committed = list_runs(store.root)
    unreadable = {}
    for run in committed:
        try:
            read_manifest(store.root, run)
        except ManifestUnreadable as exc:
            unreadable[run] = str(exc)
    return committed, uncommitted_runs(store.root), unreadable


def require_run(store: StoreConfig, run: str) -> None:
    """A LibraError naming the runs there are when `run` has nothing committed in the store (checked
    before a command starts anything that would create files)."""
    from storage.catalog import list_runs, no_such_run
    from storage.writer import check_run_name

    if check_run_name(run) not in list_runs(store.root):
        raise no_such_run(store.root, run)


def tables() -> dict[str, TableSchema]:
    """The store's tables by name: their columns, with units and meaning."""
    return TABLES
