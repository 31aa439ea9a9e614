"""Planner benchmark: planning time at 48, 256 and 1,024 GPUs and the search space pruned per stage.

Workload: the bundled SWE agent trace (512 trajectories per step), Qwen3-14B on A800 nodes of 8 GPUs,
one-step-off pipelining with hybrids. Each planning time is the median of `--repeats` fresh planners
(no caches shared), reported against its goal (under 100 ms at 48 GPUs, under 2 s at 1,024).

    python -m benchmarks.bench_planner [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchmarks.common import median_time, save
from libra.clock import WallClock
from libra.planner.cost_model import CostModel
from libra.planner.planner import Planner
from libra.planner.profiles import MODELS, parse_cluster
from libra.planner.rollout_search import TP_CHOICES
from libra.planner.workload import build_workload, lengths_from_trajectories
from libra.traces import read_trace

TRACE = Path(__file__).resolve().parent.parent / "data" / "traces" / "swe_gemini3_mini_A.csv"
GOALS_MS = {48: 100.0, 256: None, 1024: 2000.0}


def layouts_up_to(gpus: int, tps: tuple[int, ...]) -> int:
    """Instance-count vectors with sum(tp * count) <= gpus (the rollout layouts of one pool size)."""
    ways = [1] + [0] * gpus  # ways[g]: vectors using exactly g GPUs
    for tp in tps:
        for g in range(tp, gpus + 1):
            ways[g] += ways[g - tp]
    return sum(ways)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/out/planner.json")
    parser.add_argument("--nodes", type=int, nargs="*", default=[6, 32, 128], help="A800 nodes of 8 GPUs")
    args = parser.parse_args(argv)
    lengths = lengths_from_trajectories(read_trace(TRACE).trajectories)
    workload = build_workload(lengths, 512)
    model = MODELS["qwen3-14b"]
    rows = []
    for nodes in args.nodes:
        cluster = parse_cluster(f"{nodes}x8:a800")
        cost = CostModel(cluster, model)
        median_s, _ = median_time(lambda c=cost: Planner(c, workload).plan(WallClock()), args.repeats)
        planner = Planner(cost, workload)
        plan = planner.plan(WallClock())
        s = plan.stats
        tps = tuple(tp for tp in TP_CHOICES if cost.kv_capacity_tokens(tp) > 0)
        buckets = len(workload.buckets)
        assignments = math.comb(buckets + len(tps) - 1, len(tps) - 1)
        step = planner.granularity()
        split_space = len(planner.hybrid_sizes()) * len(planner.shares()) * (cluster.gpus // step)
        goal = GOALS_MS.get(cluster.gpus)
        row = {
            "gpus": cluster.gpus, "median_ms": median_s * 1000, "goal_ms": goal,
            "ratio_to_goal": (median_s * 1000 / goal) if goal else None,
            "t_iter_s": plan.t_iter_s, "split": [plan.train_gpus, plan.rollout_gpus, plan.hybrid_gpus],
            "granularity": step,
            "splits": {"space": split_space, "evaluated": s.splits},
            "training": {"enumerated": s.train_enumerated, "memory_pruned": s.train_memory_pruned, "costed": s.train_costed},
            "rollout": {"layouts_at_full_pool": layouts_up_to(cluster.gpus, tps), "monotone_assignments": assignments,
                        "pool_sizes_solved": s.rollout_solves, "dp_evaluations": s.rollout_dp_evaluations,
                        "group_times_costed": s.rollout_group_evaluations},
        }
        rows.append(row)
        goal_text = f"{row['ratio_to_goal']:.2f} of the {goal:.0f} ms goal" if goal else "no goal"
        print(f"{cluster.gpus:>5} GPUs: plan in {row['median_ms']:.1f} ms ({goal_text}); T_iter {plan.t_iter_s:.1f} s; "
              f"splits {s.splits}/{split_space}; training configs enumerated {s.train_enumerated}, "
              f"memory-pruned {s.train_memory_pruned}, costed {s.train_costed}; rollout layouts in space "
              f"{row['rollout']['layouts_at_full_pool']:,} x {assignments} assignments, solved by "
              f"{s.rollout_dp_evaluations} DP evaluations over {s.rollout_solves} pool sizes")
    if not args.no_save:
        print(f"wrote {save('planner', {'workload': 'swe_gemini3_mini_A x512, Qwen3-14B, A800', 'rows': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
