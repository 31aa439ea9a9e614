"""What the elastic pool trains: a `TrainTask` builds the model and optimizer, produces each step's
global batch, and computes the summed loss of a shard. Every replica builds the same task from the
same seed, so core ranks and hybrids start identical and draw the same batch for a step.

`RegressionTask` is a small multi-layer perceptron on a seeded synthetic regression problem, with
AdamW (so optimizer state matters when a hybrid joins). A real RL trainer implements the same four
methods around its policy and the step's trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


class TrainTask(Protocol):
    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]: ...

    def batch(self, step: int, rows: range | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's global batch (inputs, targets), or only its `rows` (a replica's shard)."""
        ...

    def loss_sum(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    @property
    def batch_size(self) -> int: ...


@dataclass(frozen=True)
class RegressionTask:
    """y = tanh(x W*) + noise, fitted by an MLP `dim -> hidden -> ... -> dim` with AdamW."""

    dim: int = 16
    hidden: int = 64
    layers: int = 2
    global_batch: int = 32
    lr: float = 1e-3
    seed: int = 0
    dtype: str = "float32"

    @property
    def batch_size(self) -> int:
        return self.global_batch

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "float64": torch.float64}[self.dtype]

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(self.seed)
        width = [self.dim] + [self.hidden] * self.layers + [self.dim]
        blocks: list[nn.Module] = []
        for i in range(len(width) - 1):
            blocks.append(nn.Linear(width[i], width[i + 1]))
            if i < len(width) - 2:
                blocks.append(nn.Tanh())
        model = nn.Sequential(*blocks).to(self.torch_dtype)
        return model, torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=0.01)

    @property
    def parameters(self) -> int:
        width = [self.dim] + [self.hidden] * self.layers + [self.dim]
        return sum(width[i] * width[i + 1] + width[i + 1] for i in range(len(width) - 1))

    def batch(self, step: int, rows: range | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        teacher = torch.Generator().manual_seed(self.seed + 7)
        w = torch.randn(self.dim, self.dim, generator=teacher, dtype=torch.float64) / self.dim ** 0.5
        x = torch.randn(self.global_batch, self.dim, generator=g, dtype=torch.float64)
        noise = torch.randn(self.global_batch, self.dim, generator=g, dtype=torch.float64)
        if rows is not None:  # the same draws; only the shard's targets are computed
            x, noise = x[rows.start:rows.stop], noise[rows.start:rows.stop]
        y = torch.tanh(x @ w) + 0.01 * noise
        return x.to(self.torch_dtype), y.to(self.torch_dtype)

    def loss_sum(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ((model(inputs) - targets) ** 2).mean(dim=1).sum()
