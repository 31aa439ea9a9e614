"""`libra pool`: run the elastic hybrid pool with real processes, drive it with a schedule of desired
hybrid counts (as the planner would), optionally kill workers, and record every transition."""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from libra.config import LibraConfig
from libra.errors import LibraError


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


def parse_schedule(text: str, hybrids: int) -> dict[int, int]:
    schedule = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        step, _, count = part.partition(":")
        try:
            value = hybrids if count == "all" else int(count)
            at = int(step)
        except ValueError:
            raise LibraError(f"--schedule entry {part!r} is not STEP:COUNT (e.g. 10:2,40:0)") from None
        if at < 0 or not 0 <= value <= hybrids:
            raise LibraError(f"--schedule entry {part!r}: need STEP >= 0 and 0 <= COUNT <= {hybrids} hybrids")
        schedule[at] = value
    return schedule


def parse_kills(items: list[str], hybrids: int) -> list[tuple[str, int]]:
    kills = []
    names = {f"hybrid-{i}" for i in range(hybrids)}
    for item in items:
        worker, _, step = item.partition("@")
        if worker not in names or not step.isdigit():
            raise LibraError(f"--kill {item!r}: expected HYBRID@STEP with HYBRID one of {', '.join(sorted(names))}")
        kills.append((worker, int(step)))
    return kills


def cmd_pool(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    with json_stdout(args.json) as out:
        summary, result = run_pool(args, config)
        print(json.dumps(summary) if args.json else render(summary, result), file=out)
    return 0


def run_pool(args: argparse.Namespace, config: LibraConfig) -> tuple[dict[str, Any], Any]:
    from cli.checks import in_range
    from libra.pools.pool import ElasticPool, events_table
    from libra.pools.task import RegressionTask
    from storage.ingest import writer_for
    from storage.writer import check_run_name

    settings = config.pool
    for flag, value, high in (("--steps", args.steps, 1_000_000), ("--core", args.core, 4_096),
                              ("--hybrids", args.hybrids, 4_096), ("--hidden", args.hidden, 65_536),
                              ("--batch", args.batch, 1_000_000), ("--pace", args.pace, 60.0)):
        in_range(flag, value, -math.inf, high)  # the least values are checked below, together
    core = args.core if args.core is not None else settings.core_ranks
    hybrids = args.hybrids if args.hybrids is not None else settings.hybrids
    if args.steps < 1 or core < 1 or hybrids < 0 or args.hidden < 1 or args.batch < core + hybrids or args.pace < 0:
        raise LibraError(f"need --steps >= 1, --core >= 1, --hybrids >= 0, --hidden >= 1, --pace >= 0 and --batch "
                         f">= core + hybrids ({core + hybrids}); got {args.steps}, {core}, {hybrids}, {args.hidden}, "
                         f"{args.pace}, {args.batch}")
    schedule = parse_schedule(args.schedule, hybrids)
    kills = parse_kills(args.kill, hybrids)
    run = check_run_name(args.run or time.strftime("pool-%Y%m%d-%H%M%S"))
    task = RegressionTask(hidden=args.hidden, global_batch=args.batch)
    provider_name = args.provider or settings.provider
    provider = None
    if provider_name == "ray":
        import ray

        from libra.pools.providers import RayActors

        ray.init(num_cpus=max(2, hybrids), include_dashboard=False, log_to_driver=False, configure_logging=False)
        provider = RayActors()
    out_dir = f"{settings.snapshot_dir}/{run}"
    try:
        pool = ElasticPool(task, steps=args.steps, core_ranks=core, hybrids=hybrids, out_dir=out_dir,
                           provider=provider, group_timeout_s=settings.group_timeout_s,
                           join_timeout_s=settings.join_timeout_s, max_catchup_steps=settings.max_catchup_steps,
                           enter_gap=settings.enter_gap, min_step_s=args.pace, poll_s=settings.poll_s,
                           schedule=schedule, device=settings.device)
        started = time.perf_counter()
        pool.start(wait_for_hybrids_s=120)
        for worker, step in sorted(kills, key=lambda k: k[1]):
            while pool.progress < step and pool.running:
                time.sleep(settings.poll_s)
            pool.kill(worker)
        result = pool.wait(max(600.0, args.steps * (args.pace + 5)))
        wall = time.perf_counter() - started
    finally:
        if provider_name == "ray":
            import ray

            ray.shutdown()
    writer_for(config.store).write_run("pool_events", run, events_table(result.events))
    summary = summarize(result, run, wall, core, hybrids)
    if args.verify:
        reference = ElasticPool(task, steps=args.steps, core_ranks=core, hybrids=0, device=settings.device).start().wait()
        summary["max_abs_diff_vs_core_only"] = max(
            (result.model[k] - reference.model[k]).abs().max().item() for k in result.model)
    if not args.no_track:
        summary["mlflow_run_id"] = track(summary, result, args, config, schedule)
    return summary, result


def summarize(result: Any, run: str, wall: float, core: int, hybrids: int) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for e in result.events:
        counts[e.event] = counts.get(e.event, 0) + 1
    steps = result.steps
    return {"run": run, "core_ranks": core, "hybrids": hybrids, "steps": len(steps), "wall_s": wall,
            "step_time_mean_s": sum(s["seconds"] for s in steps) / len(steps),
            "replica_steps": sum(s["active"] for s in steps), "retried_steps": sum(s["retried"] for s in steps),
            "events": counts}


def render(summary: dict[str, Any], result: Any) -> str:
    lines = [f"{'step':>5} {'time':>8}  {'worker':<10} {'transition':<22} {'event':<17} detail"]
    for e in result.events:
        lines.append(f"{e.step:>5} {e.time_s:>7.2f}s  {e.worker_id:<10} {e.from_state + ' -> ' + e.to_state:<22} "
                     f"{e.event:<17} {e.detail}")
    active = [s["active"] for s in result.steps]
    lines.append(f"{summary['steps']} steps in {summary['wall_s']:.1f} s (mean {summary['step_time_mean_s'] * 1000:.0f} ms); "
                 f"active replicas per step: min {min(active)}, max {max(active)}; "
                 f"{summary['retried_steps']} step(s) redone by the core after a failure")
    if "max_abs_diff_vs_core_only" in summary:
        lines.append(f"final parameters vs a core-only run: max |diff| {summary['max_abs_diff_vs_core_only']:.2e}")
    lines.append(f"store run {summary['run']!r}: libra query --run {summary['run']} \"select * from pool_events\"")
    return "\n".join(lines)


def track(summary: dict[str, Any], result: Any, args: argparse.Namespace, config: LibraConfig,
          schedule: dict[int, int]) -> str:
    from flows.runtime import prepare_runtime

    prepare_runtime(config)
    from dataclasses import asdict

    from tasks.tracking_tasks import log_run

    params = {"core_ranks": summary["core_ranks"], "hybrids": summary["hybrids"], "steps": args.steps,
              "schedule": json.dumps(schedule), "kills": ",".join(args.kill), "hidden": args.hidden, "batch": args.batch}
    metrics = {"wall_s": summary["wall_s"], "step_time_mean_s": summary["step_time_mean_s"],
               "retried_steps": summary["retried_steps"], "replica_steps": summary["replica_steps"]}
    steps = [(s["step"], {"step_s": s["seconds"], "active_replicas": s["active"]}) for s in result.steps]
    return log_run(f"{config.tracking.experiment_prefix}-pool", config.tracking.artifact_root, summary["run"], params,
                   metrics, steps=steps, texts={"pool_events.json": json.dumps([asdict(e) for e in result.events], indent=1)})
