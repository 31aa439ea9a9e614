"""Tasks that record runs in MLflow: config and inputs as params, statistics as metrics, tables and
plots as artifacts."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
import pyarrow.csv as pacsv
from prefect import task
from prefect.cache_policies import NO_CACHE

from dashboards.plots import length_histogram_png, per_step_drift_png
from libra.config import LibraConfig
from storage.catalog import Catalog
from storage.ingest import ImportSummary
from storage.queries import run_named


def ensure_experiment(name: str, artifact_root: str) -> str:
    """The experiment's id, creating it with its artifact location under `artifact_root`."""
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    location = (Path(artifact_root).resolve() / name).as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


@task(name="log-trace-run", cache_policy=NO_CACHE)
def log_trace_run_task(summary: ImportSummary, stats: dict[str, Any], config: LibraConfig, experiment: str) -> str:
    """One MLflow run per imported trace; returns its run id."""
    experiment_id = ensure_experiment(experiment, config.tracking.artifact_root)
    with mlflow.start_run(experiment_id=experiment_id, run_name=summary.run) as active:
        mlflow.log_params(
            {
                "trace_file": Path(summary.path).name,
                "store_run": summary.run,
                "prompts_per_step": config.traces.prompts_per_step,
                "store_root": config.store.root,
            }
        )
        mlflow.log_metrics({k: float(v) for k, v in stats.items() if isinstance(v, (int, float))})
        with Catalog(config.store.root, summary.run, threads=config.store.duckdb_threads) as catalog:
            drift = run_named(catalog, "per_step_drift").to_pylist()
            for row in drift:
                mlflow.log_metrics(
                    {"step_total_tokens_mean": row["total_tokens_mean"], "step_turns_mean": row["turns_mean"]},
                    step=int(row["step"]),
                )
            with tempfile.TemporaryDirectory() as tmp:
                for name in ("tool_statistics", "length_histogram", "per_step_drift"):
                    pacsv.write_csv(run_named(catalog, name), Path(tmp) / f"{name}.csv")
                length_histogram_png(catalog, Path(tmp) / "length_histogram.png", title=f"{summary.run}: trajectory length")
                per_step_drift_png(catalog, Path(tmp) / "per_step_drift.png", title=f"{summary.run}: length per step")
                mlflow.log_artifacts(tmp)
        return active.info.run_id


def find_or_create_run(experiment_id: str, name: str, tags: dict[str, str] | None = None) -> str:
    """The id of the live MLflow run tagged `libra.run` = `name` in the experiment (the newest one,
    if a killed process left several), created when there is none."""
    client = mlflow.MlflowClient()
    quoted = name.replace("'", "\\'")
    found = [r for r in client.search_runs([experiment_id], filter_string=f"tags.`libra.run` = '{quoted}'",
                                           order_by=["attributes.start_time DESC"])
             if r.data.tags.get("libra.superseded") != "true"]
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=name, tags={"libra.run": name, **(tags or {})})
    return run.info.run_id


def supersede_runs(experiment_id: str, name: str) -> None:
    """Mark every run tagged `libra.run` = `name` as superseded (a run trained again from the start)."""
    client = mlflow.MlflowClient()
    quoted = name.replace("'", "\\'")
    for run in client.search_runs([experiment_id], filter_string=f"tags.`libra.run` = '{quoted}'"):
        client.set_tag(run.info.run_id, "libra.superseded", "true")
        client.set_terminated(run.info.run_id, "KILLED")


def log_step_once(run_id: str, metrics: dict[str, float], step: int, sentinel: str) -> bool:
    """Log `metrics` at `step` in one batch, unless `sentinel` already has a value at that step (the
    step was logged before a crash): re-running a step never duplicates it. True when logged."""
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    if any(m.step == step for m in client.get_metric_history(run_id, sentinel)):
        return False
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])
    return True
