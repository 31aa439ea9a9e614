"""HF <-> megatron-core weight conversion: exact round trips for TP 1, 2 and 4 and PP 1 and 2, on
Qwen2 (QKV bias, tied head) and Llama (no bias, untied head, grouped-query attention) layouts."""

import pytest
import torch

from libra.errors import LibraError
from libra.trainer.megatron_convert import Architecture, Sharding, to_hf, to_megatron

QWEN2 = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 17, "tie_word_embeddings": True}
LLAMA = {**QWEN2, "model_type": "llama", "tie_word_embeddings": False, "num_key_value_heads": 4}


def hf_weights(arch: Architecture) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    d, kv = arch.head_dim, arch.kv_heads * arch.head_dim
    shapes = {"model.embed_tokens.weight": (arch.vocab, arch.hidden), "model.norm.weight": (arch.hidden,)}
    for i in range(arch.layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (arch.hidden,), p + "post_attention_layernorm.weight": (arch.hidden,),
                   p + "self_attn.q_proj.weight": (arch.heads * d, arch.hidden), p + "self_attn.k_proj.weight": (kv, arch.hidden),
                   p + "self_attn.v_proj.weight": (kv, arch.hidden), p + "self_attn.o_proj.weight": (arch.hidden, arch.heads * d),
                   p + "mlp.gate_proj.weight": (arch.ffn, arch.hidden), p + "mlp.up_proj.weight": (arch.ffn, arch.hidden),
                   p + "mlp.down_proj.weight": (arch.hidden, arch.ffn)}
        if arch.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (arch.heads * d,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
    if not arch.tied:
        shapes["lm_head.weight"] = (arch.vocab, arch.hidden)
    return {k: torch.randn(*s, generator=g) for k, s in shapes.items()}


@pytest.mark.parametrize("config", [QWEN2, LLAMA], ids=["qwen2", "llama"])
@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)])
def test_hf_to_megatron_to_hf_gives_back_equal_tensors(config, tp, pp):
    arch = Architecture.from_hf_config(config)
    if arch.kv_heads % tp:
        pytest.skip("tp does not divide the key/value heads")
    sharding = Sharding(tp, pp)
    hf = hf_weights(arch)
    shards = {(r, s): to_megatron(hf, arch, sharding, r, s) for r in range(tp) for s in range(pp)}
    back = to_hf(shards, arch, sharding)
    assert back.keys() == hf.keys()
    for name, value in hf.items():
        assert torch.equal(back[name], value), name


def test_the_shards_are_megatrons_layout():
    """Fused QKV grouped by key/value head (each group's queries, its key, its value), split by group
    over TP; fc1 = [gate shard; up shard] on each rank; the vocabulary padded to a multiple of TP."""
    arch = Architecture.from_hf_config(QWEN2)  # 4 heads, 2 groups, head_dim 8
    hf = hf_weights(arch)
    a = "model.layers.0.self_attn."
    rank1 = to_megatron(hf, arch, Sharding(2, 1), 1, 0)
    qkv = rank1["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == (32, 32)  # one group: 2 query heads + key + value, 8 rows each
    assert torch.equal(qkv[:16], hf[a + "q_proj.weight"][16:32])
    assert torch.equal(qkv[16:24], hf[a + "k_proj.weight"][8:16])
    assert torch.equal(qkv[24:], hf[a + "v_proj.weight"][8:16])
    fc1 = rank1["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:32], hf["model.layers.0.mlp.gate_proj.weight"][32:])
    assert torch.equal(fc1[32:], hf["model.layers.0.mlp.up_proj.weight"][32:])
    embedding = rank1["embedding.word_embeddings.weight"]
    assert embedding.shape == (9, 32)  # 17 rows padded to 18
    assert torch.equal(embedding[:8], hf["model.embed_tokens.weight"][9:]) and not embedding[8].any()
    assert "output_layer.weight" not in rank1  # tied, one stage
    last = to_megatron(hf, arch, Sharding(1, 2), 0, 1)
    assert torch.equal(last["output_layer.weight"], hf["model.embed_tokens.weight"])  # the last stage's copy
    assert sorted(k for k in last if k.startswith("decoder.layers.")) == sorted(
        k for k in to_megatron(hf, arch, Sharding(1, 2), 0, 0) if k.startswith("decoder.layers."))


@pytest.mark.parametrize("tp, pp, message", [
    (3, 1, "tp=3 does not divide the model's 4 attention heads"),
    (4, 1, "tp=4 does not divide the model's 2 key/value heads"),
    (1, 3, "pp=3 is more pipeline stages than the model's 2 layers"),
])
def test_a_layout_the_model_cannot_take_is_refused(tp, pp, message):
    with pytest.raises(LibraError, match=message):
        Sharding(tp, pp).check(Architecture.from_hf_config(QWEN2))


def test_an_architecture_megatron_cannot_take_is_refused():
    with pytest.raises(LibraError, match="model_type is 'gpt2'"):
        Architecture.from_hf_config({**QWEN2, "model_type": "gpt2"})
    with pytest.raises(LibraError, match="hidden_act is 'gelu'"):
        Architecture.from_hf_config({**QWEN2, "hidden_act": "gelu"})
