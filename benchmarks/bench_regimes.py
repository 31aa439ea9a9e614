"""Regime map: where heterogeneous TP, routing and hybrids pay, by context length, tail heaviness and
cluster size.

Each cell simulates `--steps` RL steps of a search-agent workload (the FireAct trace's tool-calling
shapes, Qwen3-14B on A800) under the four planned ablation stages, on the same trajectories:
generated tokens scaled by `--scales` (context length), with or without a heavy-tailed first-turn
reasoning phase (log-normal, sigma 1, mean `--tail-tokens` x scale: the tail), on clusters of
`--nodes` nodes of 8 GPUs with the batch grown with the cluster (32 prompts x 16 samples per 6
nodes). A stage's gain is its throughput over the stage before it in the same cell; Libra's ratio
to the proven bound says how much any policy could still add, and the oracle's gain over Libra (it
knows every trajectory's length: heterogeneous instances with true-length routing, per-step plans)
how much knowing the lengths is worth there.

    python -m benchmarks.bench_regimes [--steps 12] [--scales 1 4 16] [--nodes 2 6 16]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from benchmarks.common import DECODE_FIT, save
from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.sim.bound import run_bound
from libra.sim.runner import simulate
from libra.sim.workloads import WorkloadGenerator, workload_spec

STAGES = ("+planner", "+hetero-tp", "+cmlfq", "libra")


def cell(scale: float, tail: float, nodes: int, steps: int) -> dict:
    base = workload_spec("search-r1")
    spec = replace(base, name=f"search x{scale:g}{' tail' if tail else ''}", gen_scale=base.gen_scale * scale,
                   reasoning_tokens=tail * scale, prompts_per_step=max(1, base.prompts_per_step * nodes // 6),
                   max_tokens=131_072)
    cost = CostModel(parse_cluster(f"{nodes}x8:a800"), MODELS["qwen3-14b"])
    started = time.perf_counter()
    runs = simulate(spec, cost, steps, [*STAGES, "oracle"], seed=0)
    generator = WorkloadGenerator(spec, 0)
    batches = [generator.step(k) for k in range(steps)]
    bound = run_bound(cost, batches)
    tokens = [t.total_tokens for batch in batches for t in batch]
    tokens.sort()
    throughput = {s: runs[s].tokens_per_s for s in STAGES}
    gains = {s: throughput[s] / throughput[before] - 1 for before, s in zip(STAGES, STAGES[1:], strict=False)}
    return {"scale": scale, "tail": tail > 0, "gpus": nodes * 8, "trajectories_per_step": len(batches[0]),
            "p50_tokens": tokens[len(tokens) // 2], "p99_tokens": tokens[int(0.99 * (len(tokens) - 1))],
            "tokens_per_s": throughput, "gains": gains,
            "libra_vs_bound": throughput["libra"] * bound.total_s / runs["libra"].trained_tokens,
            "oracle_over_libra": runs["oracle"].tokens_per_s / throughput["libra"] - 1,
            "oracle_layout": [list(i) for i in runs["oracle"].steps[-1].instances],
            "layouts": {s: [list(i) for i in runs[s].steps[-1].instances] for s in STAGES},
            "hybrid_gpus": runs["libra"].steps[-1].hybrid_gpus, "wall_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--scales", type=float, nargs="*", default=[1.0, 4.0, 16.0])
    parser.add_argument("--tail-tokens", type=float, default=1000.0)
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 6, 16])
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    cells = []
    for nodes in args.nodes:
        for scale in args.scales:
            for tail in (0.0, args.tail_tokens):
                c = cell(scale, tail, nodes, args.steps)
                cells.append(c)
                gains = "  ".join(f"{s} {g:+.1%}" for s, g in c["gains"].items())
                print(f"{c['gpus']:>4} GPUs  x{scale:<4g} {'tail' if tail else 'light':<5}  p50/p99 {c['p50_tokens']:,}/"
                      f"{c['p99_tokens']:,} tokens  {gains}  libra/bound {c['libra_vs_bound']:.2f}  "
                      f"libra layout {c['layouts']['libra']} hybrids {c['hybrid_gpus']}  oracle {c['oracle_over_libra']:+.1%} "
                      f"{c['oracle_layout']}  ({c['wall_s']:.0f} s)")
    if not args.no_save:
        print(f"wrote {save('regimes', {'model': 'Qwen3-14B', 'hardware': 'A800', 'steps': args.steps, 'decode_fit': DECODE_FIT, 'cells': cells})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
