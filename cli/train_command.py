"""`libra train`: GRPO training of the local policy as Prefect flows (the main job, `make run`).

The command checks its input, builds the local policy when the config names the default one and it
is missing, then runs `flows.train.train_flow` and prints a line per iteration and a summary. Run
again after a kill, it continues from the last completed iteration; run again after it finished, it
reports the finished run (pass --restart to train it again from the policy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from libra.config import LibraConfig
from libra.errors import LibraError

EXPECTED = (LibraError, OSError, MemoryError, KeyboardInterrupt)


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser("train", parents=[parent], help="train the policy with GRPO (the main job)",
                         description="Train the policy with GRPO on an environment's tasks: each iteration is a "
                         "Prefect flow of rollout (vLLM or transformers engines, real sandboxed tools), reward, update "
                         "and weight sync; every trajectory and turn goes to the store, every step to MLflow, and every "
                         "iteration is checkpointed. Re-run the same command after a kill to continue the run.")
    cmd.add_argument("--steps", type=int, help="iterations (overrides trainer.steps)")
    cmd.add_argument("--run", help="run name (overrides trainer.run)")
    cmd.add_argument("--policy", choices=("none", "libra", "static", "colocated"),
                     help="where rollout and training run (overrides placement.policy): libra re-plans from the run's "
                     "statistics, static keeps the initial split, colocated takes turns on every worker")
    cmd.add_argument("--restart", action="store_true", help="train the run again from the initial policy, replacing it")
    cmd.add_argument("--json", action="store_true", help="end with one JSON line instead of the summary")
    cmd.set_defaults(handler=cmd_train)


def with_overrides(config: LibraConfig, args: argparse.Namespace) -> LibraConfig:
    from pydantic import ValidationError

    from libra.config import describe_validation_error

    trainer = config.trainer.model_dump()
    if args.steps is not None:
        trainer["steps"] = args.steps
    if args.run is not None:
        trainer["run"] = args.run
    placement = config.placement.model_dump()
    if getattr(args, "policy", None) is not None:
        placement["policy"] = args.policy
    try:
        return LibraConfig.model_validate({**config.model_dump(), "trainer": trainer, "placement": placement})
    except ValidationError as exc:
        raise LibraError(describe_validation_error(exc, LibraConfig).replace("trainer.steps", "--steps")
                         .replace("trainer.run", "--run")) from None


def check(config: LibraConfig) -> None:
    """Everything that can be refused before anything is written or started."""
    from libra.scheduler.replay import POLICIES
    from storage.writer import check_run_name

    check_run_name(config.trainer.run_name())
    router = config.rollout.router
    if router not in POLICIES or router == "oracle":
        raise LibraError(f"rollout.router: unknown router {router!r}; routers: {', '.join(p for p in POLICIES if p != 'oracle')}")
    for device, where in ((config.rollout.device, "rollout.device"), (config.trainer.device, "trainer.device")):
        if device == "cuda":
            from libra.devices import gpu_count

            if gpu_count() == 0:
                raise LibraError(f"{where} is cuda, but torch sees no GPU here; set it to cpu")


def ensure_policy(config: LibraConfig, quiet: bool) -> None:
    """Put the local policy in place when the config names the default directory and it holds none
    (the shipped policy is copied; it is built when it does not fit the settings); any other missing
    directory is an error (Libra does not write where it was not asked to)."""
    from pathlib import Path

    from cli.rollout_command import DEFAULT_POLICY

    policy = Path(config.trainer.policy)
    if (policy / "config.json").is_file():
        return
    if policy.resolve() != Path(DEFAULT_POLICY).resolve():
        raise LibraError(f"trainer.policy: no policy in {policy}; build one with `libra policy init --out {policy}`, or "
                         "point trainer.policy at an HF-format checkpoint")
    from cli.progress import progress
    from libra.rollout.policy import PolicySettings, init_policy

    with progress("building the local policy", quiet=quiet) as bar:
        init_policy(policy, PolicySettings(), log=bar.echo if not quiet else lambda _: None,
                    progress=lambda done, steps, loss: bar.update(done, steps, f"loss {loss:.3f}"), sandbox=config.sandbox)


def cmd_train(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout

    with json_stdout(args.json) as out:
        summary = train(with_overrides(config, args), args.restart, quiet=args.json)
        print(json.dumps(summary) if args.json else render(summary), file=out)
    return 0


def train(config: LibraConfig, restart: bool, quiet: bool) -> dict[str, Any]:
    check(config)
    ensure_policy(config, quiet)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up and per-reload warnings would bury the progress
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # likewise the deprecation warnings its worker processes print
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # loading and saving weights every iteration: no bars
    from flows.runtime import held_logs, prepare_runtime, start_prefect

    prepare_runtime(config)
    start_prefect()
    from flows.train import train_flow
    from tasks.train_tasks import LISTENERS

    listener = None if quiet else _progress_line(config.trainer.steps)
    if listener:
        LISTENERS.append(listener)
    try:
        with held_logs(EXPECTED):
            result = train_flow(config, restart)
    finally:
        if listener:
            LISTENERS.remove(listener)
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
