"""`libra eval-router`: replay a per-turn trace through every router and score their decisions."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from typing import Any

from libra.config import LibraConfig
from libra.errors import LibraError

MAX_DECISIONS = 20_000_000  # routing decisions one router's replay may record (about 100 bytes each)


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "eval-router",
        parents=[parent],
        help="score C-MLFQ, Libra's router and baselines on a per-turn trace",
        description="Replay a per-turn trace in RL order (a step takes a batch of prompts with all their samples; "
        "a step's trajectories become visible to the routers when it ends), warm up on the first 30%% of steps, "
        "and report per router: accuracy, balanced accuracy, rank correlation of its remaining-length estimate, "
        "migrated-token ratio, decisions and decision latency.",
    )
    cmd.add_argument("--trace", required=True, metavar="FILE.csv", help="per-turn trace file")
    cmd.add_argument("--buckets", default="auto", help="'auto' (warm-up p50/p90 of lengths) or bounds B1,B2,... in tokens")
    cmd.add_argument("--order", default="group", help="'group' (each prompt once) or 'epochs:N' (revisit prompts N times)")
    cmd.add_argument("--policies", help="comma-separated routers (default: all)")
    cmd.add_argument("--prompts-per-step", type=int, metavar="N", help="prompts per RL step (default: traces.prompts_per_step)")
    cmd.add_argument("--json", action="store_true", help='print {"buckets": [...], "policies": {name: {metric: value}}}')
    cmd.set_defaults(handler=cmd_eval_router)


def parse_buckets(text: str) -> list[int] | None:
    from libra.checks import token_bounds

    return None if text == "auto" else token_bounds("--buckets", text)


def evaluate_trace(path: str, config: LibraConfig, buckets: str = "auto", order: str = "group",
                   policies: list[str] | None = None, prompts_per_step: int | None = None,
                   quiet: bool = True) -> dict[str, Any]:
    """Replay the trace through the routers; progress on a terminal unless `quiet`."""
    from cli.plan_command import read_trace_with_progress
    from cli.progress import progress
    from libra.checks import in_range
    from libra.scheduler.replay import POLICIES, parse_order, replay

    in_range("--prompts-per-step", prompts_per_step, 1, 100_000)  # traces.prompts_per_step's range
    per_step = prompts_per_step if prompts_per_step is not None else config.traces.prompts_per_step
    epochs = parse_order(order)
    bounds = parse_buckets(buckets)
    names = policies or list(POLICIES)
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise LibraError(f"unknown router(s) {', '.join(unknown)}; routers: {', '.join(POLICIES)}")
    trace = read_trace_with_progress(path, quiet)
    if epochs * trace.rows > MAX_DECISIONS:
        raise LibraError(f"--order {order}: {epochs:,} epochs of {trace.rows:,} turns make up to {epochs * trace.rows:,} "
                         f"routing decisions per router, more than the {MAX_DECISIONS:,} a replay may hold; "
                         "use fewer epochs")
    with progress("replaying", quiet=quiet) as bar:
        def step_done(name: str, done: int, steps: int) -> None:
            bar.update(names.index(name) * steps + done, len(names) * steps, f"{name} step {done}/{steps}")

        result = replay(trace.trajectories, prompts_per_step=per_step, order=order, bounds=bounds,
                        policies=names, settings=config.scheduler, timer=time.perf_counter_ns, progress=step_done)

    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and math.isnan(value) else value

    return {
        "trace": path,
        "order": order,
        "buckets": list(result.buckets),
        "steps": result.steps,
        "warmup_steps": result.warmup_steps,
        "policies": {name: {k: clean(v) for k, v in asdict(r).items()} for name, r in result.policies.items()},
        "bound": None if result.bound is None else {k: clean(v) for k, v in asdict(result.bound).items()},
    }


def cmd_eval_router(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies is not None else None
    if policies == []:
        raise LibraError(f"--policies {args.policies!r}: name at least one router, or leave --policies out for all")
    with json_stdout(args.json) as out:
        report = evaluate_trace(args.trace, config, args.buckets, args.order, policies, args.prompts_per_step,
                                quiet=args.json)
        if args.json:
            print(json.dumps(report), file=out)
            return 0
    print(f"{report['trace']}: {report['steps']} steps ({report['warmup_steps']} warm-up), order {report['order']}, "
          f"bucket bounds {report['buckets']} tokens")
    print(f"{'router':<27} {'accuracy':>8} {'balanced':>8} {'rank':>6} {'migrated':>8} {'decisions':>9} {'p50 us':>7} {'p99 us':>7}")
    for name, m in report["policies"].items():
        rank = "-" if m["rank_correlation"] is None else f"{m['rank_correlation']:.3f}"
        print(f"{name:<27} {m['accuracy']:>8.3f} {m['balanced_accuracy']:>8.3f} {rank:>6} "
              f"{m['migrated_token_ratio']:>8.1%} {m['decisions']:>9} {m['p50_us']:>7.1f} {m['p99_us']:>7.1f}")
    bound = report["bound"]
    if bound is not None:
        print(f"clairvoyant bound within a {bound['budget']:.1%} migration budget: balanced accuracy <= "
              f"{bound['balanced_accuracy']:.3f} (a schedule reaching {bound['achieved']:.3f} migrates "
              f"{bound['migrated_token_ratio']:.1%})")
    return 0
