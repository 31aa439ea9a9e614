"""GRPO's maths as pure tensor functions (no model, no optimizer, no I/O).

Shapes: N trajectories; B sequences in a micro-batch, T tokens each (right-padded); V the
vocabulary. A token's "mask" is 1 where the policy wrote it (its own turns) and 0 on the prompt,
the tool outputs and the padding: only those tokens carry a loss.

- `group_advantages`: each trajectory's reward minus its prompt group's mean, divided by the
  group's standard deviation (unbiased, as `torch.std`) when `normalize_std`; a group of one, or a
  group whose rewards are all equal, has advantage 0 (nothing to learn from it).
- `token_logprobs` / `token_entropy`: log p(token) and the entropy of the next-token distribution
  at each position, from logits.
- `clipped_surrogate`: the PPO-clip objective per token against the behaviour log-probs the engine
  returned, with separate lower and upper clip ranges (1 - clip_low, 1 + clip_high).
- `kl_k3`: the k3 estimator of KL(policy || reference) per token (non-negative, unbiased).
- `token_mean`: token-level aggregation: a sum over masked tokens divided by a token count that
  may be the whole step's (every micro-batch and every rank), so the step's gradient is the mean
  over all its tokens, whatever way they are split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, normalize_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """rewards [N] float, groups [N] int64 (any group labels) -> advantages [N] float."""
    if rewards.shape != groups.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and groups {tuple(groups.shape)} must be equal 1-d shapes")
    rewards = rewards.to(torch.float64)
    _, index = torch.unique(groups, return_inverse=True)
    count = torch.zeros(int(index.max()) + 1 if len(index) else 0, dtype=torch.float64).index_add_(
        0, index, torch.ones_like(rewards))
    mean = torch.zeros_like(count).index_add_(0, index, rewards) / count
    centred = rewards - mean[index]
    if not normalize_std:
        return torch.where(count[index] > 1, centred, torch.zeros_like(centred)).to(torch.float32)
    squares = torch.zeros_like(count).index_add_(0, index, centred**2)
    std = torch.sqrt(squares / (count - 1).clamp(min=1))
    flat = (count[index] < 2) | (std[index] <= eps)
    return torch.where(flat, torch.zeros_like(centred), centred / (std[index] + eps)).to(torch.float32)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V] (the prediction of targets[:, t] at position t), targets [B, T] -> [B, T]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V] -> the entropy of each position's distribution [B, T] (nats)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass(frozen=True)
class Surrogate:
    loss: torch.Tensor  # [B, T] per-token loss (to minimise)
    clipped: torch.Tensor  # [B, T] bool: the clipped term was the one taken (its gradient is 0)
    ratio: torch.Tensor  # [B, T] pi / pi_behaviour


def clipped_surrogate(logprobs: torch.Tensor, behaviour: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float, clip_high: float) -> Surrogate:
    """logprobs, behaviour [B, T]; advantages [B] (one per sequence) or [B, T].
    loss = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with r = exp(logprobs - behaviour)."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logprobs - behaviour)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return Surrogate(-torch.minimum(unclipped, clipped), clipped < unclipped, ratio)


def kl_k3(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """[B, T] each -> [B, T]: exp(ref - lp) - (ref - lp) - 1, an unbiased, non-negative estimate
    of KL(policy || reference) from samples of the policy."""
    delta = reference - logprobs
    return torch.exp(delta) - delta - 1.0


def token_mean(values: torch.Tensor, mask: torch.Tensor, tokens: float | None = None) -> torch.Tensor:
    """sum(values * mask) / tokens (default: mask.sum()); 0 when there are no tokens."""
    total = float(mask.sum()) if tokens is None else float(tokens)
    return (values * mask).sum() / total if total > 0 else values.sum() * 0.0
