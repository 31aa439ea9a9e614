"""The project's one optimizer and learning-rate schedule: the policy's supervised warm start and
the RL trainer both use them.

    lr(step) = base * min(1, (step + 1) / warmup) * shape(step)

`shape` is 1 for a constant schedule and 0.5 (1 + cos(pi step / total)) for a cosine one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch


def make_optimizer(parameters: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.01,
                   betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, betas=betas)


def learning_rate(step: int, total: int, base: float, warmup: int,
                  schedule: Literal["constant", "cosine"] = "cosine") -> float:
    """The rate for update `step` (from 0) of `total`."""
    if step < 0 or total < 1:
        raise ValueError(f"step {step} of {total}: need step >= 0 and total >= 1")
    ramp = min(1.0, (step + 1) / max(1, warmup))
    shape = 1.0 if schedule == "constant" else 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    return base * ramp * shape


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
