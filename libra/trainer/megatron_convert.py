"""The policy's weights between Hugging Face's layout and megatron-core's, for Qwen2 and Llama
decoders, sharded for a tensor- and pipeline-parallel layout. Pure tensor functions: no process
group, no megatron import, so each direction is testable on its own and exact.

Megatron-core's `GPTModel` (local layer spec) names and fuses the HF tensors so:

    embed_tokens          -> embedding.word_embeddings.weight   vocabulary rows split over TP
    q_proj, k_proj, v_proj -> self_attention.linear_qkv          one fused matrix (and bias), grouped
                                                                by key/value head: for each group its
                                                                query heads, its key head, its value
                                                                head; TP rank r holds groups r*G/TP..
    o_proj                -> self_attention.linear_proj          input columns split over TP (by head)
    gate_proj, up_proj    -> mlp.linear_fc1                      rank r holds [gate_r; up_r]
    down_proj             -> mlp.linear_fc2                      input columns split over TP
    input_layernorm       -> input_layernorm                     replicated
    post_attention_layernorm -> pre_mlp_layernorm                replicated
    norm                  -> decoder.final_layernorm             replicated (last stage)
    lm_head               -> output_layer.weight                 vocabulary rows split over TP; absent
                                                                when the embeddings are tied and the
                                                                first stage is also the last

Pipeline stage s holds layers s*L/PP .. (s+1)*L/PP - 1, numbered from 0 within the stage. With tied
embeddings and PP > 1 the last stage keeps its own copy of the embedding as `output_layer.weight`
(megatron sums the two copies' gradients), which `to_hf` takes from the first stage. The vocabulary
is padded with zero rows to a multiple of TP (`padded_vocab`); `to_hf` drops them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from libra.errors import LibraError

Tensor = torch.Tensor

FAMILIES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True)
class Architecture:
    """A decoder's shape as megatron needs it, read from its HF config (`from_hf_config`)."""

    family: Literal["qwen2", "llama"]
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_positions: int
    norm_eps: float
    rope_base: float
    qkv_bias: bool
    tied: bool
    pad_token: int = 0  # the id batches are padded with

    @classmethod
    def from_hf_config(cls, config: Mapping) -> Architecture:
        """From a `config.json`'s contents; a clear error for what megatron's GPT cannot take."""
        family = config.get("model_type")
        if family not in FAMILIES:
            raise LibraError(f"the megatron trainer converts Qwen2 and Llama decoders; this policy's model_type is "
                             f"{family!r} (train it with trainer.backend: torch)")
        if config.get("hidden_act", "silu") != "silu":
            raise LibraError(f"the megatron trainer's MLP is SwiGLU; this policy's hidden_act is {config['hidden_act']!r}")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise LibraError(f"the megatron trainer takes plain RoPE; this policy's rope_type is {rope.get('rope_type')!r}")
        if config.get("use_sliding_window"):
            raise LibraError("the megatron trainer takes full attention; this policy uses a sliding window")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        qkv_bias = bool(config.get("attention_bias", family == "qwen2"))
        if family == "llama" and config.get("mlp_bias"):
            raise LibraError("the megatron trainer's MLP has no biases; this Llama policy sets mlp_bias")
        return cls(family=family, layers=int(config["num_hidden_layers"]), hidden=hidden, heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads), ffn=int(config["intermediate_size"]),
                   vocab=int(config["vocab_size"]), max_positions=int(config.get("max_position_embeddings", 2048)),
                   norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   rope_base=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))), qkv_bias=qkv_bias,
                   tied=bool(config.get("tie_word_embeddings", False)),
                   pad_token=int(config.get("pad_token_id") or 0))

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class Sharding:
    """A model-parallel layout: `tp` tensor-parallel and `pp` pipeline-parallel ranks."""

    tp: int = 1
    pp: int = 1

    def check(self, arch: Architecture) -> None:
        """A clear error for a layout the model cannot take."""
        if self.tp < 1 or self.pp < 1:
            raise LibraError(f"tensor and pipeline parallel sizes must be >= 1, got tp={self.tp} pp={self.pp}")
        for what, count in (("attention heads", arch.heads), ("key/value heads", arch.kv_heads),
                            ("MLP width", arch.ffn)):
            if count % self.tp:
                raise LibraError(f"tp={self.tp} does not divide the model's {count} {what}; choose a tp that does")
        if self.pp > arch.layers:
            raise LibraError(f"pp={self.pp} is more pipeline stages than the model's {arch.layers} layers")
        if arch.layers % self.pp:
            raise LibraError(f"pp={self.pp} does not divide the model's {arch.layers} layers into equal stages")

    def stage_layers(self, arch: Architecture, stage: int) -> range:
        per = arch.layers // self.pp
        return range(stage * per, (stage + 1) * per)

    def padded_vocab(self, arch: Architecture) -> int:
        return -(-arch.vocab // self.tp) * self.tp


def _hf(i: int) -> str:
    return f"model.layers.{i}."


def _mg(i: int) -> str:
    return f"decoder.layers.{i}."


def _rows(tensor: Tensor, tp: int, rank: int) -> Tensor:
    return tensor.chunk(tp, dim=0)[rank].clone()


def _cols(tensor: Tensor, tp: int, rank: int) -> Tensor:
    return tensor.chunk(tp, dim=1)[rank].clone()


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])]) if rows > tensor.shape[0] \
        else tensor


def _fuse_qkv(arch: Architecture, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """[heads*d | kv*d | kv*d, ...] -> grouped [kv, (group + 2)*d, ...] flattened on dim 0."""
    d, groups = arch.head_dim, arch.kv_heads
    rest = q.shape[1:]
    parts = (q.reshape(groups, arch.group_size * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(arch: Architecture, fused: Tensor, groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """The inverse of `_fuse_qkv` for `groups` key/value groups."""
    d, g = arch.head_dim, arch.group_size
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (g + 2) * d, *rest)
    q, k, v = grouped.split([g * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def to_megatron(hf: Mapping[str, Tensor], arch: Architecture, sharding: Sharding, tp_rank: int,
                stage: int) -> dict[str, Tensor]:
    """The megatron state dict of TP rank `tp_rank` of pipeline stage `stage` (its own tensors)."""
    sharding.check(arch)
    tp = sharding.tp
    out: dict[str, Tensor] = {}
    vocab = sharding.padded_vocab(arch)
    first, last = stage == 0, stage == sharding.pp - 1
    if first:
        out["embedding.word_embeddings.weight"] = _rows(_pad_rows(hf["model.embed_tokens.weight"], vocab), tp, tp_rank)
    for local, i in enumerate(sharding.stage_layers(arch, stage)):
        h, m = _hf(i), _mg(local)
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"].clone()
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"].clone()
        attn = h + "self_attn."
        qkv = _fuse_qkv(arch, hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"])
        out[m + "self_attention.linear_qkv.weight"] = _rows(qkv, tp, tp_rank)
        if arch.qkv_bias:
            bias = _fuse_qkv(arch, hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"])
            out[m + "self_attention.linear_qkv.bias"] = _rows(bias, tp, tp_rank)
        out[m + "self_attention.linear_proj.weight"] = _cols(hf[attn + "o_proj.weight"], tp, tp_rank)
        gate, up = hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([_rows(gate, tp, tp_rank), _rows(up, tp, tp_rank)])
        out[m + "mlp.linear_fc2.weight"] = _cols(hf[h + "mlp.down_proj.weight"], tp, tp_rank)
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        if not arch.tied:
            out["output_layer.weight"] = _rows(_pad_rows(hf["lm_head.weight"], vocab), tp, tp_rank)
        elif not first:
            out["output_layer.weight"] = _rows(_pad_rows(hf["model.embed_tokens.weight"], vocab), tp, tp_rank)
    return out


def to_hf(shards: Mapping[tuple[int, int], Mapping[str, Tensor]], arch: Architecture,
          sharding: Sharding) -> dict[str, Tensor]:
    """The HF state dict from every rank's megatron state dict, keyed by (tp_rank, stage)."""
    sharding.check(arch)
    tp = sharding.tp
    missing = [(r, s) for s in range(sharding.pp) for r in range(tp) if (r, s) not in shards]
    if missing:
        raise LibraError(f"megatron shards missing for (tp rank, stage) {missing}")

    def cat_rows(stage: int, key: str) -> Tensor:
        return torch.cat([shards[(r, stage)][key] for r in range(tp)])

    def cat_cols(stage: int, key: str) -> Tensor:
        return torch.cat([shards[(r, stage)][key] for r in range(tp)], dim=1)

    out: dict[str, Tensor] = {"model.embed_tokens.weight": cat_rows(0, "embedding.word_embeddings.weight")[:arch.vocab]}
    groups = arch.kv_heads // tp
    for stage in range(sharding.pp):
        for local, i in enumerate(sharding.stage_layers(arch, stage)):
            h, m = _hf(i), _mg(local)
            one = shards[(0, stage)]
            out[h + "input_layernorm.weight"] = one[m + "input_layernorm.weight"].clone()
            out[h + "post_attention_layernorm.weight"] = one[m + "pre_mlp_layernorm.weight"].clone()
            names = ("weight", "bias") if arch.qkv_bias else ("weight",)
            for name in names:
                parts = [_split_qkv(arch, shards[(r, stage)][m + f"self_attention.linear_qkv.{name}"], groups)
                         for r in range(tp)]
                for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    out[h + f"self_attn.{proj}.{name}"] = torch.cat([p[j] for p in parts])
            out[h + "self_attn.o_proj.weight"] = cat_cols(stage, m + "self_attention.linear_proj.weight")
            halves = [shards[(r, stage)][m + "mlp.linear_fc1.weight"].chunk(2) for r in range(tp)]
            out[h + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in halves])
            out[h + "mlp.up_proj.weight"] = torch.cat([u for _, u in halves])
            out[h + "mlp.down_proj.weight"] = cat_cols(stage, m + "mlp.linear_fc2.weight")
    last = sharding.pp - 1
    out["model.norm.weight"] = shards[(0, last)]["decoder.final_layernorm.weight"].clone()
    if not arch.tied:
        out["lm_head.weight"] = cat_rows(last, "output_layer.weight")[:arch.vocab]
    return out
