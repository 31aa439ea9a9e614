"""The simulation as a Prefect flow: whole-system policies on a simulated cluster, one task per policy.

    workload         the steps' trajectories, drawn once (every policy sees the same ones)
    simulate-<name>  one task per policy: its run over those steps
    bound            the proven bound's total seconds over the same steps
    record-store     the steps, plans and pool_events tables (one store run per seed)
    record-mlflow    a parent run with a child run per policy, plus plots

`libra simulate` and the `libra-simulate` deployment call `simulate_flow`; `simulate_sweep_flow`
runs it once per seed (a sweep is one flow run). `simulation_request` checks the parameters before
anything starts, with one line naming the parameter as the caller spells it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import flow

from libra.checks import Names, as_parameter, in_range
from libra.config import LibraConfig, PlannerConfig
from libra.errors import LibraError
from tasks.sim_tasks import SimProgress

MAX_TRAJECTORIES = 5_000_000  # simulated trajectories of a whole run (all held in memory)


@dataclass(frozen=True)
class SimulationRequest:
    """A checked simulation: which workload on which cluster, for how long, with which policies."""

    workload: str  # a preset (search-r1, dapo-math, r2e-gym) or trace:FILE.csv
    cluster: str  # NODESxGPUS:HARDWARE
    model: str  # a model profile
    steps: int
    policies: tuple[str, ...]
    group_size: int | None  # samples per prompt (None: the workload's)
    prompts_per_step: int | None  # None: the workload's
    seed: int
    run: str  # the store run

    def spec(self):
        from libra.sim.workloads import workload_spec

        return workload_spec(self.workload, self.group_size, self.prompts_per_step)


def simulation_request(workload: str, cluster: str = "6x8:a800", model: str = "qwen3-14b", steps: int = 200,
                       policies: str | list[str] = "all", group_size: int | None = None,
                       prompts_per_step: int | None = None, seed: int = 0, run: str | None = None,
                       names: Names = as_parameter) -> SimulationRequest:
    """The request, or a LibraError saying which parameter is wrong and what to give instead."""
    from libra.planner.profiles import model_profile, parse_cluster
    from libra.sim.policies import POLICIES
    from storage.writer import check_run_name

    in_range(names("steps"), steps, 1, 100_000)
    in_range(names("group_size"), group_size, 1, 4_096)
    in_range(names("prompts_per_step"), prompts_per_step, 1, 100_000)
    in_range(names("seed"), seed, 0, 2**31 - 1)
    given = policies.split(",") if isinstance(policies, str) else list(policies)
    chosen = list(POLICIES) if given == ["all"] else list(dict.fromkeys(p.strip() for p in given if p.strip()))
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        raise LibraError(f"unknown policies {', '.join(unknown) or '(none given)'}; policies: all, {', '.join(POLICIES)}")
    parse_cluster(cluster)
    model_profile(model)
    request = SimulationRequest(workload, cluster, model, steps, tuple(chosen), group_size, prompts_per_step, seed,
                                check_run_name(run or f"sim-{workload.replace(':', '-').replace('/', '-')}-{seed}"[:128]))
    spec = request.spec()
    if spec.name.startswith("trace:"):
        from libra.traces import read_trace

        read_trace(spec.template)  # a bad trace file is the caller's error, found before anything starts
    else:
        total = steps * spec.group_size * spec.prompts_per_step
        if total > MAX_TRAJECTORIES:
            raise LibraError(f"{steps:,} steps of {spec.prompts_per_step:,} prompts x {spec.group_size:,} samples are "
                             f"{total:,} trajectories, more than the {MAX_TRAJECTORIES:,} a simulation may hold; "
                             "use fewer steps, prompts or samples")
    return request


def check_feasible(request: SimulationRequest, planner: PlannerConfig) -> None:
    """A LibraError when the model cannot train even on all of the cluster's GPUs (then no policy
    can run), before anything starts (`tasks.sim_tasks.check_feasible`)."""
    from tasks.sim_tasks import check_feasible as feasible

    feasible(request, planner)


@flow(name="libra-simulate", log_prints=False)
def simulate_flow(workload: str, cluster: str = "6x8:a800", model: str = "qwen3-14b", steps: int = 200,
                  policies: str | list[str] = "all", group_size: int | None = None, prompts_per_step: int | None = None,
                  seed: int = 0, run: str | None = None, track: bool = True,
                  config: LibraConfig | str | None = None, store: str | None = None,
                  progress: SimProgress | None = None) -> dict[str, Any]:
    """Each policy's figures and its ratios to libra, the oracle and the proven bound (see
    `tasks.sim_tasks.summarize`); `config` is a LibraConfig, a YAML file or None (the defaults);
    `progress` hears of each simulated step of each policy (the CLI's progress bar)."""
    import time

    from flows.runtime import flow_config
    from tasks.sim_tasks import (
        bound_task,
        record_mlflow_task,
        record_store_task,
        simulate_policy_task,
        summarize,
        workload_task,
    )

    settings = flow_config(config, {"store.root": store}, tracking=track)
    request = simulation_request(workload, cluster, model, steps, policies, group_size, prompts_per_step, seed, run)
    check_feasible(request, settings.planner)
    began = time.perf_counter()
    drawn = workload_task(request, settings.planner)
    runs = {name: simulate_policy_task.with_options(name=f"simulate-{name}")(request, name, drawn, settings.planner,
                                                                             progress)
            for name in request.policies}
    bound_s = bound_task(drawn)
    summary = summarize(runs, drawn.gpus, request.workload, bound_s)
    summary["simulation_wall_s"] = time.perf_counter() - began
    record_store_task(runs, request.run, settings.store)
    if track:
        summary["mlflow_parent_run_id"] = record_mlflow_task(runs, summary, request, settings)
    summary["store_run"] = request.run
    return summary


@flow(name="libra-simulate-sweep", log_prints=False)
def simulate_sweep_flow(workload: str, seeds: list[int], cluster: str = "6x8:a800", model: str = "qwen3-14b",
                        steps: int = 200, policies: str | list[str] = "all", group_size: int | None = None,
                        prompts_per_step: int | None = None, track: bool = True,
                        config: LibraConfig | str | None = None, store: str | None = None) -> dict[str, Any]:
    """The simulation once per seed (a store run each, `sim-<workload>-<seed>`), as subflows; every
    seed's request is checked before the first one starts."""
    if not seeds:
        raise LibraError("seeds: give at least one seed")
    for seed in seeds:
        simulation_request(workload, cluster, model, steps, policies, group_size, prompts_per_step, seed)
    return {"workload": workload, "seeds": {
        str(seed): simulate_flow(workload, cluster, model, steps, policies, group_size, prompts_per_step, seed, None,
                                 track, config, store) for seed in seeds}}
