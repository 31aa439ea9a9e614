"""`libra run`: the main job on embedded defaults."""

from __future__ import annotations

import argparse
import json
import os

from libra.config import LibraConfig


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "run",
        parents=[parent],
        help="run the main job (trace analysis flow) on the configured store, Prefect and MLflow",
        description="Run the main job as a Prefect flow without a server: import every bundled agent trace "
        "into the store (one run per trace), compute the named statistics with DuckDB, and log each trace's "
        "statistics, tables and length plots to MLflow. Idempotent: running it again leaves the same rows.",
    )
    run.add_argument("--traces", nargs="*", metavar="FILE.csv", help="trace files (default: the bundled data/traces/*.csv)")
    run.add_argument("--json", action="store_true", help="print the per-trace summary as JSON")
    run.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.runtime import prepare_runtime

    prepare_runtime(config)
    from flows.trace_analysis import bundled_traces, experiment_name, trace_analysis_flow

    traces = args.traces or [str(p) for p in bundled_traces()]
    summaries = trace_analysis_flow(traces=traces, config_json=config.model_dump_json())
    if args.json:
        print(json.dumps(summaries))
    else:
        import pyarrow as pa

        from cli.format import render_table

        print(render_table(pa.Table.from_pylist(summaries)))
        print(
            f"store: {config.store.root} (try: libra query --run {summaries[0]['run']} --named tool_statistics)\n"
            f"MLflow: {os.environ['MLFLOW_TRACKING_URI']}, experiment {experiment_name(config)!r} "
            f"(browse: mlflow ui --backend-store-uri {os.environ['MLFLOW_TRACKING_URI']})"
        )
    return 0
