"""Prefect tasks of a training run. Each takes the run's context (`tasks.run_context.RunContext`,
made by the training flow): the run's engines, trainer and batches live in its session there, never
in task results. Results are small records. Only the recording tasks retry: their writes are
idempotent by step.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.checks import missing_policy
from libra.config import LibraConfig, TrainerConfig
from libra.errors import LibraError
from libra.rl.records import RolloutStats, Update
from libra.rl.runs import open_session
from libra.rl.session import TrainingSession
from storage.manifest import TRAIN_ORIGIN
from tasks.run_context import RunContext

DEFAULT_POLICY = TrainerConfig.model_fields["policy"].default  # built (or copied) when it is missing


def default_policy(policy: Path) -> tuple[str, ...] | None:
    """Which of Libra's own policy directories `policy` is, which it builds (or copies) when missing:
    () for the default one (DEFAULT_POLICY), (env,) for that one tuned on an environment
    (DEFAULT_POLICY-<env>, as `libra policy tune --env <env>` writes it); None for any other."""
    from libra.rollout.envs import ENVS
    from libra.rollout.policy import tuned_dir

    base, policy = Path(DEFAULT_POLICY).resolve(), policy.resolve()
    for env in ENVS:
        if policy == tuned_dir(base, env):
            return (env,)
    return () if policy == base else None


def policy_missing(config: LibraConfig) -> str | None:
    """Why the run cannot start for want of a policy: trainer.policy names a directory with none
    that is not one of Libra's own (Libra writes only where it was asked to); None otherwise."""
    policy = Path(config.trainer.policy)
    return None if default_policy(policy) is not None else missing_policy(policy, "trainer.policy")


def check_training(config: LibraConfig, restart: bool = False) -> None:
    """A LibraError for a run that cannot start as configured (run name, a run of another kind by that
    name, backend and layout, router, devices, policy), before anything is written or started;
    `flows.train.training_config` calls it. `restart`: the run is to be trained again whole (its
    store run is replaced, even one whose manifest cannot be read)."""
    from libra.scheduler.replay import LIVE_ROUTERS, check_routers
    from storage.writer import check_run_name, refuse_other_origin

    run = check_run_name(config.trainer.run_name())
    refuse_other_origin(config.store.root, run, TRAIN_ORIGIN, "a training run", replacing=restart)
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
    check_routers([router], LIVE_ROUTERS, "rollout.router")
    for device, where in ((config.rollout.device, "rollout.device"), (config.trainer.device, "trainer.device")):
        if device == "cuda":
            from libra.devices import require_gpus

            require_gpus(1, f"{where} is cuda", "set it to cpu")
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
    if config.placement.strategy != "none":
        from libra.rl.cluster import initial_placement
        from libra.rl.placing import local_cluster

        cluster = local_cluster(config)
        check_layout_fits(config, initial_placement(config.placement.strategy, cluster, config.placement.hybrids))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    layout = fixed_layout(config)  # unplaced, the layout is fixed (planned needs a placement: the config says so)
    if layout is not None and t.device == "cpu" and layout.world > cores:
        raise LibraError(f"trainer.tp x pp x dp = {layout.world} rank processes ({layout}), but this process may use "
                         f"{cores} core(s): a rank needs one of its own; lower the layout")


@task(name="prepare-policy", cache_policy=NO_CACHE)
def prepare_policy_task(context: RunContext, config: LibraConfig) -> None:
    """Put the local policy in place when the config names one of Libra's own directories and it
    holds none (`default_policy`): the shipped policy is copied, or built when it does not fit the
    settings (minutes), then tuned when the directory is a tuned one (the shipped tuning copied
    likewise); the context's policy-progress listener hears of each step of building it."""
    policy = Path(config.trainer.policy)
    if (policy / "config.json").is_file() or (which := default_policy(policy)) is None:
        return
    from libra.rollout.policy import PolicySettings, TuneSettings, init_policy, tune_policy

    base = Path(DEFAULT_POLICY) if which else policy
    init_policy(base, PolicySettings(), log=lambda _: None, progress=context.policy_built, sandbox=config.sandbox)
    for env in which:
        tune_policy(policy, base, TuneSettings(env=env), log=lambda _: None, progress=context.policy_built,
                    sandbox=config.sandbox)


@dataclass(frozen=True)
class SessionInfo:
    run: str
    step: int  # the next iteration
    version: int
    pending: tuple[int, ...]  # batches already rolled out (restored from the checkpoint)
    heldout: dict[str, float]  # held-out reward by weights version, so far
    unrecorded: bool  # the last checkpoint's iteration may not be recorded yet
    mlflow_run_id: str


def _info(s: TrainingSession) -> SessionInfo:
    return SessionInfo(s.run, s.state.step, s.state.version, tuple(sorted(s.pending)),
                       dict(s.state.summary.get("heldout", {})), s.last_record is not None, s.state.mlflow_run_id)


@dataclass(frozen=True)
class IterationSetup:
    pipeline: str  # one_step_off, async or sync
    rolled_out: bool  # the iteration's batch was rolled out ahead (or restored from the checkpoint)


@task(name="iteration-setup", cache_policy=NO_CACHE)
def iteration_setup_task(context: RunContext, step: int) -> IterationSetup:
    """How iteration `step` runs: the placement's pipeline (the stages overlap only on workers of
    their own), or the trainer's when the run is not placed."""
    s = context.session
    pipeline = s.placement.pipeline if s.placement is not None else s.config.trainer.pipeline
    if s.config.trainer.pipeline == "async" and pipeline == "one_step_off":  # the stages overlap: asynchronously
        pipeline = "async"
    return IterationSetup(pipeline, step in s.pending)


@task(name="open-session", cache_policy=NO_CACHE)
def open_session_task(context: RunContext, config: LibraConfig, restart: bool = False) -> SessionInfo:
    """Load the policy (or the run's newest checkpoint), start the engines and the trainer, and hold
    the session in the run's context. `restart`: the run's checkpoints are removed first (it trains
    again from the policy)."""
    context.hold(open_session(config, restart))
    return _info(context.session)


@task(name="recover-hosts", cache_policy=NO_CACHE)
def recover_task(context: RunContext, config: LibraConfig, host: str) -> SessionInfo:
    """After `host` was lost mid-iteration: wait for Ray to count it gone (up to
    cluster.start_timeout_s), close the run's session and open it again from its newest checkpoint on
    the hosts there are (`open_session` places it anew when they changed); the iteration in
    flight was not checkpointed, so it runs again, and nothing of it was recorded."""
    lost = context.release()
    try:
        lost.await_departure(host, config.cluster.start_timeout_s)
    finally:
        lost.close()
    context.hold(open_session(config))
    return _info(context.session)


@task(name="close-session", cache_policy=NO_CACHE)
def close_session_task(context: RunContext) -> None:
    context.close()


@task(name="rollout", cache_policy=NO_CACHE)
def rollout_task(context: RunContext, step: int, beside: int | None = None) -> float:
    """Roll out iteration `step` on the engines; returns seconds. `beside`: the update it runs
    beside in the asynchronous pipeline (its batch closes once that update is done)."""
    return context.session.rollout(step, beside=beside)


def _reward(context: RunContext, step: int) -> RolloutStats:
    return context.session.score(step).stats


# one reward task per environment: each names what it judges
reward_tasks = {env: task(_reward, name=f"reward-{env}", cache_policy=NO_CACHE) for env in ("search", "math", "repo")}


@task(name="update", cache_policy=NO_CACHE)
def update_task(context: RunContext, step: int) -> Update:
    """One GRPO update on batch `step` (trajectories beyond the staleness bound are dropped)."""
    return context.session.update(step)


@task(name="sync-weights", cache_policy=NO_CACHE)
def sync_task(context: RunContext) -> float:
    return context.session.sync()


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(context: RunContext) -> float:
    """Held-out reward with the engines' current weights; remembered in the run's state."""
    s = context.session
    reward = s.evaluate()
    s.note_evaluation(s.engine_version, reward)
    return reward


@task(name="checkpoint", cache_policy=NO_CACHE)
def checkpoint_task(context: RunContext, step: int, update: Update, seconds: dict[str, float], heldout: float | None,
                    mlflow_run_id: str) -> str:
    s = context.session
    return str(s.checkpoint(s.finish_iteration(step, update, seconds, heldout), mlflow_run_id))


@task(name="start-tracking", cache_policy=NO_CACHE)
def start_tracking_task(context: RunContext) -> str:
    """The run's MLflow run in the experiment of its environment, with the whole configuration as
    parameters: the one its checkpoint names, or (a run starting from the policy) a new one, the
    earlier runs of that name being marked superseded."""
    import mlflow

    from tasks.tracking_tasks import create_run, ensure_experiment, supersede_runs

    s = context.session
    run = s.run
    config = s.config
    experiment = ensure_experiment(config.train_experiment,
                                   config.tracking.artifact_root)
    run_id = s.state.mlflow_run_id
    if not run_id:
        supersede_runs(experiment, run)
        run_id = create_run(experiment, run)
        s.state = replace(s.state, mlflow_run_id=run_id)
    client = mlflow.MlflowClient()
    logged = client.get_run(run_id).data.params
    params = {k: str(v) for k, v in flatten(config.model_dump(mode="json")).items()}
    fresh = {k: v[:6000] for k, v in params.items() if k not in logged}
    if fresh:
        from mlflow.entities import Param

        client.log_batch(run_id, params=[Param(k, v) for k, v in fresh.items()])
    client.set_tag(run_id, "libra.checkpoints", str(Path(s.root).resolve()))
    return run_id


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


@task(name="record", cache_policy=NO_CACHE, retries=1)
def record_task(context: RunContext, mlflow_run_id: str, announce: bool = True) -> int:
    """Write the last checkpointed iteration to the store (its trajectories, turns and step row in
    one commit that replaces the step; step 0 replaces the whole run, so a run trained again from
    the start keeps none of its earlier rows) and to MLflow (once per step); returns its step.
    `announce`: tell the context's listeners (not when a resumed run records its last iteration again)."""
    import pyarrow as pa

    from storage.ingest import writer_for
    from storage.records import trajectories_table, turns_table
    from tasks.tracking_tasks import log_step_once

    s = context.session
    run = s.run
    record = s.last_record
    writer = writer_for(s.config.store)
    with writer.transaction(run, mode="replace" if record.step == 0 else "update", origin=TRAIN_ORIGIN) as tx:
        step_of = {t.prompt_id: record.step for t in record.batch.trajectories}
        tx.write_step("trajectories", record.step, trajectories_table(run, record.batch.trajectories, step_of))
        tx.write_step("turns", record.step, turns_table(run, record.batch.trajectories, step_of))
        tx.write_step("steps", record.step, pa.Table.from_pylist([record.steps_row(run)]))
        timings = record.timing_rows(s.hardware_name(), s.model_name())
        if timings:
            tx.write_step("timings", record.step, pa.Table.from_pylist(timings))
        events = s.plan_events.get(record.step, []) + record.pool_rows()
        if events:  # the step's pool_events: the planning's and placing's rows (moves, tree rebuild, hosts), the hybrids'
            tx.write_step("pool_events", record.step, pa.Table.from_pylist(events))
    s.plan_events.pop(record.step, None)
    log_step_once(mlflow_run_id, record.metrics(), record.step, sentinel="reward")
    if record.heldout_reward is not None:  # by weights version: 0 is the policy before training
        log_step_once(mlflow_run_id, {"heldout_reward": record.heldout_reward}, record.version, sentinel="heldout_reward")
    if announce:
        context.announce(record)
    return record.step


@task(name="log-evaluation", cache_policy=NO_CACHE, retries=1)
def log_evaluation_task(mlflow_run_id: str, version: int, reward: float) -> None:
    from tasks.tracking_tasks import log_step_once

    log_step_once(mlflow_run_id, {"heldout_reward": reward}, version, sentinel="heldout_reward")


@task(name="finish-tracking", cache_policy=NO_CACHE, retries=1)
def finish_tracking_task(context: RunContext, mlflow_run_id: str) -> dict[str, Any]:
    """Plots of reward and throughput by step as artifacts, the checkpoint as a tag; the run ends."""
    import mlflow

    from storage.plots import lines_png

    client = mlflow.MlflowClient()
    s = context.session
    history = {key: sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run_id, key))
               for key in ("reward", "tokens_per_s", "heldout_reward")}
    directory = Path(tempfile.mkdtemp(prefix="libra-plots-"))
    try:
        lines_png({"train reward": tuple(zip(*history["reward"], strict=True)) or ([], []),
                   "held-out reward (after step updates)": tuple(zip(*history["heldout_reward"], strict=True)) or ([], [])},
                  "step", "reward", directory / "reward.png")
        lines_png({"generated tokens / s": tuple(zip(*history["tokens_per_s"], strict=True)) or ([], [])},
                  "step", "tokens / s", directory / "throughput.png")
        for file in directory.iterdir():
            client.log_artifact(mlflow_run_id, str(file))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    from libra.trainer.checkpoint import latest_checkpoint

    latest = latest_checkpoint(s.root)
    client.set_tag(mlflow_run_id, "libra.checkpoint", str(latest.resolve()) if latest else "")
    client.set_terminated(mlflow_run_id, "FINISHED")
    return {"checkpoint": str(latest) if latest else "", "state": dict(s.state.summary), "step": s.state.step,
            "version": s.state.version}
