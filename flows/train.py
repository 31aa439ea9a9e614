"""The training run as a Prefect flow: open the run (resuming from its newest checkpoint), evaluate
the policy on held-out tasks, run the iterations (`flows.rl_iteration`), and close the run with its
plots and summary. Every iteration is checkpointed; killed at any point, the same flow continues
from the last completed iteration, and each step lands once in the store and in MLflow. A run
placed by Libra (`placement.policy: libra`) runs the planning flow (`flows.planning`) before the
iterations the trigger names; where the stages run decides the iteration's pipeline.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.planning import planning_flow
from flows.rl_iteration import rl_iteration_flow
from libra.config import LibraConfig
from tasks.planning_tasks import planning_due_task
from tasks.train_tasks import (
    close_session_task,
    evaluate_task,
    finish_tracking_task,
    iteration_setup_task,
    log_evaluation_task,
    open_session_task,
    record_task,
    start_tracking_task,
)


@flow(name="libra-train", log_prints=False)
def train_flow(config: LibraConfig, restart: bool = False) -> dict[str, Any]:
    t = config.trainer
    info = open_session_task(config, restart)
    try:
        mlflow_run_id = start_tracking_task(info.run)
        if info.unrecorded:  # the process died between the checkpoint and its record: record it (once)
            record_task(info.run, mlflow_run_id, announce=False)
        if "0" not in info.heldout and info.version == 0:
            log_evaluation_task(mlflow_run_id, 0, evaluate_task(info.run))
        for step in range(info.step, t.steps):
            if planning_due_task(info.run, step):
                planning_flow(info.run, step, mlflow_run_id)
            setup = iteration_setup_task(info.run, step)
            rl_iteration_flow(info.run, step, t.steps, t.env, setup.pipeline, t.eval_every, rolled_out=setup.rolled_out,
                              mlflow_run_id=mlflow_run_id)
        summary = finish_tracking_task(info.run, mlflow_run_id)
    finally:
        close_session_task(info.run)
    return {"run": info.run, "resumed_at": info.step, "mlflow_run_id": mlflow_run_id, **summary}
