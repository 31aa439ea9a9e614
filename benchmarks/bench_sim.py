"""Simulator benchmark: every whole-system policy on the three workloads at 48 A800 GPUs, and how
simulation time grows with the cluster.

Each workload runs `--steps` RL steps (Qwen3-14B, 16 samples per prompt, seed 0) under every policy
on the same trajectories; each policy's throughput is reported as a ratio to Libra's and to the
oracle's in the same run. Scale: Libra alone at 48, 256 and 1,024 GPUs with the batch grown in
proportion, timed per simulated step.

    python -m benchmarks.bench_sim [--steps 200] [--scale-steps 20]
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import save
from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.sim.policies import POLICIES
from libra.sim.runner import simulate
from libra.sim.workloads import PRESETS, workload_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--scale-steps", type=int, default=20)
    parser.add_argument("--workloads", nargs="*", default=list(PRESETS))
    parser.add_argument("--scale-nodes", type=int, nargs="*", default=[6, 32, 128])
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    model = MODELS["qwen3-14b"]
    cost = CostModel(parse_cluster("6x8:a800"), model)
    tables = []
    for name in args.workloads:
        spec = workload_spec(name)
        started = time.perf_counter()
        runs = simulate(spec, cost, args.steps, list(POLICIES), seed=0)
        wall = time.perf_counter() - started
        libra, oracle = runs["libra"].tokens_per_s, runs["oracle"].tokens_per_s
        rows = {p: {"tokens_per_s": r.tokens_per_s, "vs_libra": r.tokens_per_s / libra, "vs_oracle": r.tokens_per_s / oracle,
                    "step_time_mean_s": r.step_time_mean_s, "step_time_p99_s": r.step_time_quantile(0.99),
                    "total_time_s": r.total_time_s} for p, r in runs.items()}
        tables.append({"workload": name, "steps": args.steps, "trajectories_per_step": spec.group_size * spec.prompts_per_step,
                       "wall_s": wall, "policies": rows})
        print(f"{name} ({args.steps} steps, {spec.prompts_per_step} prompts x {spec.group_size} samples), all policies "
              f"simulated in {wall:.1f} s:")
        for p, m in rows.items():
            print(f"  {p:<22} {m['tokens_per_s']:8.1f} tokens/s  vs libra {m['vs_libra']:.2f}  vs oracle {m['vs_oracle']:.2f}"
                  f"  step mean {m['step_time_mean_s']:.1f} s  p99 {m['step_time_p99_s']:.1f} s")
    scale = []
    for nodes in args.scale_nodes:
        cluster = parse_cluster(f"{nodes}x8:a800")
        base = workload_spec("search-r1")
        spec = workload_spec("search-r1", prompts_per_step=max(1, base.prompts_per_step * nodes // 6))
        started = time.perf_counter()
        simulate(spec, CostModel(cluster, model), args.scale_steps, ["libra"], seed=0)
        per_step = (time.perf_counter() - started) / args.scale_steps
        scale.append({"gpus": cluster.gpus, "trajectories_per_step": spec.prompts_per_step * spec.group_size,
                      "seconds_per_step": per_step, "seconds_for_200_steps": per_step * 200})
        print(f"scale: {cluster.gpus} GPUs, {spec.prompts_per_step * spec.group_size} trajectories/step: "
              f"{per_step:.2f} s per simulated step ({per_step * 200:.0f} s for 200 steps, libra)")
    if not args.no_save:
        print(f"wrote {save('sim', {'model': 'Qwen3-14B', 'cluster': '6x8:a800', 'tables': tables, 'scale': scale})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
