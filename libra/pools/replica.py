"""One replica's arithmetic in the elastic pool: the payload it contributes to a step's all-reduce
(the summed gradient of its shard and the shard's weight), the mean update every replica applies,
and a generation's process group.

A step: every replica computes the summed loss gradient of its shard of the step's global batch and
the shard's weight (what the task's loss sums over: samples, or GRPO's policy tokens;
`batching.shards`; a replica that is not active contributes zeros and a zero weight), the gradients
and weights are summed by one all-reduce, and every replica applies `sum / weight` through the
task's own optimizer step, so all replicas stay identical.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from libra.pools.batching import shards
from libra.pools.control import Control
from libra.pools.spec import WorkerSpec
from libra.pools.task import Reduced, Report, TrainTask


def shard_payload(task: TrainTask, model: nn.Module, step: int, shard: range | None) -> torch.Tensor:
    """[summed loss gradient of the shard..., its weight, the task's tallies...] on the model's
    device; zeros for a replica without a shard. The weight is what the task's sum is over (samples,
    or GRPO's policy tokens)."""
    params = [p for p in model.parameters()]
    dtype, device = params[0].dtype, params[0].device
    if shard is None or len(shard) == 0:
        size = sum(p.numel() for p in params)
        return torch.zeros(size + 1 + len(task.tallies), dtype=dtype, device=device)
    model.zero_grad(set_to_none=True)
    summed = task.accumulate(model, step, shard)
    if len(summed.tallies) != len(task.tallies):
        raise ValueError(f"the task reported {len(summed.tallies)} tallies; it names {len(task.tallies)}: {task.tallies}")
    grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=dtype, device=device)
             for p in params]
    return torch.cat(grads + [torch.tensor([summed.weight, *summed.tallies], dtype=dtype, device=device)])


def step_payload(task: TrainTask, model: nn.Module, step: int, active: list[str], me: str) -> torch.Tensor:
    """`me`'s payload for `step` when `active` replicas (rank order) share the batch; zeros if `me`
    is not among them."""
    return shard_payload(task, model, step, shards(task.step_size(step), active).get(me))


def apply_update(task: TrainTask[Report], model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                 update: torch.Tensor) -> Report:
    """Load step `step`'s mean gradient `update` into the parameters' grads (copies: the update stays
    as it was, for the log that joining hybrids replay) and let the task take the optimizer step;
    returns what the task's step reports."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = update[offset:offset + n].view_as(p).clone()
        offset += n
    return task.update(model, optimizer, step)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def mean_update(task: TrainTask, payload: torch.Tensor) -> Reduced:
    """The summed gradient over the summed weight (a zero gradient when nothing had weight: a GRPO
    step without policy tokens, as the trainer's token mean), with the weight and the tallies."""
    tail = 1 + len(task.tallies)
    grads, (weight, *tallies) = payload[:-tail], payload[-tail:].tolist()
    update = grads / weight if weight > 0 else torch.zeros_like(grads)
    return Reduced(update, weight, tuple(tallies))


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """References to the weights and optimizer state (copy them before the next optimizer step)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def generation_group(control: Control, spec: WorkerSpec, gen: int, rank: int, size: int) -> dist.ProcessGroup:
    """Generation `gen`'s group: its own communicator (gloo or NCCL), apart from the core group."""
    store = dist.PrefixStore(f"gen/{gen}", control.store)
    timeout = timedelta(seconds=spec.group_timeout_s)
    if spec.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)
