"""Finished trajectories to training samples and micro-batches."""

from dataclasses import dataclass, field

import pytest

from libra.trainer.samples import TrainingSample, collate, micro_batches, to_samples


@dataclass
class Finished:
    trajectory_id: str
    prompt_id: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    reward: float
    model_version: int = 3
    extra: dict = field(default_factory=dict)


def test_samples_carry_tokens_mask_logprobs_version_and_group_advantage():
    runs = [Finished("p/0", "p", [5, 6, 7, 8], [0, 1, 0, 1], [0.0, -0.5, 0.0, -0.25], 1.0),
            Finished("p/1", "p", [5, 6, 9], [0, 1, 1], [0.0, -1.0, -2.0], 0.0),
            Finished("q/0", "q", [4, 2], [0, 1], [0.0, -0.1], 1.0)]
    samples = to_samples(runs, normalize_std=False)
    assert [s.advantage for s in samples] == [0.5, -0.5, 0.0]
    assert samples[0] == TrainingSample("p/0", "p", (5, 6, 7, 8), (0, 1, 0, 1), (0.0, -0.5, 0.0, -0.25), 0.5, 1.0, 3)
    assert samples[0].policy_tokens == 2


def test_a_sample_whose_parts_disagree_is_refused():
    with pytest.raises(ValueError, match="must be as many"):
        TrainingSample("t", "p", (1, 2), (0, 1, 1), (0.0, 0.0), 0.0, 0.0, 0)
    with pytest.raises(ValueError, match="first token cannot be trained on"):
        TrainingSample("t", "p", (1, 2), (1, 1), (0.0, 0.0), 0.0, 0.0, 0)


def test_collate_pads_right_and_shifts_targets_mask_and_logprobs_by_one():
    a = TrainingSample("a", "p", (5, 6, 7), (0, 1, 1), (0.0, -0.5, -0.7), 1.0, 1.0, 0)
    b = TrainingSample("b", "p", (5, 9), (0, 1), (0.0, -0.2), -1.0, 0.0, 0)
    batch = collate([a, b], pad=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [5, 9, 0]]
    assert batch.attention.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.targets.tolist() == [[6, 7], [9, 0]]
    assert batch.mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert batch.behaviour.flatten().tolist() == pytest.approx([-0.5, -0.7, -0.2, 0.0])
    assert batch.advantages.tolist() == [1.0, -1.0]


def test_micro_batches_keep_order_within_the_padded_token_budget():
    samples = [TrainingSample(str(n), "p", tuple(range(n)), (0,) * n, (0.0,) * n, 0.0, 0.0, 0) for n in (3, 3, 5, 2)]
    groups = micro_batches(samples, max_tokens=8)
    assert [[s.trajectory_id for s in g] for g in groups] == [["3", "3"], ["5"], ["2"]]
    assert [[s.trajectory_id for s in g] for g in micro_batches(samples, max_tokens=4)] == [["3"], ["3"], ["5"], ["2"]]
    assert micro_batches([], 8) == []
