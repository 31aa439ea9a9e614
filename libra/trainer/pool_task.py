"""The GRPO update as the elastic pool's training task: hybrids train the policy beside the core
ranks as extra data-parallel replicas, with the trainer's own step (`step.GRPOStep`) and update
(`trainer.take_update`).

A step's samples reach every replica as one file, written by whoever scores the step's rollout
(`write_step`): a JSON list of `TrainingSample` records under a temporary name, then renamed, so a
replica never reads half a step. A replica that needs a step not written yet waits for it (up to
`wait_s`). Each replica sums the per-token GRPO loss of its shard and reports its policy-token count
with the loss's token sums (`step.TALLIES`); the pool divides the summed gradient by the step's
total, which is the token mean the trainer takes over the whole step in one process.

With a `publish_dir`, core rank 0 publishes the state after each update (`publish`): the weights in
HF form, the optimizer state and the update's statistics, in `update-<version>/` written under a
temporary name and renamed, so a live run (`libra.trainer.pooled.PooledTrainer`) reads whole ones.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from libra.clock import Stopwatch, WallClock, sleep
from libra.config import TrainerConfig
from libra.files import replacing
from libra.optim import make_optimizer
from libra.pools.task import Reduced, Shard
from libra.trainer.samples import MicroBatch, TrainingSample, micro_batches
from libra.trainer.step import TALLIES, Forward, GRPOStep, hf_logits
from libra.trainer.trainer import AppliedUpdate, load_policy, load_reference, take_update, update_stats

PUBLISHED_KEPT = 2  # published updates kept: the newest, and the one a reader may still be copying


def step_path(steps_dir: str | Path, step: int) -> Path:
    return Path(steps_dir) / f"step-{step:06d}.json"


def write_step(steps_dir: str | Path, step: int, samples: list[TrainingSample]) -> Path:
    """Publish step `step`'s samples to the replicas (atomically)."""
    path = step_path(steps_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as f:
        f.write(json.dumps([asdict(s) for s in samples]).encode())
    return path


@lru_cache(maxsize=4)
def _read(path: str) -> tuple[TrainingSample, ...]:
    rows = json.loads(Path(path).read_text())
    return tuple(TrainingSample(**{k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}) for row in rows)


def read_step(steps_dir: str | Path, step: int, wait_s: float = 0.0, poll_s: float = 0.05) -> tuple[TrainingSample, ...]:
    """Step `step`'s samples, waiting up to `wait_s` for them to be published."""
    path = step_path(steps_dir, step)
    waited = Stopwatch()
    while not path.exists():
        if waited.seconds() >= wait_s:
            raise FileNotFoundError(f"step {step}'s samples are not published ({path.name} in {steps_dir}) after "
                                    f"{wait_s:.0f} s; the rollout that produces them must call write_step")
        sleep(WallClock(), poll_s)
    return _read(str(path))


@lru_cache(maxsize=2)
def _reference(policy_dir: str, device: str) -> nn.Module:
    return load_reference(policy_dir, torch.device(device))


def published_path(publish_dir: str | Path, version: int) -> Path:
    """Where the state after update `version` (counted from the run's start) is published."""
    return Path(publish_dir) / f"update-{version:06d}"


@dataclass(frozen=True)
class GRPOTask:
    """`policy_dir`: the weights every replica starts from; `first_update`: updates they have had
    already (the learning-rate schedule's position, for a resumed run), with the optimizer state
    saved at `optimizer_path` (torch.save of its state dict; empty: a fresh optimizer);
    `reference_dir`: the KL term's frozen reference (empty: `policy_dir`); `publish_dir`: where core
    rank 0 publishes each update (empty: nowhere)."""

    policy_dir: str
    trainer: TrainerConfig
    steps_dir: str
    temperature: float = 1.0
    first_update: int = 0
    wait_s: float = 600.0
    reference_dir: str = ""
    optimizer_path: str = ""
    publish_dir: str = ""
    tallies: ClassVar[tuple[str, ...]] = (*TALLIES, "padded_tokens")

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(self.trainer.seed)
        model = load_policy(self.policy_dir, torch.device("cpu"))
        optimizer = make_optimizer(model.parameters(), self.trainer.lr, self.trainer.weight_decay)
        if self.optimizer_path:
            optimizer.load_state_dict(torch.load(self.optimizer_path, weights_only=False))
        return model, optimizer

    def samples(self, step: int) -> tuple[TrainingSample, ...]:
        return read_step(self.steps_dir, step, self.wait_s)

    def step_size(self, step: int) -> int:
        return len(self.samples(step))

    def accumulate(self, model: nn.Module, step: int, rows: range) -> Shard:
        mine = self.samples(step)[rows.start:rows.stop]
        device = next(model.parameters()).device
        reference = _reference(self.reference_dir or self.policy_dir, str(device)) if self.trainer.wants_reference else None
        grpo = GRPOStep(self.trainer, self.temperature, device, reference)
        grpo.run(micro_batches(mine, self.trainer.micro_batch_tokens), self.pad(model), self.forward(model, device))
        return Shard(float(sum(s.policy_tokens for s in mine)), (*(float(v) for v in grpo.sums), float(grpo.padded)))

    def pad(self, model: nn.Module) -> int:
        """The token a micro-batch's shorter sequences are padded with."""
        return int(getattr(model.config, "pad_token_id", None) or 0)

    def forward(self, model: nn.Module, device: torch.device) -> Forward:
        """The replica's forward pass: the HF model's temperature-scaled logits."""

        def logits(batch: MicroBatch) -> torch.Tensor:
            return hf_logits(model, batch, self.temperature, device)

        return logits

    def update(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> AppliedUpdate:
        return take_update(model, optimizer, self.trainer, self.first_update + step)

    def save_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """The weights in HF form (safetensors and config) and `optimizer.pt`, the torch trainer's
        optimizer state dict, into `directory`."""
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the pool process's stderr is the run's
        model.save_pretrained(directory, safe_serialization=True)
        torch.save(optimizer.state_dict(), directory / "optimizer.pt")

    def publish(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, reduced: Reduced,
                hybrids: int, applied: AppliedUpdate) -> None:
        """The state after pool step `step` as `update-<first_update + step + 1>/`: `model.safetensors`
        and `config.json` (HF), `optimizer.pt`, and `update.json` (the update's statistics, with the
        hybrids whose shards made it); older ones beyond `PUBLISHED_KEPT` are removed."""
        if not self.publish_dir:
            return
        version = self.first_update + step + 1
        final = published_path(self.publish_dir, version)
        partial = final.with_name(f".{final.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.save_state(model, optimizer, partial)
        stats = update_stats(reduced.tallies[:-1], reduced.weight, self.step_size(step), int(reduced.tallies[-1]),
                             applied, 0.0, hybrids)
        (partial / "update.json").write_text(json.dumps({"version": version, "stats": asdict(stats)}))
        os.replace(partial, final)
        for old in sorted(Path(self.publish_dir).glob("update-*"))[:-PUBLISHED_KEPT]:
            shutil.rmtree(old, ignore_errors=True)
