"""The simulation as a Prefect flow: the simulated systems (whole-system variants, `libra.sim.systems`)
on a simulated cluster, one task per system.

    workload         the steps' trajectories, drawn once (every system sees the same ones)
    simulate-<name>  one task per system: its run over those steps
    bound            the proven bound's total seconds over the same steps
    record-store     the steps, plans and pool_events tables (one store run per seed)
    record-mlflow    a parent run with a child run per system, plus plots

`libra simulate` and the `libra-simulate` deployment call `simulate_flow`; `simulate_sweep_flow`
runs it once per seed (a sweep is one flow run). `simulation_request` checks the parameters before
anything starts, with one line naming the parameter as the caller spells it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from prefect import flow

from libra.checks import Names, as_parameter, in_range
from libra.clock import Stopwatch
from libra.config import LibraConfig, PlannerConfig
from libra.errors import LibraError
from tasks.sim_tasks import SimProgress

MAX_TRAJECTORIES = 5_000_000  # simulated trajectories of a whole run (all held in memory)


@dataclass(frozen=True)
class SimulationRequest:
    """A checked simulation: which workload on which cluster, for how long, with which systems."""

    workload: str  # a preset (search-r1, dapo-math, r2e-gym) or trace:FILE.csv
    cluster: str  # NODESxGPUS:HARDWARE
    model: str  # a model profile
    steps: int
    systems: tuple[str, ...]
    group_size: int | None  # samples per prompt (None: the workload's)
    prompts_per_step: int | None  # None: the workload's
    seed: int
    run: str  # the store run
    rollout_mode: str = "sync"  # sync, partial or async (`libra.sim.modes`)
    overprovision: float = 1.5
    max_staleness: int = 4

    def spec(self):
        from libra.sim.workloads import workload_spec

        return workload_spec(self.workload, self.group_size, self.prompts_per_step)

    def mode(self):
        from libra.sim.modes import RolloutMode

        return RolloutMode(self.rollout_mode, self.overprovision, self.max_staleness)


def simulation_request(workload: str, cluster: str = "6x8:a800", model: str = "qwen3-14b", steps: int = 200,
                       systems: str | list[str] = "all", group_size: int | None = None,
                       prompts_per_step: int | None = None, seed: int = 0, run: str | None = None,
                       names: Names = as_parameter, rollout_mode: str = "sync", overprovision: float = 1.5,
                       max_staleness: int = 4) -> SimulationRequest:
    """The request, or a LibraError saying which parameter is wrong and what to give instead."""
    from libra.planner.profiles import model_profile, parse_cluster
    from libra.sim.modes import check_mode
    from libra.sim.systems import SYSTEMS
    from storage.writer import check_run_name

    in_range(names("steps"), steps, 1, 100_000)
    in_range(names("group_size"), group_size, 1, 4_096)
    in_range(names("prompts_per_step"), prompts_per_step, 1, 100_000)
    in_range(names("seed"), seed, 0, 2**31 - 1)
    in_range(names("overprovision"), overprovision, 1, 16)
    in_range(names("max_staleness"), max_staleness, 0, 1_000)
    given = systems.split(",") if isinstance(systems, str) else list(systems)
    chosen = list(SYSTEMS) if given == ["all"] else list(dict.fromkeys(s.strip() for s in given if s.strip()))
    unknown = [s for s in chosen if s not in SYSTEMS]
    if unknown or not chosen:
        raise LibraError(f"unknown systems {', '.join(unknown) or '(none given)'}; systems: all, {', '.join(SYSTEMS)}")
    parse_cluster(cluster)
    model_profile(model)
    suffix = "" if rollout_mode == "sync" else f"-{rollout_mode}"
    request = SimulationRequest(workload, cluster, model, steps, tuple(chosen), group_size, prompts_per_step, seed,
                                check_run_name(run or re.sub(r"[^A-Za-z0-9._-]+", "-", f"sim-{workload}-{seed}{suffix}")[:128]),
                                rollout_mode, overprovision, max_staleness)
    check_mode(rollout_mode, overprovision, max_staleness, names)
    spec = request.spec()
    if spec.name.startswith("trace:"):
        from libra.traces import read_trace

        if group_size is not None:  # a replay runs the trace's own samples of each prompt
            raise LibraError(f"{names('group_size')} {group_size}: a trace workload replays the samples its file "
                             "holds for each prompt; leave it out, or simulate a preset workload")

        trace = read_trace(spec.template)  # a bad trace file is the caller's error, found before anything starts
        prompts = {t.prompt_id for t in trace.trajectories}
        samples = -(-len(trace.trajectories) // max(1, len(prompts)))  # its samples a prompt, on average
    else:
        samples = spec.group_size
    total = steps * samples * spec.prompts_per_step
    if total > MAX_TRAJECTORIES:  # (a trace's once passed unchecked: 10^10 trajectories, drawn until memory ran out)
        raise LibraError(f"{steps:,} steps of {spec.prompts_per_step:,} prompts x {samples:,} samples are "
                         f"{total:,} trajectories, more than the {MAX_TRAJECTORIES:,} a simulation may hold; "
                         "use fewer steps, prompts or samples")
    return request


def check_feasible(request: SimulationRequest, planner: PlannerConfig) -> None:
    """A LibraError when the model cannot train even on all of the cluster's GPUs (then no system
    can run), before anything starts (`tasks.sim_tasks.check_feasible`)."""
    from tasks.sim_tasks import check_feasible as feasible

    feasible(request, planner)


@flow(name="libra-simulate", log_prints=False)
def simulate_flow(workload: str, cluster: str = "6x8:a800", model: str = "qwen3-14b", steps: int = 200,
                  systems: str | list[str] = "all", group_size: int | None = None, prompts_per_step: int | None = None,
                  seed: int = 0, run: str | None = None, track: bool = True,
                  config: LibraConfig | str | None = None, store: str | None = None,
                  progress: SimProgress | None = None, policies: str | list[str] | None = None,
                  rollout_mode: str = "sync", overprovision: float = 1.5, max_staleness: int = 4,
                  replace: bool = False) -> dict[str, Any]:
    """Each system's figures and its ratios to libra, the oracle and the proven bound (see
    `tasks.sim_tasks.summarize`), recorded as store run `run` (one that exists is refused before
    anything is simulated, unless `replace`: then replaced whole);
    `config` is a LibraConfig, a YAML file or None (the defaults);
    `progress` hears of each simulated step of each system (the CLI's progress bar); `policies` is
    the old name of `systems`; `rollout_mode` sync, partial or async, with partial rollouts'
    `overprovision` and `max_staleness` (`libra.sim.modes`)."""
    import uuid

    from prefect.utilities.annotations import quote

    from flows.runtime import flow_config
    from libra.renames import renamed_parameter
    from storage.manifest import SIMULATION_ORIGIN, simulation_origin
    from storage.writer import refuse_existing, refuse_other_origin
    from tasks.sim_tasks import (
        bound_task,
        record_mlflow_task,
        record_store_task,
        simulate_system_task,
        summarize,
        workload_task,
    )

    systems = renamed_parameter("policies", "systems", policies, systems, "all")
    settings = flow_config(config, {"store.root": store}, tracking=track)
    request = simulation_request(workload, cluster, model, steps, systems, group_size, prompts_per_step, seed, run,
                                 rollout_mode=rollout_mode, overprovision=overprovision, max_staleness=max_staleness)
    check_feasible(request, settings.planner)
    if not replace:
        refuse_existing(settings.store.root, request.run)
    else:  # a training run's checkpoints would be left without their run, never to resume
        refuse_other_origin(settings.store.root, request.run, SIMULATION_ORIGIN, "a simulation", replacing=True,
                            hint="--replace replaces only a simulation; name this one another way (--run NAME)")
    origin = simulation_origin(f"{request.workload}, {request.cluster}, {request.model}, {request.steps} steps, "
                               f"{uuid.uuid4().hex[:12]}")
    watch = Stopwatch()
    drawn = workload_task(request, settings.planner)
    # the steps' trajectories and the runs go to the tasks as they are (`quote`): Prefect would
    # otherwise walk every trajectory of every step looking for futures in them
    runs = {name: simulate_system_task.with_options(name=f"simulate-{name}")(request, name, quote(drawn),
                                                                             settings.planner, progress)
            for name in request.systems}
    bounds = bound_task(quote(drawn), quote(runs))
    summary = summarize(runs, drawn.cost.cluster.gpus, request.workload, bounds)
    summary["rollout_mode"] = request.rollout_mode
    summary["simulation_wall_s"] = watch.seconds()
    record_store_task(quote(runs), request.run, settings.store, replace, origin)
    if track:
        summary["mlflow_parent_run_id"] = record_mlflow_task(quote(runs), summary, request, settings)
    summary["store_run"] = request.run
    return summary


@flow(name="libra-simulate-sweep", log_prints=False)
def simulate_sweep_flow(workload: str, seeds: list[int], cluster: str = "6x8:a800", model: str = "qwen3-14b",
                        steps: int = 200, systems: str | list[str] = "all", group_size: int | None = None,
                        prompts_per_step: int | None = None, track: bool = True,
                        config: LibraConfig | str | None = None, store: str | None = None,
                        policies: str | list[str] | None = None, replace: bool = False) -> dict[str, Any]:
    """The simulation once per seed (a store run each, `sim-<workload>-<seed>`, replaced whole with
    `replace`), as subflows; every seed's request is checked before the first one starts. `policies`
    is the old name of `systems`."""
    from libra.renames import renamed_parameter

    systems = renamed_parameter("policies", "systems", policies, systems, "all")
    if not seeds:
        raise LibraError("seeds: give at least one seed")
    for seed in seeds:
        simulation_request(workload, cluster, model, steps, systems, group_size, prompts_per_step, seed)
    return {"workload": workload, "seeds": {
        str(seed): simulate_flow(workload, cluster, model, steps, systems, group_size, prompts_per_step, seed, None,
                                 track, config, store, replace=replace) for seed in seeds}}
