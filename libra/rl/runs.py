"""A training run's directory: who may train it (one process, locked), and what a resumed run must
share with the run it continues (the configuration's digest)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TextIO

from libra.config import LibraConfig
from libra.errors import LibraError


def config_digest(config: LibraConfig) -> str:
    """What a resumed run must share with the run it continues: what it trains on and how (the
    environment, the policy, the rollout, the trainer's settings), not where files go or how they
    are written, how often it is evaluated or kept, nor its step count (a run may be extended;
    with a cosine schedule the count shapes the learning rate, so it counts there)."""
    rollout = config.rollout.model_dump(mode="json")
    rollout.pop("tool_threads")
    trainer = config.trainer.model_dump(mode="json")
    for key in ("run", "eval_every", "checkpoint_dir", "keep_checkpoints") + (("steps",) if config.trainer.schedule != "cosine" else ()):
        trainer.pop(key)
    if trainer["layout"] == "fixed":  # the default, which runs from before layouts were planned left out
        trainer.pop("layout")
    trainer["policy"] = str(Path(config.trainer.policy).resolve())
    data = {"run": config.trainer.run_name(), "rollout": rollout, "trainer": trainer,
            "scheduler": config.scheduler.model_dump(mode="json"), "placement": config.placement.policy}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def hold_run(root: Path) -> TextIO:
    """Lock the run's checkpoint directory for this process (the kernel releases it if the process
    dies); a second process training the same run is refused."""
    root.mkdir(parents=True, exist_ok=True)
    handle = (root / ".lock").open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise LibraError(f"run {root.name!r} is being trained by another process (pid {holder}); wait for it, or "
                         "train another run (trainer.run)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def clear_run(root: Path) -> None:
    """Remove a locked run's checkpoints (it trains again from the policy)."""
    for entry in root.iterdir():
        if entry.name != ".lock":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def check_policy(config: LibraConfig) -> Path:
    """The run's initial policy, refused with what to do when it is missing or shorter than the
    rollout's context."""
    policy = Path(config.trainer.policy)
    if not (policy / "config.json").is_file():
        raise LibraError(f"no policy in {policy}: run `libra policy init --out {policy}` (or set trainer.policy to an "
                         "HF-format checkpoint)")
    positions = json.loads((policy / "config.json").read_text()).get("max_position_embeddings")
    if positions and config.rollout.max_context > positions:
        raise LibraError(f"rollout.max_context {config.rollout.max_context} is more than the policy's {positions} "
                         f"positions; set it to at most {positions}")
    return policy
