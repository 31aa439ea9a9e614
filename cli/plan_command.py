"""`libra plan`: parses its flags and calls the plan flow (`flows/cluster_plan.py`): the resource plan for a
cluster, a model and the lengths of a run or a trace."""

from __future__ import annotations

import argparse
import json
from typing import Any

from libra.config import LibraConfig
from libra.planner.profiles import MODELS


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
    plan.add_argument("--model", required=True, help=f"model profile: {', '.join(MODELS)}")
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="take lengths from this run in the store")
    source.add_argument("--trace", metavar="FILE.csv", help="take lengths from a per-turn trace file")
    plan.add_argument("--mode", choices=["one_step_off", "sync", "colocated"], help="pipelining (default: planner.mode)")
    plan.add_argument("--batch", type=int, metavar="N", help="trajectories per step (default: planner.batch_trajectories)")
    plan.add_argument("--calibrate", action="store_true", help="fit cost-model coefficients to the run's timings first")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(handler=cmd_plan)


def read_trace_with_progress(path: str, quiet: bool):
    """`flows.trace_analysis.check_trace` with a progress bar on a terminal (in MiB read)."""
    from cli.progress import progress
    from flows.trace_analysis import check_trace

    with progress(f"reading {path}", quiet=quiet) as bar:
        return check_trace(path, progress=lambda done, total: bar.update(done / 2**20, total / 2**20, "MiB"))


def cmd_plan(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.flow_call import run_flow
    from cli.progress import progress
    from cli.streams import json_stdout
    from flows.cluster_plan import plan_flow, plan_request
    from libra.checks import as_flag

    request = plan_request(args.cluster, args.model, args.run, args.trace, args.mode, args.batch, args.calibrate,
                           names=as_flag)
    if args.trace:
        read_trace_with_progress(args.trace, quiet=args.json)  # a bad trace is refused before Prefect starts
    with json_stdout(args.json) as out:
        with progress(f"planning {request.cluster}", quiet=args.json) as bar:
            payload = run_flow(plan_flow, config, tracking=False, cluster=request.cluster, model=request.model,
                               run=request.run, trace=request.trace, mode=request.mode, batch=request.batch,
                               calibrate=request.calibrate,
                               progress=lambda done, total: bar.update(done, total, "pools of hybrids searched"))
        print(json.dumps(payload) if args.json else render_plan(payload), file=out)
    return 0


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
