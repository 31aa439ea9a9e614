"""What the elastic pool trains: a `TrainTask` builds the model and optimizer, says how many samples
a step's global batch holds, accumulates the gradient of a shard's summed loss (and says how many
units the sum is over: samples, or policy tokens for GRPO, with any other sums the task reports about
its loss: its `tallies`), and takes the optimizer step once the mean gradient is in place; after
each step core rank 0 lets it `publish` the state (for whoever drives the run step by step). Every
replica builds the same task from the same seed, so core ranks and hybrids start identical and see
the same batch for a step.

`RegressionTask` is a small multi-layer perceptron on a seeded synthetic regression problem, with
AdamW (so optimizer state matters when a hybrid joins). `libra.trainer.pool_task.GRPOTask` is the
policy trainer's GRPO update on the run's trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """What a replica's shard of a step sums over (`weight`: samples or policy tokens) and the task's
    other sums over it (one per name in the task's `tallies`), summed over the replicas with the
    gradient."""

    weight: float
    tallies: tuple[float, ...] = ()


@dataclass(frozen=True)
class Reduced:
    """A step summed over its replicas: the mean gradient, the total weight, the task's tallies."""

    update: torch.Tensor
    weight: float
    tallies: tuple[float, ...]


Report = TypeVar("Report")  # what a task's optimizer step reports, handed back to its `publish`


class TrainTask(Protocol[Report]):
    tallies: ClassVar[tuple[str, ...]]  # names of the sums `accumulate` reports beside the weight

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]: ...

    def step_size(self, step: int) -> int:
        """Samples in the step's global batch (what the replicas' shards divide)."""
        ...

    def accumulate(self, model: nn.Module, step: int, rows: range) -> Shard:
        """Add the gradient of the summed loss of the step's samples `rows` into the parameters'
        grads (on the model's device); return how many units the sum is over, and the tallies."""
        ...

    def update(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> Report:
        """Step `step`'s mean gradient is in the parameters' grads: take the optimizer step; return
        what the step reports (handed to `publish`; GRPO: its learning rate and gradient norm)."""
        ...

    def publish(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, reduced: Reduced,
                hybrids: int, applied: Report) -> None:
        """Step `step` is applied (`reduced`: what its replicas summed; `hybrids`: how many of them were
        hybrids; `applied`: what `update` reported): make the state after it available to whoever
        drives the run step by step (core rank 0 calls this)."""
        ...


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
    tallies: ClassVar[tuple[str, ...]] = ()

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

    def step_size(self, step: int) -> int:
        return self.global_batch

    def accumulate(self, model: nn.Module, step: int, rows: range) -> Shard:
        inputs, targets = self.batch(step, rows)
        device = next(model.parameters()).device
        self.loss_sum(model, inputs.to(device), targets.to(device)).backward()
        return Shard(float(len(rows)))

    def update(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        optimizer.step()

    def publish(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, reduced: Reduced,
                hybrids: int, applied: None) -> None:
        """Nothing: the pool's result (its final snapshot and step log) is this task's outcome."""
