"""`libra eval-router`: parses its flags and calls the router evaluation flow (`flows/routing.py`), which
replays a per-turn trace through every router and scores their decisions."""

from __future__ import annotations

import argparse
import json

from cli.renamed import RenamedFlag
from libra.config import LibraConfig


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "eval-router",
        parents=[parent],
        help="score C-MLFQ, Libra's router and baselines on a per-turn trace",
        description="Replay a per-turn trace in RL order (a step takes a batch of prompts with all their samples; "
        "a step's trajectories become visible to the routers when it ends), warm up on the first 30% of steps, "
        "and report per router: accuracy, balanced accuracy, rank correlation of its remaining-length estimate, "
        "migrated-token ratio, decisions and decision latency.",
    )
    cmd.add_argument("--trace", required=True, metavar="FILE.csv", help="per-turn trace file")
    cmd.add_argument("--buckets", default="auto", help="'auto' (warm-up p50/p90 of lengths) or bounds B1,B2,... in tokens")
    cmd.add_argument("--order", default="group", help="'group' (each prompt once) or 'epochs:N' (revisit prompts N times)")
    cmd.add_argument("--routers", help="comma-separated routers (default: all)")
    cmd.add_argument("--policies", dest="routers", action=RenamedFlag, new="--routers")
    cmd.add_argument("--prompts-per-step", type=int, metavar="N", help="prompts per RL step (default: traces.prompts_per_step)")
    cmd.add_argument("--json", action="store_true", help='print {"buckets": [...], "policies": {name: {metric: value}}}')
    cmd.set_defaults(handler=cmd_eval_router)


def cmd_eval_router(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.flow_call import run_flow
    from cli.plan_command import read_trace_with_progress
    from cli.progress import progress
    from cli.streams import json_stdout
    from flows.routing import eval_router_flow, router_request
    from libra.checks import as_flag

    with json_stdout(args.json) as out:
        read_trace_with_progress(args.trace, quiet=args.json)
        request = router_request(args.trace, config, args.buckets, args.order, args.routers, args.prompts_per_step,
                                 names=as_flag)
        names = list(request.routers)
        with progress("replaying", quiet=args.json) as bar:
            def step_done(name: str, done: int, steps: int) -> None:
                bar.update(names.index(name) * steps + done, len(names) * steps, f"{name} step {done}/{steps}")

            report = run_flow(eval_router_flow, config, tracking=False, trace=request.trace, buckets=args.buckets,
                              order=request.order, routers=names, prompts_per_step=request.prompts_per_step,
                              progress=step_done)
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
