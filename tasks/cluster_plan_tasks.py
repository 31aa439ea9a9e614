"""Prefect tasks of the plan flow (`flows/cluster_plan.py`): the lengths to plan for (a run in the store or a
trace file), the run's timing samples, and the plan as a JSON-ready record."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.clock import WallClock
from libra.config import LibraConfig
from libra.errors import LibraError

if TYPE_CHECKING:
    from libra.planner.cost_model import CostModel
    from libra.planner.planner import Plan, PlanProgress
    from libra.planner.profiles import Cluster, ModelProfile
    from libra.planner.workload import Workload


@dataclass(frozen=True)
class Lengths:
    lengths: list  # the planner's TrajectoryLength records
    source: str  # "run NAME" or "trace FILE"


@task(name="read-lengths", cache_policy=NO_CACHE)
def lengths_task(run: str | None, trace: str | None, config: LibraConfig) -> Lengths:
    from libra.planner.workload import lengths_from_rows, lengths_from_trajectories

    if trace:
        from libra.traces import read_trace

        return Lengths(lengths_from_trajectories(read_trace(trace).trajectories), f"trace {trace}")
    from storage.catalog import Catalog
    from storage.queries import run_named

    with Catalog(config.store.root, run, threads=config.store.duckdb_threads) as catalog:
        rows = run_named(catalog, "trajectory_lengths", last_steps=config.planner.recent_steps).to_pylist()
    return Lengths(lengths_from_rows(rows), f"run {run}")


@task(name="read-timings", cache_policy=NO_CACHE)
def timings_task(run: str, config: LibraConfig) -> list:
    """The run's timing samples (the calibration's input)."""
    from libra.planner.calibrate import samples_from_rows
    from storage.catalog import Catalog
    from storage.queries import run_named

    with Catalog(config.store.root, run, threads=config.store.duckdb_threads) as catalog:
        rows = run_named(catalog, "timing_samples", last_steps=config.planner.recent_steps).to_pylist()
    samples = samples_from_rows(rows)
    if not samples:
        raise LibraError(f"run {run!r} has no timing samples to calibrate from (table timings is empty)")
    return samples


@task(name="plan", cache_policy=NO_CACHE)
def plan_task(request, lengths: Lengths, samples: list | None, config: LibraConfig,
              progress: PlanProgress | None = None) -> dict[str, Any]:
    """The plan for the request's cluster and model (calibrated on `samples` when given);
    `progress` hears the search's (pools searched, pools)."""
    from libra.planner.cost_model import CostModel
    from libra.planner.planner import Planner, PlannerSettings
    from libra.planner.profiles import model_profile, parse_cluster
    from libra.planner.workload import build_workload

    cluster, model = parse_cluster(request.cluster), model_profile(request.model)
    settings = PlannerSettings.of(config.planner)
    if request.mode:
        settings = settings.model_copy(update={"mode": request.mode})
    workload = build_workload(lengths.lengths, request.batch or config.planner.batch_trajectories)
    if workload.tokens <= 0:
        raise LibraError(f"{lengths.source}: every trajectory has 0 tokens; there is nothing to plan for")
    cost = CostModel.configured(cluster, model, config.planner)
    calibration = None
    if samples:
        from libra.planner.calibrate import fit

        calibration = fit(cost, samples)
        cost = replace(cost, coefficients=calibration.coefficients)
    plan = Planner(cost, workload, settings).plan(WallClock(), progress)
    check_feasible(plan, cost, workload)
    payload = plan_json(plan, cluster, model, workload, lengths.source)
    if calibration is not None:
        payload["calibration"] = {"coefficients": asdict(calibration.coefficients), "samples": calibration.samples,
                                  "mean_abs_rel_error": calibration.mean_abs_rel_error,
                                  "set_aside": calibration.set_aside}
    return payload


def check_feasible(plan: Plan, cost: CostModel, workload: Workload) -> None:
    if plan.train is None or math.isinf(plan.t_train_s):
        raise LibraError(
            f"no training configuration of {cost.model.name} fits {cost.hw.name} GPUs for sequences of "
            f"{workload.max_tokens:,} tokens; use larger GPUs, more of them, or a shorter maximum length"
        )
    if math.isinf(plan.t_rollout_s):
        raise LibraError(
            f"no rollout instance of {cost.model.name} on {cost.hw.name} can hold a trajectory of "
            f"{workload.max_tokens:,} tokens (KV cache or max context); cap the trajectory length"
        )


def plan_json(plan: Plan, cluster: Cluster, model: ModelProfile, workload: Workload, source: str) -> dict[str, Any]:
    config = plan.train.config
    stats = plan.stats
    return {
        "cluster": str(cluster),
        "gpus": cluster.gpus,
        "model": model.name,
        "mode": plan.mode,
        "source": source,
        "trajectories_per_step": round(workload.trajectories, 3),
        "length_buckets": [{"max_tokens": b.max_tokens, "trajectories": round(b.count, 3)} for b in workload.buckets],
        "train": {"gpus": plan.train_gpus, "tp": config.tp, "pp": config.pp, "dp": config.dp, "ep": config.ep,
                  "micro_batch": config.micro_batch, "memory_gb": round(plan.train.memory_bytes / 1e9, 2)},
        "rollout": {"gpus": plan.rollout_gpus,
                    "instances": [{"tp": g.tp, "count": g.count, "max_tokens": g.max_tokens,
                                   "seconds": round(g.seconds, 3)} for g in plan.rollout.groups]},
        "hybrid": {"gpus": plan.hybrid_gpus, "rollout_share": plan.hybrid_rollout_share},
        "idle_gpus": plan.idle_gpus,
        "t_train_s": round(plan.t_train_s, 3),
        "t_rollout_s": round(plan.t_rollout_s, 3),
        "t_sync_s": round(plan.t_sync_s, 3),
        "t_iter_s": round(plan.t_iter_s, 3),
        "search_ms": round(plan.search_ms, 2),
        "search": {"splits": stats.splits, "train_enumerated": stats.train_enumerated,
                   "train_memory_pruned": stats.train_memory_pruned, "train_costed": stats.train_costed,
                   "rollout_solves": stats.rollout_solves, "rollout_dp_evaluations": stats.rollout_dp_evaluations},
    }
