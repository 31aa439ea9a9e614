"""A training run's directory and how a session opens on it: who may train it (one process,
locked), what a resumed run must share with the run it continues (the configuration's digest),
where it starts (the newest checkpoint, else the policy), and the session's parts started in order.

    session = open_session(config)      # resumes from the run's newest checkpoint, if any
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from libra.checks import context_beyond_policy, missing_policy
from libra.clock import Clock, WallClock
from libra.config import LibraConfig
from libra.errors import LibraError
from libra.pools.states import PoolEvent
from libra.rl.batches import Batches
from libra.rl.cluster import initial_placement
from libra.rl.placing import Placer, host_change, local_cluster, site_of
from libra.rl.planning import EngineStart
from libra.rl.ray_cluster import RayCluster, address_of
from libra.rl.routes import router_for
from libra.rl.session import PlanningState, Saved, TrainingSession
from libra.rl.trainers import open_trainer, with_first_layout
from libra.trainer.checkpoint import CheckpointState, latest_checkpoint, load_state, restore_rng

if TYPE_CHECKING:
    from libra.rollout.engines import Engine


def config_digest(config: LibraConfig) -> str:
    """What a resumed run must share with the run it continues: what it trains on and how (the
    environment, the policy, the rollout, the trainer's settings), not where files go or how they
    are written, how often it is evaluated or kept, nor its step count (a run may be extended;
    with a cosine schedule the count shapes the learning rate, so it counts there)."""
    rollout = config.rollout.model_dump(mode="json")
    for key in ("tool_threads", "tool_timeout_s", "trajectory_timeout_s", "suspend_bytes", "suspend_total_bytes"):  # limits, not what is trained
        rollout.pop(key)
    trainer = config.trainer.model_dump(mode="json")
    for key in ("run", "eval_every", "checkpoint_dir", "keep_checkpoints", "track_kl") + (("steps",) if config.trainer.schedule != "cosine" else ()):
        trainer.pop(key)
    # defaults of settings added later are left out, so runs from before them resume
    for section, key, default in (("trainer", "layout", "fixed"), ("trainer", "dynamic_sampling", False),
                                  ("trainer", "oversample", 1.0), ("trainer", "epochs", 1),
                                  ("trainer", "decoupled_cap", 0.0), ("rollout", "partial", False),
                                  ("trainer", "partial_credit", 0.0), ("rollout", "overprovision", 1.0),
                                  ("trainer", "overlong_filter", False), ("trainer", "curriculum", False)):
        values = trainer if section == "trainer" else rollout
        if values[key] == default:
            values.pop(key)
    if not config.trainer.curriculum:  # its decay shapes nothing then
        trainer.pop("curriculum_decay", None)
    trainer["policy"] = str(Path(config.trainer.policy).resolve())
    data = {"run": config.trainer.run_name(), "rollout": rollout, "trainer": trainer,
            "scheduler": config.scheduler.model_dump(mode="json"), "placement": config.placement.strategy}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def hold_run(root: Path) -> TextIO:
    """Lock the run's checkpoint directory for this process (the kernel releases it if the process
    dies); a second process training the same run is refused."""
    root.mkdir(parents=True, exist_ok=True)
    handle = (root / ".lock").open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise LibraError(f"run {root.name!r} is being trained by another process (pid {holder}); wait for it, or "
                         "train another run (trainer.run)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def clear_run(root: Path) -> None:
    """Remove a locked run's checkpoints (it trains again from the policy)."""
    for entry in root.iterdir():
        if entry.name != ".lock":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def check_policy(config: LibraConfig) -> Path:
    """The run's initial policy, refused with what to do when it is missing or shorter than the
    rollout's context."""
    policy = Path(config.trainer.policy)
    if (missing := missing_policy(policy, "trainer.policy")) is not None:
        raise LibraError(missing)
    if (beyond := context_beyond_policy(policy, config.rollout.max_context)) is not None:
        raise LibraError(beyond)
    from libra.rollout.policy import tuned_apart

    apart = tuned_apart(policy, config.trainer.env)
    if apart is not None and config.trainer.eval_prompts > apart:
        raise LibraError(f"trainer.eval_prompts {config.trainer.eval_prompts} is more than the {apart} held-out tasks "
                         f"the policy was tuned apart from (its libra_policy.json): the rest include problems it was "
                         f"tuned on; set it to at most {apart}")
    return policy


def resume_point(config: LibraConfig, policy: Path, root: Path) -> tuple[CheckpointState, Path, Path | None]:
    """Where the run starts: its state, the weights it starts from and its newest checkpoint (None:
    from the policy). A checkpoint of another configuration is refused with what to do."""
    run, digest = config.trainer.run_name(), config_digest(config)
    latest = latest_checkpoint(root)
    if latest is None:
        return CheckpointState(run, 0, 0, digest), policy, None
    state = load_state(latest)
    if state.config_digest != digest:
        raise LibraError(f"run {run!r} was trained with another configuration (checkpoints in {root}); name a new "
                         "run (trainer.run) or pass --restart to train this one again from the policy")
    return state, latest, latest


def check_tasks(config: LibraConfig) -> None:
    """Refused before any work: trainer.partial_credit for an environment that grades no partial
    work, trainer.curriculum for one whose tasks have no categories, and an environment with too few
    problems apart from the held-out ones for an iteration."""
    from libra.partial import groups_to_start
    from libra.rl.schedule import iteration_tasks, rolled_prompts, train_task_seed
    from libra.rollout.envs import make_env
    from libra.rollout.workroots import check_workdirs

    t = config.trainer
    env = make_env(t.env, config.sandbox)
    if t.partial_credit and not env.grades_partial_work:
        raise LibraError(f"trainer.partial_credit {t.partial_credit:g}: the {t.env} environment grades no partial work "
                         "(its reward is right or wrong); set trainer.partial_credit 0, or train on math")
    r = config.rollout
    most = max(rolled_prompts(t), groups_to_start(t.prompts_per_step, r.overprovision, 0) if r.partial else 0)
    if t.curriculum and any(task.data.get("category") is None for task in env.tasks(8, train_task_seed(t.seed, 0))):
        raise LibraError(f"trainer.curriculum draws prompts by task category, and the {t.env} environment's tasks have "
                         "none; set trainer.curriculum false, or train on math")
    iteration_tasks(env, most, train_task_seed(t.seed, 0), t, None)
    check_workdirs(config.sandbox, most * t.samples_per_prompt + t.eval_prompts)  # an evaluation may overlap a rollout


def open_session(config: LibraConfig, restart: bool = False) -> TrainingSession:
    """The run's session: from its newest checkpoint when one exists, else from the policy. The run
    is locked for this process until the session closes; `restart` removes its checkpoints first."""
    run, policy = config.trainer.run_name(), check_policy(config)
    check_tasks(config)
    if config.placement.strategy != "none" and not address_of(config):
        local_cluster(config)  # workers this machine's cores cannot make are refused before any work
    root = Path(config.trainer.checkpoint_dir) / run
    lock = hold_run(root)
    try:
        if restart:
            clear_run(root)
        return _open(config, run, policy, root, lock)
    except BaseException:
        lock.close()
        raise


def _open(config: LibraConfig, run: str, policy: Path, root: Path, lock: TextIO) -> TrainingSession:
    """The session's parts started in order (tokenizer, environment, router, the site and placement,
    the trainer, the engines where the placement says), then a resumed run's state restored; what
    started is closed again if a later part fails."""
    from transformers import AutoTokenizer

    from libra.rollout.envs import make_env

    state, weights, latest = resume_point(config, policy, root)
    tokenizer = AutoTokenizer.from_pretrained(weights)
    env = make_env(config.trainer.env, config.sandbox)
    router = router_for(config, env, tokenizer, config.rollout.instances)
    clock = WallClock()
    address = address_of(config)
    ray = RayCluster.connect(address, config.cluster.start_timeout_s) if address else None
    saved = Saved.load(latest) if latest is not None else None
    planning = saved.planning if saved is not None else None
    site = site_of(config, ray, clock) if config.placement.strategy != "none" else None
    placement = None
    if site is not None:
        placed = planning is not None and planning.cluster == site.cluster
        placement = planning.placement if planning is not None and placed else \
            initial_placement(config.placement.strategy, site.cluster, config.placement.hybrids)
        placement = with_first_layout(config, placement, site.cluster, policy)
    pool_events: list[PoolEvent] = []
    trainer = open_trainer(config, weights, policy, root, placement, site.cluster if site else None,
                           pool_events.append, pooled=bool(config.placement.hybrids) or ray is not None)
    session = TrainingSession(config, run, root, policy, state, trainer, [], env, tokenizer, router, lock=lock,
                              clock=clock, engine_version=state.version, pool_events=pool_events)
    try:
        if site is None:
            session.took_engines(start_engines(config, weights, clock))
        else:
            assert placement is not None
            session.placer = Placer.open(site, trainer, clock)
            _resume_placement(session, planning)
            session.took(session.placer.apply(placement, weights, [], state.step, session.elapsed_s()))
        if saved is not None:
            if saved.trainer is None:
                raise LibraError(f"checkpoint {latest} holds no optimizer state (trainer.pt); start the run over (--restart)")
            session.trainer.load_optimizer_state(saved.trainer)
            if saved.rng is not None:
                restore_rng(saved.rng)
            session.batches = Batches.restored(saved.pending)
            session.suspended = saved.suspended
            session.last_record = saved.record
    except BaseException:  # nothing started is left running (the caller releases the lock)
        session.lock = None
        session.close()
        raise
    return session


def start_engines(config: LibraConfig, weights: Path, clock: Clock) -> tuple[list[Engine], EngineStart]:
    """An unplaced run's engines: rollout.instances of them, sharing every core; their start, measured."""
    from libra.rollout.engines import make_engines

    r = config.rollout
    began = clock.now()
    engines = make_engines(r.engine, weights, r.instances, r.device, r.max_context)
    return engines, EngineStart(r.instances, clock.now() - began)


def _resume_placement(session: TrainingSession, planning: PlanningState | None) -> None:
    """A resumed placed run's planning state: its plan controller and planning rows, when it is on
    the cluster it was placed on; else the hosts it lost or got back, as the step's rows."""
    if planning is None:
        return
    session.plan_events = planning.plan_events
    cluster = session.cluster
    assert cluster is not None
    if planning.cluster == cluster:
        session.controller = planning.controller
        return
    step = session.state.step
    session.note_hosts(step, host_change(step, session.elapsed_s(), planning.cluster, cluster))
