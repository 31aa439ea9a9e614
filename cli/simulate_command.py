"""`libra simulate`: parses its flags and calls the simulation flow (`flows/simulate.py`), which runs
the simulated systems (whole-system variants) on a simulated cluster and records them in the store and MLflow."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.renamed import RenamedFlag
from libra.config import LibraConfig
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "simulate",
        parents=[parent],
        help="compare Libra with verl/AReaL-style baselines and the oracle on a simulated cluster",
        description="Simulate an agentic RL job step by step on a cluster of GPUs (same workload, same seed for "
        "every system) and report throughput, step times, idle GPU time and total time, with each system's ratio "
        "to libra, to the oracle and to the proven bound. Results go to the store (steps, plans, pool_events) and to MLflow (a parent "
        "run with a child run per system, plus plots).",
    )
    cmd.add_argument("--workload", required=True, help="search-r1, dapo-math, r2e-gym or trace:FILE.csv")
    cmd.add_argument("--cluster", default="6x8:a800", help="NODESxGPUS:HARDWARE (default 6x8:a800)")
    cmd.add_argument("--model", default="qwen3-14b", help="model profile (default qwen3-14b)")
    cmd.add_argument("--steps", type=int, default=200, help="RL steps (default 200)")
    cmd.add_argument("--systems", default="all", help="'all' or a comma-separated list of simulated systems")
    cmd.add_argument("--policies", dest="systems", action=RenamedFlag, new="--systems")
    cmd.add_argument("--group-size", type=int, help="samples per prompt (default: the workload's, 16)")
    cmd.add_argument("--prompts-per-step", type=int, help="prompts per step (default: the workload's)")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--rollout-mode", default="sync", choices=("sync", "partial", "async"),
                     help="sync: a step's rollout ends with its last trajectory; partial: the batch closes at its "
                     "last needed group and the rest are suspended and continued later; async: partial, the rollout "
                     "going on until the update beside it is done (default sync)")
    cmd.add_argument("--overprovision", type=float,
                     help="partial/async: groups in flight per group a batch needs (default 1.5)")
    cmd.add_argument("--max-staleness", type=int,
                     help="partial/async: updates a trained token may be behind its trainer; older groups are "
                     "dropped and counted (default 4)")
    cmd.add_argument("--run", help="store run name (default: sim-<workload>-<seed>); one that exists is refused")
    cmd.add_argument("--replace", action="store_true", help="replace the store run of that name whole")
    cmd.add_argument("--no-track", action="store_true", help="skip MLflow")
    cmd.add_argument("--json", action="store_true", help="print the results as JSON")
    cmd.set_defaults(handler=cmd_simulate)


def render(summary: dict[str, Any]) -> str:
    mode = summary.get("rollout_mode", "sync")
    lines = [f"{summary['workload']} on {summary['gpus']} GPUs, {mode} rollouts",
             f"{'policy':<22} {'tokens/s':>9} {'step mean':>10} {'step p99':>9} {'idle rollout':>13} "
             f"{'idle train':>11} {'total':>9} {'off-policy':>10} {'vs libra':>9} {'vs oracle':>9} {'vs bound':>9}"]
    for name, m in summary["policies"].items():
        vs = [f"{m[key]:.2f}" if key in m else "-" for key in ("vs_libra", "vs_oracle", "vs_bound")]
        lines.append(f"{name:<22} {m['tokens_per_s']:>9.1f} {m['step_time_mean_s']:>9.1f}s {m['step_time_p99_s']:>8.1f}s "
                     f"{m['idle_gpu_s']['rollout']:>12.0f}s {m['idle_gpu_s']['train']:>10.0f}s {m['total_time_s']:>8.0f}s "
                     f"{m.get('offpolicy_share', 0.0):>10.0%} {vs[0]:>9} {vs[1]:>9} {vs[2]:>9}")
    if "bound_tokens_per_s" in summary:
        whose = "" if mode == "sync" else f" for the batches {summary.get('bound_of', 'libra')} trained"
        lines.append(f"{'proven bound':<22} {summary['bound_tokens_per_s']:>9.1f}  (no policy can beat it in this "
                     f"physics{whose}; vs bound: each run against the bound of what it trained)")
    lines.append("(tokens/s: trained tokens per second of simulated time; idle: GPU-seconds)")
    return "\n".join(lines)


def cmd_simulate(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.flow_call import run_flow
    from cli.progress import progress
    from cli.streams import json_stdout
    from flows.simulate import check_feasible, simulate_flow, simulation_request
    from libra.checks import as_flag
    from storage.writer import refuse_existing

    if args.rollout_mode == "sync" and (args.overprovision is not None or args.max_staleness is not None):
        raise LibraError("--overprovision and --max-staleness apply to partial and async rollouts; add "
                         "--rollout-mode partial (or async), or leave them out")
    given = {k: v for k, v in (("overprovision", args.overprovision), ("max_staleness", args.max_staleness)) if v is not None}
    request = simulation_request(args.workload, args.cluster, args.model, args.steps, args.systems, args.group_size,
                                 args.prompts_per_step, args.seed, args.run, names=as_flag,
                                 rollout_mode=args.rollout_mode, **given)
    check_feasible(request, config.planner)
    if not args.replace:
        refuse_existing(config.store.root, request.run)
    systems, steps = list(request.systems), request.steps
    with json_stdout(args.json) as out:
        with progress("simulating", quiet=args.json) as bar:
            def step_done(system: str, step: int) -> None:
                bar.update(systems.index(system) * steps + step + 1, len(systems) * steps,
                           f"{system} step {step + 1}/{steps}")

            summary = run_flow(simulate_flow, config, tracking=not args.no_track, workload=request.workload,
                               cluster=request.cluster, model=request.model, steps=steps, systems=systems,
                               group_size=request.group_size, prompts_per_step=request.prompts_per_step,
                               seed=request.seed, run=request.run, track=not args.no_track, progress=step_done,
                               rollout_mode=request.rollout_mode, overprovision=request.overprovision,
                               max_staleness=request.max_staleness, replace=args.replace)
        print(json.dumps(summary) if args.json else render(summary) +
              f"\nsimulated in {summary['simulation_wall_s']:.1f} s; store run {summary['store_run']!r}", file=out)
    return 0
