"""A hybrid in a live training run, measured: the static split against the same split whose rollout
worker also trains as a hybrid of the elastic pool, on the same steps and seed.

    python -m benchmarks.bench_live_hybrids [--steps 6] [--seeds 0]

The workload is `bench_train_policies`'s (the shipped policy on the math tasks, 8 prompts x 8
samples, the per-turn floor growing 15% an iteration), on two workers of one core: the engine on one,
the trainer on the other. With `placement.hybrids: 1` the trainer is the pool's core rank and the
engine's worker trains a shard of every update as a hybrid. With the one-step-off pipeline the
rollout of iteration k + 1 runs beside the update of k, so while that rollout lasts the hybrid's
shard and the engine share the worker's core (the scheduler divides it), and after it the core is
the shard's: a hybrid trades rollout time for update time. Figures (read from MLflow as `libra
compare` reads them, and from the store):

- throughput: generated tokens per second of training time, hybrid / static;
- update seconds (the `train_s` of each iteration), hybrid / static, and how many updates the
  hybrid trained in;
- rollout seconds, hybrid / static (what the hybrid's shards cost the engine on its worker).

The figures go to benchmarks/out/live_hybrids.json and the README's performance section.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_train_policies import config_for
from benchmarks.common import quiet_engines, save
from libra.config import LibraConfig

KINDS = ("static", "hybrid")


def config_of(base: Path, kind: str, steps: int, seed: int) -> LibraConfig:
    config = config_for(base, "static", steps, seed, eval_every=steps)
    return config.model_copy(update={
        "trainer": config.trainer.model_copy(update={"run": f"{kind}-seed{seed}"}),
        "placement": config.placement.model_copy(update={"hybrids": 1 if kind == "hybrid" else 0})})


def store_figures(base: Path, run: str) -> dict[str, Any]:
    from storage.catalog import Catalog

    with Catalog(base / "store", run) as catalog:
        rows = catalog.query("SELECT step, train_s, rollout_s, hybrid_gpus FROM steps ORDER BY step").to_pylist()
    return {"train_s": [r["train_s"] for r in rows], "rollout_s": [r["rollout_s"] for r in rows],
            "hybrid_updates": sum(1 for r in rows if r["hybrid_gpus"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--quick", action="store_true", help="2 steps (a smoke run; figures not saved)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 2
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first iteration's rollout has no update beside it)")

    from dashboards.compare import compare, read_runs
    from flows.runtime import prepare_runtime, start_prefect
    from flows.train import train_flow

    quiet_engines()
    began = time.perf_counter()
    per_seed: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="libra-bench-hybrids-") as tmp:
        base = Path(tmp)
        prepare_runtime(config_of(base, "static", args.steps, 0))
        start_prefect()
        warm = config_of(base, "static", 1, 0)  # not measured: the machine's cold start
        train_flow(warm.model_copy(update={"trainer": warm.trainer.model_copy(update={"run": "warm-up"})}))
        for i, seed in enumerate(args.seeds):
            for kind in KINDS[i % 2:] + KINDS[:i % 2]:
                t0 = time.perf_counter()
                train_flow(config_of(base, kind, args.steps, seed))
                print(f"seed {seed} {kind}: {args.steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
            runs = [f"{kind}-seed{seed}" for kind in KINDS]
            rows = {r.run: r for r in compare(read_runs(f"sqlite:///{base / 'mlflow.db'}", "libra-train-math", runs)).rows}
            figures = {kind: {"tokens_per_s": rows[f"{kind}-seed{seed}"].tokens_per_s,
                              **store_figures(base, f"{kind}-seed{seed}")} for kind in KINDS}
            static, hybrid = figures["static"], figures["hybrid"]
            # update and rollout times from the second iteration on: the first rollout has no update beside it
            per_seed[str(seed)] = {
                "runs": figures,
                "throughput_ratio": hybrid["tokens_per_s"] / static["tokens_per_s"],
                "train_ratio": statistics.fmean(hybrid["train_s"][1:]) / statistics.fmean(static["train_s"][1:]),
                "rollout_ratio": statistics.fmean(hybrid["rollout_s"][1:]) / statistics.fmean(static["rollout_s"][1:]),
            }
            f = per_seed[str(seed)]
            print(f"seed {seed}: hybrid / static throughput {f['throughput_ratio']:.2f} ({hybrid['tokens_per_s']:.0f} / "
                  f"{static['tokens_per_s']:.0f} tok/s), update time {f['train_ratio']:.2f}, rollout time "
                  f"{f['rollout_ratio']:.2f}; the hybrid trained in {hybrid['hybrid_updates']} of {args.steps} updates",
                  flush=True)
    result = {"steps": args.steps, "seeds": per_seed, "bench_s": time.perf_counter() - began,
              **{k: statistics.fmean(s[k] for s in per_seed.values())
                 for k in ("throughput_ratio", "train_ratio", "rollout_ratio")}}
    if not args.quick:
        print(f"saved {save('live_hybrids', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
