"""Agentic rollout benchmark on real engines with the local policy (`libra policy init` first).

1. Agent-loop efficiency: generated tokens/s of the multi-turn agent loop (tools run in the
   sandbox, observations appended, every turn re-submitted to the engine) divided by raw
   `generate` tokens/s of the same vLLM engine on the same prompts and batch, in the same run, with
   the same number of tokens per sequence (goal: at least 0.7).
2. Routing: makespan of the same long-tail batch (repo tasks, several samples each) on two vLLM
   instances, routed by Libra's router (warmed on one earlier batch of the same prompts) and by
   least-load; the ratio least-load / Libra (> 1: Libra's batch finishes sooner).

    python -m benchmarks.bench_rollout [--policy .libra/policy] [--no-save]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.common import save
from libra.rollout.agent import rollout
from libra.rollout.engines import VLLMEngine
from libra.rollout.envs import make_env, prompt
from libra.scheduler.policies import Buckets, LeastLoad
from libra.scheduler.replay import make_router


def efficiency(policy: Path, env_name: str, prompts: int, samples: int) -> dict:
    engine = VLLMEngine(policy, size=len(os.sched_getaffinity(0)))
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(policy)
    env = make_env(env_name)
    tasks = env.tasks(prompts, seed=1)
    rollout(env, tasks[:2], 1, [engine], LeastLoad(Buckets((10**6,))), tokenizer, temperature=1.0)  # warm-up
    loop = rollout(env, tasks, samples, [engine], LeastLoad(Buckets((10**6,))), tokenizer, temperature=1.0, seed=3)
    per_sequence = max(1, loop.generated_tokens // len(loop.trajectories))
    ids = [tokenizer(prompt(env, t), add_special_tokens=False)["input_ids"] for t in tasks for _ in range(samples)]
    raw = engine.generate(ids, per_sequence, [], temperature=1.0, seed=3)  # no stops: straight decoding
    raw_tokens = sum(len(g.token_ids) for g in raw)
    engine.close()
    loop_tps = loop.generated_tokens / loop.wall_s
    raw_tps = raw_tokens / raw[0].seconds
    return {"env": env_name, "trajectories": len(loop.trajectories), "loop_tokens": loop.generated_tokens,
            "loop_s": loop.wall_s, "loop_generate_s": loop.generate_s, "engine_steps": loop.engine_steps,
            "loop_tokens_per_s": loop_tps, "raw_tokens": raw_tokens, "raw_s": raw[0].seconds,
            "raw_tokens_per_s": raw_tps, "efficiency": loop_tps / raw_tps, "solved_fraction": loop.solved_fraction}


def routing(policy: Path, prompts: int, samples: int) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    engines = [VLLMEngine(policy, size=half, cores=cores[:half]), VLLMEngine(policy, size=half, cores=cores[half:] or cores)]
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(policy)
    env = make_env("repo")
    tasks = env.tasks(prompts, seed=2)
    out = {}
    for name in ("least-load", "libra"):
        router = make_router(name, Buckets((200,)), {})
        if name == "libra":  # one earlier step of the same prompts: the tree has seen them
            rollout(env, tasks, samples, engines, router, tokenizer, temperature=1.0, seed=11)
        result = rollout(env, tasks, samples, engines, router, tokenizer, temperature=1.0, seed=12)
        out[name] = {"makespan_s": result.wall_s, "engine_steps": result.engine_steps, "generated_tokens": result.generated_tokens,
                     "migrations": result.migrations, "solved_fraction": result.solved_fraction}
    for engine in engines:
        engine.close()
    out["makespan_ratio_least_load_over_libra"] = out["least-load"]["makespan_s"] / out["libra"]["makespan_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=".libra/policy")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    policy = Path(args.policy)
    if not (policy / "config.json").exists():
        raise SystemExit(f"no policy in {policy}: run `libra policy init --out {policy}` first")
    rows = [efficiency(policy, name, args.prompts, args.samples) for name in ("search", "math")]
    for r in rows:
        print(f"{r['env']}: agent loop {r['loop_tokens_per_s']:.0f} tokens/s ({r['trajectories']} trajectories, "
              f"{r['engine_steps']} engine steps), raw generate {r['raw_tokens_per_s']:.0f} tokens/s: efficiency {r['efficiency']:.2f}",
              flush=True)
    route = routing(policy, args.prompts, args.samples)
    print(f"repo, 2 instances: makespan least-load {route['least-load']['makespan_s']:.1f} s, libra "
          f"{route['libra']['makespan_s']:.1f} s: ratio {route['makespan_ratio_least_load_over_libra']:.2f}")
    if not args.no_save:
        save("rollout", {"prompts": args.prompts, "samples": args.samples, "efficiency": rows, "routing": route})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
