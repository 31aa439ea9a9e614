"""One GRPO step's accumulation (libra/trainer/step.py): the same gradient however the samples are
split into micro-batches, the loss summed or a token mean, tallies counted once."""

from dataclasses import replace

import pytest
import torch

from libra.config import TrainerConfig
from libra.trainer.samples import micro_batches
from libra.trainer.step import TALLIES, GRPOStep, hf_logits
from libra.trainer.trainer import load_policy, load_reference
from tests.libra.trainer.policies import random_samples

CONFIG = TrainerConfig(lr=1e-3, micro_batch_tokens=64, seed=0, kl_coef=0.1)
CPU = torch.device("cpu")


def accumulated(policy, groups, **options) -> tuple[GRPOStep, list[torch.Tensor]]:
    model = load_policy(policy, CPU)
    step = GRPOStep(CONFIG, 0.7, CPU, load_reference(policy, CPU), **options)
    step.run(groups, 0, lambda batch: hf_logits(model, batch, 0.7, CPU))
    return step, [p.grad.clone() for p in model.parameters()]


def test_micro_batches_sum_to_the_gradient_and_tallies_of_one_batch(tiny_policy):
    samples = random_samples(0)
    split, grads = accumulated(tiny_policy, micro_batches(samples, CONFIG.micro_batch_tokens))
    whole, want = accumulated(tiny_policy, [samples])
    assert len(micro_batches(samples, CONFIG.micro_batch_tokens)) > 1
    for got, expected in zip(grads, want, strict=True):
        assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(split.sums, whole.sums, rtol=1e-5)
    assert split.padded < whole.padded  # one batch pads every sequence to the longest


def test_a_token_mean_over_replicas_scales_the_summed_gradient(tiny_policy):
    groups = micro_batches(random_samples(1), CONFIG.micro_batch_tokens)
    summed, grads = accumulated(tiny_policy, groups)
    mean, scaled = accumulated(tiny_policy, groups, tokens=40.0, replicas=2)
    for got, expected in zip(scaled, grads, strict=True):
        assert torch.allclose(got, expected * 2 / 40.0, atol=1e-7)
    assert torch.equal(mean.sums, summed.sums)  # the tallies are sums either way


def test_an_untallied_step_trains_and_counts_nothing(tiny_policy):
    step, grads = accumulated(tiny_policy, micro_batches(random_samples(2), CONFIG.micro_batch_tokens), tallied=False)
    assert torch.equal(step.sums, torch.zeros(len(TALLIES), dtype=torch.float64))
    assert any(g.abs().sum() > 0 for g in grads) and step.padded > 0


def test_the_micro_batches_forward_and_backward_run_inside_around(tiny_policy):
    seen: list[bool] = []

    class Note:
        def __init__(self, last: bool) -> None:
            seen.append(last)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

    groups = micro_batches(random_samples(3), CONFIG.micro_batch_tokens)
    model = load_policy(tiny_policy, CPU)
    GRPOStep(CONFIG, 1.0, CPU).run(groups, 0, lambda batch: hf_logits(model, batch, 1.0, CPU), Note)
    assert seen == [False] * (len(groups) - 1) + [True]


@pytest.mark.parametrize("tokens", [None, 0.0])
def test_a_step_without_policy_tokens_has_a_zero_loss(tiny_policy, tokens):
    sample = random_samples(0, 1)[0]
    blank = replace(sample, loss_mask=(0,) * len(sample.token_ids))
    step, grads = accumulated(tiny_policy, [[blank]], tokens=tokens)
    assert all(float(g.abs().sum()) == 0.0 for g in grads)
    assert step.sums.abs().sum() == 0.0
