"""Prefect tasks of the planning flow (`flows/replanning.py`). Like the training tasks, each takes the
run's context (`tasks.run_context.RunContext`); the live objects (the session's engines, trainer,
router, the plan controller) stay in its session. Results are small records.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.clock import Stopwatch
from libra.rl.cluster import Placement
from storage.manifest import TRAIN_ORIGIN
from tasks.run_context import RunContext

if TYPE_CHECKING:
    from libra.planner.controller import PlanController
    from libra.rl.session import TrainingSession


@dataclass(frozen=True)
class RunStats:
    """What the planning flow reads of the run from the store (DuckDB), over the recent steps."""

    lengths: tuple[dict, ...]  # `trajectory_lengths` rows
    timings: tuple[dict, ...]  # `timing_samples` rows
    returns: tuple[dict, ...]  # `remaining_length_paths` rows (the routing tree's input)
    last_step: dict | None  # the newest `steps` row


@dataclass(frozen=True)
class PlanOutcome:
    step: int
    plan_id: str
    reason: str
    applied: bool
    placement: Placement | None  # the placement to move to, when applied
    row: dict  # the `plans` row
    calibration: dict  # samples per kind and mean relative error after the fit


@dataclass(frozen=True)
class TreeRebuild:
    paths: int
    nodes: int
    seconds: float


@task(name="planning-due", cache_policy=NO_CACHE)
def planning_due_task(context: RunContext, step: int) -> str | None:
    """Why the planning flow should run before iteration `step` (the trigger's reason), or None;
    the measured rollout time of the last iteration first corrects the plan in force's prediction.
    The run's plan controller is made here on first use (`new_controller`)."""
    s = context.session
    if s.config.placement.strategy != "libra" or s.last_record is None:
        return None
    from libra.rl.planning import step_times

    if s.controller is None:
        # the one place the controller is set: it is kept on the session, whose checkpoint saves it
        # (`planning_state`) and whose reopening restores it
        s.controller = new_controller(s)
    controller = s.controller
    record = s.last_record
    times = step_times({"step": record.step, "rollout_s": record.batch.stats.wall_s, "train_s": record.seconds["train"]})
    if controller.current is not None:
        controller.record(times.t_rollout_s, controller.current.t_rollout_s)
    return controller.due(step, times, force=True)


@task(name="follow-hosts", cache_policy=NO_CACHE, retries=0)
def follow_hosts_task(context: RunContext, step: int, mlflow_run_id: str) -> str:
    """On a Ray cluster, before iteration `step`: when hosts left or came back since the run was
    placed, place it anew on the hosts there are and record that as the step's plan (the `plans`
    row, the hosts' `pool_events` rows with the iteration's); why, or '' when nothing changed."""
    import pyarrow as pa

    from libra.rl.planning import placement_row
    from storage.ingest import writer_for
    from tasks.tracking_tasks import log_step_once

    s = context.session
    run = s.run
    reason = s.follow_hosts(step) or s.replaced
    if not reason:
        return ""
    assert s.placement is not None
    with writer_for(s.config.store).transaction(run, mode="update", origin=TRAIN_ORIGIN) as tx:
        tx.write_step("plans", step, pa.Table.from_pylist([placement_row(step, f"hosts-{step}", s.placement, reason)]))
    log_step_once(mlflow_run_id, {"plan_applied": 1.0, "plan_train_workers": float(len(s.placement.train)),
                                  "plan_rollout_workers": float(len(s.placement.rollout_workers)),
                                  "cluster_workers": float(s.cluster.size if s.cluster else 0)}, step,
                  sentinel="plan_applied")
    s.replaced = ""
    return reason


@task(name="read-run-stats", cache_policy=NO_CACHE)
def read_stats_task(context: RunContext) -> RunStats:
    """The run's recent trajectories, timing samples, tool returns and last step, from the store."""
    from storage.catalog import Catalog
    from storage.queries import run_named

    s = context.session
    run = s.run
    recent = s.config.planner.recent_steps
    with Catalog(s.config.store.root, run, threads=s.config.store.duckdb_threads) as catalog:
        lengths = run_named(catalog, "trajectory_lengths", last_steps=recent).to_pylist()
        timings = run_named(catalog, "timing_samples", last_steps=recent).to_pylist()
        returns = run_named(catalog, "remaining_length_paths", last_steps=recent).to_pylist()
        last = catalog.query("SELECT step, rollout_s, train_s FROM steps ORDER BY step DESC LIMIT 1").to_pylist()
    return RunStats(tuple(lengths), tuple(timings), tuple(returns), last[0] if last else None)


def new_controller(s: TrainingSession) -> PlanController:
    """A plan controller for the session's run: the live variants (split, colocated) over this
    machine's workers, the trigger's engine start the measured one."""
    from libra.planner.controller import PlanController  # noqa: F811 - at run time
    from libra.planner.trigger import TriggerSettings
    from libra.rl.planning import live_variants

    trigger = TriggerSettings.of(s.config.planner).model_copy(update={"engine_start_s": s.engine_start_s})
    return PlanController(_cost(s), trigger=trigger, variants=live_variants(s.cluster, s.config.planner,
                                                                          s.config.placement.hybrids))


def _cost(s):
    from libra.rl.planning import policy_cost_model

    return policy_cost_model(s.cluster, s.policy, s.config.planner)


@task(name="plan", cache_policy=NO_CACHE)
def plan_task(context: RunContext, step: int, stats: RunStats) -> PlanOutcome | None:
    """Fit the cost model to the run's timing samples, then let the controller decide for the
    recent workload: the plan, whether it pays to move, and where that puts the workers. The
    controller is the one `planning-due` made or the checkpoint restored."""
    from libra.planner.calibrate import fit, samples_from_rows
    from libra.planner.workload import build_workload, lengths_from_rows
    from libra.rl.cluster import placement_of
    from libra.rl.planning import adopt_placement, move_held, plan_row, step_times
    from libra.rl.trainers import fixed_layout, planned_running

    s = context.session
    if not stats.lengths:
        return None
    controller = s.controller
    if controller is None:
        raise RuntimeError("the run has no plan controller: the planning flow runs after planning-due")
    fitted = fit(_cost(s), samples_from_rows(stats.timings))
    controller.cost = replace(controller.cost, coefficients=fitted.coefficients)
    t = s.config.trainer
    workload = build_workload(lengths_from_rows(stats.lengths), t.prompts_per_step * t.samples_per_prompt)
    if controller.current is None:  # the run started from its own placement: weigh the first plan against it
        adopt_placement(controller, s.placement, workload, planned_running(s.config, s.placement))
    times = step_times(stats.last_step) if stats.last_step else None
    plan_id = f"plan-{step}"
    calibrating = fitted.wait_reason()  # a move that pays waits while the fit keeps default coefficients
    # a move pays off over the run's remaining iterations at most (step..steps-1)
    event = controller.observe(step, workload, times, force=True, steps_left=t.steps - step,
                               hold=lambda plan: move_held(plan, s.cluster, plan_id, calibrating,
                                                           s.placement if s.config.placement.hybrids else None,
                                                           fixed_layout(s.config)))
    if event is None:
        return None
    placement = placement_of(event.candidate, s.cluster, plan_id) if event.applied else None
    calibration = {"samples": fitted.samples, "mean_abs_rel_error": fitted.mean_abs_rel_error,
                   "kept_defaults": list(fitted.kept_defaults), "set_aside": fitted.set_aside}
    return PlanOutcome(step, plan_id, event.reason, placement is not None, placement, plan_row(step, plan_id, event),
                       calibration)


@task(name="move-workers", cache_policy=NO_CACHE)
def apply_task(context: RunContext, outcome: PlanOutcome) -> list[dict]:
    """Move the workers to the outcome's placement (engines restart only when theirs change); the
    `pool_events` rows of every worker moved, and of the engines' restart."""
    from libra.rl.planning import move_rows
    from libra.rl.trainers import reshard_row

    s = context.session
    old = s.placement
    assert outcome.placement is not None and old is not None
    restarted = s.apply(outcome.placement)
    time_s = float(s.state.summary.get("elapsed_s", 0.0))
    rows = move_rows(outcome.step, time_s, old, outcome.placement, s.cluster)
    if restarted:
        rows.append({"step": outcome.step, "time_s": time_s, "worker_id": "engines", "gpus": len(outcome.placement.rollout_workers),
                     "from_state": "serving", "to_state": "serving", "event": "engines_restarted",
                     "detail": f"{len(s.engines)} engine(s) of {list(outcome.placement.engine_sizes())} workers in "
                               f"{s.engine_start_s:.1f} s"})
    if s.reshard is not None:  # the plan's training layout is not the trainer's: its ranks restarted in it
        rows.append(reshard_row(outcome.step, time_s, s.reshard, len(outcome.placement.train)))
        s.reshard = None
    return rows


@task(name="rebuild-tree", cache_policy=NO_CACHE)
def rebuild_tree_task(context: RunContext, stats: RunStats) -> TreeRebuild | None:
    """Rebuild the router's causal trees from the recent steps in the store and swap them in (None
    when the run's router keeps no tree)."""
    from libra.scheduler.causal_tree import paths_from_rows

    s = context.session
    rebuild = getattr(s.router, "rebuild_trees", None)
    if rebuild is None:
        return None
    watch = Stopwatch(s.clock)
    paths = paths_from_rows(stats.lengths, stats.returns)
    nodes = rebuild(paths)
    return TreeRebuild(len(paths), nodes, watch.seconds())


@task(name="record-plan", cache_policy=NO_CACHE, retries=1)
def record_plan_task(context: RunContext, outcome: PlanOutcome, moves: list[dict], tree: TreeRebuild | None, seconds: float,
                     mlflow_run_id: str) -> None:
    """The plan, the moves and the tree rebuild into the store (`plans`, `pool_events`; replacing
    the step's rows, so a retried or resumed planning writes them once) and MLflow (metrics at the
    step, among them `planning_s`, the flow's seconds so far; the plan history as an artifact)."""
    import mlflow
    import pyarrow as pa

    from storage.ingest import writer_for
    from tasks.tracking_tasks import log_step_once

    s = context.session
    run = s.run
    time_s = float(s.state.summary.get("elapsed_s", 0.0))
    events = list(moves)
    if tree is not None:
        events.append({"step": outcome.step, "time_s": time_s, "worker_id": "router", "gpus": 0, "from_state": "serving",
                       "to_state": "serving", "event": "tree_rebuilt",
                       "detail": f"{tree.paths} trajectories, {tree.nodes} nodes, {tree.seconds * 1000:.0f} ms"})
    with writer_for(s.config.store).transaction(run, mode="update", origin=TRAIN_ORIGIN) as tx:
        tx.write_step("plans", outcome.step, pa.Table.from_pylist([outcome.row]))
        if events:
            tx.write_step("pool_events", outcome.step, pa.Table.from_pylist(events))
    s.plan_events[outcome.step] = events  # the iteration's record rewrites the step's pool_events with its own
    row = outcome.row
    log_step_once(mlflow_run_id, {"plan_applied": float(outcome.applied), "plan_t_iter_s": row["t_iter_s"],
                                  "planning_s": seconds,
                                  "plan_train_workers": float(row["train_gpus"]),
                                  "plan_rollout_workers": float(row["rollout_gpus"] or 0),
                                  "workers_moved": float(sum(1 for m in moves if m["event"] == "moved"))},
                  outcome.step, sentinel="plan_applied")
    history = [{"step": e.step, "reason": e.reason, "applied": e.applied, "held": e.held, "t_iter_s": e.candidate.t_iter_s,
                "current_t_iter_s": e.current_t_iter_s, "train_workers": e.candidate.train_gpus,
                "rollout_workers": e.candidate.rollout_gpus, "mode": e.candidate.mode,
                "decision": asdict(e.decision) if e.decision else None} for e in s.controller.events]
    with tempfile.TemporaryDirectory(prefix="libra-plans-") as directory:
        path = Path(directory) / "plan_history.json"
        path.write_text(json.dumps({"plans": history, "calibration": outcome.calibration}, indent=1, default=str))
        mlflow.MlflowClient().log_artifact(mlflow_run_id, str(path))
