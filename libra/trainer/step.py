"""One GRPO step's accumulation over its micro-batches, the same for every trainer: the torch
trainer (`PolicyTrainer`), the elastic pool's tasks (`GRPOTask`, `MegatronGRPOTask`) and megatron's
ranks (`MegatronRank`). What differs between them is the forward pass, a `Forward` that maps a
micro-batch to the policy's temperature-scaled logits at each target position; the loss
(`losses_from_logits`), the reference's logits (`reference_logits`), the statistics an update
reports (`tallies`) and the loss handed to the backward pass are this module's.

    step = GRPOStep(config, temperature, device, reference)
    step.run(micro_batches(samples, config.micro_batch_tokens), pad, forward)   # backward on each
    step.sums, step.padded                                                       # the step's tallies

Megatron's pipeline schedule runs its own forward and backward over the micro-batches: a rank calls
`GRPOStep.loss` from the loss function it hands the schedule, which is the body of `run`'s loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from libra.config import TrainerConfig
from libra.trainer.grpo import clipped_surrogate, kl_k3, masked, token_entropy, token_logprobs, token_mean
from libra.trainer.samples import MicroBatch, TrainingSample, collate

Forward = Callable[[MicroBatch], torch.Tensor]  # a micro-batch -> temperature-scaled logits [B, T-1, V]

TALLIES = ("loss", "kl", "entropy", "clipped", "logprob_gap")  # token sums an update reports (`tallies`)


@dataclass(frozen=True)
class TokenLosses:
    """One micro-batch's GRPO terms at each target position ([B, T-1])."""

    per_token: torch.Tensor  # clipped surrogate + kl_coef * k3 KL: the loss before the token mean
    kl: torch.Tensor  # zeros without a reference
    logits: torch.Tensor  # temperature-scaled
    logprobs: torch.Tensor  # the trainer's log p of each target
    clipped: torch.Tensor  # 1 where the clipped term was taken


def hf_logits(module: torch.nn.Module, batch: MicroBatch, temperature: float, device: torch.device) -> torch.Tensor:
    """An HF-style causal LM's temperature-scaled logits at each target position of `batch`."""
    logits = module(input_ids=batch.input_ids.to(device), attention_mask=batch.attention.to(device)).logits
    return logits[:, :-1] / temperature


def reference_logits(reference: torch.nn.Module | None, batch: MicroBatch, temperature: float,
                     device: torch.device) -> torch.Tensor | None:
    """The frozen reference's temperature-scaled logits at each target position of `batch`, without
    a gradient (None without a reference: no KL term). Every backend's reference is the HF model."""
    if reference is None:
        return None
    with torch.no_grad():
        return hf_logits(reference, batch, temperature, device)


def losses_from_logits(logits: torch.Tensor, reference: torch.Tensor | None, batch: MicroBatch,
                       config: TrainerConfig, device: torch.device,
                       proximal: torch.Tensor | None = None) -> TokenLosses:
    """The one definition of GRPO's loss, from a micro-batch's temperature-scaled logits at each
    target position ([B, T-1, V]) and the reference's (None: no KL term). With trainer.decoupled_cap,
    the ratio is to `proximal`, the log-probs of the weights the update started from (None: these
    logits are those weights', the first pass of an update)."""
    targets = batch.targets.to(device)
    logprobs = token_logprobs(logits, targets)
    if config.decoupled_cap > 0 and proximal is None:
        proximal = logprobs.detach()
    surrogate = clipped_surrogate(logprobs, batch.behaviour.to(device), batch.advantages.to(device),
                                  config.clip_low, config.clip_high, proximal, config.decoupled_cap)
    per_token, kl = surrogate.loss, torch.zeros_like(surrogate.loss)
    if reference is not None:
        kl = kl_k3(logprobs, token_logprobs(reference, targets))
        if config.kl_coef > 0:  # else measured only (trainer.track_kl)
            per_token = per_token + config.kl_coef * kl
    return TokenLosses(per_token, kl, logits, logprobs, surrogate.clipped)


@torch.no_grad()
def tallies(terms: TokenLosses, batch: MicroBatch, mask: torch.Tensor) -> torch.Tensor:
    """A micro-batch's sums over its policy tokens (`TALLIES`, float64 on the CPU): the loss, the KL,
    the entropy, the tokens whose clipped term was taken, |trainer log p - engine log p|."""
    gap = (terms.logprobs.detach() - batch.behaviour.to(mask.device)).abs()
    return torch.stack([masked(v.double(), mask).sum() for v in (
        terms.per_token, terms.kl, token_entropy(terms.logits.detach()), terms.clipped, gap)]).cpu()


class GRPOStep:
    """A GRPO step's running sums over the micro-batches it has seen: `sums`, the `TALLIES` over
    their policy tokens (float64, on the CPU), and `padded`, the tokens the forward passes of `run`
    computed (padding included).

    `reference`: the KL term's frozen HF model (None: no KL term). `tokens`: the token count the
    loss is a mean over (`token_mean`), multiplied by `replicas` (DDP averages the replicas'
    gradients; the step's mean is over every replica's tokens); None: the loss is the sum over the
    micro-batch's policy tokens (the caller divides the summed gradient). `tallied`: whether this
    step's micro-batches count in `sums` (a tensor-parallel rank other than the first computes the
    same loss as the first: counted once). `proximal`: with trainer.decoupled_cap, the proximal
    log-probs of each micro-batch by its index in the step, kept by the first pass over them and
    read by later ones (an update of several epochs passes the same dict to each of its steps)."""

    def __init__(self, config: TrainerConfig, temperature: float, device: torch.device,
                 reference: torch.nn.Module | None = None, *, tokens: float | None = None, replicas: int = 1,
                 tallied: bool = True, proximal: dict[int, torch.Tensor] | None = None) -> None:
        self.config, self.temperature, self.device, self.reference = config, temperature, device, reference
        self.tokens, self.replicas, self.tallied = tokens, replicas, tallied
        self.sums = torch.zeros(len(TALLIES), dtype=torch.float64)
        self.padded = 0
        self.proximal = {} if proximal is None else proximal
        self.seen = 0  # micro-batches whose loss was taken

    def reference_logits(self, batch: MicroBatch) -> torch.Tensor | None:
        return reference_logits(self.reference, batch, self.temperature, self.device)

    def loss(self, batch: MicroBatch, logits: torch.Tensor, reference: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's loss to back-propagate and its policy-token mask, from the policy's
        logits (`Forward`) and the reference's (`reference_logits`); its tallies join `sums`."""
        terms = losses_from_logits(logits, reference, batch, self.config, self.device, self.proximal.get(self.seen))
        if self.config.decoupled_cap > 0:
            self.proximal.setdefault(self.seen, terms.logprobs.detach())
        self.seen += 1
        mask = batch.mask.to(self.device)
        if self.tallied:
            self.sums += tallies(terms, batch, mask)
        if self.tokens is None:
            return masked(terms.per_token, mask).sum(), mask
        return token_mean(terms.per_token, mask, self.tokens) * self.replicas, mask

    def run(self, groups: Sequence[Sequence[TrainingSample]], pad: int, forward: Forward,
            around: Callable[[bool], AbstractContextManager[object]] | None = None) -> None:
        """Each group of samples as a micro-batch (padded with `pad`): the reference's logits, the
        policy's (`forward`), the loss and its backward pass, the gradients summed in the
        parameters' grads. `around(last)` wraps a micro-batch's forward and backward passes (DDP's
        `no_sync` on all but the last); default: nothing."""
        for i, group in enumerate(groups):
            batch = collate(group, pad)
            self.padded += batch.input_ids.numel()
            with (around(i == len(groups) - 1) if around is not None else nullcontext()):
                reference = self.reference_logits(batch)
                loss, _ = self.loss(batch, forward(batch), reference)
                loss.backward()
