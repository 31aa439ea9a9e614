"""Prefect tasks of the simulation flow (`flows/simulate.py`): draw the workload once, run each
simulated system over it, compute the proven bound, record the runs. The flow's `progress` listener hears of
every simulated step (the CLI's progress bar); a deployment run has none. `check_feasible` refuses a
request no system can run, before anything starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.config import LibraConfig, PlannerConfig, StoreConfig
from libra.errors import InfeasibleError, LibraError

if TYPE_CHECKING:
    from libra.sim.runner import Drawn

SimProgress = Callable[[str, int], None]  # told (system, step) after each simulated step


def request_cost(request, planner: PlannerConfig):
    """The cost model of a simulation request's cluster and model."""
    from libra.planner.cost_model import CostModel
    from libra.planner.profiles import model_profile, parse_cluster

    return CostModel.configured(parse_cluster(request.cluster), model_profile(request.model), planner)


@task(name="workload", cache_policy=NO_CACHE)
def workload_task(request, planner: PlannerConfig) -> Drawn:
    """The simulated steps every system runs, and the cost model they are timed with."""
    from libra.sim.runner import draw

    return draw(request.spec(), request_cost(request, planner), request.steps, request.seed, request.mode())


@task(name="simulate-system", cache_policy=NO_CACHE)
def simulate_system_task(request, system: str, drawn: Drawn, planner: PlannerConfig,
                         progress: SimProgress | None = None):
    """One system's run (`libra.sim.runner.SystemRun`) over the drawn steps; `progress` hears of
    each step."""
    from libra.planner.planner import PlannerSettings
    from libra.sim.runner import simulate_system

    def step_done(name: str, step: int) -> None:
        if progress is not None:
            progress(name, step)

    try:
        return simulate_system(system, drawn, PlannerSettings.of(planner), planner, progress=step_done)
    except InfeasibleError as exc:
        raise cannot_run(request, drawn.cost.model.name, str(exc)) from None


def check_feasible(request, planner: PlannerConfig) -> None:
    """A LibraError when the model cannot train even on all of the cluster's GPUs (then no system
    can run), before anything starts; what each system finds within that is its run's to say."""
    from libra.planner.planner import Planner, PlannerSettings
    from libra.sim.training import workload_of
    from libra.sim.workloads import WorkloadGenerator

    cost = request_cost(request, planner)
    warmup = WorkloadGenerator(request.spec(), request.seed).step(-1)
    if Planner(cost, workload_of(warmup), PlannerSettings.of(planner)).training.best(cost.cluster.gpus) is None:
        raise cannot_run(request, cost.model.name, f"no training configuration fits {cost.cluster.gpus} GPUs")


def cannot_run(request, model: str, reason: str) -> LibraError:
    """The error of a simulation whose model does not fit its cluster, and what to do."""
    return LibraError(f"{model} cannot run on {request.cluster} with workload {request.workload}: {reason}; use more "
                      "or larger GPUs, a smaller model or shorter trajectories")


@task(name="bound", cache_policy=NO_CACHE)
def bound_task(drawn: Drawn, runs: dict) -> dict[str, float]:
    """Each run's proven bound in seconds (`libra.sim.bound`): over the drawn steps for synchronous
    runs (every one trains the same batches), over the batches it trained for partial ones."""
    return run_bounds(drawn.cost, drawn.batches, runs)


def run_bounds(cost, batches: list, runs: dict) -> dict[str, float]:
    """Each run's proven bound in seconds (`bound_task`)."""
    from libra.sim.bound import pooled_bound_s, run_bound

    whole = None
    out = {}
    for name, r in runs.items():
        if r.mode == "sync":
            whole = whole if whole is not None else run_bound(cost, batches).total_s
            out[name] = whole
        else:
            out[name] = pooled_bound_s(cost, r.trained, len(r.steps))
    return out


def summarize(runs: dict, gpus: int, workload: str, bounds: dict[str, float] | None = None) -> dict[str, Any]:
    """Each system's figures and its ratios to libra, the oracle and (given each run's bound in
    seconds, `run_bounds`) the proven bound."""
    out: dict[str, Any] = {"workload": workload, "gpus": gpus, "policies": {}}
    for name, r in runs.items():
        out["policies"][name] = {
            "tokens_per_s": r.tokens_per_s,
            "step_time_mean_s": r.step_time_mean_s,
            "step_time_p99_s": r.step_time_quantile(0.99),
            "idle_gpu_s": r.idle_gpu_s,
            "total_time_s": r.total_time_s,
            "offpolicy_share": r.offpolicy_share,
            "untrained_tokens": r.untrained_tokens,
        }
    for ref in ("libra", "oracle"):
        if ref in runs and runs[ref].tokens_per_s > 0:
            for m in out["policies"].values():
                m[f"vs_{ref}"] = m["tokens_per_s"] / runs[ref].tokens_per_s
    if bounds and runs:
        for name, m in out["policies"].items():
            m["bound_tokens_per_s"] = runs[name].trained_tokens / bounds[name]
            m["vs_bound"] = m["tokens_per_s"] / m["bound_tokens_per_s"]
        reference = "libra" if "libra" in runs else next(iter(runs))
        out["bound_tokens_per_s"] = out["policies"][reference]["bound_tokens_per_s"]
        out["bound_of"] = reference
    return out


@task(name="record-store", cache_policy=NO_CACHE, retries=1)
def record_store_task(runs: dict, run: str, store: StoreConfig, replace: bool, origin: str) -> None:
    """The runs' steps, plans and pool_events as store run `run`, in one commit (`origin` names this
    simulation, so a retry after its commit finds its own run and writes nothing twice)."""
    from tasks.sim_records import record_store

    record_store(runs, run, store, replace, origin)


@task(name="record-mlflow", cache_policy=NO_CACHE)
def record_mlflow_task(runs: dict, summary: dict[str, Any], request, config: LibraConfig) -> str:
    """A parent MLflow run with a child per system; the parent's id. Not retried: a retry after a
    partial write would log a second parent."""
    from tasks.sim_records import record_mlflow

    return record_mlflow(runs, summary, request, config)
