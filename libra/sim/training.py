"""Training in the simulator: a batch's training time from the cost model, and hybrid replicas
joining it (what a join costs and how much it speeds the step up)."""

from __future__ import annotations

from dataclasses import replace

from libra.errors import LibraError
from libra.planner.cost_model import CostModel, TrainConfig
from libra.planner.planner import Planner, PlannerSettings
from libra.planner.workload import TrajectoryLength, Workload, build_workload
from libra.sim.workloads import SimTrajectory


def workload_of(trajectories: list[SimTrajectory], steps: int = 1) -> Workload:
    """The planner's view of `trajectories`; with `steps` > 1 they are several steps' batches pooled,
    and the counts are those of one step (the window's mean)."""
    lengths = [TrajectoryLength(t.prompt_tokens, t.gen_tokens, sum(u.payload_tokens for u in t.turns), len(t.turns),
                                sum(u.tool_latency_s for u in t.turns)) for t in trajectories]
    return build_workload(lengths, round(len(lengths) / steps) if steps > 1 else None)


def train_seconds(cost: CostModel, config: TrainConfig, gpus: int, batch: list[SimTrajectory],
                  settings: PlannerSettings) -> tuple[float, TrainConfig]:
    """Training time of `batch`; a configuration that no longer fits memory is replaced by the best
    one on the same GPUs (the trainer re-shards), falling back to ZeRO-3 sharding when nothing else fits."""
    workload = workload_of(batch)
    if cost.train_memory_bytes(config, workload.max_tokens) > cost.train_memory_limit_bytes():
        for fallback in (cost, replace(cost, training=replace(cost.training, zero_stage=3))):
            best = Planner(fallback, workload, settings).training.best(gpus)
            if best is not None:
                return fallback.train_time(best.config, workload).seconds, best.config
        raise LibraError(f"no training configuration of {cost.model.name} fits {gpus} GPUs for sequences of "
                         f"{workload.max_tokens:,} tokens, even with ZeRO-3; simulate with more GPUs or a smaller model")
    return cost.train_time(config, workload).seconds, config




def join_seconds(cost: CostModel, config: TrainConfig) -> float:
    """A hybrid replica fetching the latest weights and optimizer state (its shard) from a snapshot."""
    shard_bytes = 14 * cost.model.total_params / (config.tp * config.pp)  # bf16 weights + fp32 Adam state
    return 2.0 + shard_bytes / cost.hw.inter_node_bandwidth


def with_hybrids(cost: CostModel, train_s: float, config: TrainConfig,
                 released: list[tuple[int, float]]) -> tuple[float, list]:
    """Training time when hybrid GPUs join as extra replicas at their release time + the time to
    fetch a snapshot (`join_seconds`)."""
    join_s = join_seconds(cost, config)
    replica = config.tp * config.pp
    arrivals = sorted(t + join_s for _, t in released)
    gpus_joined = 0
    now, done, rate = 0.0, 0.0, 1.0  # rate: replicas relative to the core's
    events = []
    for (gpus, _), at in zip(sorted(released, key=lambda r: r[1]), arrivals, strict=True):
        if at >= now + (1 - done) * train_s / rate:
            break
        done += (at - now) * rate / train_s
        now = at
        gpus_joined += gpus
        rate = (config.dp + gpus_joined // replica) / config.dp
        events.append((at, "join_training", gpus))
    return now + (1 - done) * train_s / rate, events
