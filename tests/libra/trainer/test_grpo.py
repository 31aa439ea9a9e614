"""GRPO's maths against values computed by hand."""

import math

import pytest
import torch

from libra.trainer.grpo import (
    clipped_surrogate,
    group_advantages,
    kl_k3,
    token_entropy,
    token_logprobs,
    token_mean,
)


def test_group_advantages_centre_and_scale_within_each_prompt_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([7, 7, 7, 3, 3, 9])
    # group 7: mean 1/3, centred (2/3, -1/3, -1/3), unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3)
    # group 3: equal rewards -> 0; group 9: a single sample -> 0
    std = math.sqrt(1 / 3)
    expected = [(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std, 0.0, 0.0, 0.0]
    assert group_advantages(rewards, groups).tolist() == pytest.approx(expected, abs=1e-5)
    assert group_advantages(rewards, groups, normalize_std=False).tolist() == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0], abs=1e-7)


def test_group_advantages_sum_to_zero_per_group_and_refuse_mismatched_shapes():
    rewards = torch.tensor([3.0, 1.0, 2.0, 0.0, 5.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(rewards, groups)
    assert float(adv[:3].sum()) == pytest.approx(0.0, abs=1e-6) and float(adv[3:].sum()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv[:3].std()) == pytest.approx(1.0, abs=1e-5)  # normalised to unit (unbiased) std
    with pytest.raises(ValueError, match="equal 1-d shapes"):
        group_advantages(rewards, groups[:5])


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # softmax (1/4, 3/4), then (1/2, 1/2)
    targets = torch.tensor([[1, 0]])
    assert token_logprobs(logits, targets).tolist()[0] == pytest.approx([math.log(0.75), math.log(0.5)])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert token_entropy(logits).tolist()[0] == pytest.approx([h, math.log(2.0)])


def test_clipped_surrogate_takes_the_pessimistic_term_with_asymmetric_clips():
    ratios = torch.tensor([[1.5, 0.7, 1.0]])
    logprobs, behaviour = torch.log(ratios), torch.zeros(1, 3)
    up = clipped_surrogate(logprobs, behaviour, torch.tensor([1.0]), clip_low=0.2, clip_high=0.28)
    # A > 0: min(r, clip(r, 0.8, 1.28)) -> 1.28 (clipped), 0.7, 1.0
    assert up.loss.tolist()[0] == pytest.approx([-1.28, -0.7, -1.0])
    assert up.clipped.tolist()[0] == [True, False, False]
    down = clipped_surrogate(logprobs, behaviour, torch.tensor([-1.0]), clip_low=0.2, clip_high=0.28)
    # A < 0: min(-r, -clip(r)) -> -1.5, -0.8 (clipped), -1.0
    assert down.loss.tolist()[0] == pytest.approx([1.5, 0.8, 1.0])
    assert down.clipped.tolist()[0] == [False, True, False]
    assert up.ratio.tolist()[0] == pytest.approx([1.5, 0.7, 1.0])


def test_clipped_tokens_carry_no_gradient_and_others_carry_the_advantage():
    logprobs = torch.log(torch.tensor([[1.5, 0.9]])).requires_grad_(True)
    loss = clipped_surrogate(logprobs, torch.zeros(1, 2), torch.tensor([2.0]), 0.2, 0.28).loss.sum()
    loss.backward()
    # d(-r A)/d logp = -r A for the unclipped token (r = 0.9, A = 2); 0 for the clipped one
    assert logprobs.grad.tolist()[0] == pytest.approx([0.0, -1.8])


def test_decoupled_surrogate_clips_around_the_proximal_policy_and_weights_by_its_truncated_ratio():
    """Tokens sampled by old weights (behaviour 0.5) trained by an update that started at 0.8: the
    ratio is to 0.8, and each term is weighted by 0.8 / 0.5 = 1.6, truncated at the cap."""
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    proximal = torch.log(torch.tensor([[0.8, 0.8, 0.8]]))
    logprobs = torch.log(torch.tensor([[0.96, 1.2, 0.4]]))  # r = 1.2, 1.5 (clipped to 1.28), 0.5
    out = clipped_surrogate(logprobs, behaviour, torch.tensor([1.0]), 0.2, 0.28, proximal, cap=2.0)
    assert out.ratio.tolist()[0] == pytest.approx([1.2, 1.5, 0.5])
    assert out.loss.tolist()[0] == pytest.approx([-1.6 * 1.2, -1.6 * 1.28, -1.6 * 0.5])
    assert out.clipped.tolist()[0] == [False, True, False]
    capped = clipped_surrogate(logprobs, behaviour, torch.tensor([1.0]), 0.2, 0.28, proximal, cap=1.5)
    assert capped.loss.tolist()[0] == pytest.approx([-1.5 * 1.2, -1.5 * 1.28, -1.5 * 0.5])
    off = clipped_surrogate(logprobs, behaviour, torch.tensor([1.0]), 0.2, 0.28, proximal, cap=0.0)
    plain = clipped_surrogate(logprobs, behaviour, torch.tensor([1.0]), 0.2, 0.28)
    assert torch.equal(off.loss, plain.loss)  # cap 0: the ratio to the behaviour policy, as before


def test_kl_k3():
    lp, ref = torch.tensor([math.log(0.5), 0.0]), torch.tensor([math.log(0.25), 0.0])
    # exp(ref - lp) - (ref - lp) - 1: 0.5 + ln 2 - 1; and 0 where they agree
    assert kl_k3(lp, ref).tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])


def test_token_mean_divides_by_the_given_token_count():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert float(token_mean(values, mask)) == pytest.approx(8 / 3)
    assert float(token_mean(values, mask, tokens=4)) == pytest.approx(2.0)
    assert float(token_mean(values, torch.zeros(2, 2))) == 0.0


def test_a_log_prob_far_off_or_infinite_cannot_make_the_loss_or_its_gradient_nan():
    """An engine's -inf (or a log-prob 100 nats below the trainer's) made exp(log-ratio) inf, and inf
    times an advantage of 0 NaN: one update then wrote NaN into every weight. Log-ratios are bounded
    at 20 nats before exp; the KL's too; a masked position's inf is never multiplied by its 0."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    behaviour = torch.tensor([[-math.inf, -100.0, -0.5]])
    for advantage in (0.0, -1.0, 1.0):
        out = clipped_surrogate(logprobs, behaviour, torch.tensor([advantage]), 0.2, 0.28)
        loss = token_mean(out.loss, torch.ones(1, 3))
        loss.backward()
        assert math.isfinite(loss.item()) and torch.isfinite(logprobs.grad).all()
        logprobs.grad = None
    assert out.ratio[0, 0].item() == pytest.approx(math.exp(20.0)) and out.ratio[0, 2].item() == 1.0
    assert clipped_surrogate(logprobs, behaviour, torch.tensor([0.0]), 0.2, 0.28).loss.sum().item() == 0.0
    reference = torch.tensor([[100.0, -1.0, -0.5]])
    kl = kl_k3(logprobs.detach(), reference)
    assert math.isfinite(float(kl[0, 0])) and float(kl[0, 0]) == pytest.approx(math.exp(20.0) - 21.0)
    assert float(token_mean(torch.tensor([[math.inf, 2.0, math.nan]]), torch.tensor([[0.0, 1.0, 0.0]]))) == 2.0
