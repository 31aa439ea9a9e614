"""The policy trainer: loads an HF-format causal LM, takes one GRPO update per call, and hands out
its weights in HF form (for the rollout engines and for checkpoints).

Data parallel with torch's DDP when a process group is up (gloo on CPU, NCCL on GPUs): rank r
trains on samples r, r + W, r + 2W, ... of the step, and the loss is normalised by the token count
of the whole step (all ranks), so the update is the same as one process training on every sample.
Within a rank, micro-batches of at most `micro_batch_tokens` padded tokens accumulate gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from libra.config import RolloutConfig, TrainerConfig
from libra.trainer.grpo import clipped_surrogate, kl_k3, token_entropy, token_logprobs, token_mean
from libra.trainer.optim import learning_rate, make_optimizer, set_learning_rate
from libra.trainer.samples import MicroBatch, TrainingSample, collate, micro_batches


@dataclass(frozen=True)
class UpdateStats:
    """One update, summed over its micro-batches and ranks; per-token means over policy tokens."""

    loss: float
    grad_norm: float  # before clipping
    kl: float  # k3 estimate against the reference (0 when kl_coef is 0)
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
class TokenLosses:
    """One micro-batch's GRPO terms at each target position ([B, T-1])."""

    per_token: torch.Tensor  # clipped surrogate + kl_coef * k3 KL: the loss before the token mean
    kl: torch.Tensor  # zeros without a reference
    logits: torch.Tensor  # temperature-scaled
    logprobs: torch.Tensor  # the trainer's log p of each target
    clipped: torch.Tensor  # 1 where the clipped term was taken


def hf_logits(module: torch.nn.Module, batch: MicroBatch, temperature: float, device: torch.device) -> torch.Tensor:
    logits = module(input_ids=batch.input_ids.to(device), attention_mask=batch.attention.to(device)).logits
    return logits[:, :-1] / temperature


def token_losses(module: torch.nn.Module, reference: torch.nn.Module | None, batch: MicroBatch,
                 config: TrainerConfig, temperature: float, device: torch.device) -> TokenLosses:
    """The loss terms of one micro-batch from an HF-style model (and reference): used by the trainer
    and by the elastic pool's training task."""
    reference_logits = None
    if reference is not None:
        with torch.no_grad():
            reference_logits = hf_logits(reference, batch, temperature, device)
    return losses_from_logits(hf_logits(module, batch, temperature, device), reference_logits, batch, config, device)


def losses_from_logits(logits: torch.Tensor, reference_logits: torch.Tensor | None, batch: MicroBatch,
                       config: TrainerConfig, device: torch.device) -> TokenLosses:
    """The one definition of GRPO's loss, from a micro-batch's temperature-scaled logits at each
    target position ([B, T-1, V]) and the reference's (None: no KL term). Every backend (torch,
    megatron, the pool's task) computes its loss here."""
    targets = batch.targets.to(device)
    logprobs = token_logprobs(logits, targets)
    surrogate = clipped_surrogate(logprobs, batch.behaviour.to(device), batch.advantages.to(device),
                                  config.clip_low, config.clip_high)
    per_token, kl = surrogate.loss, torch.zeros_like(surrogate.loss)
    if reference_logits is not None:
        kl = kl_k3(logprobs, token_logprobs(reference_logits, targets))
        per_token = per_token + config.kl_coef * kl
    return TokenLosses(per_token, kl, logits, logprobs, surrogate.clipped)


TALLIES = ("loss", "kl", "entropy", "clipped", "logprob_gap")  # token sums an update reports (`tallies`)


@torch.no_grad()
def tallies(terms: TokenLosses, batch: MicroBatch, mask: torch.Tensor) -> torch.Tensor:
    """A micro-batch's sums over its policy tokens (`TALLIES`, float64 on the CPU): the loss, the KL,
    the entropy, the tokens whose clipped term was taken, |trainer log p - engine log p|."""
    m = mask.double()
    return torch.stack([(terms.per_token.double() * m).sum(), (terms.kl.double() * m).sum(),
                        (token_entropy(terms.logits.detach()).double() * m).sum(), (terms.clipped.double() * m).sum(),
                        ((terms.logprobs.detach() - batch.behaviour.to(mask.device)).abs().double() * m).sum()]).cpu()


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
                 device: str = "cpu", reference_dir: str | Path | None = None) -> None:
        """`policy_dir`: the weights to start from (the initial policy, or a checkpoint's);
        `reference_dir`: the frozen reference of the KL term (default `policy_dir`)."""
        from libra.devices import torch_device

        self.config = trainer
        self.temperature = (rollout or RolloutConfig()).temperature
        self.device = torch_device(device)
        torch.manual_seed(trainer.seed)
        self.model = load_policy(policy_dir, self.device)
        self.reference = load_reference(reference_dir or policy_dir, self.device) if trainer.kl_coef > 0 else None
        self.rank, self.world = _world()
        self.module: torch.nn.Module = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.module = DistributedDataParallel(self.model, device_ids=None if self.device.type == "cpu" else [self.device])
        self.optimizer = make_optimizer(self.model.parameters(), trainer.lr, trainer.weight_decay)
        self.updates = 0  # updates applied: the version of the weights held
        self.pad = int(self.model.config.pad_token_id or 0)

    def train_step(self, samples: Sequence[TrainingSample]) -> UpdateStats:
        """One update on the step's samples (every rank passes the same list)."""
        began = time.perf_counter()
        cfg = self.config
        mine = list(samples[self.rank::self.world])
        totals = torch.tensor([float(sum(s.policy_tokens for s in samples))], dtype=torch.float64)
        step_tokens = float(totals.item())
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(len(TALLIES), dtype=torch.float64)
        padded = 0
        groups = micro_batches(mine, cfg.micro_batch_tokens)
        for i, group in enumerate(groups):
            batch = collate(group, self.pad)
            mask = batch.mask.to(self.device)
            padded += batch.input_ids.numel()
            sync = self.world == 1 or i == len(groups) - 1
            context = self.module.no_sync() if not sync and hasattr(self.module, "no_sync") else nullcontext()
            with context:
                terms = token_losses(self.module, self.reference, batch, cfg, self.temperature, self.device)
                # DDP averages gradients over ranks; the step's mean is over all ranks' tokens
                loss = token_mean(terms.per_token, mask, step_tokens) * self.world
                loss.backward()
            sums += tallies(terms, batch, mask)
        if not groups and self.world > 1:  # a rank without samples still joins the gradient all-reduce
            blank = torch.full((1, 2), self.pad, dtype=torch.int64, device=self.device)
            (self.module(input_ids=blank).logits.sum() * 0.0).backward()
        if self.world > 1:
            dist.all_reduce(sums)
        applied = take_update(self.model, self.optimizer, cfg, self.updates)
        self.updates += 1
        return update_stats(tuple(float(v) for v in sums), step_tokens, len(samples), padded, applied,
                            time.perf_counter() - began)

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
