"""The training run as a Prefect flow: open the run (resuming from its newest checkpoint), evaluate
the policy on held-out tasks, run the iterations (`flows.rl_iteration`), and close the run with its
plots and summary. Every iteration is checkpointed; killed at any point, the same flow continues
from the last completed iteration, and each step lands once in the store and in MLflow.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.rl_iteration import rl_iteration_flow
from libra.config import LibraConfig
from tasks.train_tasks import (
    close_session_task,
    evaluate_task,
    finish_tracking_task,
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
            rl_iteration_flow(info.run, step, t.steps, t.env, t.pipeline, t.eval_every,
                              rolled_out=step in info.pending or (step > info.step and t.pipeline == "one_step_off"),
                              mlflow_run_id=mlflow_run_id)
        summary = finish_tracking_task(info.run, mlflow_run_id)
    finally:
        close_session_task(info.run)
    return {"run": info.run, "resumed_at": info.step, "mlflow_run_id": mlflow_run_id, **summary}
