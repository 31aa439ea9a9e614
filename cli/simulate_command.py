"""`libra simulate`: whole-system policies on a simulated cluster, recorded in the store and MLflow."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from libra.config import LibraConfig
from libra.errors import LibraError

MAX_TRAJECTORIES = 5_000_000  # simulated trajectories of a whole run (all held in memory)


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "simulate",
        parents=[parent],
        help="compare Libra with verl/AReaL-style baselines and the oracle on a simulated cluster",
        description="Simulate an agentic RL job step by step on a cluster of GPUs (same workload, same seed for "
        "every policy) and report throughput, step times, idle GPU time and total time, with each policy's ratio "
        "to libra, to the oracle and to the proven bound. Results go to the store (steps, plans, pool_events) and to MLflow (a parent "
        "run with a child run per policy, plus plots).",
    )
    cmd.add_argument("--workload", required=True, help="search-r1, dapo-math, r2e-gym or trace:FILE.csv")
    cmd.add_argument("--cluster", default="6x8:a800", help="NODESxGPUS:HARDWARE (default 6x8:a800)")
    cmd.add_argument("--model", default="qwen3-14b", help="model profile (default qwen3-14b)")
    cmd.add_argument("--steps", type=int, default=200, help="RL steps (default 200)")
    cmd.add_argument("--policies", default="all", help="'all' or a comma-separated list")
    cmd.add_argument("--group-size", type=int, help="samples per prompt (default: the workload's, 16)")
    cmd.add_argument("--prompts-per-step", type=int, help="prompts per step (default: the workload's)")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--run", help="store run name (default: sim-<workload>-<seed>)")
    cmd.add_argument("--no-track", action="store_true", help="skip MLflow")
    cmd.add_argument("--json", action="store_true", help="print the results as JSON")
    cmd.set_defaults(handler=cmd_simulate)


def summarize(runs: dict, gpus: int, workload: str, bound_s: float | None = None) -> dict[str, Any]:
    """Each policy's figures and its ratios to libra, the oracle and (given the bound's total
    seconds for the same steps) the proven bound."""
    out: dict[str, Any] = {"workload": workload, "gpus": gpus, "policies": {}}
    for name, r in runs.items():
        out["policies"][name] = {
            "tokens_per_s": r.tokens_per_s,
            "step_time_mean_s": r.step_time_mean_s,
            "step_time_p99_s": r.step_time_quantile(0.99),
            "idle_gpu_s": r.idle_gpu_s,
            "total_time_s": r.total_time_s,
        }
    for ref in ("libra", "oracle"):
        if ref in runs and runs[ref].tokens_per_s > 0:
            for m in out["policies"].values():
                m[f"vs_{ref}"] = m["tokens_per_s"] / runs[ref].tokens_per_s
    if bound_s and runs:
        out["bound_tokens_per_s"] = next(iter(runs.values())).trained_tokens / bound_s
        for m in out["policies"].values():
            m["vs_bound"] = m["tokens_per_s"] / out["bound_tokens_per_s"]
    return out


def render(summary: dict[str, Any]) -> str:
    lines = [f"{summary['workload']} on {summary['gpus']} GPUs",
             f"{'policy':<22} {'tokens/s':>9} {'step mean':>10} {'step p99':>9} {'idle rollout':>13} "
             f"{'idle train':>11} {'total':>9} {'vs libra':>9} {'vs oracle':>9} {'vs bound':>9}"]
    for name, m in summary["policies"].items():
        vs = [f"{m[key]:.2f}" if key in m else "-" for key in ("vs_libra", "vs_oracle", "vs_bound")]
        lines.append(f"{name:<22} {m['tokens_per_s']:>9.1f} {m['step_time_mean_s']:>9.1f}s {m['step_time_p99_s']:>8.1f}s "
                     f"{m['idle_gpu_s']['rollout']:>12.0f}s {m['idle_gpu_s']['train']:>10.0f}s {m['total_time_s']:>8.0f}s "
                     f"{vs[0]:>9} {vs[1]:>9} {vs[2]:>9}")
    if "bound_tokens_per_s" in summary:
        lines.append(f"{'proven bound':<22} {summary['bound_tokens_per_s']:>9.1f}  (no policy can beat it in this physics)")
    lines.append("(tokens/s: trained tokens per second of simulated time; idle: GPU-seconds)")
    return "\n".join(lines)


def cmd_simulate(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    with json_stdout(args.json) as out:
        summary, wall, run_name = run_simulation(args, config)
        print(json.dumps(summary) if args.json else render(summary) +
              f"\nsimulated in {wall:.1f} s; store run {run_name!r}", file=out)
    return 0


def run_simulation(args: argparse.Namespace, config: LibraConfig) -> tuple[dict[str, Any], float, str]:
    from cli.checks import in_range
    from cli.progress import progress
    from libra.errors import InfeasibleError
    from libra.planner.profiles import model_profile, parse_cluster
    from libra.planner.settings import cost_model, planner_settings, trigger_settings
    from libra.sim.policies import POLICIES
    from libra.sim.runner import simulate
    from libra.sim.workloads import workload_spec
    from storage.writer import check_run_name

    in_range("--steps", args.steps, 1, 100_000)
    in_range("--group-size", args.group_size, 1, 4_096)
    in_range("--prompts-per-step", args.prompts_per_step, 1, 100_000)
    policies = list(POLICIES) if args.policies == "all" else list(dict.fromkeys(
        p.strip() for p in args.policies.split(",") if p.strip()))
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise LibraError(f"unknown policies {', '.join(unknown) or '(none given)'}; policies: all, {', '.join(POLICIES)}")
    cluster, model = parse_cluster(args.cluster), model_profile(args.model)
    spec = workload_spec(args.workload, args.group_size, args.prompts_per_step)
    if not spec.name.startswith("trace:"):
        total = args.steps * spec.group_size * spec.prompts_per_step
        if total > MAX_TRAJECTORIES:
            raise LibraError(f"{args.steps:,} steps of {spec.prompts_per_step:,} prompts x {spec.group_size:,} samples are "
                             f"{total:,} trajectories, more than the {MAX_TRAJECTORIES:,} a simulation may hold; "
                             "use fewer steps, prompts or samples")
    run_name = check_run_name(args.run or f"sim-{args.workload.replace(':', '-').replace('/', '-')}-{args.seed}"[:128])
    cost = cost_model(cluster, model, config.planner)
    started = time.perf_counter()
    with progress("simulating", quiet=args.json) as bar:
        def step_done(policy: str, step: int) -> None:
            bar.update(policies.index(policy) * args.steps + step + 1, len(policies) * args.steps,
                       f"{policy} step {step + 1}/{args.steps}")

        try:
            runs = simulate(spec, cost, args.steps, policies, args.seed, planner_settings(config.planner),
                            trigger_settings(config.planner), progress=step_done)
        except InfeasibleError as exc:
            raise LibraError(f"{model.name} cannot run on {args.cluster} with workload {args.workload}: {exc}; "
                             "use more or larger GPUs, a smaller model or shorter trajectories") from None
    from libra.sim.bound import run_bound
    from libra.sim.workloads import WorkloadGenerator

    generator = WorkloadGenerator(spec, args.seed)
    bound = run_bound(cost, [generator.step(k) for k in range(args.steps)])
    wall = time.perf_counter() - started
    summary = summarize(runs, cluster.gpus, args.workload, bound.total_s)
    summary["simulation_wall_s"] = wall
    from tasks.sim_records import record_store

    record_store(runs, run_name, config.store)
    if not args.no_track:
        from flows.runtime import prepare_runtime

        prepare_runtime(config)
        from tasks.sim_records import record_mlflow

        summary["mlflow_parent_run_id"] = record_mlflow(runs, summary, args, config)
    summary["store_run"] = run_name
    return summary, wall, run_name
