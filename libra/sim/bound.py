"""A proven lower bound on a simulated run's time: no split, layout, router or pool policy can
finish the same steps sooner in this physics (the rollout simulator and the cost model's training).

Two facts of the physics give it.

Work. A GPU does one thing at a time, so a step lasts at least the GPU-seconds of work in it over
the cluster's GPUs. A step of a TP-`tp` instance decoding `batch` sequences at mean context c costs
`tp` GPUs for its GEMM phase, max(the batch's matmul FLOPs at peak, the weights' share over HBM),
then its attention phase (the batch's KV over HBM, and one sequence's KV again), then all-reduces,
a fixed cost and a cost per sequence (`cost_model`). Each splits into per-token terms that no TP or
batch makes smaller, since `tp` GPUs times a GPU's share is at least the whole (KV heads are split
or replicated, never fewer in total) and a batch holds at most `max_batch` sequences:
    GEMM      batch x max(FLOPs, weights / batch) >= batch x max(FLOPs, weights / max_batch)
    KV        c tokens of KV at TP1 per token
    tail      one sequence's KV per step: c tokens of KV at TP1 / `max_batch` per token
    fixed     fixed / `max_batch` per token; per sequence: its cost (on one GPU at least)
Prefill costs its FLOPs at the prefill efficiency on any TP. Training a batch costs at least its
FLOPs at the modelled MFU (no pipeline bubble, no communication).

The longest trajectory. Its turns run one after another: each prompt or tool result is prefilled,
each token decoded at least as slowly as a batch of one at its context (a step only grows with the
batch and the contexts beside it), each tool call takes its latency; every turn on the fastest TP
that holds it.

Step k of one-step-off pipelining rolls out batch k while batch k-1 trains, then syncs weights:
    T_k >= max((rollout work_k + training work_{k-1}) / GPUs, longest_k, training's fixed cost) + sync
and the run adds the last batch's training. A colocated step (rollout, then training) is no shorter
than the same sum regrouped, so the bound holds for every policy the simulator runs, the oracle
included. It is not attainable in general: perfect packing at `max_batch` on every GPU and the
longest trajectory alone never happen together.

Partial rollouts and the asynchronous mode take the longest trajectory out of the step: it can be
suspended and continued later, so no step has to wait for it, and the batches a run trains are its
own choice (the first groups to complete). What remains holds for the batches it did train: every
trained trajectory was generated whole at least once (continuing one only adds the prefill of its
context again), every batch was trained, every training step costs its fixed seconds and every
step ends with a weight sync. Over N steps training B batches,
    T >= max((sum of rollout work + sum of training work) / GPUs, B x training's fixed cost) + N x sync
(the sum over steps of each step's max is at least the max of the sums). It bounds a run by the
batches it trained (`pooled_bound_s`): no policy trains those batches sooner, with partial rollouts
or without; a run that trained other batches has its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from libra.planner.cost_model import CostModel
from libra.sim.training import workload_of
from libra.sim.workloads import SimTrajectory

TPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class StepBound:
    rollout_gpu_s: float  # least GPU-seconds to roll out the step's batch
    train_gpu_s: float  # least GPU-seconds to train it
    longest_s: float  # least seconds for its longest trajectory alone


@dataclass(frozen=True)
class RunBound:
    steps: tuple[StepBound, ...]
    gpus: int
    sync_s: float  # weight sync after every step
    train_fixed_s: float  # fixed seconds of any training step

    def step_s(self, k: int) -> float:
        """Least time of step k (rollout of batch k beside training of batch k-1)."""
        step = self.steps[k]
        work = step.rollout_gpu_s + (self.steps[k - 1].train_gpu_s if k else 0.0)
        floor = self.train_fixed_s if k else 0.0
        return max(work / self.gpus, step.longest_s, floor) + self.sync_s

    @property
    def total_s(self) -> float:
        """Least time of the whole run: every step, then the last batch's training."""
        if not self.steps:
            return 0.0
        tail = max(self.steps[-1].train_gpu_s / self.gpus, self.train_fixed_s)
        return sum(self.step_s(k) for k in range(len(self.steps))) + tail


def _turns(trajectory: SimTrajectory):
    """(new tokens to prefill, context after them, tokens generated, tool latency) per turn, with
    contexts as the rollout simulator prices them (a turn decodes at its starting context)."""
    context = 0
    for i, turn in enumerate(trajectory.turns):
        new = trajectory.prompt_tokens if i == 0 else trajectory.turns[i - 1].payload_tokens
        context += new
        yield new, context, turn.gen_tokens, turn.tool_latency_s
        context += turn.gen_tokens


def rollout_gpu_s(cost: CostModel, trajectories: Sequence[SimTrajectory]) -> float:
    """Least GPU-seconds any set of instances spends rolling the trajectories out (module docstring)."""
    m, hw, c = cost.model, cost.hw, cost.coefficients
    most = cost.rollout.max_batch
    gemm = max(c.decode_compute * 2 * m.matmul_params / hw.peak_flops, c.decode_memory * m.weight_bytes / most / hw.hbm_bandwidth)
    kv = m.kv_bytes_per_token(1) / hw.hbm_bandwidth  # seconds per token of context read once
    prefill = tokens = kv_read = 0.0
    for trajectory in trajectories:
        for new, context, gen, _ in _turns(trajectory):
            prefill += cost.prefill_s(1, new, context)
            tokens += gen
            kv_read += gen * context * kv
    return (prefill + tokens * gemm + (c.decode_kv + c.decode_kv_tail / most) * kv_read
            + tokens * (c.decode_step_s / most + c.decode_seq_s))


def longest_s(cost: CostModel, trajectories: Sequence[SimTrajectory]) -> float:
    """Least seconds of the slowest trajectory run alone, each turn on the fastest TP that holds it."""
    tps = cost.instance_tps(TPS)
    limit = {tp: min(cost.kv_capacity_tokens(tp), cost.rollout.max_context_tokens) for tp in tps}
    slowest = 0.0
    for trajectory in trajectories:
        seconds = 0.0
        for new, context, gen, tool_s in _turns(trajectory):
            fitting = [tp for tp in tps if context + gen <= limit[tp]]
            if not fitting:
                return math.inf
            seconds += min(cost.prefill_s(tp, new, context) + gen * cost.decode_step_s(tp, 1, context)
                           for tp in fitting) + tool_s
        slowest = max(slowest, seconds)
    return slowest


def train_gpu_s(cost: CostModel, batch: Sequence[SimTrajectory]) -> float:
    """Least GPU-seconds to train the batch: its FLOPs at the modelled MFU."""
    return cost.coefficients.train_compute * cost.train_flops(workload_of(list(batch))) / cost.hw.peak_flops


def step_bound(cost: CostModel, batch: Sequence[SimTrajectory]) -> StepBound:
    return StepBound(rollout_gpu_s(cost, batch), train_gpu_s(cost, batch), longest_s(cost, batch))


def run_bound(cost: CostModel, batches: Sequence[Sequence[SimTrajectory]]) -> RunBound:
    return RunBound(tuple(step_bound(cost, batch) for batch in batches), cost.cluster.gpus,
                    cost.weight_sync_s(), cost.coefficients.train_step_s)


def pooled_bound_s(cost: CostModel, trained: Sequence[Sequence[SimTrajectory]], steps: int) -> float:
    """Least seconds in which any policy, suspending and continuing trajectories across steps as it
    likes, trains the batches `trained` in `steps` steps (module docstring)."""
    batches = [batch for batch in trained if batch]
    work = sum(rollout_gpu_s(cost, batch) + train_gpu_s(cost, batch) for batch in batches)
    return max(work / cost.cluster.gpus, len(batches) * cost.coefficients.train_step_s) + steps * cost.weight_sync_s()
