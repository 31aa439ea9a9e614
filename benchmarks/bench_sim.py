"""Simulator benchmark: the ablation of every simulated system (whole-system variant) against a
proven bound, routing judged by the makespan it buys, and how simulation time grows with the cluster.

Ablation: each workload runs `--steps` RL steps (Qwen3-14B on 48 A800 GPUs, seed 0) under every
system on the same trajectories; each system's throughput is reported with its ratio to the proven
bound (`libra/sim/bound.py`: no system can beat it), to Libra and to the oracle (the best known
schedule) of the same run.

Routing: one heterogeneous layout per workload (the planner's heterogeneous plan for the warm-up
batch, its rollout instances only), every router over the same steps; the first half teaches the
routers, the second half is scored by mean rollout makespan, as a ratio to routing on true lengths;
beside them, the same GPUs as uniform instances of the layout's largest TP (nothing to route).

Scale: Libra alone at 48, 256 and 1,024 GPUs with the batch grown in proportion, each run timed whole
(200 steps, the draw included) in a process of its own on the compiled core (`libra.native`) against
the limit of 5 minutes, and at 48 GPUs on the Python sources too.

    python -m benchmarks.bench_sim [--steps 100] [--routing-steps 40] [--scale-steps 200] [--scale-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.common import DECODE_FIT, OUT, save
from libra import native
from libra.planner.cost_model import CostModel
from libra.planner.planner import Planner, PlannerSettings
from libra.planner.profiles import MODELS, parse_cluster
from libra.scheduler.routers import Buckets
from libra.sim.bound import run_bound
from libra.sim.rollout import InstanceSpec
from libra.sim.routing import bucket_shares, compare_routers
from libra.sim.runner import simulate
from libra.sim.systems import SYSTEMS, plan_layout
from libra.sim.training import workload_of
from libra.sim.workloads import PRESETS, TRACES, WorkloadGenerator, workload_spec

SCALE_LIMIT_S = 300.0  # the goal: 200 simulated steps at any cluster size in 5 minutes on 2 cores

ROUTERS = ("oracle", "libra", "least-latency", "cmlfq", "mlfq", "predictor", "predictor-repredict", "least-load")
REPLAY = f"trace:{TRACES / 'taubench_airline.csv'}"


def ablation(name: str, cost: CostModel, steps: int) -> dict:
    spec = workload_spec(name)
    started = time.perf_counter()
    runs = simulate(spec, cost, steps, list(SYSTEMS), seed=0)
    wall = time.perf_counter() - started
    generator = WorkloadGenerator(spec, 0)
    bound = run_bound(cost, [generator.step(k) for k in range(steps)])
    trained = runs["libra"].trained_tokens  # every system trains the same tokens
    bound_tps = trained / bound.total_s
    libra, oracle = runs["libra"].tokens_per_s, runs["oracle"].tokens_per_s
    rows = {p: {"tokens_per_s": r.tokens_per_s, "vs_bound": r.tokens_per_s / bound_tps, "vs_libra": r.tokens_per_s / libra,
                "vs_oracle": r.tokens_per_s / oracle, "step_time_mean_s": r.step_time_mean_s,
                "step_time_p99_s": r.step_time_quantile(0.99), "total_time_s": r.total_time_s,
                "last_instances": [list(i) for i in r.steps[-1].instances]} for p, r in runs.items()}
    label = "trace replay (tau-bench)" if name == REPLAY else name
    print(f"{label} ({steps} steps, {len(generator.step(0))} trajectories/step), all systems simulated in {wall:.1f} s; "
          f"bound {bound_tps:.0f} tokens/s:")
    for p, m in rows.items():
        print(f"  {p:<22} {m['tokens_per_s']:8.1f} tokens/s  vs bound {m['vs_bound']:.2f}  vs libra {m['vs_libra']:.2f}  "
              f"vs oracle {m['vs_oracle']:.2f}  step mean {m['step_time_mean_s']:.1f} s  p99 {m['step_time_p99_s']:.1f} s")
    return {"workload": label, "steps": steps, "trajectories_per_step": len(generator.step(0)), "wall_s": wall,
            "bound_tokens_per_s": bound_tps, "policies": rows}


def routing(name: str, cost: CostModel, steps: int) -> dict:
    spec = workload_spec(name)
    generator = WorkloadGenerator(spec, 0)
    warmup = generator.step(-1)
    settings = PlannerSettings(mode="one_step_off", max_hybrid_fraction=0.0)
    plan = Planner(cost, workload_of(warmup), settings).plan()
    layout, bounds = plan_layout(plan)
    label = "trace replay (tau-bench)" if name == REPLAY else name
    groups = [[g.tp, g.count] for g in plan.rollout.groups]
    if not bounds:
        print(f"routing, {label}: the planner's plan is uniform ({groups}); nothing to route")
        return {"workload": label, "groups": groups, "bounds": [], "routers": {}}
    batches = [generator.step(k) for k in range(steps)]
    results = compare_routers(cost, layout, bounds, batches, ROUTERS, warmup_steps=steps // 2,
                              prior_shares=bucket_shares(warmup, Buckets(bounds)))
    gpus = sum(spec.tp for spec in layout)
    largest = max(spec.tp for spec in layout)
    uniform = tuple(InstanceSpec(largest, 0) for _ in range(gpus // largest))
    results[f"uniform TP{largest}"] = compare_routers(cost, uniform, (), batches, ["least-load"],
                                                      warmup_steps=steps // 2)["least-load"]
    oracle = results["oracle"].mean_makespan_s
    rows = {r: {"mean_makespan_s": v.mean_makespan_s, "vs_oracle": v.mean_makespan_s / oracle,
                "migrated_share": v.migrated_share} for r, v in results.items()}
    print(f"routing, {label}: layout {groups} (TP, instances), bounds {list(bounds)}, {steps} steps (scored from step {steps // 2}):")
    for r, m in rows.items():
        print(f"  {r:<20} mean makespan {m['mean_makespan_s']:7.1f} s  vs oracle {m['vs_oracle']:.2f}  "
              f"migrated {m['migrated_share']:.1%}")
    return {"workload": label, "groups": groups, "bounds": list(bounds), "steps": steps, "routers": rows}


SCALE_RUN = """
import json, sys, time
from libra import native
from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.sim.runner import simulate
from libra.sim.workloads import workload_spec
nodes, steps = int(sys.argv[1]), int(sys.argv[2])
base = workload_spec("search-r1")
spec = workload_spec("search-r1", prompts_per_step=max(1, base.prompts_per_step * nodes // 6))
started = time.perf_counter()
simulate(spec, CostModel(parse_cluster(f"{nodes}x8:a800"), MODELS["qwen3-14b"]), steps, ["libra"], seed=0)
print(json.dumps({"seconds": time.perf_counter() - started, "trajectories_per_step": spec.prompts_per_step * spec.group_size,
                  "compiled": native.compiled(), "core": native.state().reason}))
"""


def scale_run(nodes: int, steps: int, *, compiled: bool) -> dict:
    """Libra alone on `nodes` x 8 A800s (search-r1, the batch grown with the cluster), `steps` steps
    timed whole (the draw included) in a process of its own, on the compiled core or the Python one."""
    env = dict(os.environ, **{native.SWITCH: "1" if compiled else "0"})
    out = subprocess.run([sys.executable, "-c", SCALE_RUN, str(nodes), str(steps)], env=env, capture_output=True,
                         text=True, check=True)
    run = json.loads(out.stdout)
    if run["compiled"] != compiled:
        raise SystemExit(f"asked for the {'compiled' if compiled else 'Python'} core, got: {run['core']}")
    per_step = run["seconds"] / steps
    core = "compiled" if compiled else "Python"
    print(f"scale: {nodes * 8} GPUs, {run['trajectories_per_step']} trajectories/step, {core} core: {per_step:.2f} s per "
          f"simulated step over {steps} steps ({per_step * 200:.0f} s for 200 steps, "
          f"{per_step * 200 / SCALE_LIMIT_S:.2f} of the {SCALE_LIMIT_S:.0f} s limit; libra)")
    return {"gpus": nodes * 8, "trajectories_per_step": run["trajectories_per_step"], "core": core,
            "seconds_per_step": per_step, "seconds_for_200_steps": per_step * 200, "steps_timed": steps,
            "limit_s": SCALE_LIMIT_S}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--routing-steps", type=int, default=40)
    parser.add_argument("--scale-steps", type=int, default=200, help="steps timed per cluster size (200: the whole run)")
    parser.add_argument("--workloads", nargs="*", default=[*PRESETS, REPLAY])
    parser.add_argument("--scale-nodes", type=int, nargs="*", default=[6, 32, 128])
    parser.add_argument("--python-core-nodes", type=int, nargs="*", default=[6],
                        help="sizes also timed on the Python sources (LIBRA_NATIVE=0)")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--scale-only", action="store_true", help="time the scale runs again and keep the saved tables")
    args = parser.parse_args(argv)
    model = MODELS["qwen3-14b"]
    cost = CostModel(parse_cluster("6x8:a800"), model)
    if args.scale_only:
        saved = json.loads((OUT / "sim.json").read_text())
        tables, routed = saved["tables"], saved.get("routing", [])
    else:
        tables = [ablation(name, cost, args.steps) for name in args.workloads]
        routed = [routing(name, cost, args.routing_steps) for name in args.workloads] if args.routing_steps > 1 else []
    compiled = native.state().active  # (not built, or stale: the Python sources are timed, and said so)
    scale = [scale_run(nodes, args.scale_steps, compiled=compiled) for nodes in args.scale_nodes]
    if compiled and args.python_core_nodes:  # the same runs on the Python sources: what the compiled core buys
        timed = {r["gpus"]: r for r in scale}
        for nodes in args.python_core_nodes:
            python = scale_run(nodes, args.scale_steps, compiled=False)
            if python["gpus"] in timed:
                timed[python["gpus"]]["python_core_seconds_for_200_steps"] = python["seconds_for_200_steps"]
    if not args.no_save:
        print(f"wrote {save('sim', {'model': 'Qwen3-14B', 'cluster': '6x8:a800', 'decode_fit': DECODE_FIT, 'tables': tables, 'routing': routed, 'scale': scale})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
