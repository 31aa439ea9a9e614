"""Store benchmark: ingest of synthetic turn rows and the latency of every named query.

Ingest is reported as a ratio: (bare `pyarrow.parquet.write_table` of the same rows, one file, same
codec and row groups) / (Libra's writer appending them step by step with atomic, fsynced shards).
Goal: at least 0.5. Each named query runs `--repeats` times over the ingested run; goal: median
under 1 s.

    python -m benchmarks.bench_store [--rows 10000000] [--steps 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import median_time, save, timed
from libra.config import StoreConfig
from storage.catalog import Catalog
from storage.ingest import writer_for
from storage.queries import NAMED_QUERIES, run_named
from storage.synthetic import synthetic_turns, trajectories_of

RUN = "bench"
QUERY_CASES = [
    ("length_histogram", {}),
    ("length_histogram", {"last_steps": 10}),
    ("remaining_length_paths", {"last_steps": 10}),
    ("remaining_length_paths", {}),
    ("tool_statistics", {}),
    ("per_step_drift", {}),
    ("run_summary", {}),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="turn rows to ingest (default 10,000,000)")
    parser.add_argument("--steps", type=int, default=100, help="RL steps the rows are spread over (default 100)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each query (default 5)")
    parser.add_argument("--dir", help="scratch directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/out/store.json (smoke runs)")
    args = parser.parse_args(argv)
    if args.rows < args.steps or args.steps < 1:
        parser.error("--rows must be >= --steps >= 1")

    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="libra-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    config = StoreConfig(root=str(scratch / "store"))
    try:
        per_step = args.rows // args.steps
        steps = [synthetic_turns(RUN, s, per_step) for s in range(args.steps)]
        rows = per_step * args.steps
        whole = pa.concat_tables(steps)
        compression = None if config.compression == "none" else config.compression

        bare_s, _ = timed(lambda: pq.write_table(whole, scratch / "bare.parquet", compression=compression,
                                                 row_group_size=config.row_group_rows))
        writer = writer_for(config)
        libra_s, _ = timed(lambda: [writer.write_step("turns", RUN, s, t) for s, t in enumerate(steps)])
        ratio = bare_s / libra_s
        print(f"ingest {rows:,} turn rows in {args.steps} steps: libra {libra_s:.2f} s ({rows / libra_s / 1e6:.2f} M rows/s), "
              f"bare pyarrow {bare_s:.2f} s; ratio bare/libra = {ratio:.2f} (goal >= 0.5)")
        writer.write_run("trajectories", RUN, trajectories_of(whole))

        queries = []
        with Catalog(config.root, RUN, threads=config.duckdb_threads) as catalog:
            for name, params in QUERY_CASES:
                assert name in NAMED_QUERIES
                result_rows = run_named(catalog, name, **params).num_rows  # warm-up, also the row count
                median_s, times = median_time(lambda n=name, p=params: run_named(catalog, n, **p), args.repeats)
                label = name + "".join(f" {k}={v}" for k, v in params.items())
                queries.append({"query": label, "median_s": median_s, "times_s": times, "result_rows": result_rows})
                verdict = "ok" if median_s < 1.0 else "over 1 s"
                print(f"query {label:<40} median {median_s * 1000:8.1f} ms over {args.repeats} runs, "
                      f"{result_rows:,} result rows ({verdict})")
        result = {
            "rows": rows, "steps": args.steps,
            "ingest": {"libra_s": libra_s, "bare_pyarrow_s": bare_s, "ratio": ratio, "goal": ">= 0.5",
                       "compression": config.compression, "fsync": config.fsync},
            "queries": queries, "query_goal": "median < 1 s",
        }
        if not args.no_save:
            print(f"wrote {save('store', result)}")
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
