"""Tasks that record runs in MLflow: config and inputs as params, statistics as metrics, tables and
plots as artifacts."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlflow
import pyarrow as pa
import pyarrow.csv as pacsv
from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.clock import unix_time
from libra.config import LibraConfig
from storage.catalog import Catalog
from storage.ingest import ImportSummary
from storage.plots import length_histogram_png, per_step_drift_png
from storage.queries import run_named


def ensure_experiment(name: str, artifact_root: str) -> str:
    """The experiment's id, creating it with its artifact location under `artifact_root`."""
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    location = (Path(artifact_root).resolve() / name).as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


def log_run(experiment: str, artifact_root: str, name: str, params: dict[str, Any], metrics: dict[str, float], *,
            steps: Iterable[tuple[int, dict[str, float]]] = (), artifacts: Iterable[str | Path] = (),
            texts: dict[str, str] | None = None, parent: str | None = None) -> str:
    """Libra's one way to write a finished MLflow run: params, metrics, metrics by step, files (and
    texts written as files) as artifacts, optionally nested under `parent`; returns the run id."""
    from mlflow.entities import Metric, Param

    client = mlflow.MlflowClient()
    tags = {"mlflow.parentRunId": parent} if parent else {}
    run_id = client.create_run(ensure_experiment(experiment, artifact_root), run_name=name, tags=tags).info.run_id
    now = int(unix_time() * 1000)
    client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                     metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    for step, values in steps:
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, int(step)) for k, v in values.items()])
    for path in artifacts:
        client.log_artifact(run_id, str(path))
    if texts:
        with tempfile.TemporaryDirectory() as tmp:
            for file, text in texts.items():
                (Path(tmp) / file).write_text(text)
                client.log_artifact(run_id, str(Path(tmp) / file))
    client.set_terminated(run_id, "FINISHED")
    return run_id


@task(name="log-trace-run", cache_policy=NO_CACHE)
def log_trace_run_task(summary: ImportSummary, stats: dict[str, Any], config: LibraConfig, experiment: str) -> str:
    """One MLflow run per imported trace; returns its run id."""
    params = {"trace_file": Path(summary.path).name, "store_run": summary.run,
              "prompts_per_step": config.traces.prompts_per_step, "store_root": config.store.root}
    metrics = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}
    with Catalog(config.store.root, summary.run, threads=config.store.duckdb_threads) as catalog, \
            tempfile.TemporaryDirectory() as tmp:
        steps = [(int(row["step"]), {"step_total_tokens_mean": row["total_tokens_mean"],
                                     "step_turns_mean": row["turns_mean"]})
                 for row in run_named(catalog, "per_step_drift").to_pylist()]
        for name in ("tool_statistics", "length_histogram", "per_step_drift"):
            pacsv.write_csv(spreadsheet_safe(run_named(catalog, name)), Path(tmp) / f"{name}.csv")
        length_histogram_png(catalog, Path(tmp) / "length_histogram.png", title=f"{summary.run}: trajectory length")
        per_step_drift_png(catalog, Path(tmp) / "per_step_drift.png", title=f"{summary.run}: length per step")
        return log_run(experiment, config.tracking.artifact_root, summary.run, params, metrics, steps=steps,
                       artifacts=sorted(Path(tmp).iterdir()))


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(table: pa.Table) -> pa.Table:
    """`table` with every text cell a spreadsheet would run as a formula (one that starts with `=`,
    `+`, `-`, `@`, a tab or a carriage return: an imported trace's tool name `=HYPERLINK(...)`)
    written after a `'`, which spreadsheets read as "text follows"."""
    for i, field in enumerate(table.schema):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            cells = [f"'{v}" if isinstance(v, str) and v.startswith(FORMULA_STARTS) else v
                     for v in table.column(i).to_pylist()]
            table = table.set_column(i, field, pa.array(cells, type=field.type))
    return table


def create_run(experiment_id: str, name: str, tags: dict[str, str] | None = None) -> str:
    """A new MLflow run tagged `libra.run` = `name`; returns its id."""
    client = mlflow.MlflowClient()
    return client.create_run(experiment_id, run_name=name, tags={"libra.run": name, **(tags or {})}).info.run_id


def supersede_runs(experiment_id: str, name: str) -> None:
    """Mark every live run tagged `libra.run` = `name` as superseded (a run trained again from the start)."""
    client = mlflow.MlflowClient()
    quoted = name.replace("'", "\\'")
    for run in client.search_runs([experiment_id], filter_string=f"tags.`libra.run` = '{quoted}'"):
        if run.data.tags.get("libra.superseded") == "true":
            continue
        client.set_tag(run.info.run_id, "libra.superseded", "true")
        client.set_terminated(run.info.run_id, "KILLED")


def log_step_once(run_id: str, metrics: dict[str, float], step: int, sentinel: str) -> bool:
    """Log `metrics` at `step` in one batch, unless `sentinel` already has a value at that step (the
    step was logged before a crash): re-running a step never duplicates it. True when logged."""
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    if any(m.step == step for m in client.get_metric_history(run_id, sentinel)):
        return False
    now = int(unix_time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])
    return True
