"""Tasks over the trajectory store."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.config import LibraConfig
from storage.catalog import Catalog
from storage.ingest import ImportSummary, import_trace
from storage.queries import run_named, to_jsonable


@task(name="import-trace", cache_policy=NO_CACHE, retries=0)
def import_trace_task(path: str, run: str, config: LibraConfig) -> ImportSummary:
    """Validate a trace file and write it into the store as `run`, all or nothing. An earlier import
    of a file of the same name is replaced whole, so re-running the flow (or retrying the task)
    refreshes its runs; a run of that name that something else wrote (a simulation, a pool's, an
    import of another file) is refused and left as it was."""
    return import_trace(path, run, config.store, config.traces.prompts_per_step, refresh=True)


@task(name="summarize-run", cache_policy=NO_CACHE)
def summarize_run_task(run: str, config: LibraConfig) -> dict[str, Any]:
    """The run's summary statistics (the `run_summary` named query) as a flat dict."""
    with Catalog(config.store.root, run, threads=config.store.duckdb_threads) as catalog:
        row = run_named(catalog, "run_summary").to_pylist()[0]
    return {k: to_jsonable(v) for k, v in row.items()}
