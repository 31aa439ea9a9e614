"""`libra plan`: the resource plan for a cluster, a model and the lengths of a run or a trace."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace
from typing import Any

from libra.clock import WallClock
from libra.config import LibraConfig
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    plan = sub.add_parser(
        "plan",
        parents=[parent],
        help="plan the GPU split, training parallelism and rollout layout",
        description="Plan how many GPUs train, roll out and float (hybrid), the training parallelism "
        "(TP/PP/DP/EP, micro-batch) and the heterogeneous TP layout of rollout instances, minimising the "
        "iteration time for the trajectory lengths of a run in the store or of a per-turn trace file.",
    )
    plan.add_argument("--cluster", required=True, metavar="NxG:HW", help="e.g. 6x8:a800 (hardware: a800, a100, h100, h200, cpu)")
    plan.add_argument("--model", required=True, help="model profile, e.g. qwen3-14b (see `libra plan --list-models`)")
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="take lengths from this run in the store")
    source.add_argument("--trace", metavar="FILE.csv", help="take lengths from a per-turn trace file")
    plan.add_argument("--mode", choices=["one_step_off", "sync", "colocated"], help="pipelining (default: planner.mode)")
    plan.add_argument("--batch", type=int, metavar="N", help="trajectories per step (default: planner.batch_trajectories)")
    plan.add_argument("--calibrate", action="store_true", help="fit cost-model coefficients to the run's timings first")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(handler=cmd_plan)


def read_trace_with_progress(path: str, quiet: bool):
    """`libra.traces.read_trace` with a progress bar on a terminal (in MiB read)."""
    from cli.progress import progress
    from libra.traces import read_trace

    with progress(f"reading {path}", quiet=quiet) as bar:
        return read_trace(path, progress=lambda done, total: bar.update(done / 2**20, total / 2**20, "MiB"))


def _lengths(args: argparse.Namespace, config: LibraConfig) -> tuple[list, str]:
    from libra.planner.workload import lengths_from_rows, lengths_from_trajectories

    if args.trace:
        trace = read_trace_with_progress(args.trace, quiet=args.json)
        return lengths_from_trajectories(trace.trajectories), f"trace {args.trace}"
    from storage.catalog import Catalog
    from storage.queries import run_named

    with Catalog(config.store.root, args.run, threads=config.store.duckdb_threads) as catalog:
        rows = run_named(catalog, "trajectory_lengths", last_steps=config.planner.recent_steps).to_pylist()
    return lengths_from_rows(rows), f"run {args.run}"


def _timing_samples(args: argparse.Namespace, config: LibraConfig) -> list:
    from libra.planner.calibrate import samples_from_rows
    from storage.catalog import Catalog
    from storage.queries import run_named

    with Catalog(config.store.root, args.run, threads=config.store.duckdb_threads) as catalog:
        rows = run_named(catalog, "timing_samples", last_steps=config.planner.recent_steps).to_pylist()
    return samples_from_rows(rows)


def cmd_plan(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    with json_stdout(args.json) as out:
        payload = make_plan(args, config)
        print(json.dumps(payload) if args.json else render_plan(payload), file=out)
    return 0


def make_plan(args: argparse.Namespace, config: LibraConfig) -> dict[str, Any]:
    from cli.checks import in_range
    from libra.planner.planner import Planner
    from libra.planner.profiles import model_profile, parse_cluster
    from libra.planner.settings import cost_model, planner_settings
    from libra.planner.workload import build_workload

    if args.calibrate and not args.run:
        raise LibraError("--calibrate needs --run (timings are read from the run's store)")
    cluster, model = parse_cluster(args.cluster), model_profile(args.model)
    settings = planner_settings(config.planner)
    if args.mode:
        settings = replace(settings, mode=args.mode)
    in_range("--batch", args.batch, 1, 1_000_000)  # planner.batch_trajectories' range
    batch = args.batch if args.batch is not None else config.planner.batch_trajectories
    lengths, source = _lengths(args, config)
    workload = build_workload(lengths, batch)
    if workload.tokens <= 0:
        raise LibraError(f"{source}: every trajectory has 0 tokens; there is nothing to plan for")
    cost = cost_model(cluster, model, config.planner)
    calibration = None
    if args.calibrate:
        from libra.planner.calibrate import fit

        samples = _timing_samples(args, config)
        if not samples:
            raise LibraError(f"run {args.run!r} has no timing samples to calibrate from (table timings is empty)")
        calibration = fit(cost, samples)
        cost = replace(cost, coefficients=calibration.coefficients)
    plan = Planner(cost, workload, settings).plan(WallClock())
    _check_feasible(plan, cost, workload)
    payload = plan_json(plan, cluster, model, workload, source)
    if calibration is not None:
        payload["calibration"] = {"coefficients": asdict(calibration.coefficients), "samples": calibration.samples,
                                  "mean_abs_rel_error": calibration.mean_abs_rel_error,
                                  "set_aside": calibration.set_aside}
    return payload


def _check_feasible(plan: Any, cost: Any, workload: Any) -> None:
    if plan.train is None or math.isinf(plan.t_train_s):
        raise LibraError(
            f"no training configuration of {cost.model.name} fits {cost.hw.name} GPUs for sequences of "
            f"{workload.max_tokens:,} tokens; use larger GPUs, more of them, or a shorter maximum length"
        )
    if math.isinf(plan.t_rollout_s):
        raise LibraError(
            f"no rollout instance of {cost.model.name} on {cost.hw.name} can hold a trajectory of "
            f"{workload.max_tokens:,} tokens (KV cache or max context); cap the trajectory length"
        )


def plan_json(plan: Any, cluster: Any, model: Any, workload: Any, source: str) -> dict[str, Any]:
    config = plan.train.config
    stats = plan.stats
    return {
        "cluster": str(cluster),
        "gpus": cluster.gpus,
        "model": model.name,
        "mode": plan.mode,
        "source": source,
        "trajectories_per_step": round(workload.trajectories, 3),
        "length_buckets": [{"max_tokens": b.max_tokens, "trajectories": round(b.count, 3)} for b in workload.buckets],
        "train": {"gpus": plan.train_gpus, "tp": config.tp, "pp": config.pp, "dp": config.dp, "ep": config.ep,
                  "micro_batch": config.micro_batch, "memory_gb": round(plan.train.memory_bytes / 1e9, 2)},
        "rollout": {"gpus": plan.rollout_gpus,
                    "instances": [{"tp": g.tp, "count": g.count, "max_tokens": g.max_tokens,
                                   "seconds": round(g.seconds, 3)} for g in plan.rollout.groups]},
        "hybrid": {"gpus": plan.hybrid_gpus, "rollout_share": plan.hybrid_rollout_share},
        "t_train_s": round(plan.t_train_s, 3),
        "t_rollout_s": round(plan.t_rollout_s, 3),
        "t_sync_s": round(plan.t_sync_s, 3),
        "t_iter_s": round(plan.t_iter_s, 3),
        "search_ms": round(plan.search_ms, 2),
        "search": {"splits": stats.splits, "train_enumerated": stats.train_enumerated,
                   "train_memory_pruned": stats.train_memory_pruned, "train_costed": stats.train_costed,
                   "rollout_solves": stats.rollout_solves, "rollout_dp_evaluations": stats.rollout_dp_evaluations},
    }


def render_plan(p: dict[str, Any]) -> str:
    t, r, h = p["train"], p["rollout"], p["hybrid"]
    instances = ", ".join(f"{g['count']} x TP{g['tp']} (<= {g['max_tokens']:,} tokens)" for g in r["instances"])
    lines = [
        f"plan for {p['cluster']} ({p['gpus']} GPUs), {p['model']}, {p['mode']}, "
        f"{p['trajectories_per_step']:g} trajectories/step from {p['source']}",
        f"  train    {t['gpus']:>5} GPUs  TP {t['tp']} x PP {t['pp']} x DP {t['dp']} (EP {t['ep']}), "
        f"micro-batch {t['micro_batch']}, {t['memory_gb']} GB/GPU    T_train   {p['t_train_s']:.1f} s",
        f"  rollout  {r['gpus']:>5} GPUs  {instances}    T_rollout {p['t_rollout_s']:.1f} s",
        f"  hybrid   {h['gpus']:>5} GPUs" + (f"  {h['rollout_share']:.0%} of each iteration in rollout" if h["gpus"] else ""),
        f"  T_iter {p['t_iter_s']:.1f} s (weight sync {p['t_sync_s']:.2f} s); searched in {p['search_ms']:.0f} ms "
        f"({p['search']['splits']} splits, {p['search']['train_costed']} of {p['search']['train_enumerated']} training "
        f"configurations costed after memory pruning, {p['search']['rollout_dp_evaluations']} rollout DP evaluations)",
    ]
    if "calibration" in p:
        c = p["calibration"]
        errors = ", ".join(f"{k} {v:.1%}" for k, v in c["mean_abs_rel_error"].items())
        aside = f"; {c['set_aside']} decode samples over 3x off set aside" if c.get("set_aside") else ""
        lines.append(f"  calibrated on {sum(c['samples'].values())} timing samples (mean error {errors}{aside})")
    return "\n".join(lines)
