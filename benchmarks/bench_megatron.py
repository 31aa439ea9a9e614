"""The megatron-core trainer, measured against the torch trainer in the same run.

    python -m benchmarks.bench_megatron [--updates 4] [--steps 30] [--seed 0] [--quick]

1. Throughput: policy tokens/s of `MegatronTrainer.train_step` (TP=PP=DP=1) against
   `PolicyTrainer.train_step` on the same 64 math-like samples of the shipped policy, every thread
   of this machine given to the one process of each: the cost of megatron's model, schedule and rank
   process over the HF model in the run's process.
2. Layouts: TP=2, PP=2 and DP=2 (two rank processes, half the threads each) against TP=1 (one
   process, all the threads) on the same samples: same cores, so the ratio is what splitting the
   model or the batch costs or gains here, not a speed-up from more hardware.
   Resharding: TP=2 -> DP=2 after an update (what a plan that changes the layout costs) against
   a fresh start of DP=2's ranks.
3. Learning: `libra train`'s flow (configs/demo.yaml's settings: the math tasks, lr 1e-4, 8 x 8
   samples a step) once with each backend, the same seed: held-out reward (128 prompts, greedy)
   at the start, every 10 steps and at the end.

Figures go to benchmarks/out/megatron.json and the README's performance section
(`python -m benchmarks.report`). `--quick`: 1 update, 2 steps, not saved.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_train import config_for, math_like_samples, train_run
from benchmarks.common import quiet_engines, save, saved
from libra.config import TrainerConfig
from libra.rollout.policy import SHIPPED
from libra.trainer.layout import Layout

LAYOUTS = (Layout(tp=2), Layout(pp=2), Layout(dp=2))


def seconds_per_update(trainer: Any, samples: list, updates: int) -> float:
    """Mean seconds over `updates` steps after one warm-up step (the first builds the optimizer
    state and, for megatron, its buffers)."""
    trainer.train_step(samples)
    began = time.perf_counter()
    for _ in range(updates):
        trainer.train_step(samples)
    return (time.perf_counter() - began) / updates


def throughput(updates: int) -> dict[str, Any]:
    from libra.trainer.megatron_trainer import MegatronTrainer
    from libra.trainer.trainer import PolicyTrainer

    samples = math_like_samples()
    tokens = sum(s.policy_tokens for s in samples)
    config = TrainerConfig(lr=1e-5, warmup_steps=0)
    cores = torch.get_num_threads()

    torch_s = seconds_per_update(PolicyTrainer(SHIPPED, config), samples, updates)
    rows = {}
    for layout in (Layout(), *LAYOUTS):
        trainer = MegatronTrainer(SHIPPED, config, layout=layout, threads=max(1, cores // layout.world))
        try:
            rows[str(layout)] = seconds_per_update(trainer, samples, updates)
        finally:
            trainer.close()
    single = rows[str(Layout())]
    reshard = resharding(samples, config, cores)
    return {
        "updates": updates, "policy_tokens_per_update": tokens, "threads": cores,
        "torch_tokens_per_s": tokens / torch_s,
        "megatron_tokens_per_s": tokens / single,
        "megatron_over_torch": torch_s / single,
        "layouts": [{"layout": name, "ranks": layout.world, "seconds_per_update": rows[name],
                     "tokens_per_s": tokens / rows[name], "speed_over_tp1": single / rows[name]}
                    for layout in (Layout(), *LAYOUTS) for name in [str(layout)]],
        "reshard": reshard,
    }


def resharding(samples: list, config: TrainerConfig, cores: int) -> dict[str, Any]:
    """What a plan that changes the trainer's layout costs: TP=2 -> DP=2 after one update
    (`MegatronTrainer.relayout`: the weights and AdamW's state gathered, the ranks restarted in the
    new layout, the state loaded), against starting DP=2's ranks from the policy."""
    from libra.trainer.megatron_trainer import MegatronTrainer

    began = time.perf_counter()
    fresh = MegatronTrainer(SHIPPED, config, layout=Layout(dp=2), threads=max(1, cores // 2))
    start_s = time.perf_counter() - began
    fresh.close()
    trainer = MegatronTrainer(SHIPPED, config, layout=Layout(tp=2), threads=max(1, cores // 2))
    try:
        trainer.train_step(samples)
        reshard_s = trainer.relayout(Layout(dp=2))
    finally:
        trainer.close()
    return {"from": str(Layout(tp=2)), "to": str(Layout(dp=2)), "reshard_s": reshard_s, "start_s": start_s,
            "reshard_over_start": reshard_s / start_s}


def learning(steps: int, seed: int) -> dict[str, Any]:
    from flows.runtime import prepare_runtime, start_prefect

    with tempfile.TemporaryDirectory(prefix="libra-bench-megatron-") as tmp:
        base = Path(tmp)
        prepare_runtime(config_for(base, "probe", 1, seed, "one_step_off", 10))
        start_prefect()
        runs = {}
        for backend in ("torch", "megatron"):
            began = time.perf_counter()
            result = train_run(config_for(base, f"learn-{backend}", steps, seed, "one_step_off", 10, backend=backend))
            runs[backend] = {**result, "wall_s": time.perf_counter() - began}
            print(f"{backend}: held-out reward {result['reward_start']:.3f} -> {result['reward_end']:.3f} "
                  f"({steps} steps, {runs[backend]['wall_s']:.0f} s)", flush=True)
    return {"steps": steps, "seed": seed, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=4, help="timed updates per trainer (after one warm-up)")
    parser.add_argument("--steps", type=int, default=30, help="training steps of each learning run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1 update, 2 steps (a smoke run; figures not saved)")
    parser.add_argument("--only", choices=("throughput", "learning"),
                        help="measure one part; the other part's figures are kept from the saved result")
    args = parser.parse_args(argv)
    if args.quick:
        args.updates, args.steps = 1, 2
    quiet_engines()
    began = time.perf_counter()
    kept = saved("megatron") if args.only and not args.quick else {}
    if args.only == "learning":
        speed = kept["throughput"]
    else:
        speed = throughput(args.updates)
        print(f"trainer: megatron {speed['megatron_tokens_per_s']:.0f} policy tokens/s, torch "
              f"{speed['torch_tokens_per_s']:.0f}: ratio {speed['megatron_over_torch']:.2f}", flush=True)
        for row in speed["layouts"][1:]:
            print(f"{row['layout']} on {row['ranks']} processes: {row['seconds_per_update']:.2f} s an update, "
                  f"{row['speed_over_tp1']:.2f}x TP=1's speed on the same {speed['threads']} threads", flush=True)
        r = speed["reshard"]
        print(f"reshard {r['from']} -> {r['to']}: {r['reshard_s']:.1f} s, {r['reshard_over_start']:.2f}x a fresh start "
              f"({r['start_s']:.1f} s)", flush=True)
    learned = kept["learning"] if args.only == "throughput" else learning(args.steps, args.seed)
    result = {"throughput": speed, "learning": learned, "bench_s": time.perf_counter() - began}
    if not args.quick:
        print(f"saved {save('megatron', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
