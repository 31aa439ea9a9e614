"""Hardware and model profiles as data, with the arithmetic that derives sizes from architecture.

GPU figures are datasheet values (bf16 dense peak, HBM size and bandwidth, NVLink per GPU
unidirectional, one NIC per GPU); model rows are Hugging Face `config.json` fields. Parameter counts
are derived (embedding, attention with optional biases and QK-norm, SwiGLU MLP or routed experts,
RMSNorm weights) and reproduce the published counts exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from libra.errors import LibraError

GB = 1e9
GiB = 2**30
TFLOPS = 1e12
BF16_BYTES = 2


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    peak_flops: float  # bf16 dense tensor FLOP/s per GPU
    memory_bytes: float  # HBM per GPU
    hbm_bandwidth: float  # bytes/s per GPU
    intra_node_bandwidth: float  # bytes/s per GPU, one direction (NVLink)
    inter_node_bandwidth: float  # bytes/s per GPU, one direction (its NIC)
    gpus_per_node: int
    intra_latency_s: float = 5e-6  # per collective hop inside a node
    inter_latency_s: float = 2e-5  # per collective hop across nodes


HARDWARE: dict[str, HardwareProfile] = {
    # A800 = A100 with NVLink cut to 400 GB/s bidirectional; 200 Gb/s NIC per GPU assumed (CX-6 class).
    "a800": HardwareProfile("A800-SXM4-80GB", 312 * TFLOPS, 80 * GB, 2039 * GB, 200 * GB, 25 * GB, 8),
    "a100": HardwareProfile("A100-SXM4-80GB", 312 * TFLOPS, 80 * GB, 2039 * GB, 300 * GB, 25 * GB, 8),
    "h100": HardwareProfile("H100-SXM5-80GB", 989 * TFLOPS, 80 * GB, 3350 * GB, 450 * GB, 50 * GB, 8),
    "h200": HardwareProfile("H200-SXM-141GB", 989 * TFLOPS, 141 * GB, 4800 * GB, 450 * GB, 50 * GB, 8),
    # The local CPU machine (2 cores, 24 GiB) as one "device": ~0.1 TFLOP/s fp32 GEMM, DDR bandwidth,
    # loopback between processes. Used to plan the tiny local policy end to end.
    "cpu": HardwareProfile("local-cpu-2core", 0.1 * TFLOPS, 24 * GiB, 20 * GB, 5 * GB, 5 * GB, 1, 2e-5, 2e-5),
}


@dataclass(frozen=True)
class ModelProfile:
    name: str
    layers: int
    hidden: int
    intermediate: int  # dense MLP width (unused when every layer is MoE)
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    experts: int = 0  # routed experts per MoE layer (0 = dense)
    experts_per_token: int = 0
    moe_intermediate: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @cached_property
    def embedding_params(self) -> int:
        """Input embedding plus an untied output head."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @cached_property
    def attention_params(self) -> int:
        """One layer's attention: q, k, v, o projections, biases, QK-norm and the input norm."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        params = self.hidden * (q + 2 * kv) + q * self.hidden + self.hidden
        if self.qkv_bias:
            params += q + 2 * kv
        if self.qk_norm:
            params += 2 * self.head_dim
        return params

    @cached_property
    def mlp_params(self) -> int:
        """One layer's MLP (all experts and the router for MoE) and its norm."""
        if self.is_moe:
            return self.experts * 3 * self.hidden * self.moe_intermediate + self.hidden * self.experts + self.hidden
        return 3 * self.hidden * self.intermediate + self.hidden

    @cached_property
    def expert_params(self) -> int:
        """Parameters of routed experts, all layers (these shard over expert parallelism)."""
        return self.layers * self.experts * 3 * self.hidden * self.moe_intermediate if self.is_moe else 0

    @cached_property
    def total_params(self) -> int:
        return self.embedding_params + self.layers * (self.attention_params + self.mlp_params) + self.hidden

    @cached_property
    def non_embedding_params(self) -> int:
        return self.total_params - self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @cached_property
    def dense_params(self) -> int:
        """Everything that is not a routed expert (shards over tensor and pipeline parallelism)."""
        return self.total_params - self.expert_params

    @cached_property
    def active_params(self) -> int:
        """Parameters touched per token: all dense ones plus `experts_per_token` experts per layer."""
        if not self.is_moe:
            return self.total_params
        unused = self.experts - self.experts_per_token
        return self.total_params - self.layers * unused * 3 * self.hidden * self.moe_intermediate

    @cached_property
    def matmul_params(self) -> int:
        """Parameters in matrix multiplies per token (active minus the input embedding lookup;
        a tied head still multiplies)."""
        return self.active_params - self.vocab * self.hidden * (0 if self.tied_embeddings else 1)

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV-cache bytes one token occupies on one GPU of a TP-`tp` instance (bf16). KV heads split
        over TP ranks and are replicated once tp exceeds them."""
        heads_per_gpu = max(1.0, self.kv_heads / tp)
        return 2 * self.layers * heads_per_gpu * self.head_dim * BF16_BYTES

    @cached_property
    def weight_bytes(self) -> int:
        return self.total_params * BF16_BYTES


def _qwen3(name: str, layers: int, hidden: int, inter: int, heads: int, kv: int, tied: bool) -> ModelProfile:
    return ModelProfile(name, layers, hidden, inter, heads, kv, 128, 151936, tied, qkv_bias=False, qk_norm=True)


MODELS: dict[str, ModelProfile] = {
    "qwen2.5-3b": ModelProfile("Qwen2.5-3B", 36, 2048, 11008, 16, 2, 128, 151936, True, qkv_bias=True, qk_norm=False),
    "qwen2.5-7b": ModelProfile("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 128, 152064, False, qkv_bias=True, qk_norm=False),
    "qwen3-4b": _qwen3("Qwen3-4B", 36, 2560, 9728, 32, 8, tied=True),
    "qwen3-8b": _qwen3("Qwen3-8B", 36, 4096, 12288, 32, 8, tied=False),
    "qwen3-14b": _qwen3("Qwen3-14B", 40, 5120, 17408, 40, 8, tied=False),
    "qwen3-32b": _qwen3("Qwen3-32B", 64, 5120, 25600, 64, 8, tied=False),
    "qwen3-30b-a3b": ModelProfile(
        "Qwen3-30B-A3B", 48, 2048, 6144, 32, 4, 128, 151936, False, qkv_bias=False, qk_norm=True,
        experts=128, experts_per_token=8, moe_intermediate=768,
    ),
    # The local policy Libra trains on CPU (Qwen2 architecture, head_dim 64 for vLLM-CPU).
    "libra-tiny": ModelProfile("libra-tiny", 2, 128, 512, 2, 2, 64, 1024, True, qkv_bias=True, qk_norm=False),
}


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    hardware: HardwareProfile

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}:{self.hardware.name}"


_CLUSTER = re.compile(r"^(\d+)x(\d+):([a-z0-9.-]+)$")


def parse_cluster(text: str) -> Cluster:
    """`6x8:a800` -> 6 nodes of 8 A800 GPUs."""
    match = _CLUSTER.match(text.strip().lower())
    if not match:
        raise LibraError(f"cluster {text!r}: write NODESxGPUS:HARDWARE, e.g. 6x8:a800 (hardware: {', '.join(HARDWARE)})")
    nodes, per_node, name = int(match[1]), int(match[2]), match[3]
    if name not in HARDWARE:
        raise LibraError(f"cluster {text!r}: unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    if not (1 <= nodes <= 4096 and 1 <= per_node <= 16):
        raise LibraError(f"cluster {text!r}: need 1 <= nodes <= 4096 and 1 <= GPUs per node <= 16")
    return Cluster(nodes, per_node, HARDWARE[name])


def model_profile(name: str) -> ModelProfile:
    key = name.strip().lower()
    if key not in MODELS:
        raise LibraError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[key]
