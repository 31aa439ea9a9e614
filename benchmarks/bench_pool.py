"""Elastic pool benchmark: join latency against snapshot size, and what a join costs the core.

One core rank and one hybrid (one thread each), a `RegressionTask` MLP of growing size with AdamW
(snapshot = weights + two optimizer moments). Each run alternates: the reconciler asks for the
hybrid, keeps it for half a cycle, releases it, and so on. Measured in the same run (medians):

- join latency: join requested -> activated (snapshot copied and written by the leader, loaded by
  the hybrid, logged updates replayed, the entering step);
- the core's step time while a join is in progress (from the request to the step the hybrid
  enters) against its step time when it trains alone with no join pending: the slowdown (goal:
  under 5%);
- the entering step (catch-up transfer, the hybrid's replay, the first all-reduce with the new
  member) on its own, and the slowdown over the whole join with it included.

Each size runs with 64 rows per step (a memory-bound step) and 1,024 (compute-bound, as a trainer's
step is), and the core's step while the hybrid trains is measured against alone: what a join buys.

    python -m benchmarks.bench_pool [--sizes 256 1024 2048] [--batches 64 1024] [--no-save]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.common import save
from libra.pools.pool import ElasticPool
from libra.pools.task import RegressionTask

CYCLE_S = 6.0  # seconds per join/leave cycle (at least 16 steps): the hybrid is wanted for the first half
# the core rank is on CPU 0; the hybrid and the leader's snapshot writer thread share CPU 1
# (on a cluster: the hybrid's own host and a spare core of the trainer's host). The coordinating
# process (the reconciler and the control-plane store) runs beside the core rank on CPU 0 by
# default, as on the trainer's host; `--coordinator-cpu 1` moves it off, as a head-node service.
AFFINITY = {"core-0": (0,), "hybrid-0": (1,), "snapshot-writer": (1,)}


def step_estimate(task: RegressionTask) -> float:
    """Seconds of one single-threaded forward, backward and optimizer step, timed here."""
    torch.set_num_threads(1)
    model, optimizer = task.build()
    inputs, targets = task.batch(0)
    began = time.perf_counter()
    for _ in range(5):
        model.zero_grad(set_to_none=True)
        task.loss_sum(model, inputs, targets).backward()
        optimizer.step()
    return (time.perf_counter() - began) / 5


def measure(hidden: int, batch: int, cycles: int) -> dict:
    task = RegressionTask(dim=256, hidden=hidden, layers=2, global_batch=batch)
    cycle = max(16, 2 * round(CYCLE_S / step_estimate(task) / 2))  # the pool's monitor polls every 50 ms
    steps = cycle * (cycles + 1)
    schedule = {cycle * (c + 1) + (0 if half == 0 else cycle // 2): 1 - half for c in range(cycles) for half in (0, 1)}
    pool = ElasticPool(task, steps=steps, core_ranks=1, hybrids=1, schedule={0: 0, **schedule}, affinity=AFFINITY)
    pool.start(wait_for_hybrids_s=120)
    result = pool.wait(1800)
    events = [e for e in result.events if e.worker_id == "hybrid-0"]
    joins = []  # (requested, snapshot loaded, activated) of each join that completed
    for i, e in enumerate(events):
        if e.event != "join_requested":
            continue
        rest = [f for f in events[i + 1:] if f.from_state != f.to_state]  # transitions, not progress notes
        if rest and rest[0].event == "activated":
            loaded = next(f for f in events[i + 1:] if f.event == "snapshot_loaded")
            joins.append((e, loaded, rest[0]))
    if not joins:
        raise RuntimeError(f"no join completed: {[e.event for e in events]}")
    window = {s for r, _, a in joins for s in range(r.step, a.step - 1)}
    entering = {a.step - 1 for _, _, a in joins}
    seconds = {s["step"]: s["seconds"] for s in result.steps}
    baseline = [seconds[s["step"]] for s in result.steps
                if s["active"] == 1 and s["replicas"] == 1 and s["step"] >= 2 and s["step"] not in window | entering]
    during = [seconds[s] for s in sorted(window)]
    together = [seconds[s["step"]] for s in result.steps if s["active"] == 2 and s["step"] not in entering]
    base = statistics.median(baseline)
    loads = [float(lo.detail.split(" in ")[1].split(" ")[0]) for _, lo, _ in joins]
    return {
        "parameters": task.parameters,
        "cycle_steps": cycle,
        "snapshot_bytes": int(joins[0][1].detail.split(", ")[1].split(" ")[0]),
        "joins": len(joins),
        "join_latency_s": statistics.median(a.time_s - r.time_s for r, _, a in joins),
        "join_steps": statistics.median(a.step - r.step for r, _, a in joins),
        "load_s": statistics.median(loads),
        "core_step_s": base,
        "baseline_steps": len(baseline),
        "during_join_step_s": statistics.median(during) if during else base,
        "steps_during_join": len(during),
        "slowdown": (statistics.median(during) / base - 1) if during else 0.0,
        "entering_step_s": statistics.median(seconds[s] for s in entering),
        # the whole join, the entering step included: extra core time over what the same steps take alone
        "slowdown_with_entering": sum(seconds[s] for s in window | entering) / (base * len(window | entering)) - 1,
        # what the join buys: the core's step while the hybrid trains beside it, against alone
        "with_hybrid_step_s": statistics.median(together),
        "speedup_with_hybrid": base / statistics.median(together),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", type=int, default=[256, 1024, 2048, 4096], help="MLP hidden widths")
    parser.add_argument("--batches", nargs="*", type=int, default=[64, 1024],
                        help="rows per step: 64 makes a memory-bound step, 1024 a compute-bound one")
    parser.add_argument("--cycles", type=int, default=6, help="join/leave cycles per size")
    parser.add_argument("--coordinator-cpu", type=int, default=0, choices=(0, 1),
                        help="CPU of the coordinating process and its store (0: beside the core rank)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {args.coordinator_cpu})
    rows = []
    for batch, hidden in [(b, h) for b in args.batches for h in args.sizes]:
        row = {"hidden": hidden, "batch": batch, **measure(hidden, batch, args.cycles)}
        rows.append(row)
        print(f"batch {batch}, hidden {hidden}: {row['parameters']:,} params, snapshot {row['snapshot_bytes'] / 2**20:.1f} MiB, "
              f"{row['joins']} joins, median {row['join_latency_s']:.2f} s ({row['join_steps']:.0f} steps, load {row['load_s']:.3f} s), core step {row['core_step_s'] * 1000:.1f} ms, "
              f"during join {row['during_join_step_s'] * 1000:.1f} ms ({row['slowdown']:+.1%}), "
              f"entering step {row['entering_step_s'] * 1000:.1f} ms (whole join {row['slowdown_with_entering']:+.1%}), "
              f"with the hybrid training {row['with_hybrid_step_s'] * 1000:.1f} ms ({row['speedup_with_hybrid']:.2f}x)",
              flush=True)
    if not args.no_save:
        save("pool", {"core_ranks": 1, "hybrids": 1, "cycles": args.cycles, "coordinator_cpu": args.coordinator_cpu,
                      "runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
