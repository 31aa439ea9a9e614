"""The planning flow: before an iteration, when the trigger says so (the first time after warm-up,
every `planner.period_steps` iterations, and when the stages' measured times drift from what the
plan in force predicted), re-plan the run from its own statistics and move its workers.

    read-run-stats   the recent trajectories, timing samples, tool returns and last step (DuckDB)
    plan             fit the cost model to the timings (`calibrate`), the controller decides
    move-workers     the engines and the trainer to the new placement (when the plan pays)
    rebuild-tree     the router's causal trees from the same recent steps, swapped in
    record-plan      the plan, moves and rebuild into the store and MLflow

The training flow (`flows/train.py`) runs it for runs whose placement strategy is `libra`.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from libra.clock import Stopwatch
from tasks.replanning_tasks import apply_task, plan_task, read_stats_task, rebuild_tree_task, record_plan_task
from tasks.run_context import RunContext


@flow(name="libra-planning", log_prints=False)
def planning_flow(context: RunContext, step: int, mlflow_run_id: str) -> dict[str, Any]:
    """Re-plan the run of `context` before iteration `step`: what was planned, and moved."""
    watch = Stopwatch(context.session.clock)
    stats = read_stats_task(context)
    outcome = plan_task(context, step, stats)
    if outcome is None:
        return {"step": step, "planned": False}
    moves = apply_task(context, outcome) if outcome.applied else []
    tree = rebuild_tree_task(context, stats)
    record_plan_task(context, outcome, moves, tree, watch.seconds(), mlflow_run_id)
    return {"step": step, "planned": True, "applied": outcome.applied, "reason": outcome.row["reason"],
            "moved": sum(1 for m in moves if m["event"] == "moved")}
