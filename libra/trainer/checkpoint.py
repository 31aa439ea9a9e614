"""Checkpoints of a training run, written atomically.

    <root>/step-000007/        the state after 7 completed iterations
        config.json, model.safetensors, tokenizer files   an HF-format policy (usable as --policy)
        state.json             `CheckpointState`: step, weights version, config digest, MLflow run id
        <name>.pt              blobs: optimizer state, RNG states, the batch rolled out ahead, ...
    <root>/LATEST              the name of the newest complete checkpoint

A checkpoint is written under a temporary name, every file fsynced, then renamed into place, and
only then is LATEST replaced (os.replace) to name it. A process killed at any point leaves LATEST
naming a complete checkpoint (or no LATEST at all); leftovers of the killed write are removed by
the next write. The newest `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from libra.errors import LibraError
from libra.files import fsync_path as _fsync

LATEST = "LATEST"


@dataclass(frozen=True)
class CheckpointState:
    run: str
    step: int  # iterations completed (the next one to run)
    version: int  # updates applied to the weights
    config_digest: str  # the run's configuration, hashed: a resume under another config is refused
    mlflow_run_id: str = ""
    summary: dict[str, Any] = field(default_factory=dict)  # small JSON values (held-out rewards so far, ...)


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def save_checkpoint(root: str | Path, state: CheckpointState, write_weights: Callable[[Path], None],
                    blobs: Mapping[str, object], copy_from: str | Path | None = None, keep: int = 2) -> Path:
    """Write the checkpoint of `state.step`; `write_weights(dir)` writes the HF weights, `copy_from`
    names a directory whose tokenizer files are copied beside them. Returns its directory."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("*.partial-*"):  # a killed write's leftovers
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    final = root / checkpoint_name(state.step)
    partial = root / f"{final.name}.partial-{os.getpid()}"
    partial.mkdir()
    write_weights(partial)
    if copy_from is not None:
        for file in Path(copy_from).iterdir():
            if file.is_file() and (file.name.startswith("tokenizer") or file.name in ("special_tokens_map.json", "vocab.json", "merges.txt")):
                shutil.copy2(file, partial / file.name)
    for name, blob in blobs.items():
        torch.save(blob, partial / f"{name}.pt")
    (partial / "state.json").write_text(json.dumps(asdict(state), indent=2, sort_keys=True))
    for file in partial.iterdir():
        _fsync(file)
    _fsync(partial)  # its entries, before it is renamed into place
    if final.exists():  # written before by a run killed before LATEST named it
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync(root)
    pointer = root / f"{LATEST}.partial-{os.getpid()}"
    pointer.write_text(final.name + "\n")
    _fsync(pointer)
    os.replace(pointer, root / LATEST)
    _fsync(root)
    complete = sorted(p for p in root.glob("step-*") if p.is_dir() and ".partial-" not in p.name)
    for old in complete[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    path = Path(root) / name
    if not name.startswith("step-") or not (path / "state.json").is_file():
        raise LibraError(f"{pointer} names {name!r}, which is not a complete checkpoint; remove {root} to start the run over")
    return path


def load_state(path: str | Path) -> CheckpointState:
    return CheckpointState(**json.loads((Path(path) / "state.json").read_text()))


def load_blob(path: str | Path, name: str) -> object:
    """The object saved as `name` (None where the checkpoint has none); `libra.rl.session.Saved` types them."""
    file = Path(path) / f"{name}.pt"
    return torch.load(file, weights_only=False) if file.exists() else None


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
