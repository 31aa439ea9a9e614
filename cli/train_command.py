"""`libra train`: GRPO training of the local policy as Prefect flows (the main job, `make run`).

The command checks its flags (as the flow checks its parameters) and calls `flows.train.train_flow`,
which builds the local policy when the config names the default one and it is missing; it prints a
line per iteration and a summary. Run
again after a kill, it continues from the last completed iteration; run again after it finished, it
reports the finished run (pass --restart to train it again from the policy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cli.renamed import RenamedFlag
from libra.config import LibraConfig
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser("train", parents=[parent], help="train the policy with GRPO (the main job)",
                         description="Train the policy with GRPO on an environment's tasks: each iteration is a "
                         "Prefect flow of rollout (vLLM or transformers engines, real sandboxed tools), reward, update "
                         "and weight sync; every trajectory and turn goes to the store, every step to MLflow, and every "
                         "iteration is checkpointed. Re-run the same command after a kill to continue the run.")
    cmd.add_argument("--steps", type=int, help="iterations (overrides trainer.steps)")
    cmd.add_argument("--run", help="run name (overrides trainer.run)")
    cmd.add_argument("--placement", choices=("none", "libra", "static", "colocated"),
                     help="where rollout and training run (overrides placement.strategy): libra re-plans from the run's "
                     "statistics, static keeps the initial split, colocated takes turns on every worker")
    cmd.add_argument("--policy", dest="placement", action=RenamedFlag, new="--placement",
                     choices=("none", "libra", "static", "colocated"))
    cmd.add_argument("--trainer", choices=("torch", "megatron"),
                     help="the training backend (overrides trainer.backend; megatron's layout is trainer.tp/pp/dp, or the "
                          "planner's with trainer.layout: planned)")
    cmd.add_argument("--restart", action="store_true", help="train the run again from the initial policy, replacing it")
    cmd.add_argument("--json", action="store_true", help="end with one JSON line instead of the summary")
    cmd.set_defaults(handler=cmd_train)


def with_overrides(config: LibraConfig, args: argparse.Namespace) -> LibraConfig:
    """The config with the flags in place, checked as the flow checks it (`flows.train.training_config`),
    the flags named as given."""
    from flows.train import training_config

    try:
        return training_config(config, args.steps, args.run, None, getattr(args, "placement", None),
                               backend=getattr(args, "trainer", None), restart=getattr(args, "restart", False))
    except LibraError as exc:
        raise LibraError(str(exc).replace("trainer.steps", "--steps").replace("trainer.run", "--run")
                         .replace("trainer.backend", "--trainer")) from None


def cmd_train(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    with json_stdout(args.json) as out:
        summary = train(with_overrides(config, args), args.restart, quiet=args.json)
        print(json.dumps(summary) if args.json else render(summary), file=out)
    return 0


def train(config: LibraConfig, restart: bool, quiet: bool) -> dict[str, Any]:
    from cli.flow_call import run_flow
    from cli.progress import progress
    from flows.train import train_flow

    listeners = () if quiet else (_progress_line(config.trainer.steps),)
    with progress("building the local policy", quiet=quiet) as bar:
        def built(done: int, steps: int, loss: float) -> None:
            bar.update(done, steps, f"loss {loss:.3f}")
            if done >= steps:
                bar.close()  # its own line, before the iterations' lines

        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # loading and saving weights every iteration: no bars
        result = run_flow(train_flow, config, restart=restart, listeners=listeners, policy_progress=built)
    return summarize(result, config)


def _progress_line(steps: int):
    width = len(str(steps))

    def line(record) -> None:
        m = record.metrics()
        s = record.seconds
        heldout = f"  held-out {record.heldout_reward:.3f}" if record.heldout_reward is not None else ""
        print(f"step {record.step + 1:{width}d}/{steps}  reward {m['reward']:.3f}  {m['tokens_per_s']:6.0f} tokens/s  "
              f"rollout {record.batch.stats.wall_s:5.1f} s  train {s['train']:5.1f} s  "
              f"sync {s['sync']:4.1f} s  step {s['iteration']:5.1f} s{heldout}", file=sys.stderr, flush=True)
    return line


def summarize(result: dict[str, Any], config: LibraConfig) -> dict[str, Any]:
    state = result["state"]
    heldout = {int(v): r for v, r in state.get("heldout", {}).items()}
    elapsed = float(state.get("elapsed_s", 0.0))
    return {
        "run": result["run"], "env": config.trainer.env, "steps": result["step"], "resumed_at": result["resumed_at"],
        "reward_start": heldout.get(0), "reward_end": heldout[max(heldout)] if heldout else None,
        "heldout": {str(v): heldout[v] for v in sorted(heldout)},
        "tokens_per_s": state.get("generated_tokens", 0) / elapsed if elapsed > 0 else 0.0, "train_s": elapsed,
        "mlflow_run_id": result["mlflow_run_id"], "checkpoint": result["checkpoint"],
        "tracking_uri": os.environ.get("MLFLOW_TRACKING_URI", ""), "store": config.store.root,
    }


def render(s: dict[str, Any]) -> str:
    if s["resumed_at"] >= s["steps"]:
        resumed = " (finished before; --steps N extends it, --restart trains it again)"
    else:
        resumed = f" (continued from step {s['resumed_at']})" if s["resumed_at"] else ""
    lines = [f"run {s['run']!r} on {s['env']}: {s['steps']} steps{resumed}, {s['train_s']:.0f} s of training, "
             f"{s['tokens_per_s']:.0f} generated tokens/s"]
    if s["reward_start"] is not None:
        lines.append(f"held-out reward {s['reward_start']:.3f} -> {s['reward_end']:.3f} "
                     f"(by update: {', '.join(f'{v}: {r:.3f}' for v, r in s['heldout'].items())})")
    lines += [f"checkpoint: {s['checkpoint']}",
              f"MLflow: mlflow ui --backend-store-uri {s['tracking_uri']}   (run {s['mlflow_run_id']})",
              f"DuckDB: libra query --store {s['store']} --run {s['run']} --named reward_by_step"]
    return "\n".join(lines)
