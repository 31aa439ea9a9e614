"""The GRPO update as the elastic pool's training task: hybrids train the policy beside the core
ranks as extra data-parallel replicas, with the trainer's own loss (`trainer.token_losses`) and
update (`trainer.take_update`).

A step's samples reach every replica as one file, written by whoever scores the step's rollout
(`write_step`): a JSON list of `TrainingSample` records under a temporary name, then renamed, so a
replica never reads half a step. A replica that needs a step not written yet waits for it (up to
`wait_s`). Each replica sums the per-token GRPO loss of its shard and reports its policy-token count;
the pool divides the summed gradient by the step's total, which is the token mean the trainer takes
over the whole step in one process.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from libra.config import TrainerConfig
from libra.trainer.optim import make_optimizer
from libra.trainer.samples import TrainingSample, collate, micro_batches
from libra.trainer.trainer import load_policy, load_reference, take_update, token_losses


def step_path(steps_dir: str | Path, step: int) -> Path:
    return Path(steps_dir) / f"step-{step:06d}.json"


def write_step(steps_dir: str | Path, step: int, samples: list[TrainingSample]) -> Path:
    """Publish step `step`'s samples to the replicas (atomically)."""
    path = step_path(steps_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([asdict(s) for s in samples]))
    os.replace(tmp, path)
    return path


@lru_cache(maxsize=4)
def _read(path: str) -> tuple[TrainingSample, ...]:
    rows = json.loads(Path(path).read_text())
    return tuple(TrainingSample(**{k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}) for row in rows)


def read_step(steps_dir: str | Path, step: int, wait_s: float = 0.0, poll_s: float = 0.05) -> tuple[TrainingSample, ...]:
    """Step `step`'s samples, waiting up to `wait_s` for them to be published."""
    path = step_path(steps_dir, step)
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() >= deadline:
            raise FileNotFoundError(f"step {step}'s samples are not published ({path.name} in {steps_dir}) after "
                                    f"{wait_s:.0f} s; the rollout that produces them must call write_step")
        time.sleep(poll_s)
    return _read(str(path))


@lru_cache(maxsize=2)
def _reference(policy_dir: str, device: str) -> nn.Module:
    return load_reference(policy_dir, torch.device(device))


@dataclass(frozen=True)
class GRPOTask:
    """`policy_dir`: the weights every replica starts from; `first_update`: updates they have had
    already (the learning-rate schedule's position, for a resumed run)."""

    policy_dir: str
    trainer: TrainerConfig
    steps_dir: str
    temperature: float = 1.0
    first_update: int = 0
    wait_s: float = 600.0

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(self.trainer.seed)
        model = load_policy(self.policy_dir, torch.device("cpu"))
        return model, make_optimizer(model.parameters(), self.trainer.lr, self.trainer.weight_decay)

    def samples(self, step: int) -> tuple[TrainingSample, ...]:
        return read_step(self.steps_dir, step, self.wait_s)

    def step_size(self, step: int) -> int:
        return len(self.samples(step))

    def accumulate(self, model: nn.Module, step: int, rows: range) -> float:
        mine = self.samples(step)[rows.start:rows.stop]
        device = next(model.parameters()).device
        reference = _reference(self.policy_dir, str(device)) if self.trainer.kl_coef > 0 else None
        pad = int(getattr(model.config, "pad_token_id", None) or 0)
        for group in micro_batches(mine, self.trainer.micro_batch_tokens):
            batch = collate(group, pad)
            terms = token_losses(model, reference, batch, self.trainer, self.temperature, device)
            (terms.per_token * batch.mask.to(device)).sum().backward()
        return float(sum(s.policy_tokens for s in mine))

    def update(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        take_update(model, optimizer, self.trainer, self.first_update + step)
