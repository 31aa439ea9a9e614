"""A resource plan as a Prefect flow, for a cluster and a model, from the lengths of a run in the
store or of a per-turn trace file (optionally calibrated on the run's measured timings):

    read-lengths     the recent trajectories' lengths (DuckDB over the run, or the trace file)
    read-timings     with `calibrate`: the run's timing samples
    plan             the planner's split, training parallelism and rollout layout

It only reads. The planning flow inside a training run (`flows/replanning.py`) also moves that run's
workers, so it runs in the training flow's process; this one plans offline: `libra plan` and the
`libra-plan` deployment call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import flow

from libra.checks import Names, as_parameter, field_range, in_range
from libra.config import LibraConfig, PlannerConfig
from libra.errors import LibraError
from libra.planner.planner import PlanProgress


@dataclass(frozen=True)
class PlanRequest:
    cluster: str  # NODESxGPUS:HARDWARE
    model: str
    run: str | None  # lengths from this store run ...
    trace: str | None  # ... or from this trace file
    mode: str | None  # one_step_off, sync or colocated (None: planner.mode)
    batch: int | None  # trajectories per step (None: planner.batch_trajectories)
    calibrate: bool


def plan_request(cluster: str, model: str, run: str | None = None, trace: str | None = None, mode: str | None = None,
                 batch: int | None = None, calibrate: bool = False, names: Names = as_parameter) -> PlanRequest:
    from libra.planner.profiles import model_profile, parse_cluster

    if (run is None) == (trace is None):
        raise LibraError(f"give one of {names('run')} and {names('trace')}: where the lengths come from")
    if trace is not None and not trace.strip():
        raise LibraError(f"{names('trace')} '' names no file: give a per-turn trace, FILE.csv")
    if calibrate and not run:
        raise LibraError(f"{names('calibrate')} needs {names('run')} (timings are read from the run's store)")
    if mode not in (None, "one_step_off", "sync", "colocated"):
        raise LibraError(f"{names('mode')} {mode!r}: modes are one_step_off, sync and colocated")
    in_range(names("batch"), batch, *field_range(PlannerConfig, "batch_trajectories"))
    parse_cluster(cluster)
    model_profile(model)
    return PlanRequest(cluster, model, run, trace, mode, batch, calibrate)


@flow(name="libra-plan", log_prints=False)
def plan_flow(cluster: str, model: str, run: str | None = None, trace: str | None = None, mode: str | None = None,
              batch: int | None = None, calibrate: bool = False, config: LibraConfig | str | None = None,
              store: str | None = None, progress: PlanProgress | None = None) -> dict[str, Any]:
    """The plan as a JSON-ready record (`tasks.cluster_plan_tasks.plan_json`); `progress` hears the
    search's (pools searched, pools) (the CLI's progress bar)."""
    from flows.runtime import flow_config
    from tasks.cluster_plan_tasks import lengths_task, plan_task, timings_task

    settings = flow_config(config, {"store.root": store}, tracking=False)
    request = plan_request(cluster, model, run, trace, mode, batch, calibrate)
    lengths = lengths_task(request.run, request.trace, settings)
    samples = timings_task(request.run, settings) if request.calibrate else None
    return plan_task(request, lengths, samples, settings, progress)
