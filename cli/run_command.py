"""`libra run`: the trace analysis job on embedded defaults.

Every trace is read and validated before Prefect starts, so a bad trace is one line and nothing is
written (not even the traces before it). The flow's log lines are held while it runs (see
`flows.runtime.held_logs`): an expected error is the one line it makes, not Prefect's log of it.
"""

from __future__ import annotations

import argparse
import json
import os

from libra.config import LibraConfig
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "run",
        parents=[parent],
        help="run the trace analysis job (a flow) on the configured store, Prefect and MLflow",
        description="Run the trace analysis job as a Prefect flow without a server: import every bundled agent trace "
        "into the store (one run per trace), compute the named statistics with DuckDB, and log each trace's "
        "statistics, tables and length plots to MLflow. Idempotent: running it again leaves the same rows. A run "
        "of a trace's name that something else wrote (not an import of a file of that name) is refused and kept.",
    )
    run.add_argument("--traces", nargs="*", metavar="FILE.csv", help="trace files (default: the bundled data/traces/*.csv)")
    run.add_argument("--json", action="store_true", help="print the per-trace summary as JSON")
    run.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.flow_call import run_flow
    from cli.plan_command import read_trace_with_progress
    from cli.streams import json_stdout
    from flows.trace_analysis import bundled_traces, experiment_name, trace_analysis_flow

    with json_stdout(args.json) as out:
        traces = args.traces
        if not traces:
            traces = [str(p) for p in bundled_traces()]
        if not traces:
            raise LibraError("no trace files: pass --traces FILE.csv ... (the bundled data/traces/*.csv are missing)")
        for path in traces:
            read_trace_with_progress(path, quiet=args.json)
        summaries = run_flow(trace_analysis_flow, config, traces=traces)
        if args.json:
            print(json.dumps(summaries), file=out)
            return 0
        import pyarrow as pa

        from cli.format import render_table

        print(render_table(pa.Table.from_pylist(summaries)), file=out)
        print(
            f"store: {config.store.root} (try: libra query --run {summaries[0]['run']} --named tool_statistics)\n"
            f"MLflow: {os.environ['MLFLOW_TRACKING_URI']}, experiment {experiment_name(config)!r} "
            f"(browse: mlflow ui --backend-store-uri {os.environ['MLFLOW_TRACKING_URI']})",
            file=out,
        )
    return 0
