"""Cost model: seconds and bytes for a training configuration or a rollout instance group.

No search happens here (the solvers are `training_search` and `rollout_search`). Every time is a
sum of *ideal* terms computed from the profiles (FLOPs at peak, bytes at link or HBM bandwidth)
multiplied by a `Coefficients` entry, so calibration can fit the multipliers to measured timings
(`calibrate`). Training's and the collectives' defaults come from published efficiencies (training
MFU ~40%, collectives at ~70% of link bandwidth); prefill's and decode's are `calibrate.fit` of
one H200's measured decode steps and prefills (`data/gpu/h200_qwen3_14b_tp1.json`: a Qwen3-14B-shaped
model at TP1, whole steps in CUDA graphs), the weights' read at that GPU's measured HBM ceiling.

Training (one RL step over all its tokens, Megatron-style layout: TP inside a node, then DP, then PP):
    compute  = FLOPs(fwd + bwd + recompute + log-prob passes) / (GPUs * peak), stretched by the
               1F1B bubble (m + pp - 1) / m and by uneven micro-batches
    comm     = TP all-reduces per layer + PP activations + exposed DP gradient sync + EP all-to-all
Rollout (a group of `count` instances of TP `tp` serving some length buckets, continuous batching):
    batch    = KV pool (HBM left after weights and activations, over the instance's GPUs) / mean
               resident context, capped by `max_batch` and by the trajectories each instance holds
    step     = GEMM phase + attention phase + TP all-reduces + per-step overhead
               + per-sequence overhead * batch, the phases one after the other as the GPU runs them
               (separate kernels, not overlapped):
               GEMM phase = max(the batch's matmul FLOPs at peak, the weights' bytes over HBM)
               attention  = the batch's KV bytes over HBM, plus one sequence's KV bytes over HBM
                            again (`decode_kv_tail`: the share of a long sequence's attention that
                            no batch parallelism hides, which is what makes a lone long-context
                            straggler slow); attention's FLOPs (2 x the GQA group per KV byte) are
                            far below any GPU's ridge point and never bind;
               the all-reduces are small messages, run as
               inference engines run them inside a node (one-shot or two-shot: one or two hops of
               latency, not the ring's 2(n-1)); the overheads are the host's work (scheduling,
               sampling, output processing), which no instance size shrinks; where one process
               drives every instance (`shared_host`: a local run) a step also waits for the
               per-sequence work of the other instances' sequences
    time     = max(prefill + decode steps of an instance's share, the longest trajectory's own
               time: its tokens decode at the steady batch while the rest of the share lasts, then
               alone, at batch 1, as the physics runs a shrinking tail)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property

from pydantic import BaseModel, Field

from libra.planner.profiles import BF16_BYTES, GB, Cluster, HardwareProfile, ModelProfile
from libra.planner.settings import Settings
from libra.planner.workload import LengthBucket, Workload


@dataclass(frozen=True)
class Coefficients:
    """Multipliers over ideal times (1.0 = datasheet speed). Fitted by `calibrate.fit`."""

    train_compute: float = 1 / 0.40  # 1 / training MFU
    train_comm: float = 1 / 0.70  # actual / ideal collective time
    train_step_s: float = 2.0  # fixed seconds per training step (optimizer, launches, bookkeeping)
    # prefill and decode: `calibrate.fit` of one H200's measurements (module docstring); every decode row
    # within 5% of the fit and every prefill within 6%
    prefill_compute: float = 1.5344  # 0.65 of peak
    decode_compute: float = 1.6021  # the GEMMs' FLOPs: 0.62 of peak where they bind
    decode_memory: float = 1.1443  # the weights' read: the measured HBM read ceiling (4.19 of 4.8 TB/s), held in the fit
    decode_kv: float = 1.1007  # the batch's KV read: 0.91 of HBM bandwidth
    decode_kv_tail: float = 0.9700  # one sequence's KV read again per step (flash decoding's tail)
    rollout_comm: float = 1 / 0.70
    decode_step_s: float = 0.003039  # fixed seconds per decode step of an instance: launches, norms and the LM
    # head's sampling under CUDA graphs (measured: a graphed 40-layer step pays about 3 ms over its weights' read)
    decode_seq_s: float = 1.03e-5  # seconds per sequence per decode step at any instance size (on the H200:
    # its sampling and KV writes); a host's sampling and output processing where they show: a small model
    # on CPU cores decodes in 10 ms + 0.5 ms per sequence at one core or two alike

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


class TrainingDials(Settings):
    """Training knobs that are not searched, of those a config sets: `planner.zero_stage` .. `planner.logprob_passes`."""

    zero_stage: int = Field(1, ge=1, le=3, description="ZeRO stage of the trainer (1: optimizer sharded over DP; "
                            "2: + gradients; 3: + weights)")
    recompute: bool = Field(True, description="full activation recomputation in training")
    logprob_passes: int = Field(1, ge=0, le=4, description="extra forward passes per step (old / reference log-probs)")


class TrainingSettings(TrainingDials):
    """Training knobs that are not searched: the dials, and the ones set in code."""

    dp_overlap: float = 0.4  # fraction of the DP gradient sync hidden behind backward
    memory_headroom: float = 0.08  # fraction of HBM kept free
    memory_margin_bytes: float = 2.5 * GB  # workspace + fragmentation margin
    logits_chunk_tokens: int = 8192  # log-probs are computed over chunks of this many tokens
    min_sequence_tokens: int = 0  # memory is planned for sequences of at least this length (the generation cap)


class RolloutDials(Settings):
    """Rollout-engine knobs that are not searched, of those a config sets: `planner.memory_utilization` ..
    `planner.max_context_tokens`."""

    memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="share of HBM a rollout engine may use "
                                      "(vLLM gpu_memory_utilization)")
    max_batch: int = Field(256, ge=1, le=65_536, description="concurrent sequences per rollout instance")
    max_context_tokens: int = Field(131_072, ge=1_024, le=10_000_000, description="rollout engine max_model_len")


class RolloutSettings(RolloutDials):
    """Rollout-engine knobs that are not searched: the dials, and the ones set in code."""

    activation_reserve_bytes: float = 1.0 * GB  # per GPU, kept for activations and CUDA graphs
    shared_host: bool = False  # one process drives every instance (a local run's engines), so the host's
    # per-sequence work (`Coefficients.decode_seq_s`) of all instances takes turns: a step of one instance
    # also waits for the sequences of the others (servers of their own on a cluster: False)


@dataclass(frozen=True)
class TrainConfig:
    tp: int
    pp: int
    dp: int
    ep: int
    micro_batch: int  # sequences per micro-batch

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class TrainEstimate:
    config: TrainConfig
    seconds: float
    memory_bytes: float  # peak per GPU
    compute_ideal_s: float  # feature: FLOPs at peak, bubble included
    comm_ideal_s: float  # feature: collectives at link bandwidth


@dataclass(frozen=True)
class CostModel:
    cluster: Cluster
    model: ModelProfile
    coefficients: Coefficients = field(default_factory=Coefficients)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)

    @classmethod
    def configured(cls, cluster: Cluster, model: ModelProfile, dials: BaseModel) -> CostModel:
        """The cost model of `cluster` and `model` with the training and rollout dials `dials` holds
        (a config's `planner` section), the default coefficients and the other knobs' defaults."""
        return cls(cluster, model, training=TrainingSettings.of(dials), rollout=RolloutSettings.of(dials))

    @property
    def hw(self) -> HardwareProfile:
        return self.cluster.hardware

    # ---------------------------------------------------------------- links
    def _bandwidth(self, size: int, stride: int) -> tuple[float, float]:
        """(bytes/s, latency) of a collective over `size` ranks spaced `stride` apart."""
        if size * stride <= self.cluster.gpus_per_node:
            return self.hw.intra_node_bandwidth, self.hw.intra_latency_s
        return self.hw.inter_node_bandwidth, self.hw.inter_latency_s

    def _all_reduce_s(self, nbytes: float, size: int, stride: int, calls: float = 1.0) -> float:
        """`calls` ring all-reduces (NCCL, as trainers run them) moving `nbytes` in all: each call
        sends 2(n-1)/n of its bytes and waits 2(n-1) hops."""
        if size <= 1:
            return 0.0
        bandwidth, latency = self._bandwidth(size, stride)
        return 2 * (size - 1) / size * nbytes / bandwidth + calls * 2 * (size - 1) * latency

    def _engine_all_reduce_s(self, message_bytes: float, size: int, calls: float) -> float:
        """`calls` all-reduces of `message_bytes` each among `size` adjacent GPUs, as inference
        engines run them: inside a node the fastest of one-shot (every rank reads each peer's buffer:
        one hop, (n-1) messages over its link), two-shot (reduce-scatter, then all-gather: two hops,
        2(n-1)/n messages) and the ring; across nodes the ring."""
        if size <= 1:
            return 0.0
        bandwidth, latency = self._bandwidth(size, 1)
        ring = 2 * (size - 1) * latency + 2 * (size - 1) / size * message_bytes / bandwidth
        if size > self.cluster.gpus_per_node:
            return calls * ring
        one_shot = latency + (size - 1) * message_bytes / bandwidth
        two_shot = 2 * latency + 2 * (size - 1) / size * message_bytes / bandwidth
        return calls * min(one_shot, two_shot, ring)

    # ---------------------------------------------------------------- training
    def train_memory_bytes(self, config: TrainConfig, max_tokens: int) -> float:
        """Peak bytes on the busiest GPU: weights, gradients, optimizer state (by ZeRO stage),
        recomputation checkpoints of in-flight micro-batches, one layer's working set, logits."""
        m, s = self.model, self.training
        max_tokens = max(max_tokens, s.min_sequence_tokens)
        dense = m.dense_params / (config.tp * config.pp)
        experts = m.expert_params / (config.ep * config.pp)
        expert_dp = max(1, config.dp * config.tp // config.ep)
        weights = BF16_BYTES * (dense + experts)
        grads = BF16_BYTES * (dense + experts)
        optimizer = 12 * (dense / config.dp + experts / expert_dp)
        if s.zero_stage >= 2:
            grads = BF16_BYTES * (dense / config.dp + experts / expert_dp)
        if s.zero_stage >= 3:
            weights = BF16_BYTES * (dense / config.dp + experts / expert_dp)
        tokens = config.micro_batch * max_tokens
        layers_per_stage = m.layers / config.pp
        per_layer_full = tokens * m.hidden * 34 / config.tp  # flash attention: no L^2 term
        per_layer_ckpt = tokens * m.hidden * BF16_BYTES / config.tp
        in_flight = config.pp  # 1F1B: the first stage holds pp micro-batches
        if s.recompute:
            first_stage = in_flight * layers_per_stage * per_layer_ckpt + per_layer_full
        else:
            first_stage = in_flight * layers_per_stage * per_layer_full
        logits = min(tokens, s.logits_chunk_tokens) * m.vocab * 4 * 2 / config.tp  # fp32 logits + gradient, one chunk
        last_stage = (layers_per_stage * per_layer_ckpt + per_layer_full if s.recompute else
                      layers_per_stage * per_layer_full) + logits
        activations = max(first_stage, last_stage) if config.pp > 1 else first_stage + logits
        return weights + grads + optimizer + activations

    def train_memory_limit_bytes(self) -> float:
        return self.hw.memory_bytes * (1 - self.training.memory_headroom) - self.training.memory_margin_bytes

    def train_flops(self, workload: Workload) -> float:
        """FLOPs of one training step over the workload's tokens."""
        m, s = self.model, self.training
        forward = 2 * m.matmul_params * workload.tokens + 2 * m.layers * m.heads * m.head_dim * sum(
            b.count * b.total_tokens_sq for b in workload.buckets
        )
        passes = 1 + 2 + (1 if s.recompute else 0) + s.logprob_passes
        return forward * passes

    def train_time(self, config: TrainConfig, workload: Workload) -> TrainEstimate:
        m, s, c = self.model, self.training, self.coefficients
        sequences = max(1.0, workload.trajectories)
        per_replica = math.ceil(sequences / config.dp)
        micro_batches = math.ceil(per_replica / config.micro_batch)
        imbalance = per_replica * config.dp / sequences
        bubble = (micro_batches + config.pp - 1) / micro_batches
        compute = self.train_flops(workload) / (config.gpus * self.hw.peak_flops) * imbalance * bubble

        tokens_per_replica = workload.tokens / config.dp * imbalance
        layers_per_stage = m.layers / config.pp
        forward_passes = 1 + (1 if s.recompute else 0) + s.logprob_passes
        tp_calls = 2 * forward_passes + 2  # two all-reduces per layer per forward pass, two in backward
        tp_bytes = tokens_per_replica * layers_per_stage * tp_calls * m.hidden * BF16_BYTES
        comm = self._all_reduce_s(tp_bytes, config.tp, 1, calls=micro_batches * layers_per_stage * tp_calls)
        if config.pp > 1:
            bandwidth, latency = self._bandwidth(config.pp, config.tp * config.dp)
            comm += 2 * tokens_per_replica * m.hidden * BF16_BYTES / bandwidth + 2 * micro_batches * latency
        grad_bytes = BF16_BYTES * (m.dense_params / (config.tp * config.pp) + m.expert_params / (config.ep * config.pp))
        comm += (1 - s.dp_overlap) * self._all_reduce_s(grad_bytes, config.dp, config.tp)
        if m.is_moe and config.ep > 1:
            bandwidth, latency = self._bandwidth(config.ep, config.tp)
            a2a_bytes = (tokens_per_replica / config.tp) * layers_per_stage * tp_calls * m.hidden * BF16_BYTES \
                * m.experts_per_token * (config.ep - 1) / config.ep
            comm += a2a_bytes / bandwidth + micro_batches * layers_per_stage * tp_calls * latency
        seconds = c.train_compute * compute + c.train_comm * comm + c.train_step_s
        memory = self.train_memory_bytes(config, workload.max_tokens)
        return TrainEstimate(config, seconds, memory, compute, comm)

    # ---------------------------------------------------------------- rollout
    def weights_per_gpu_bytes(self, tp: int) -> float:
        return self.model.weight_bytes / tp

    def instance_tps(self, choices: Sequence[int]) -> tuple[int, ...]:
        """Of `choices`, the TP sizes a rollout instance can have here: within one node, with room
        for KV cache beside the weights."""
        return tuple(tp for tp in choices if tp <= self.cluster.gpus_per_node and self.kv_capacity_tokens(tp) > 0)

    def kv_capacity_tokens(self, tp: int) -> int:
        """Tokens of KV cache a TP-`tp` instance holds (0 if the weights do not fit)."""
        r = self.rollout
        free = self.hw.memory_bytes * r.memory_utilization - self.weights_per_gpu_bytes(tp) - r.activation_reserve_bytes
        return max(0, int(free / self.model.kv_bytes_per_token(tp)))

    def instance_fits(self, tp: int, max_tokens: int) -> bool:
        """Whether a trajectory of `max_tokens` can run on a TP-`tp` instance at all."""
        return max_tokens <= min(self.kv_capacity_tokens(tp), self.rollout.max_context_tokens)

    @cached_property
    def _decode_memo(self) -> dict:
        """Per-TP constants of a decode step and all-reduce times per whole batch size (the simulator
        asks for the same few hundred batch sizes millions of times)."""
        return {}

    def decode_step_features(self, tp: int, batch: float, context: float) -> tuple[float, float, float, float, float]:
        """Ideal seconds of one decode step of `batch` sequences whose mean context is `context`
        tokens: (the GEMMs' FLOPs at peak, the weights' bytes over HBM, the batch's KV bytes over
        HBM, one sequence's KV bytes over HBM, the all-reduces)."""
        m, hw, memo = self.model, self.hw, self._decode_memo
        terms = memo.get(tp)
        if terms is None:  # the same arithmetic as written out below, done once per TP
            terms = memo[tp] = (2 * m.matmul_params / (tp * hw.peak_flops), self.weights_per_gpu_bytes(tp) / hw.hbm_bandwidth,
                                m.kv_bytes_per_token(tp) / hw.hbm_bandwidth)
        matmul, weights, kv = terms  # 2 FLOPs per weight and token; KV bytes per token of context
        one = context * kv
        key = (tp, batch)
        comm = memo.get(key) if isinstance(batch, int) else None
        if comm is None:
            comm = self._engine_all_reduce_s(batch * m.hidden * BF16_BYTES, tp, calls=2 * m.layers)
            if isinstance(batch, int):
                memo[key] = comm
        return batch * matmul, weights, batch * one, one, comm

    def _decode_terms(self, tp: int, batch: float) -> tuple[float, float, float, float]:
        """A decode step's terms that do not depend on the context: the larger of the GEMMs' time
        and the weights' read, the all-reduces, the per-sequence cost, and one context token's KV
        read (kept per whole batch size: the simulator asks for the same few hundred)."""
        key = ("step", tp, batch) if isinstance(batch, int) else None
        terms = self._decode_memo.get(key) if key is not None else None
        if terms is None:
            c = self.coefficients
            gemm, weights, _, _, comm = self.decode_step_features(tp, batch, 0.0)
            terms = (max(c.decode_compute * gemm, c.decode_memory * weights), c.rollout_comm * comm,
                     c.decode_seq_s * batch, self._decode_memo[tp][2])
            if key is not None:
                self._decode_memo[key] = terms
        return terms

    def decode_step_s(self, tp: int, batch: float, context: float) -> float:
        c = self.coefficients
        fixed, comm_s, per_seq_s, kv_per_token = self._decode_terms(tp, batch)
        one = context * kv_per_token  # one sequence's KV read, as `decode_step_features` has it
        return fixed + c.decode_kv * (batch * one) + c.decode_kv_tail * one + comm_s + c.decode_step_s + per_seq_s

    def host_wait_s(self, sequences_elsewhere: float) -> float:
        """What a decode step also waits for when one process drives every instance
        (`rollout.shared_host`): the host's per-sequence work of the other instances' sequences.
        The planner's group of instances and the rollout simulator's instances both add it."""
        return self.coefficients.decode_seq_s * sequences_elsewhere if self.rollout.shared_host else 0.0

    def prefill_ideal_s(self, tp: int, tokens: float, context: float) -> float:
        """Prefill FLOPs of `tokens` new tokens attending `context` tokens, at peak."""
        m = self.model
        flops = tokens * (2 * m.matmul_params + 4 * m.layers * m.heads * m.head_dim * context)
        return flops / (tp * self.hw.peak_flops)

    def prefill_s(self, tp: int, tokens: float, context: float) -> float:
        """Seconds to prefill `tokens` new tokens whose mean attended context is `context`."""
        return self.coefficients.prefill_compute * self.prefill_ideal_s(tp, tokens, context)

    def group_time(self, tp: int, count: int, buckets: tuple[LengthBucket, ...]) -> float:
        """Makespan of `count` TP-`tp` instances serving `buckets` (inf if a trajectory cannot fit)."""
        if count < 1 or not buckets:
            return 0.0 if not buckets else math.inf
        longest = max(buckets, key=lambda b: b.max_tokens)
        if not self.instance_fits(tp, longest.max_tokens):
            return math.inf
        n = sum(b.count for b in buckets)
        prompt = sum(b.count * b.prompt_tokens for b in buckets) / n
        gen = sum(b.count * b.gen_tokens for b in buckets) / n
        payload = sum(b.count * b.payload_tokens for b in buckets) / n
        resident = prompt + (gen + payload) / 2  # mean context over a trajectory's life
        kv_batch = self.kv_capacity_tokens(tp) / max(resident, 1.0)
        share = n / count  # trajectories per instance
        batch = max(1.0, min(kv_batch, self.rollout.max_batch, share))
        step = self.decode_step_s(tp, batch, resident) + self.host_wait_s(batch * (count - 1))
        steady_steps = share * gen / batch  # decode steps the instance runs at its steady batch
        instance = self.prefill_s(tp, share * (prompt + payload), resident) + steady_steps * step
        return max(instance, max(self._straggler_s(tp, b, steady_steps, step) for b in buckets))

    def _straggler_s(self, tp: int, bucket: LengthBucket, steady_steps: float, step: float) -> float:
        """The bucket's longest trajectory: its prefills, its tokens decoded at the steady batch's
        step time while the instance's other work lasts (`steady_steps`), the rest alone at batch 1
        and its mean context, and its tool calls."""
        gen, total = bucket.longest_gen_tokens, bucket.straggler_total_tokens
        context = (bucket.prompt_tokens + total) / 2
        alongside = min(gen, steady_steps)
        return (self.prefill_s(tp, total - gen, context) + alongside * step
                + (gen - alongside) * self.decode_step_s(tp, 1, context) + bucket.longest_tool_time_s)

    def weight_sync_s(self) -> float:
        """Pushing new weights from the trainer to rollout engines (bf16, one NIC per GPU of a node)."""
        return 0.05 + self.model.weight_bytes / (self.hw.inter_node_bandwidth * self.cluster.gpus_per_node)
