"""A tiny random policy and random samples, for the trainer's and the pool task's tests."""

from __future__ import annotations

from pathlib import Path

import torch

from libra.trainer.samples import TrainingSample

VOCAB = 16


def write_tiny_policy(out: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def random_samples(seed: int, count: int = 6) -> list[TrainingSample]:
    """`count` trajectories of 20 to 34 tokens (two prompt tokens, the rest the policy's), in groups
    of two; with micro_batch_tokens 64, micro-batches of one to three samples."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = 20 + 7 * (i % 3)
        ids = tuple(int(x) for x in torch.randint(2, VOCAB, (n,), generator=g))
        mask = (0, 0) + (1,) * (n - 2)
        logprobs = (0.0, 0.0) + tuple(float(x) for x in -torch.rand(n - 2, generator=g) * 3)
        out.append(TrainingSample(f"{i}", str(i // 2), ids, mask, logprobs, float(i % 2) - 0.5, 0.0, 0))
    return out


# A key bias adds the same q.b to every score of a query, which the softmax ignores: its gradient is
# zero in exact arithmetic, so what a float run gives it is rounding noise, and AdamW's normalised
# step turns that noise into moves of up to the learning rate. Summing the same gradients in another
# order (shards, replicas) changes the noise, so this parameter is not compared.
SIGNAL_FREE = ("self_attn.k_proj.bias",)


def assert_same_policy(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float,
                       noise_share: float = 0.0, bound: float | None = None) -> None:
    """Every compared tensor within `atol`; with `noise_share`, that share of a tensor's elements may
    be further apart, but none by more than `bound`. That is for runs whose gradients were summed in
    another order (shards of replicas against one process): an element whose gradient cancels to
    rounding level gets AdamW steps of up to the learning rate either way, while a shard lost or
    counted twice moves nearly every element that has a gradient."""
    assert got.keys() == want.keys()
    for name, value in got.items():
        if name.endswith(SIGNAL_FREE):
            continue
        gap = (value - want[name]).abs()
        apart = int((gap > atol).sum())
        message = f"{name}: {apart} of {gap.numel()} values differ by more than {atol}, up to {gap.max().item():.3g}"
        if noise_share == 0.0:
            assert apart == 0, message
        else:
            assert apart <= noise_share * gap.numel() and gap.max().item() <= bound, message
