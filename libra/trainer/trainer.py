"""The policy trainer: loads an HF-format causal LM, takes one GRPO update per call, and hands out
its weights in HF form (for the rollout engines and for checkpoints).

Data parallel with torch's DDP when a process group is up (gloo on CPU, NCCL on GPUs): rank r
trains on samples r, r + W, r + 2W, ... of the step, and the loss is normalised by the token count
of the whole step (all ranks), so the update is the same as one process training on every sample.
Within a rank, micro-batches of at most `micro_batch_tokens` padded tokens accumulate gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from libra.clock import Clock, Stopwatch, WallClock
from libra.config import RolloutConfig, TrainerConfig
from libra.errors import LibraError
from libra.optim import learning_rate, make_optimizer, set_learning_rate
from libra.trainer.grpo import token_logprobs
from libra.trainer.samples import MicroBatch, TrainingSample, micro_batches
from libra.trainer.step import GRPOStep, hf_logits


@dataclass(frozen=True)
class UpdateStats:
    """One update, summed over its micro-batches and ranks; per-token means over policy tokens."""

    loss: float
    grad_norm: float  # before clipping
    kl: float  # k3 estimate against the reference (0 without one: kl_coef 0 and track_kl off)
    entropy: float  # nats per policy token
    clip_fraction: float  # policy tokens whose clipped term was taken
    logprob_gap: float  # mean |trainer log p - engine log p| before the update
    tokens: int  # policy tokens trained on
    sequences: int
    padded_tokens: int  # tokens the forward passes computed (padding included), this rank
    lr: float
    seconds: float
    hybrids: int = 0  # hybrid replicas (elastic pool) whose shards were part of the update


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def load_policy(policy_dir: str | Path, device: torch.device) -> torch.nn.Module:
    """The HF-format policy in float32, in training mode, on `device`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).to(device)
    model.train()
    model.config.use_cache = False
    return model


def load_reference(policy_dir: str | Path, device: torch.device) -> torch.nn.Module:
    """The frozen reference of the KL term."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    return model.to(device).eval().requires_grad_(False)


@dataclass(frozen=True)
class AppliedUpdate:
    lr: float
    grad_norm: float  # before clipping


def take_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: TrainerConfig,
                index: int, clip: Callable[[float], float] | None = None) -> AppliedUpdate:
    """Update `index` (from 0) with the mean gradient already in the parameters' grads: the
    schedule's learning rate, the global-norm clip, one AdamW step. `clip(max_norm)` clips the
    gradients and returns their norm before clipping (default: torch's over `model`'s parameters; a
    sharded model's counts each element once over its shards). Every backend updates through here."""
    lr = learning_rate(index, config.steps, config.lr, config.warmup_steps, config.schedule)
    set_learning_rate(optimizer, lr)
    if clip is None:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
    else:
        grad_norm = float(clip(config.grad_clip))
    if not math.isfinite(grad_norm):  # AdamW would write NaN into every weight, and the engines would take them
        optimizer.zero_grad(set_to_none=True)
        raise LibraError(f"update {index + 1}: the gradient's norm is {grad_norm}; the weights were left as they were "
                         "(the run's last checkpoint is intact: run the same command to continue from it)")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return AppliedUpdate(lr, grad_norm)


def update_stats(sums: tuple[float, ...], tokens: float, sequences: int, padded: int, applied: AppliedUpdate,
                 seconds: float, hybrids: int = 0) -> UpdateStats:
    """An update's statistics from its summed `tallies` over `tokens` policy tokens: per-token means.
    The trainer and the elastic pool's training task both report through here."""
    per = max(tokens, 1.0)
    loss, kl, entropy, clipped, gap = (v / per for v in sums)
    return UpdateStats(loss, applied.grad_norm, kl, entropy, clipped, gap, int(tokens), sequences, padded, applied.lr,
                       seconds, hybrids)


class PolicyTrainer:
    def __init__(self, policy_dir: str | Path, trainer: TrainerConfig, rollout: RolloutConfig | None = None,
                 device: str = "cpu", reference_dir: str | Path | None = None, clock: Clock | None = None) -> None:
        """`policy_dir`: the weights to start from (the initial policy, or a checkpoint's);
        `reference_dir`: the frozen reference of the KL term (default `policy_dir`); `clock`: what
        an update's seconds are read on (default: wall time)."""
        from libra.devices import torch_device

        self.config = trainer
        self.temperature = (rollout or RolloutConfig()).temperature
        self.device = torch_device(device)
        self.clock = clock or WallClock()
        torch.manual_seed(trainer.seed)
        self.model = load_policy(policy_dir, self.device)
        self.reference = load_reference(reference_dir or policy_dir, self.device) if trainer.wants_reference else None
        self.rank, self.world = _world()
        self.module: torch.nn.Module = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.module = DistributedDataParallel(self.model, device_ids=None if self.device.type == "cpu" else [self.device])
        self.optimizer = make_optimizer(self.model.parameters(), trainer.lr, trainer.weight_decay)
        self.updates = 0  # updates applied: the version of the weights held
        self.pad = int(self.model.config.pad_token_id or 0)

    def train_step(self, samples: Sequence[TrainingSample]) -> UpdateStats:
        """One update on the step's samples (every rank passes the same list): `trainer.epochs`
        optimizer steps over them, each a full pass (PPO's epochs: the ratio to the behaviour
        log-probs, clipped, keeps the later passes near the policy that sampled them). The update
        counts once; its statistics are the first pass's (the policy as it sampled), its seconds and
        padded tokens every pass's."""
        watch = Stopwatch(self.clock)
        cfg = self.config
        mine = list(samples[self.rank::self.world])
        step_tokens = float(sum(s.policy_tokens for s in samples))
        first: tuple[tuple[float, ...], AppliedUpdate] | None = None
        padded = 0
        groups = micro_batches(mine, cfg.micro_batch_tokens)
        proximal: dict[int, torch.Tensor] = {}  # decoupled PPO: the first pass's log-probs, for the later ones
        for _ in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            # DDP averages gradients over ranks; the step's mean is over all ranks' tokens
            step = GRPOStep(cfg, self.temperature, self.device, self.reference, tokens=step_tokens, replicas=self.world,
                            proximal=proximal)
            step.run(groups, self.pad, self._logits, self._sync)
            if not groups and self.world > 1:  # a rank without samples still joins the gradient all-reduce
                blank = torch.full((1, 2), self.pad, dtype=torch.int64, device=self.device)
                (self.module(input_ids=blank).logits.sum() * 0.0).backward()
            sums = step.sums
            if self.world > 1:
                dist.all_reduce(sums)
            applied = take_update(self.model, self.optimizer, cfg, self.updates)
            padded += step.padded
            first = first or (tuple(float(v) for v in sums), applied)
        self.updates += 1
        assert first is not None
        return update_stats(first[0], step_tokens, len(samples), padded, first[1], watch.seconds())

    def _logits(self, batch: MicroBatch) -> torch.Tensor:
        """The policy's forward pass (through DDP when data parallel)."""
        return hf_logits(self.module, batch, self.temperature, self.device)

    def _sync(self, last: bool) -> AbstractContextManager[object]:
        """DDP reduces the gradients once, after the step's last micro-batch."""
        if self.world == 1 or last or not hasattr(self.module, "no_sync"):
            return nullcontext()
        return self.module.no_sync()

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        """log p of tokens 1.. of a sequence under the current weights (temperature 1, as the
        engines' `sequence_logprobs` score)."""
        self.model.eval()
        try:
            ids = torch.tensor([list(token_ids)], device=self.device)
            logits = self.model(input_ids=ids).logits[:, :-1] / temperature
            return token_logprobs(logits, ids[:, 1:])[0].tolist()
        finally:
            self.model.train()

    def set_threads(self, count: int) -> None:
        """The trainer's intra-op threads on CPU (its share of the cores); nothing on a GPU."""
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, count))

    def threads(self) -> int:
        return torch.get_num_threads()

    def close(self) -> None:
        """Nothing to stop: the trainer is this process (the pooled trainer has processes to end)."""

    def save_weights(self, directory: str | Path) -> None:
        """The weights in HF format (safetensors and config), loadable by vLLM and transformers."""
        self.model.save_pretrained(directory, safe_serialization=True)

    def optimizer_state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
