"""From finished trajectories to what the trainer consumes: one frozen record per trajectory, and
right-padded tensors of micro-batches of them.

A trajectory's tokens are its prompt, then each turn's generated tokens and the tool output that
followed; only the generated tokens are the policy's, so only they are in the loss mask. The
behaviour log-probs are the engine's, for the same tokens, under the weights that generated them:
`model_version` for the whole trajectory, or each token's own (`token_versions`) when a partial
rollout continued it under newer weights; `model_version` is then its oldest token's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from libra.partial import oldest_version
from libra.trainer.grpo import group_advantages


class Finished(Protocol):
    """What a finished trajectory offers (libra.rollout.agent.TrajectoryRun does)."""

    trajectory_id: str
    prompt_id: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    reward: float
    model_version: int
    versions: list[int]  # each token's weights version (-1 off the mask)


@dataclass(frozen=True)
class TrainingSample:
    trajectory_id: str
    prompt_id: str
    token_ids: tuple[int, ...]  # prompt, generated and tool-output tokens, in order
    loss_mask: tuple[int, ...]  # 1 on the policy's own tokens
    behaviour_logprobs: tuple[float, ...]  # the engine's log p of each token (0.0 where the mask is 0)
    advantage: float
    reward: float
    model_version: int  # the weights that generated it (its oldest token's)
    token_versions: tuple[int, ...] = ()  # each token's weights version (-1 off the mask); (): all model_version

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.loss_mask) == len(self.behaviour_logprobs):
            raise ValueError(f"{self.trajectory_id}: {len(self.token_ids)} tokens, {len(self.loss_mask)} mask "
                             f"entries and {len(self.behaviour_logprobs)} log-probs must be as many")
        if self.token_versions and len(self.token_versions) != len(self.token_ids):
            raise ValueError(f"{self.trajectory_id}: {len(self.token_versions)} token versions for "
                             f"{len(self.token_ids)} tokens")
        if self.loss_mask and self.loss_mask[0]:
            raise ValueError(f"{self.trajectory_id}: the first token cannot be trained on (nothing predicts it)")

    @property
    def policy_tokens(self) -> int:
        return sum(self.loss_mask)

    def policy_token_versions(self) -> list[int]:
        """The weights version of each of its policy tokens."""
        if not self.token_versions:
            return [self.model_version] * self.policy_tokens
        return [v for v, m in zip(self.token_versions, self.loss_mask, strict=True) if m]


def to_sample(trajectory: Finished, advantage: float, reward: float | None = None) -> TrainingSample:
    """`trajectory` as trained on with `advantage`; `reward`: what it is trained on (default its reward)."""
    versions = tuple(trajectory.versions)
    policy = [v for v, m in zip(versions, trajectory.mask, strict=False) if m and v >= 0]
    oldest = oldest_version(policy, int(trajectory.model_version))
    uniform = all(v == oldest for v in policy) and len(policy) == sum(1 for m in trajectory.mask if m)
    return TrainingSample(trajectory.trajectory_id, trajectory.prompt_id, tuple(trajectory.ids), tuple(trajectory.mask),
                          tuple(trajectory.logprobs), float(advantage),
                          float(trajectory.reward if reward is None else reward),
                          oldest, () if uniform else versions)


def to_samples(trajectories: Sequence[Finished], normalize_std: bool = True,
               rewards: Sequence[float] | None = None) -> list[TrainingSample]:
    """Every trajectory with its advantage within its prompt's group; `rewards`: what each is
    trained on, in order (default: its reward)."""
    if not trajectories:
        return []
    rewards = [float(t.reward) for t in trajectories] if rewards is None else [float(r) for r in rewards]
    if len(rewards) != len(trajectories):
        raise ValueError(f"{len(rewards)} rewards for {len(trajectories)} trajectories")
    labels = {p: i for i, p in enumerate(dict.fromkeys(t.prompt_id for t in trajectories))}
    advantages = group_advantages(torch.tensor(rewards), torch.tensor([labels[t.prompt_id] for t in trajectories]),
                                  normalize_std)
    return [to_sample(t, a, r) for t, a, r in zip(trajectories, advantages.tolist(), rewards, strict=True)]


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] int64, right-padded with `pad`
    attention: torch.Tensor  # [B, T] int64, 1 on real tokens
    targets: torch.Tensor  # [B, T-1] the next token at each position
    mask: torch.Tensor  # [B, T-1] float, 1 where the target is a policy token
    behaviour: torch.Tensor  # [B, T-1] the engine's log-prob of each target
    advantages: torch.Tensor  # [B]


def collate(samples: Sequence[TrainingSample], pad: int = 0) -> MicroBatch:
    width = max(len(s.token_ids) for s in samples)
    ids = torch.tensor([list(s.token_ids) + [pad] * (width - len(s.token_ids)) for s in samples], dtype=torch.int64)
    attention = torch.tensor([[1] * len(s.token_ids) + [0] * (width - len(s.token_ids)) for s in samples])
    mask = torch.tensor([list(s.loss_mask) + [0] * (width - len(s.loss_mask)) for s in samples], dtype=torch.float32)
    behaviour = torch.tensor([list(s.behaviour_logprobs) + [0.0] * (width - len(s.token_ids)) for s in samples],
                             dtype=torch.float32)
    return MicroBatch(ids, attention, ids[:, 1:], mask[:, 1:], behaviour[:, 1:],
                      torch.tensor([s.advantage for s in samples], dtype=torch.float32))


def micro_batches(samples: Sequence[TrainingSample], max_tokens: int) -> list[list[TrainingSample]]:
    """Consecutive samples packed so that each micro-batch's padded size (sequences x longest) stays
    within `max_tokens` (a longer sample goes alone)."""
    out: list[list[TrainingSample]] = []
    current: list[TrainingSample] = []
    longest = 0
    for sample in samples:
        width = max(longest, len(sample.token_ids))
        if current and width * (len(current) + 1) > max_tokens:
            out.append(current)
            current, width = [], len(sample.token_ids)
        current.append(sample)
        longest = width
    if current:
        out.append(current)
    return out
