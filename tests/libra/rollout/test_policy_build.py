"""The supervised step the policy's warm start (and `bench_train --reference`) takes: the mean
cross-entropy over the labelled tokens only, one clipped AdamW step."""

import torch

from libra.optim import make_optimizer
from libra.rollout.policy import PolicySettings, build_model, supervised_step


def _examples() -> list[tuple[list[int], list[int]]]:
    # two sequences of different lengths; the first three tokens of each are the prompt (unlabelled)
    return [([5, 6, 7, 8, 9, 10], [-100, -100, -100, 8, 9, 10]), ([11, 12, 13, 14], [-100, -100, -100, 14])]


def _loss(model, examples) -> float:
    """The cross-entropy of every labelled token, averaged over all of them, written out."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in examples:
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], dim=-1)
            for position in range(1, len(ids)):
                if labels[position] != -100:
                    total -= float(logp[position - 1, labels[position]])
                    count += 1
    return total / count


def test_a_supervised_step_averages_the_labelled_tokens_and_lowers_their_loss() -> None:
    torch.manual_seed(0)
    model = build_model(PolicySettings(hidden=64, heads=1, layers=1, intermediate=128, max_positions=32), 32)
    optimizer = make_optimizer(model.parameters(), 1e-2, weight_decay=0.0)
    before = [p.detach().clone() for p in model.parameters()]
    expected = _loss(model, _examples())
    loss = supervised_step(model, optimizer, _examples())  # padding and prompts carry no loss
    assert abs(loss - expected) < 1e-5
    assert _loss(model, _examples()) < expected
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
