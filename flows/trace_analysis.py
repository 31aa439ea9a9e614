"""The trace-analysis flow: import agent traces, compute their statistics, track them in MLflow.

`libra run` and the `libra-trace-analysis` deployment call it: it exercises the store, DuckDB
queries, Prefect and MLflow end to end on real agent traces.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prefect import flow

from libra.config import LibraConfig
from libra.errors import LibraError
from libra.traces import BUNDLED as TRACE_DIR
from libra.traces import ReadProgress, TraceFile, bundled_traces, read_trace
from tasks.store_tasks import import_trace_task, summarize_run_task
from tasks.tracking_tasks import log_trace_run_task

__all__ = ["TRACE_DIR", "bundled_traces", "check_trace", "experiment_name", "run_name_for", "trace_analysis_flow"]


def check_trace(path: str, progress: ReadProgress | None = None) -> TraceFile:
    """The trace file read whole (`libra.traces.read_trace`), so that a bad one is the caller's error
    before a flow starts; `progress` hears of the bytes read so far and in all."""
    return read_trace(path, progress=progress)


def experiment_name(config: LibraConfig) -> str:
    return config.tracking.experiment("traces")


def run_name_for(path: str | Path) -> str:
    """`data/traces/swe_gemini3_mini_A.csv` -> `swe_gemini3_mini_A`."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).stem)[:128] or "trace"


@flow(name="libra-trace-analysis", log_prints=False)
def trace_analysis_flow(traces: list[str] | None = None, config: LibraConfig | str | None = None,
                        store: str | None = None) -> list[dict[str, Any]]:
    """Import each trace (default: the bundled ones) into its own store run, summarise it and log it
    to MLflow; `config` is a LibraConfig, a YAML file's path or None (the embedded defaults)."""
    from flows.runtime import flow_config

    config = flow_config(config, {"store.root": store})
    traces = traces or [str(p) for p in bundled_traces()]
    if not traces:
        raise LibraError("no trace files: pass traces (the bundled data/traces/*.csv are missing)")
    experiment = experiment_name(config)
    importer = import_trace_task.with_options(retries=config.orchestration.task_retries)
    out = []
    for path in traces:
        run = run_name_for(path)
        summary = importer(path, run, config)
        stats = summarize_run_task(run, config)
        mlflow_run_id = log_trace_run_task(summary, stats, config, experiment)
        out.append(
            {
                "run": run,
                "trajectories": summary.trajectories,
                "turns": summary.turns,
                "steps": summary.steps,
                "total_tokens_p50": stats["total_tokens_p50"],
                "total_tokens_p90": stats["total_tokens_p90"],
                "turns_p50": stats["turns_p50"],
                "tool_error_rate": round(stats["tool_error_rate"] or 0.0, 4),
                "mlflow_run_id": mlflow_run_id,
            }
        )
    return out
