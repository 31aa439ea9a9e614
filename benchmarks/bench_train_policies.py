"""Where rollout and training run, measured on the real pipeline: Libra's planning flow against a
static split and colocation, on the same steps and seeds.

    python -m benchmarks.bench_train_policies [--steps 10] [--seeds 0 1] [--quick]

Each seed trains the shipped policy on the math tasks three times, once per placement strategy
(`libra train --placement colocated|static|libra`; after one unmeasured warm-up iteration, and each seed
in another order, so no strategy always runs first): vLLM engines on their own cores, the trainer on
the others (a worker is one core). The workload drifts: every training turn generates at least
`min_tokens_per_turn` tokens and that floor, with the turn limit, grows by `turn_growth` per
iteration, so the rollout's share of an iteration grows as the run goes on. `libra compare`'s
figures are read back from MLflow:

- throughput: generated tokens per second of training time (each iteration without its held-out
  evaluation, plus the planning flow's seconds: planning, moving workers, restarting engines);
  `libra / static` and `libra / colocated` per seed, then their mean and range;
- time to a held-out reward: the training seconds until the held-out reward (32 prompts, greedy,
  every `eval_every` updates) first reached the best one all three runs of the seed reached;
- the simulator's prediction for the same three strategies on the same workload
  (`libra.rl.simulated.predict`): the static run's trajectories, turn by turn, on the cost model of
  these workers fitted to all three runs' timing samples, moves priced at the measured engine start;
  its ratios beside the live ones, and whether each comparison points the same way.

The figures go to benchmarks/out/train_policies.json and the README's performance section.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import quiet_engines, replay_of, run_locations, save, spread
from libra.config import LibraConfig
from libra.rollout.policy import SHIPPED

STRATEGIES = ("libra", "static", "colocated")
RATIOS = ("libra_over_static", "libra_over_colocated")


LEVEL = 0.02  # ratios within 2% of 1 say "no difference"


def direction(ratio: float) -> str:
    return "better" if ratio > 1 + LEVEL else "worse" if ratio < 1 - LEVEL else "level"


def same_direction(live: float, simulated: float) -> bool:
    """Whether two throughput ratios say the same thing: both better, both worse, or both level."""
    return direction(live) == direction(simulated)


def config_for(base: Path, strategy: str, steps: int, seed: int, eval_every: int) -> LibraConfig:
    return LibraConfig.model_validate({
        **run_locations(base),
        "rollout": {"engine": "vllm", "instances": 1, "max_tokens_per_turn": 96, "min_tokens_per_turn": 24,
                    "turn_growth": 0.15},
        "trainer": {"policy": str(SHIPPED), "run": f"{strategy}-seed{seed}", "env": "math", "steps": steps, "seed": seed,
                    "lr": 1e-4, "prompts_per_step": 8, "samples_per_prompt": 8, "eval_prompts": 32,
                    "eval_every": eval_every, "checkpoint_dir": str(base / "checkpoints")},
        "planner": {"warmup_steps": 2, "period_steps": 10, "recent_steps": 0},
        "placement": {"strategy": strategy},
    })


def seed_figures(rows: dict[str, Any]) -> dict[str, Any]:
    libra, static, colocated = rows["libra"], rows["static"], rows["colocated"]
    return {"libra_over_static": libra.tokens_per_s / static.tokens_per_s,
            "libra_over_colocated": libra.tokens_per_s / colocated.tokens_per_s,
            "runs": {strategy: {"tokens_per_s": r.tokens_per_s, "train_time_s": r.train_time_s,
                              "heldout_final": r.heldout_final, "time_to_target_s": r.time_to_target_s,
                              "plans_applied": r.plans_applied, "workers_moved": r.workers_moved,
                              "rollout_workers_mean": r.rollout_workers_mean} for strategy, r in rows.items()}}


def simulated(base: Path, seed: int, config: LibraConfig) -> dict[str, Any]:
    """The simulator's prediction for the seed's three runs, from what they wrote to the store."""
    from libra.rl.simulated import predict

    replay = replay_of(config, [f"{strategy}-seed{seed}" for strategy in STRATEGIES], f"static-seed{seed}")
    fitted = replay.calibration
    starts = [r["seconds"] for r in replay.timings if r["kind"] == "engine_start"]
    engine_start_s = statistics.fmean(starts) if starts else config.planner.engine_start_s
    runs = predict(replay.batches, replay.cost, replay.cluster, config.planner, engine_start_s)
    return {"libra_over_static": runs["libra"].tokens_per_s / runs["static"].tokens_per_s,
            "libra_over_colocated": runs["libra"].tokens_per_s / runs["colocated"].tokens_per_s,
            "engine_start_s": engine_start_s, "fit_error": fitted.mean_abs_rel_error, "fit_samples": fitted.samples,
            "libra_moves": sum(1 for s in runs["libra"].steps if s.switch_cost_s > 0),
            "time_s": {p: r.total_time_s for p, r in runs.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 steps, one seed (a smoke run; figures not saved)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the runs' store, MLflow and checkpoints here and keep them (default: a "
                             "temporary directory, removed at the end); the directory must not exist yet")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.eval_every = 3, [0], 2
    import os

    from dashboards.compare import compare, read_runs
    from flows.runtime import prepare_runtime, start_prefect
    from flows.train import train_flow

    quiet_engines()
    began = time.perf_counter()
    per_seed: dict[str, Any] = {}
    cores = os.sched_getaffinity(0)
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep {args.keep}: the directory exists; name a new one (runs are not mixed)")
    with tempfile.TemporaryDirectory(prefix="libra-bench-policies-") as tmp:
        base = Path(tmp) if args.keep is None else args.keep
        base.mkdir(parents=True, exist_ok=True)
        prepare_runtime(config_for(base, "libra", args.steps, 0, args.eval_every))
        start_prefect()
        # not measured: the machine's cold start (file cache, the engines' first start) would
        # otherwise be charged to whichever strategy runs first
        warm = config_for(base, "static", 1, 0, args.eval_every)
        train_flow(warm.model_copy(update={"trainer": warm.trainer.model_copy(update={"run": "warm-up"})}))
        for i, seed in enumerate(args.seeds):
            for strategy in STRATEGIES[i % 3:] + STRATEGIES[:i % 3]:  # each seed in another order
                config = config_for(base, strategy, args.steps, seed, args.eval_every)
                t0 = time.perf_counter()
                train_flow(config)
                # every run starts from the whole machine: a run that left this process pinned would
                # give the next one fewer workers
                assert os.sched_getaffinity(0) == cores, f"{strategy} left the process on {os.sched_getaffinity(0)}"
                print(f"seed {seed} {strategy}: {args.steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
            histories = read_runs(f"sqlite:///{base / 'mlflow.db'}", "libra-train-math",
                                  [f"{p}-seed{seed}" for p in STRATEGIES])
            comparison = compare(histories)
            rows = {r.strategy: r for r in comparison.rows}
            per_seed[str(seed)] = {"target": comparison.target, **seed_figures(rows),
                                   "simulated": simulated(base, seed, config_for(base, "static", args.steps, seed,
                                                                                  args.eval_every))}
            f = per_seed[str(seed)]
            sim = f["simulated"]
            print(f"seed {seed} simulated: libra/static {sim['libra_over_static']:.2f}, libra/colocated "
                  f"{sim['libra_over_colocated']:.2f} ({sim['libra_moves']} moves); the same direction as live: "
                  + ", ".join(f"{k} {same_direction(f[k], sim[k])}" for k in RATIOS), flush=True)
            print(f"seed {seed}: libra/static {f['libra_over_static']:.2f}, libra/colocated "
                  f"{f['libra_over_colocated']:.2f}; " + ", ".join(
                      f"{p} {r['tokens_per_s']:.0f} tok/s, {r['plans_applied']} plans applied, to held-out "
                      f"{comparison.target}: {r['time_to_target_s']} s" for p, r in f["runs"].items()), flush=True)
    result = {
        "steps": args.steps, "seeds": per_seed, "workers": len(os.sched_getaffinity(0)),
        **{k: spread([s[k] for s in per_seed.values()]) for k in RATIOS},
        "simulated": {k: spread([s["simulated"][k] for s in per_seed.values()]) for k in RATIOS},
        "agree": {k: all(same_direction(s[k], s["simulated"][k]) for s in per_seed.values()) for k in RATIOS},
        "bench_s": time.perf_counter() - began,
    }
    print(f"libra / static {result['libra_over_static']['mean']:.2f} (seeds {result['libra_over_static']['min']:.2f}-"
          f"{result['libra_over_static']['max']:.2f}); libra / colocated {result['libra_over_colocated']['mean']:.2f} "
          f"({result['libra_over_colocated']['min']:.2f}-{result['libra_over_colocated']['max']:.2f})")
    sim = result["simulated"]
    print(f"simulated: libra / static {sim['libra_over_static']['mean']:.2f}, libra / colocated "
          f"{sim['libra_over_colocated']['mean']:.2f}; same direction as live on every seed: "
          + ", ".join(f"{k} {v}" for k, v in result["agree"].items()))
    if not args.quick:
        print(f"saved {save('train_policies', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
