"""The GRPO update as the elastic pool's training task on megatron-core: each replica of the pool
(the core rank, and every hybrid that joins) holds the whole policy as megatron's `GPTModel` (one
process: TP = PP = 1) and is one data-parallel replica; the pool sums the replicas' gradients and
applies the mean, as it does for `GRPOTask`, whose step files, token-weighted shards, tallies and
published updates this task shares. What differs is the model: megatron's layers, its fused
QKV and gate/up weights (converted from the HF policy: `megatron_convert`), its forward pass, and
the conversion back to HF form (weights) and to the torch trainer's layout (AdamW's state) when core
rank 0 publishes an update, so a live run reads a megatron pool's updates as it reads any other's.

Megatron's layers need its parallel state, which needs a default process group: a core rank's is
the pool's core group (the pool joins it before building the task's model); a hybrid, which trains
over groups of its own, joins a group of one (a store in its own memory). Model parallelism inside
a replica (TP or PP > 1) would make a replica several processes, which the pool does not have: a
pooled megatron run trains at TP = PP = 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from libra.errors import LibraError
from libra.optim import make_optimizer
from libra.trainer.layout import Layout
from libra.trainer.megatron_convert import Sharding, to_hf
from libra.trainer.megatron_rank import (
    gpt_model,
    hf_parameter_names,
    load_shard,
    megatron_logits,
    moments_from_hf,
    moments_to_hf,
    positions_and_mask,
    read_architecture,
    read_hf_weights,
    save_hf,
)
from libra.trainer.pool_task import GRPOTask
from libra.trainer.samples import MicroBatch
from libra.trainer.step import Forward

ONE = Sharding(1, 1)


@lru_cache(maxsize=4)
def _architecture(policy_dir: str):
    """The policy's architecture, read once per process (every step's shard and every publish need it)."""
    return read_architecture(policy_dir)


@lru_cache(maxsize=4)
def _hf_order(policy_dir: str) -> list[str]:
    """The HF parameter order of the torch trainer's optimizer layout, built once per process."""
    return hf_parameter_names(policy_dir)


def join_megatron(device: torch.device) -> None:
    """Megatron's parallel state for a one-process replica: the default process group (a group of
    one when the process has none), model parallel 1 x 1, the CPU shims on the CPU."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if device.type != "cpu":
        raise LibraError(f"the pool's megatron task runs on the CPU (pool.device cpu), not {device}")
    from libra.trainer.megatron_cpu import use_cpu

    use_cpu()
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


@dataclass(frozen=True)
class MegatronGRPOTask(GRPOTask):
    """`GRPOTask` with the policy as megatron-core's `GPTModel` in every replica."""

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        device = torch.device("cpu")
        join_megatron(device)
        torch.manual_seed(self.trainer.seed)
        arch = _architecture(self.policy_dir)
        model, _ = gpt_model(arch, Layout(), device)
        load_shard(model, read_hf_weights(self.policy_dir), arch, ONE, 0, 0)
        optimizer = make_optimizer(model.parameters(), self.trainer.lr, self.trainer.weight_decay)
        if self.optimizer_path:  # the torch trainer's layout (a checkpoint's, or a published update's)
            state = torch.load(self.optimizer_path, weights_only=False)
            names = [n for n, _ in model.named_parameters()]
            optimizer.load_state_dict(moments_from_hf(state, arch, ONE, 0, 0, names, _hf_order(self.policy_dir), device))
        return model, optimizer

    def pad(self, model: nn.Module) -> int:
        return _architecture(self.policy_dir).pad_token

    def forward(self, model: nn.Module, device: torch.device) -> Forward:
        """The replica's forward pass: megatron's `GPTModel` with its positions and causal mask."""
        arch = _architecture(self.policy_dir)

        def logits(batch: MicroBatch) -> torch.Tensor:
            ids = batch.input_ids.to(device)
            positions, causal = positions_and_mask(ids, device)
            return megatron_logits(model(ids, positions, attention_mask=causal), arch, self.temperature)

        return logits

    def save_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """The weights converted to HF form and AdamW's state to the torch trainer's layout: a
        published update reads as the other trainers' do (and resumes on any backend)."""
        arch = _architecture(self.policy_dir)
        params = {n: p.detach() for n, p in model.named_parameters()}
        save_hf(self.policy_dir, to_hf({(0, 0): params}, arch, ONE), directory)
        state = optimizer.state_dict()
        names = list(params)
        moments = {key: {(0, 0): {n: state["state"][i][key] for i, n in enumerate(names) if i in state["state"]}}
                   for key in ("exp_avg", "exp_avg_sq")}
        torch.save(moments_to_hf(state, moments, arch, ONE, _hf_order(self.policy_dir)), directory / "optimizer.pt")
