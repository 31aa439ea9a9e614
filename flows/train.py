"""The training run as a Prefect flow: open the run (resuming from its newest checkpoint), evaluate
the policy on held-out tasks, run the iterations (`flows.rl_iteration`), and close the run with its
plots and summary. Every iteration is checkpointed; killed at any point, the same flow continues
from the last completed iteration, and each step lands once in the store and in MLflow. A run
placed by Libra (`placement.strategy: libra`) runs the planning flow (`flows.replanning`) before the
iterations the trigger names; where the stages run decides the iteration's pipeline.

`libra train` and the `libra-train` deployment call `train_flow` with the same parameters: a config
(a LibraConfig, a YAML file's path, or None for the embedded defaults) and the few values a run is
usually started with (steps, run name, environment, placement strategy, store). A flow run that
crashed is resumed by running the flow again with the same run name: it continues from the run's
newest checkpoint, each step recorded once.

On a Ray cluster a host may go away mid-iteration: the iteration's `HostLostError` (an engine or a
trainer rank gone with it) makes the flow wait until Ray counts the host gone, open the run again
from its newest checkpoint on the hosts that are left (placed anew there, recorded as that step's
plan) and go on from the last completed step; a host that comes back is placed on again before the
next iteration (`follow-hosts`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.replanning import planning_flow
from flows.rl_iteration import rl_iteration_flow
from libra.config import LibraConfig
from libra.config_loading import resolve_config
from libra.errors import HostLostError
from tasks.replanning_tasks import follow_hosts_task, planning_due_task
from tasks.run_context import Listener, PolicyProgress, RunContext
from tasks.train_tasks import (
    check_training,
    close_session_task,
    evaluate_task,
    finish_tracking_task,
    iteration_setup_task,
    log_evaluation_task,
    open_session_task,
    prepare_policy_task,
    record_task,
    recover_task,
    start_tracking_task,
)

MAX_RECOVERIES = 3  # host losses in a row, with no step completed between them, before the run gives up


def training_config(config: LibraConfig | str | None = None, steps: int | None = None, run: str | None = None,
                    env: str | None = None, placement: str | None = None, store: str | None = None,
                    backend: str | None = None, restart: bool = False) -> LibraConfig:
    """The run's config: `config` with the given values in place of trainer.steps, trainer.run,
    trainer.env, placement.strategy, store.root and trainer.backend; then every check that can refuse
    the run before anything is written or started (`tasks.train_tasks.check_training`; `restart`: the
    run is to be trained again whole)."""
    resolved = resolve_config(config, {"trainer.steps": steps, "trainer.run": run, "trainer.env": env,
                                       "placement.strategy": placement, "store.root": store, "trainer.backend": backend})
    check_training(resolved, restart)
    return resolved


@flow(name="libra-train", log_prints=False)
def train_flow(config: LibraConfig | str | None = None, steps: int | None = None, run: str | None = None,
               env: str | None = None, placement: str | None = None, restart: bool = False,
               store: str | None = None, listeners: tuple[Listener, ...] = (),
               policy_progress: PolicyProgress | None = None, policy: str | None = None) -> dict[str, Any]:
    """Train the run to its last step (resuming it when it has checkpoints; `restart`: from the
    policy again); its summary: where it started, its checkpoint, its MLflow run, its state.
    `listeners` hear of each recorded iteration, `policy_progress` of each step of building the
    local policy (the CLI's progress lines; a deployment run has none). `placement` overrides
    placement.strategy; `policy` is its old name."""
    from flows.runtime import prepare_runtime, quiet_engines
    from libra.renames import renamed_parameter

    placement = renamed_parameter("policy", "placement", policy, placement, None)
    config = training_config(config, steps, run, env, placement, store, restart=restart)
    prepare_runtime(config)
    quiet_engines()
    context = RunContext(listeners, policy_progress)
    prepare_policy_task(context, config)
    t = config.trainer
    info = open_session_task(context, config, restart)
    try:
        mlflow_run_id = start_tracking_task(context)
        if info.unrecorded:  # the process died between the checkpoint and its record: record it (once)
            record_task(context, mlflow_run_id, announce=False)
        if "0" not in info.heldout and info.version == 0:
            log_evaluation_task(mlflow_run_id, 0, evaluate_task(context))
        step, recoveries = info.step, 0
        while step < t.steps:
            try:
                # hosts lost or back (a Ray cluster): placed anew, which is this step's plan
                if not follow_hosts_task(context, step, mlflow_run_id) and planning_due_task(context, step):
                    planning_flow(context, step, mlflow_run_id)
                setup = iteration_setup_task(context, step)
                rl_iteration_flow(context, step, t.steps, t.env, setup.pipeline, t.eval_every,
                                  rolled_out=setup.rolled_out, mlflow_run_id=mlflow_run_id)
                step, recoveries = step + 1, 0
            except HostLostError as lost:
                recoveries += 1
                if recoveries > MAX_RECOVERIES:  # hosts keep failing before any step completes
                    raise
                info = recover_task(context, config, lost.host)  # from the newest checkpoint, on the hosts left
                if info.unrecorded:
                    record_task(context, mlflow_run_id, announce=False)
                step = info.step
        summary = finish_tracking_task(context, mlflow_run_id)
    finally:
        close_session_task(context)
    return {"run": info.run, "resumed_at": info.step, "mlflow_run_id": mlflow_run_id, **summary}
