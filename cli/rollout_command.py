"""`libra policy init` (build the local policy) and `libra rollout`, which parses its flags and calls
the rollout flow (`flows/rollout.py`): agentic rollouts on real engines, routed across instances,
recorded in the store and MLflow."""

from __future__ import annotations

import argparse
import json
from typing import Any

from libra.config import LibraConfig, TrainerConfig

DEFAULT_POLICY = TrainerConfig.model_fields["policy"].default  # .libra/policy


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    policy = sub.add_parser("policy", help="build the local policy model",
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
    tune = policy_sub.add_parser("tune", parents=[parent], help="continue a policy's supervision on one environment",
                                 description="Continue the supervised training of a built policy on one environment's "
                                 "expert demonstrations (fresh tasks, each seen once): the stage an RL run starts from "
                                 "when the warm start cannot yet earn the reward. The shipped policy tuned on math ships "
                                 "too, and is copied when the base and settings are the default.")
    tune.add_argument("--env", help="search, math or repo (default math)")
    tune.add_argument("--base", default=DEFAULT_POLICY, help=f"the policy to tune (default {DEFAULT_POLICY})")
    tune.add_argument("--out", help="the tuned policy's directory (default: the base's, suffixed -ENV)")
    tune.add_argument("--demos", type=int, help="demonstrations (default 4800)")
    tune.add_argument("--batch", type=int, help="demonstrations per update (default 64)")
    tune.add_argument("--lr", type=float, help="learning rate, constant (default 1e-3)")
    tune.add_argument("--held-out", type=int, help="leave out the problems of this many held-out tasks, the ones a "
                      "training run evaluates on (default 1024)")
    tune.add_argument("--rebuild", action="store_true", help="tune again even when OUT or the shipped tuned policy "
                      "was tuned from the same weights with the same settings")
    tune.set_defaults(handler=cmd_policy_tune)

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
    from cli.progress import progress
    from flows.policy import build_policy, policy_settings
    from libra.checks import as_flag

    settings = policy_settings(args.steps, args.demos, names=as_flag)
    with progress("training the policy") as bar:
        record = build_policy(args.out, settings, config.sandbox, args.rebuild, log=bar.echo,
                              progress=lambda done, steps, loss: bar.update(done, steps, f"loss {loss:.3f}"))
    print(f"policy in {args.out}: {record['parameters']:,} parameters, {record['demonstrations']} demonstrations, "
          f"final loss {record['final_loss']:.3f}, built in {record['train_s']:.0f} s")
    return 0


def cmd_policy_tune(args: argparse.Namespace, config: LibraConfig) -> int:
    from pathlib import Path

    from cli.progress import progress
    from flows.policy import tune, tune_settings
    from libra.checks import as_flag
    from libra.rollout.policy import tuned_dir

    settings = tune_settings(args.env, args.demos, args.lr, args.batch, args.held_out, names=as_flag)
    base = Path(args.base)
    out = Path(args.out) if args.out else tuned_dir(base, settings.env)
    with progress("tuning the policy") as bar:
        record = tune(out, base, settings, config.sandbox, args.rebuild, log=bar.echo,
                      progress=lambda done, updates, loss: bar.update(done, updates, f"loss {loss:.3f}"))
    print(f"policy in {out}: {base} after {record['demonstrations']} {settings.env} demonstrations in "
          f"{settings.updates} updates, final loss {record['final_loss']:.3f}, tuned in {record['train_s']:.0f} s")
    return 0


def cmd_rollout(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.flow_call import run_flow
    from cli.streams import json_stdout
    from flows.rollout import rollout_flow, rollout_request
    from libra.checks import as_flag
    from libra.rollout.workroots import check_workdirs
    from storage.writer import ANOTHER, refuse_existing

    request = rollout_request(args.env, args.prompts, args.samples, args.batches, args.engine, args.instances,
                              args.device, args.router, args.buckets, args.policy, args.temperature, args.max_turns,
                              args.seed, args.run, config.rollout, names=as_flag)
    refuse_existing(config.store.root, request.run, ANOTHER)  # before the engines start
    check_workdirs(config.sandbox, request.prompts * request.samples)
    with json_stdout(args.json) as out:
        summary = run_flow(rollout_flow, config, tracking=not args.no_track, env=request.env, prompts=request.prompts,
                           samples=request.samples, batches=request.batches, engine=request.engine,
                           instances=request.instances, device=request.device, router=request.router,
                           buckets=args.buckets, policy=request.policy, temperature=request.temperature,
                           max_turns=request.max_turns, seed=request.seed, run=request.run, track=not args.no_track)
        print(json.dumps(summary) if args.json else render(summary), file=out)
    return 0


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


