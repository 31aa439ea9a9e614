"""`libra pool`: parses its flags and calls the pool flow (`flows/pool.py`), which runs the elastic
hybrid pool with real processes, drives it with a schedule of desired hybrid counts (as the planner
would), optionally kills workers, and records every transition."""

from __future__ import annotations

import argparse
import json
from typing import Any

from libra.config import LibraConfig


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "pool",
        parents=[parent],
        help="run the elastic hybrid pool: core ranks train, hybrids join and leave on a schedule",
        description="Train a small MLP with AdamW on core ranks (torch.distributed, gloo) while hybrid workers "
        "join and leave as extra data-parallel replicas, following a schedule of desired hybrid counts. Every "
        "state transition goes to the store's pool_events table and to MLflow; the final parameters are checked "
        "against a core-only run of the same steps (--verify).",
    )
    cmd.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    cmd.add_argument("--schedule", default="10:all,40:0",
                     help="STEP:COUNT,... desired hybrids from each step on; COUNT may be 'all' (default 10:all,40:0)")
    cmd.add_argument("--kill", action="append", default=[], metavar="HYBRID@STEP",
                     help="SIGKILL a hybrid's process once training reaches STEP (repeatable), e.g. hybrid-1@20")
    cmd.add_argument("--core", type=int, help="core ranks (default: pool.core_ranks)")
    cmd.add_argument("--hybrids", type=int, help="hybrid workers (default: pool.hybrids)")
    cmd.add_argument("--provider", choices=["local", "ray"], help="where hybrids run (default: pool.provider)")
    cmd.add_argument("--hidden", type=int, default=256, help="MLP width (default 256)")
    cmd.add_argument("--batch", type=int, default=48, help="global batch (default 48)")
    cmd.add_argument("--pace", type=float, default=0.05, help="minimum seconds per step (default 0.05)")
    cmd.add_argument("--verify", action="store_true", help="also run core-only and compare the final parameters")
    cmd.add_argument("--run", help="store run name (default: pool-<time>)")
    cmd.add_argument("--no-track", action="store_true", help="skip MLflow")
    cmd.add_argument("--json", action="store_true", help="print the result as JSON")
    cmd.set_defaults(handler=cmd_pool)


def cmd_pool(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.flow_call import run_flow
    from cli.streams import json_stdout
    from flows.pool import pool_flow, pool_request
    from libra.checks import as_flag
    from storage.writer import ANOTHER, refuse_existing

    request = pool_request(args.steps, args.schedule, args.kill, args.core, args.hybrids, args.provider, args.hidden,
                           args.batch, args.pace, args.run, config.pool, names=as_flag)
    refuse_existing(config.store.root, request.run, ANOTHER)  # before the pool starts
    with json_stdout(args.json) as out:
        summary = run_flow(pool_flow, config, tracking=not args.no_track, steps=request.steps, schedule=args.schedule,
                           kill=args.kill, core=request.core, hybrids=request.hybrids, provider=request.provider,
                           hidden=request.hidden, batch=request.batch, pace=request.pace, verify=args.verify,
                           run=request.run, track=not args.no_track)
        events = summary.pop("transitions")
        print(json.dumps(summary) if args.json else render(summary, events), file=out)
    return 0


def render(summary: dict[str, Any], events: list) -> str:
    lines = [f"{'step':>5} {'time':>8}  {'worker':<10} {'transition':<22} {'event':<17} detail"]
    for e in events:
        lines.append(f"{e.step:>5} {e.time_s:>7.2f}s  {e.worker_id:<10} {e.from_state + ' -> ' + e.to_state:<22} "
                     f"{e.event:<17} {e.detail}")
    lines.append(f"{summary['steps']} steps in {summary['wall_s']:.1f} s (mean {summary['step_time_mean_s'] * 1000:.0f} ms); "
                 f"active replicas per step: min {summary['active_min']}, max {summary['active_max']}; "
                 f"{summary['retried_steps']} step(s) redone by the core after a failure")
    if "max_abs_diff_vs_core_only" in summary:
        lines.append(f"final parameters vs a core-only run: max |diff| {summary['max_abs_diff_vs_core_only']:.2e}")
    lines.append(f"store run {summary['run']!r}: libra query --run {summary['run']} \"select * from pool_events\"")
    return "\n".join(lines)
