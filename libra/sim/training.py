"""Training in the simulator: a batch's training time from the cost model, and hybrid replicas
joining it (what a join costs, whether the pool's join policy lets it in, and how much it speeds
the step up)."""

from __future__ import annotations

from dataclasses import replace

from libra.errors import LibraError
from libra.planner.cost_model import CostModel, TrainConfig
from libra.planner.planner import Planner, PlannerSettings
from libra.planner.workload import TrajectoryLength, Workload, build_workload
from libra.pools.joins import JoinAction, JoinProgress, JoinSettings, decide
from libra.sim.workloads import SimTrajectory

DEFAULT_JOINS = JoinSettings()  # the pool's defaults (`pool.enter_gap`, `pool.join_timeout_s`)


def workload_of(trajectories: list[SimTrajectory], steps: int = 1) -> Workload:
    """The planner's view of `trajectories`; with `steps` > 1 they are several steps' batches pooled,
    and the counts are those of one step (the window's mean)."""
    lengths = lengths_of(trajectories)
    return build_workload(lengths, round(len(lengths) / steps) if steps > 1 else None)


def lengths_of(trajectories: list[SimTrajectory]) -> list[TrajectoryLength]:
    """The planner's record of each trajectory."""
    return [t.length for t in trajectories]


def train_seconds(cost: CostModel, config: TrainConfig, gpus: int, batch: list[SimTrajectory],
                  settings: PlannerSettings, count: int | None = None) -> tuple[float, TrainConfig]:
    """Training time of `batch` (with `count`: of a step of that many trajectories shaped as `batch`);
    a configuration that no longer fits memory is replaced by the best one on the same GPUs (the
    trainer re-shards), falling back to ZeRO-3 sharding when nothing else fits."""
    workload = build_workload(lengths_of(batch), count)
    if cost.train_memory_bytes(config, workload.max_tokens) > cost.train_memory_limit_bytes():
        for fallback in (cost, replace(cost, training=cost.training.model_copy(update={"zero_stage": 3}))):
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


def with_hybrids(cost: CostModel, train_s: float, config: TrainConfig, released: list[tuple[int, float]],
                 joins: JoinSettings = DEFAULT_JOINS, join_s: float | None = None) -> tuple[float, list]:
    """Training time when hybrid GPUs join as extra replicas: each asks to join at its release and
    has the snapshot `join_seconds` later; the pool's join policy (`libra.pools.joins`) then lets it
    in (the snapshot is of the step being trained, so it is no step behind) or, past
    `join_timeout_s`, turns it away. A hybrid arriving after the step would have ended is no help.
    `join_s` replaces what a join costs (`join_seconds`)."""
    join_s = join_seconds(cost, config) if join_s is None else join_s
    replica = config.tp * config.pp
    arrivals = sorted(t + join_s for _, t in released)
    gpus_joined = 0
    now, done, rate = 0.0, 0.0, 1.0  # rate: replicas relative to the core's
    events = []
    for (gpus, asked), at in zip(sorted(released, key=lambda r: r[1]), arrivals, strict=True):
        if at >= now + (1 - done) * train_s / rate:
            break
        if decide(JoinProgress(asked, synced=0), 0, at, joins) is not JoinAction.ENTER:
            continue
        done += (at - now) * rate / train_s
        now = at
        gpus_joined += gpus
        rate = (config.dp + gpus_joined // replica) / config.dp
        events.append((at, "join_training", gpus))
    return now + (1 - done) * train_s / rate, events
