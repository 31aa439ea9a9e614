"""Prefect tasks of the pool flow (`flows/pool.py`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.clock import Stopwatch, sleep
from libra.config import LibraConfig, PoolConfig, StoreConfig


@dataclass(frozen=True)
class PoolOutcome:
    """What a pool run leaves: its events, per-step figures, final weights and wall time."""

    events: list  # PoolEvent, in order
    steps: list[dict]  # per step: seconds, replicas, active, retried
    model: dict  # final parameters (core rank 0)
    wall_s: float


def _pool(request, settings: PoolConfig, hybrids: int, provider=None, schedule: dict | None = None):
    from libra.pools.pool import ElasticPool
    from libra.pools.task import RegressionTask

    return ElasticPool(RegressionTask(hidden=request.hidden, global_batch=request.batch), steps=request.steps,
                       core_ranks=request.core, hybrids=hybrids, out_dir=f"{settings.snapshot_dir}/{request.run}",
                       provider=provider, group_timeout_s=settings.group_timeout_s,
                       join_timeout_s=settings.join_timeout_s, max_catchup_steps=settings.max_catchup_steps,
                       enter_gap=settings.enter_gap, min_step_s=request.pace, poll_s=settings.poll_s,
                       schedule=schedule or {}, device=settings.device)


@task(name="train-pool", cache_policy=NO_CACHE)
def train_pool_task(request, settings: PoolConfig) -> PoolOutcome:
    """Run the pool to its last step, SIGKILLing each named hybrid once training reaches its step.
    Not retried: the kills are part of the run."""
    provider = None
    if request.provider == "ray":
        import ray

        from libra.pools.providers import RayActors

        ray.init(num_cpus=max(2, request.hybrids), include_dashboard=False, log_to_driver=False, configure_logging=False)
        provider = RayActors()
    try:
        pool = _pool(request, settings, request.hybrids, provider, dict(request.schedule))
        watch = Stopwatch(pool.clock)
        pool.start(wait_for_hybrids_s=120)
        for worker, step in sorted(request.kills, key=lambda k: k[1]):
            while pool.progress < step and pool.running:
                sleep(pool.clock, settings.poll_s)
            pool.kill(worker)
        result = pool.wait(max(600.0, request.steps * (request.pace + 5)))
        wall = watch.seconds()
    finally:
        if request.provider == "ray":
            import ray

            ray.shutdown()
    return PoolOutcome(list(result.events), list(result.steps), result.model, wall)


@task(name="record-events", cache_policy=NO_CACHE, retries=1)
def record_events_task(run: str, events: list, store: StoreConfig) -> None:
    """The run's transitions as its `pool_events` (each step's rows replaced, so a retry writes once);
    a run whose schedule moved no hybrid within its steps has none to write."""
    from libra.pools.pool import events_table
    from storage.ingest import writer_for

    if events:
        writer_for(store).write_run("pool_events", run, events_table(events))


@task(name="verify-pool", cache_policy=NO_CACHE)
def verify_pool_task(request, settings: PoolConfig, model: dict) -> float:
    """The largest |difference| between `model` and a core-only run's final parameters."""
    reference = _pool(request, settings, 0).start().wait()
    return max((model[k] - reference.model[k]).abs().max().item() for k in model)


def summarize(request, outcome: PoolOutcome) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for e in outcome.events:
        counts[e.event] = counts.get(e.event, 0) + 1
    steps = outcome.steps
    return {"run": request.run, "core_ranks": request.core, "hybrids": request.hybrids, "steps": len(steps),
            "wall_s": outcome.wall_s, "step_time_mean_s": sum(s["seconds"] for s in steps) / len(steps),
            "replica_steps": sum(s["active"] for s in steps), "retried_steps": sum(s["retried"] for s in steps),
            "active_min": min(s["active"] for s in steps), "active_max": max(s["active"] for s in steps),
            "events": counts}


@task(name="track-pool", cache_policy=NO_CACHE)
def track_pool_task(summary: dict[str, Any], request, outcome: PoolOutcome, config: LibraConfig) -> str:
    from tasks.tracking_tasks import log_run

    params = {"core_ranks": request.core, "hybrids": request.hybrids, "steps": request.steps,
              "schedule": json.dumps(dict(request.schedule)), "kills": ",".join(f"{w}@{s}" for w, s in request.kills),
              "hidden": request.hidden, "batch": request.batch}
    metrics = {"wall_s": summary["wall_s"], "step_time_mean_s": summary["step_time_mean_s"],
               "retried_steps": summary["retried_steps"], "replica_steps": summary["replica_steps"]}
    steps = [(s["step"], {"step_s": s["seconds"], "active_replicas": s["active"]}) for s in outcome.steps]
    return log_run(config.tracking.experiment("pool"), config.tracking.artifact_root, request.run, params,
                   metrics, steps=steps, texts={"pool_events.json": json.dumps([asdict(e) for e in outcome.events],
                                                                              indent=1)})
