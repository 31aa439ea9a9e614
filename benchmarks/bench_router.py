"""Router benchmark: every router on every bundled trace, and decision latency with 100,000-node trees.

For each trace and order (`group`: each prompt once; `epochs:3`: prompts revisited three times) the
routers are replayed in RL order (8 prompts per step, 30% warm-up, buckets at the warm-up p50/p90)
and scored against the oracle's perfect 1.0 and against the clairvoyant bound within the migration
budget (no router that re-prefills at most that share of tokens can have a higher balanced accuracy).
Each baseline that migrates more than the budget is also compared with Libra's router given the
same allowance (its budget set to what that baseline migrated). Latency: Libra's router and C-MLFQ
with trees grown to 100,000 nodes from random paths, timed over about 20,000 decisions of groups of
16 samples of a prompt running side by side (half the prompts unseen, so Libra's router also weighs
the siblings' evidence; goal: p99 under 50 us).

    python -m benchmarks.bench_router
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from benchmarks.common import save
from libra.clock import WallClock
from libra.config import SchedulerConfig
from libra.scheduler.causal_tree import TrajectoryPath
from libra.scheduler.keys import ToolReturn
from libra.scheduler.libra_router import LibraRouter
from libra.scheduler.metrics import quantile
from libra.scheduler.replay import ReplayResult, replay
from libra.scheduler.routers import CMLFQ, Buckets
from libra.traces import read_trace
from libra.types import Trajectory

TRACES = sorted((Path(__file__).resolve().parent.parent / "data" / "traces").glob("*.csv"))
GROUP = 16  # samples per prompt in the latency measurement
MIGRATING = ("cmlfq", "mlfq", "predictor-repredict")  # baselines that migrate without a budget


def at_same_migration(trajectories: Sequence[Trajectory], order: str, result: ReplayResult) -> dict[str, dict]:
    """Libra's router given each migrating baseline's own allowance: the baseline's migrated share
    of tokens as its budget (for those that migrate more than the default budget)."""
    matched = {}
    for name in MIGRATING:
        share = result.routers[name].migrated_token_ratio
        if share > result.bound.budget:
            libra = replay(trajectories, prompts_per_step=8, order=order, bounds=result.buckets, routers=["libra"],
                           settings=SchedulerConfig(migration_budget=min(1.0, share)), with_bound=False).routers["libra"]
            matched[name] = {"budget": share, "baseline": asdict(result.routers[name]), "libra": asdict(libra)}
    return matched


TOOLS = ["search", "bash:cat", "bash:grep", "bash:python", "python", "api:get", "api:update", "think"]


def random_paths(rng: random.Random, count: int, depth: int) -> list[TrajectoryPath]:
    paths = []
    for i in range(count):
        start = rng.randint(200, 60_000)
        remaining = start
        returns = []
        for _ in range(rng.randint(1, depth)):
            remaining = max(0, remaining - rng.randint(50, 3_000))
            returns.append((ToolReturn(rng.choice(TOOLS), rng.choice([10, 900, 9000]), rng.choice(["ok", "ok", "error"])), remaining))
        paths.append(TrajectoryPath(f"p{i % 5000}", start, tuple(returns), rng.randint(100, 4000)))
    return paths


def latency(nodes: int, decisions: int, seed: int = 0) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    buckets = Buckets((4_000, 12_000))
    routers = {"libra": LibraRouter(buckets, max_nodes=nodes * 2), "cmlfq": CMLFQ(buckets)}
    routers["cmlfq"].tree.max_nodes = nodes * 2
    out = {}
    for name, router in routers.items():
        trees = list(router.trees.values()) if isinstance(router, LibraRouter) else [router.tree]
        while min(t.nodes for t in trees) < nodes:
            router.observe_step(batch := random_paths(rng, 2_000, 40), {p.prompt_id: p.prompt_tokens for p in batch})
        probes = random_paths(rng, decisions // 10, 19)  # 1 + ~10 decisions each
        times = []
        for g in range(0, len(probes), GROUP):  # a group of samples of one prompt runs side by side
            prompt = f"p{g}" if g // GROUP % 2 else f"unseen{g}"  # half of the prompts the trees have not seen
            group = [(f"probe{g + i}", path) for i, path in enumerate(probes[g:g + GROUP])]
            prompt_tokens = group[0][1].prompt_tokens
            events = []
            for tid, path in group:
                start = time.perf_counter_ns()
                router.start(tid, prompt, prompt_tokens)
                times.append(time.perf_counter_ns() - start)
                events += [(path.start_remaining - remaining, tid, ret) for ret, remaining in path.returns]
                events.append((path.start_remaining, tid, None))  # its end
            for spent, tid, ret in sorted(events, key=lambda e: (e[0], e[2] is None, e[1])):
                if ret is None:
                    router.finish(tid, prompt_tokens + spent)
                    continue
                start = time.perf_counter_ns()
                router.on_return(tid, ret, prompt_tokens + spent)
                times.append(time.perf_counter_ns() - start)
        sizes = [t.nodes for t in trees]
        out[name] = {"tree_nodes": min(sizes), "decisions": len(times),
                     "p50_us": quantile(times, 0.5) / 1000, "p99_us": quantile(times, 0.99) / 1000}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", nargs="*", default=["group", "epochs:3"])
    parser.add_argument("--traces", nargs="*", help="trace files (default: the bundled ones)")
    parser.add_argument("--nodes", type=int, default=100_000, help="tree size for the latency measurement")
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    tables = []
    for path in [Path(p) for p in args.traces] if args.traces else TRACES:
        trajectories = read_trace(path).trajectories
        for order in args.orders:
            result = replay(trajectories, prompts_per_step=8, order=order, clock=WallClock())
            matched = at_same_migration(trajectories, order, result)
            tables.append({"trace": path.stem, "order": order, "buckets": list(result.buckets), "steps": result.steps,
                           "policies": {k: asdict(v) for k, v in result.routers.items()},
                           "bound": asdict(result.bound), "same_migration": matched})
            print(f"{path.stem} ({order}, buckets {list(result.buckets)}):")
            for name, m in result.routers.items():
                rank = "   -  " if m.rank_correlation is None else f"{m.rank_correlation:6.3f}"
                print(f"  {name:<20} acc {m.accuracy:.3f}  balanced {m.balanced_accuracy:.3f}  rank {rank}  "
                      f"migrated {m.migrated_token_ratio:6.1%}  p99 {m.p99_us:5.1f} us")
            print(f"  clairvoyant within {result.bound.budget:.0%} migrated: balanced <= {result.bound.balanced_accuracy:.3f}")
            for name, m in matched.items():
                print(f"  libra allowed {m['budget']:.1%} like {name}: balanced {m['libra']['balanced_accuracy']:.3f} "
                      f"(migrated {m['libra']['migrated_token_ratio']:.1%}) vs {m['baseline']['balanced_accuracy']:.3f}")
    lat = latency(args.nodes, args.decisions)
    for name, m in lat.items():
        print(f"latency {name}: {m['tree_nodes']:,}-node trees, {m['decisions']:,} decisions: p50 {m['p50_us']:.1f} us, "
              f"p99 {m['p99_us']:.1f} us (goal p99 < 50 us)")
    if not args.no_save:
        print(f"wrote {save('router', {'tables': tables, 'latency': lat})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
