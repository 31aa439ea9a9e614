"""`libra policy init` (build the local policy) and `libra rollout` (a batch of agentic rollouts on
real engines, routed across instances, recorded in the store and MLflow)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from libra.config import LibraConfig
from libra.errors import LibraError

DEFAULT_POLICY = ".libra/policy"


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    policy = sub.add_parser("policy", parents=[parent], help="build the local policy model",
                            description="Build the local policy: a tokenizer trained on the environments' text and "
                            "a small Qwen2-architecture model warm-started on scripted expert demonstrations.")
    policy_sub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    init = policy_sub.add_parser("init", parents=[parent], help="train (or reuse) the policy in DIR")
    init.add_argument("--out", default=DEFAULT_POLICY, help=f"policy directory (default {DEFAULT_POLICY})")
    init.add_argument("--steps", type=int, help="supervised training steps (default 600)")
    init.add_argument("--demos", type=int, help="demonstrations per environment (default 400)")
    init.add_argument("--rebuild", action="store_true",
                      help="train it from scratch even when DIR or the shipped policy (data/policy) fits the settings")
    init.set_defaults(handler=cmd_policy_init)

    cmd = sub.add_parser("rollout", parents=[parent], help="run a batch of agentic rollouts on real engines",
                         description="Roll out the policy on an environment's tasks with real tools (sandboxed) on "
                         "several engine instances; the router places each trajectory at its start and at every "
                         "tool return. Prints throughput and trajectory statistics; every turn goes to the store.")
    cmd.add_argument("--env", required=True, help="search, math or repo")
    cmd.add_argument("--prompts", type=int, default=32, help="tasks per batch (default 32)")
    cmd.add_argument("--samples", type=int, default=8, help="samples per task (default 8)")
    cmd.add_argument("--batches", type=int, default=1, help="batches in a row; the router learns between them (default 1)")
    cmd.add_argument("--engine", choices=["vllm", "hf"], help="rollout engine (default: the config's rollout.engine, vllm)")
    cmd.add_argument("--instances", type=int, help="engine instances (default: rollout.instances, 1)")
    cmd.add_argument("--device", choices=["cpu", "cuda"],
                     help="cpu: instances share the local cores; cuda: the GPUs (each instance gets an equal share, "
                     "its tensor-parallel degree on vLLM; transformers uses the first of its share) (default: rollout.device, cpu)")
    cmd.add_argument("--router", help="libra, libra-tree, cmlfq, mlfq, predictor, predictor-repredict, least-load or "
                     "always-shortest (default: rollout.router, libra)")
    cmd.add_argument("--buckets", default="auto", help="'auto' (quantiles of expert lengths) or B1,B2,... tokens")
    cmd.add_argument("--policy", default=DEFAULT_POLICY, help=f"HF-format policy directory (default {DEFAULT_POLICY})")
    cmd.add_argument("--temperature", type=float, help="0: greedy (default: rollout.temperature, 1.0)")
    cmd.add_argument("--max-turns", type=int, help="(default: rollout.max_turns, 8)")
    cmd.add_argument("--seed", type=int, default=0, help="task seed (the policy was trained on seeds >= 10000)")
    cmd.add_argument("--run", help="store run name (default: rollout-<env>-<time>)")
    cmd.add_argument("--no-track", action="store_true", help="skip MLflow")
    cmd.add_argument("--json", action="store_true")
    cmd.set_defaults(handler=cmd_rollout)


def cmd_policy_init(args: argparse.Namespace, config: LibraConfig) -> int:
    from dataclasses import replace

    from cli.checks import in_range
    from cli.progress import progress
    from libra.rollout.policy import PolicySettings, init_policy

    settings = PolicySettings()
    in_range("--steps", args.steps, 1, 1_000_000)
    in_range("--demos", args.demos, settings.batch, 1_000_000)
    if args.steps is not None:
        settings = replace(settings, steps=args.steps)
    if args.demos is not None:
        settings = replace(settings, demos_per_env=args.demos)
    with progress("training the policy") as bar:
        record = init_policy(args.out, settings, log=bar.echo,
                             progress=lambda done, steps, loss: bar.update(done, steps, f"loss {loss:.3f}"),
                             sandbox=config.sandbox, rebuild=args.rebuild)
    print(f"policy in {args.out}: {record['parameters']:,} parameters, {record['demonstrations']} demonstrations, "
          f"final loss {record['final_loss']:.3f}, built in {record['train_s']:.0f} s")
    return 0


def cmd_rollout(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    r = config.rollout  # the one source of the defaults the flags leave open
    for flag, value in (("engine", r.engine), ("instances", r.instances), ("device", r.device), ("router", r.router),
                        ("temperature", r.temperature), ("max_turns", r.max_turns)):
        if getattr(args, flag) is None:
            setattr(args, flag, value)

    with json_stdout(args.json) as out:
        summary = roll_out(args, config)
        print(json.dumps(summary) if args.json else render(summary), file=out)
    return 0


def roll_out(args: argparse.Namespace, config: LibraConfig) -> dict[str, Any]:
    from cli.checks import in_range
    from libra.rollout.envs import ENVS, expert_bounds, make_env
    from libra.scheduler.policies import Buckets
    from libra.scheduler.replay import POLICIES, make_router
    from storage.writer import check_run_name

    if args.env not in ENVS:
        raise LibraError(f"unknown environment {args.env!r}; environments: {', '.join(ENVS)}")
    for flag, value, high in (("--prompts", args.prompts, 10_000), ("--samples", args.samples, 1_024),
                              ("--batches", args.batches, 10_000), ("--instances", args.instances, 256),
                              ("--max-turns", args.max_turns, 1_000)):
        in_range(flag, value, 1, high)
    in_range("--temperature", args.temperature, 0.0, 100.0)
    if args.router not in POLICIES or args.router == "oracle":
        raise LibraError(f"unknown router {args.router!r}; routers: {', '.join(p for p in POLICIES if p != 'oracle')}")
    policy = Path(args.policy)
    if not (policy / "config.json").is_file():
        raise LibraError(f"no policy in {policy}: run `libra policy init --out {policy}` first (or pass --policy DIR "
                         "with an HF-format checkpoint)")
    run_name = check_run_name(args.run or time.strftime(f"rollout-{args.env}-%Y%m%d-%H%M%S"))
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # vLLM logs to stdout by default
    buckets_given = None
    if args.buckets != "auto":
        from cli.router_command import parse_buckets

        buckets_given = Buckets(tuple(parse_buckets(args.buckets) or ()))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    buckets = buckets_given or Buckets(expert_bounds(make_env(args.env, config.sandbox), args.instances, tokenizer))
    from libra.rollout.engines import make_engines

    if args.device == "cuda":
        from libra.devices import gpu_count

        if (count := gpu_count()) < args.instances:
            raise LibraError(f"--device cuda with {args.instances} instance(s): this machine has {count} GPU(s) torch can "
                             "use; use fewer --instances or --device cpu")
    engines = make_engines(args.engine, policy, args.instances, args.device, config.rollout.max_context)
    try:
        summary = run_batches(args, config, engines, tokenizer, make_env(args.env, config.sandbox),
                              make_router(args.router, buckets, {}, config.scheduler), run_name)
    finally:
        for engine in engines:
            engine.close()
    summary["buckets"] = list(buckets.bounds)
    if not args.no_track:
        summary["mlflow_run_id"] = track(summary, args, config)
    return summary


def run_batches(args: argparse.Namespace, config: LibraConfig, engines: list, tokenizer, env, router,
                run_name: str) -> dict[str, Any]:
    from libra.rollout.agent import rollout
    from libra.scheduler.metrics import quantile
    from storage.ingest import writer_for
    from storage.records import trajectories_table, turns_table

    writer = writer_for(config.store)
    results = []
    for batch in range(args.batches):
        result = rollout(env, env.tasks(args.prompts, seed=args.seed + batch), args.samples, engines, router, tokenizer,
                         max_turns=args.max_turns, max_tokens_per_turn=config.rollout.max_tokens_per_turn,
                         max_context=config.rollout.max_context, temperature=args.temperature,
                         tool_threads=config.rollout.tool_threads, seed=args.seed * 1000 + batch)
        records = result.records()
        step_of = {t.prompt_id: batch for t in records}
        trajectories, turns = trajectories_table(run_name, records, step_of), turns_table(run_name, records, step_of)
        with writer.transaction(run_name, origin="rollout") as tx:  # a batch's trajectories and turns appear together
            tx.write_step("trajectories", batch, trajectories)
            tx.write_step("turns", batch, turns)
        results.append(result)
    generated = sum(r.generated_tokens for r in results)
    wall = sum(r.wall_s for r in results)
    trajectories = [t for r in results for t in r.trajectories]
    lengths = sorted(len(t.ids) - t.prompt_tokens for t in trajectories)
    return {
        "run": run_name, "env": args.env, "engine": args.engine, "device": args.device, "instances": len(engines),
        "router": args.router, "batches": args.batches, "trajectories": len(trajectories), "generated_tokens": generated,
        "tokens_per_s": generated / wall if wall > 0 else 0.0, "wall_s": wall,
        "solved_fraction": sum(t.reward > 0 for t in trajectories) / len(trajectories),
        "migrations": sum(r.migrations for r in results),
        "migrated_tokens": sum(t.migrated_tokens for t in trajectories),
        "context_tokens": sum(turn.context_tokens for t in trajectories for turn in t.turns),
        "prefill_tokens": sum(r.prefill_tokens for r in results),
        "turns_mean": sum(len(t.turns) for t in trajectories) / len(trajectories),
        "length_p50": quantile(lengths, 0.5), "length_p90": quantile(lengths, 0.9),
        "makespan_s": [r.wall_s for r in results],
    }


def render(s: dict[str, Any]) -> str:
    return "\n".join([
        f"{s['env']}: {s['trajectories']} trajectories on {s['instances']} {s['engine']} instance(s) ({s['device']}), "
        f"router {s['router']} "
        f"(buckets {s['buckets']})",
        f"generated {s['generated_tokens']:,} tokens in {s['wall_s']:.1f} s: {s['tokens_per_s']:.0f} tokens/s",
        f"solved {s['solved_fraction']:.1%}; {s['turns_mean']:.1f} turns per trajectory; tokens after the prompt "
        f"p50 {s['length_p50']}, p90 {s['length_p90']}; {s['migrations']} migrations ({s['migrated_tokens']:,} tokens "
        "re-prefilled)",
        f"prompt tokens computed {s['prefill_tokens']:,} of {s['context_tokens']:,} submitted over all turns "
        f"({1 - s['prefill_tokens'] / max(s['context_tokens'], 1):.0%} found in the prefix cache)",
        f"store run {s['run']!r}: libra query --run {s['run']} --named tool_statistics",
    ])


def track(summary: dict[str, Any], args: argparse.Namespace, config: LibraConfig) -> str:
    from flows.runtime import prepare_runtime

    prepare_runtime(config)
    from tasks.tracking_tasks import log_run

    params = {k: summary[k] for k in ("env", "engine", "device", "instances", "router", "batches")} | {
        "prompts": args.prompts, "samples": args.samples, "buckets": summary["buckets"]}
    metrics = {k: float(summary[k]) for k in ("tokens_per_s", "solved_fraction", "migrations", "migrated_tokens",
                                              "generated_tokens", "prefill_tokens", "wall_s")}
    return log_run(f"{config.tracking.experiment_prefix}-rollout", config.tracking.artifact_root, summary["run"],
                   params, metrics)
