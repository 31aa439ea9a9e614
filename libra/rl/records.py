"""What one iteration of a training run produced, as small typed records: the rolled-out batch and
its statistics, the update, and the iteration's record, which turns itself into the store's rows
(`steps`, `timings`, `pool_events`) and MLflow's metrics. The session (`libra.rl.session`) makes
them; the record tasks (`tasks/train_tasks.py`) write them; checkpoints keep them (pickled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libra.pools.states import PoolEvent
from libra.rl.cluster import Placement
from libra.rl.planning import EngineStart, EngineTiming, TrainTiming, timing_rows
from libra.trainer.samples import TrainingSample
from libra.trainer.trainer import UpdateStats
from libra.types import Trajectory


@dataclass(frozen=True)
class RolloutStats:
    trajectories: int
    generated_tokens: int
    wall_s: float
    reward_mean: float
    reward_std: float
    solved_fraction: float
    turns_mean: float
    length_mean: float  # tokens after the prompt
    migrations: int
    model_version: int


@dataclass(frozen=True)
class Batch:
    """A rolled-out and scored batch: what the update trains on and what the store records."""

    step: int
    samples: tuple[TrainingSample, ...]
    trajectories: tuple[Trajectory, ...]  # with their turns, as the store records them
    stats: RolloutStats
    decode: tuple[EngineTiming, ...] = ()  # the engines' measured decode steps (the planner's calibration)


@dataclass(frozen=True)
class Update:
    stats: UpdateStats
    admitted: int
    dropped: int
    staleness_max: int
    staleness_mean: float
    timing: TrainTiming | None = None


@dataclass(frozen=True)
class IterationRecord:
    """Everything recorded about iteration `step` (store rows and MLflow metrics)."""

    step: int
    batch: Batch
    update: Update
    seconds: dict[str, float]  # rollout, reward, train, sync, evaluate, iteration
    heldout_reward: float | None = None  # after this iteration's update, when evaluated
    start_s: float = 0.0  # when the iteration began, in training seconds since the run began
    version: int = 0  # the weights after the update
    policy: str = "none"  # the placement policy (libra, static, colocated; none: stages share every core)
    placement: Placement | None = None  # where the iteration ran (None: no placement)
    engine_starts: tuple[EngineStart, ...] = ()  # engines (re)started since the last iteration's record
    pool_events: tuple[PoolEvent, ...] = ()  # the hybrids' transitions since the last iteration's record

    def metrics(self) -> dict[str, float]:
        u, b = self.update.stats, self.batch.stats
        out = {"reward": b.reward_mean, "reward_std": b.reward_std, "solved_fraction": b.solved_fraction,
               "generated_tokens": float(b.generated_tokens), "length_mean": b.length_mean, "turns_mean": b.turns_mean,
               "tokens_per_s": b.generated_tokens / self.seconds["iteration"] if self.seconds["iteration"] > 0 else 0.0,
               "loss": u.loss, "grad_norm": u.grad_norm, "kl": u.kl, "entropy": u.entropy, "clip_fraction": u.clip_fraction,
               "logprob_gap": u.logprob_gap, "lr": u.lr, "trained_tokens": float(u.tokens),
               "staleness_max": float(self.update.staleness_max), "staleness_mean": self.update.staleness_mean,
               "dropped_stale": float(self.update.dropped)}
        if self.placement is not None:
            out |= {"rollout_workers": float(len(self.placement.rollout_workers)),
                    "train_workers": float(len(self.placement.train)),
                    "hybrid_workers": float(u.hybrids), "colocated": float(self.placement.colocated)}
        return out | {f"{stage}_s": seconds for stage, seconds in self.seconds.items()}

    def steps_row(self, run: str) -> dict[str, Any]:
        b = self.batch.stats
        p = self.placement
        placed = {} if p is None else {"plan_id": p.plan_id, "train_gpus": len(p.train),
                                       "rollout_gpus": 0 if p.colocated else len(p.rollout_workers),
                                       "hybrid_gpus": self.update.stats.hybrids}
        return placed | {"run": run, "step": self.step, "policy": self.policy, "start_s": self.start_s,
                "rollout_s": b.wall_s, "train_s": self.seconds["train"],
                "step_s": self.seconds["iteration"], "trajectories": b.trajectories, "gen_tokens": b.generated_tokens,
                "trained_tokens": self.update.stats.tokens, "reward_mean": b.reward_mean, "reward_std": b.reward_std}

    def timing_rows(self, hardware: str, model: str) -> list[dict]:
        """The iteration's measured decode and training samples, as `timings` rows."""
        return timing_rows(self.step, self.batch.decode, self.update.timing, hardware, model, self.engine_starts)

    def pool_rows(self) -> list[dict]:
        """The hybrids' transitions during the iteration, as `pool_events` rows at its step (the pool's
        own step, the update's index in the pool, is in the detail)."""
        return [{"step": self.step, "time_s": e.time_s, "worker_id": e.worker_id, "gpus": e.gpus,
                 "from_state": e.from_state, "to_state": e.to_state, "event": e.event,
                 "detail": "; ".join(part for part in (f"pool step {e.step}", e.detail) if part)}
                for e in self.pool_events]
