"""Tasks that record runs in MLflow: config and inputs as params, statistics as metrics, tables and
plots as artifacts."""

from __future__ import annotations

import tempfile
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
