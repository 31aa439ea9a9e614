"""The training run as a Prefect flow: open the run (resuming from its newest checkpoint), evaluate
the policy on held-out tasks, run the iterations (`flows.rl_iteration`), and close the run with its
plots and summary. Every iteration is checkpointed; killed at any point, the same flow continues
from the last completed iteration, and each step lands once in the store and in MLflow. A run
placed by Libra (`placement.policy: libra`) runs the planning flow (`flows.planning`) before the
iterations the trigger names; where the stages run decides the iteration's pipeline.

`libra train` and the `libra-train` deployment call `train_flow` with the same parameters: a config
(a LibraConfig, a YAML file's path, or None for the embedded defaults) and the few values a run is
usually started with (steps, run name, environment, placement policy, store). A flow run that
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

from flows.planning import planning_flow
from flows.rl_iteration import rl_iteration_flow
from libra.config import LibraConfig
from libra.config_loading import resolve_config
from libra.errors import HostLostError, LibraError
from tasks.planning_tasks import follow_hosts_task, planning_due_task
from tasks.train_tasks import (
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
                    env: str | None = None, policy: str | None = None, store: str | None = None,
                    backend: str | None = None) -> LibraConfig:
    """The run's config: `config` with the given values in place of trainer.steps, trainer.run,
    trainer.env, placement.policy, store.root and trainer.backend; then every check that can refuse
    the run before anything is written or started (`check_training`)."""
    resolved = resolve_config(config, {"trainer.steps": steps, "trainer.run": run, "trainer.env": env,
                                       "placement.policy": policy, "store.root": store, "trainer.backend": backend})
    check_training(resolved)
    return resolved


def check_training(config: LibraConfig) -> None:
    from libra.scheduler.replay import POLICIES
    from storage.writer import check_run_name

    check_run_name(config.trainer.run_name())
    from libra.rl.ray_cluster import address_of

    t = config.trainer
    if t.backend == "megatron" and address_of(config):
        raise LibraError("trainer.backend megatron trains on rank processes of this machine; a Ray cluster's workers "
                         "train with trainer.backend: torch")
    if t.backend == "megatron" and config.placement.hybrids and (t.layout == "planned" or (t.tp, t.pp, t.dp) != (1, 1, 1)):
        raise LibraError(f"placement.hybrids {config.placement.hybrids} with trainer.backend megatron: hybrids join the "
                         "elastic pool as data-parallel replicas of one process each, beside a core of one, so the "
                         "layout is TP = PP = DP = 1 (trainer.layout fixed, trainer.tp/pp/dp 1)")
    if t.backend == "megatron" and config.placement.hybrids and config.pool.device == "cuda":
        raise LibraError("placement.hybrids with trainer.backend megatron train on the CPU (the pool's megatron task "
                         "builds megatron's model with its CPU shims); set pool.device: cpu or trainer.backend: torch")
    check_megatron_layout(config)
    router = config.rollout.router
    if router not in POLICIES or router == "oracle":
        raise LibraError(f"rollout.router: unknown router {router!r}; routers: {', '.join(p for p in POLICIES if p != 'oracle')}")
    for device, where in ((config.rollout.device, "rollout.device"), (config.trainer.device, "trainer.device")):
        if device == "cuda":
            from libra.devices import gpu_count

            if gpu_count() == 0:
                raise LibraError(f"{where} is cuda, but torch sees no GPU here; set it to cpu")
    from tasks.train_tasks import policy_missing

    missing = policy_missing(config)
    if missing:
        raise LibraError(missing)


def check_megatron_layout(config: LibraConfig) -> None:
    """A megatron layout this machine cannot run is refused before the run starts: a fixed layout
    with more ranks than the placement's training workers, or, unplaced, than this process's cores."""
    import os

    from libra.rl.ray_cluster import address_of
    from libra.rl.trainers import check_layout_fits, fixed_layout

    t = config.trainer
    if t.backend != "megatron" or address_of(config):
        return
    if config.placement.policy != "none":
        from libra.rl.cluster import initial_placement
        from libra.rl.placing import local_cluster

        cluster = local_cluster(config)
        check_layout_fits(config, initial_placement(config.placement.policy, cluster, config.placement.hybrids))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    layout = fixed_layout(config)  # unplaced, the layout is fixed (planned needs a placement: the config says so)
    if layout is not None and t.device == "cpu" and layout.world > cores:
        raise LibraError(f"trainer.tp x pp x dp = {layout.world} rank processes ({layout}), but this process may use "
                         f"{cores} core(s): a rank needs one of its own; lower the layout")


@flow(name="libra-train", log_prints=False)
def train_flow(config: LibraConfig | str | None = None, steps: int | None = None, run: str | None = None,
               env: str | None = None, policy: str | None = None, restart: bool = False,
               store: str | None = None) -> dict[str, Any]:
    """Train the run to its last step (resuming it when it has checkpoints; `restart`: from the
    policy again); its summary: where it started, its checkpoint, its MLflow run, its state."""
    from flows.runtime import prepare_runtime, quiet_engines

    config = training_config(config, steps, run, env, policy, store)
    prepare_runtime(config)
    quiet_engines()
    prepare_policy_task(config)
    t = config.trainer
    info = open_session_task(config, restart)
    try:
        mlflow_run_id = start_tracking_task(info.run)
        if info.unrecorded:  # the process died between the checkpoint and its record: record it (once)
            record_task(info.run, mlflow_run_id, announce=False)
        if "0" not in info.heldout and info.version == 0:
            log_evaluation_task(mlflow_run_id, 0, evaluate_task(info.run))
        step, recoveries = info.step, 0
        while step < t.steps:
            try:
                # hosts lost or back (a Ray cluster): placed anew, which is this step's plan
                if not follow_hosts_task(info.run, step, mlflow_run_id) and planning_due_task(info.run, step):
                    planning_flow(info.run, step, mlflow_run_id)
                setup = iteration_setup_task(info.run, step)
                rl_iteration_flow(info.run, step, t.steps, t.env, setup.pipeline, t.eval_every,
                                  rolled_out=setup.rolled_out, mlflow_run_id=mlflow_run_id)
                step, recoveries = step + 1, 0
            except HostLostError as lost:
                recoveries += 1
                if recoveries > MAX_RECOVERIES:  # hosts keep failing before any step completes
                    raise
                info = recover_task(config, lost.host)  # from the newest checkpoint, on the hosts left
                if info.unrecorded:
                    record_task(info.run, mlflow_run_id, announce=False)
                step = info.step
        summary = finish_tracking_task(info.run, mlflow_run_id)
    finally:
        close_session_task(info.run)
    return {"run": info.run, "resumed_at": info.step, "mlflow_run_id": mlflow_run_id, **summary}
