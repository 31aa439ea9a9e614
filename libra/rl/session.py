"""A training run's live objects in one process, and one method per stage of an iteration.

    session = TrainingSession.open(config)      # resumes from the run's newest checkpoint, if any
    session.rollout(k); session.score(k)         # batch k: trajectories with rewards
    session.update(k)                            # one GRPO update on batch k (stale ones dropped)
    session.sync()                               # the new weights into every engine
    session.evaluate()                           # held-out reward of the engines' weights
    session.checkpoint(record)                   # the state after iteration k, atomically

Engines, the trainer and the rolled-out batches stay here, never in a flow's arguments; the flows
(flows/) call the stages in order through Prefect tasks that name the run. Where the engines and
the trainer run, and moving them, is the placer's (`libra.rl.placing`); a batch's lifecycle is
`libra.rl.batches`; decisions (which tasks an iteration sees, what is fresh enough to train on) are
in `libra.rl.schedule`; what an iteration produced is in `libra.rl.records`; which trainer runs in
`libra.rl.trainers`; the run's directory (its lock, what a resume must share) in `libra.rl.runs`.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from libra.clock import Clock, WallClock
from libra.config import LibraConfig
from libra.errors import HostLostError, LibraError, RankLostError
from libra.pools.states import PoolEvent
from libra.rl.batches import EVALUATION, Batches, Rolled
from libra.rl.cluster import LocalCluster, Placement, initial_placement
from libra.rl.placing import HostChange, Placer, event_row, host_change, site_of
from libra.rl.planning import EngineStart, EngineTiming, TrainTiming
from libra.rl.ray_cluster import RayCluster, address_of
from libra.rl.records import (  # (also where older checkpoints' pickles find them)
    Batch,
    IterationRecord,
    RolloutStats,
    Update,
)
from libra.rl.runs import check_policy, clear_run, config_digest, hold_run
from libra.rl.schedule import admit, hybrids_wanted, rollout_spec
from libra.rl.trainers import Reshard, layout_of, open_trainer, with_first_layout
from libra.trainer.checkpoint import (
    CheckpointState,
    latest_checkpoint,
    load_blob,
    load_state,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from libra.trainer.samples import to_samples

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from libra.planner.controller import PlanController
    from libra.rollout.engines import Engine
    from libra.rollout.envs.base import Env
    from libra.scheduler.policies import Router
    from libra.trainer.protocol import Trainer


@dataclass
class TrainingSession:
    config: LibraConfig
    run: str
    root: Path  # the run's checkpoints
    policy: Path  # the initial policy
    state: CheckpointState
    trainer: Trainer
    engines: list[Engine]
    env: Env
    tokenizer: PreTrainedTokenizerBase
    router: Router
    batches: Batches = field(default_factory=Batches)
    placer: Placer | None = None  # where the engines and the trainer run (None: unplaced, every core shared)
    lock: TextIO | None = None  # the run's lock file, held open while the session lives
    clock: Clock = field(default_factory=WallClock)
    engine_version: int = 0
    last_record: IterationRecord | None = None
    controller: PlanController | None = None  # the planning flow's (libra placement), kept across iterations
    engine_start_s: float = 0.0  # measured: the last (re)start of the engines
    engine_starts: list[EngineStart] = field(default_factory=list)  # (re)starts not in a record yet
    pool_events: list[PoolEvent] = field(default_factory=list)  # the hybrids' transitions not in a record yet
    plan_events: dict[int, list[dict]] = field(default_factory=dict)  # a step's planning rows (pool_events)
    replaced: str = ""  # why the run was placed anew on the hosts there are (hosts lost or back), until recorded
    reshard: Reshard | None = None  # the megatron trainer's last layout change, until recorded

    # -- open ------------------------------------------------------------------------------------

    @classmethod
    def open(cls, config: LibraConfig, restart: bool = False) -> TrainingSession:
        """The run's session: from its newest checkpoint when one exists, else from the policy. The
        run is locked for this process until `close`; `restart` removes its checkpoints first."""
        run, policy = config.trainer.run_name(), check_policy(config)
        root = Path(config.trainer.checkpoint_dir) / run
        lock = hold_run(root)
        try:
            if restart:
                clear_run(root)
            return cls._open(config, run, policy, root, lock)
        except BaseException:
            lock.close()
            raise

    @classmethod
    def _open(cls, config: LibraConfig, run: str, policy: Path, root: Path, lock: TextIO) -> TrainingSession:
        from transformers import AutoTokenizer

        from libra.rollout.envs import expert_bounds, make_env
        from libra.scheduler.policies import Buckets
        from libra.scheduler.replay import make_router

        latest = latest_checkpoint(root)
        state, weights = CheckpointState(run, 0, 0, config_digest(config)), policy
        if latest is not None:
            state, weights = load_state(latest), latest
            if state.config_digest != config_digest(config):
                raise LibraError(f"run {run!r} was trained with another configuration (checkpoints in {root}); name a new "
                                 "run (trainer.run) or pass --restart to train this one again from the policy")
        tokenizer = AutoTokenizer.from_pretrained(weights)
        env = make_env(config.trainer.env, config.sandbox)
        buckets = Buckets(expert_bounds(env, config.rollout.instances, tokenizer))
        router = make_router(config.rollout.router, buckets, {}, config.scheduler)
        clock = WallClock()
        address = address_of(config)
        ray = RayCluster.connect(address, config.cluster.start_timeout_s) if address else None
        planning = load_blob(latest, "planning") if latest is not None else None
        site = site_of(config, ray, clock) if config.placement.policy != "none" else None
        placement = None
        if site is not None:
            placed = planning is not None and planning.get("cluster", site.cluster) == site.cluster
            placement = planning["placement"] if placed else \
                initial_placement(config.placement.policy, site.cluster, config.placement.hybrids)
            placement = with_first_layout(config, placement, site.cluster, policy)
        pool_events: list[PoolEvent] = []
        trainer = open_trainer(config, weights, policy, root, placement, site.cluster if site else None,
                               pool_events.append, pooled=bool(config.placement.hybrids) or ray is not None)
        session = cls(config, run, root, policy, state, trainer, [], env, tokenizer, router, lock=lock, clock=clock,
                      engine_version=state.version, pool_events=pool_events)
        try:
            if site is None:
                session._start_engines(weights)
            else:
                assert placement is not None
                session.placer = Placer.open(site, trainer, clock)
                session._resume_placement(planning)
                session._place(placement, weights)
            if latest is not None:
                session._resume(latest)
        except BaseException:  # nothing started is left running (the caller releases the lock)
            session.lock = None
            session.close()
            raise
        return session

    def _start_engines(self, weights: Path) -> None:
        """An unplaced run's engines: rollout.instances of them, sharing every core."""
        from libra.rollout.engines import make_engines

        r = self.config.rollout
        began = self.clock.now()
        self.engines = make_engines(r.engine, weights, r.instances, r.device, r.max_context)
        self.engine_start_s = self.clock.now() - began
        self.engine_starts.append(EngineStart(r.instances, self.engine_start_s))

    def _resume_placement(self, planning: dict | None) -> None:
        """A resumed placed run's planning state: its plan controller and planning rows, when it is
        on the cluster it was placed on; else the hosts it lost or got back, as the step's rows."""
        assert self.placer is not None
        if planning is None:
            return
        self.plan_events = planning.get("plan_events", {})
        if planning.get("cluster", self.cluster) == self.cluster:
            self.controller = planning["controller"]
            return
        self._note_hosts(self.state.step, host_change(self.state.step, self.elapsed_s(), planning["cluster"], self.cluster))

    def _resume(self, latest: Path) -> None:
        """The optimizer, the RNG, the batches scored ahead and the last record of checkpoint `latest`."""
        self.trainer.load_optimizer_state(load_blob(latest, "trainer"))
        restore_rng(load_blob(latest, "rng"))
        self.batches = Batches.restored(load_blob(latest, "pending"))
        self.last_record = load_blob(latest, "record")

    # -- where it runs -----------------------------------------------------------------------

    @property
    def placement(self) -> Placement | None:
        return self.placer.placement if self.placer is not None else None

    @property
    def cluster(self) -> LocalCluster | None:
        return self.placer.cluster if self.placer is not None else None

    @property
    def pending(self) -> dict[int, Batch]:
        """The scored batches not trained on yet."""
        return self.batches.waiting()

    def apply(self, placement: Placement, force: bool = False) -> bool:
        """Move to `placement` between iterations: the engines restart from the trainer's weights
        (the version they serve stays the trainer's); returns whether they restarted. `force`:
        restart everything (the cluster changed)."""
        if self.batches.awaiting_rewards():
            raise RuntimeError("cannot move workers while a rollout awaits its rewards")
        with tempfile.TemporaryDirectory(prefix="libra-place-", dir=self.root) as directory:
            shutil.copytree(self.policy, directory, dirs_exist_ok=True)
            for stale in Path(directory).glob("*.safetensors"):
                stale.unlink()
            self.trainer.save_weights(directory)
            restarted = self._place(placement, Path(directory), force)
        if restarted:
            self.engine_version = self.trainer.updates
        return restarted

    def _place(self, placement: Placement, weights: Path, force: bool = False) -> bool:
        assert self.placer is not None
        placed = self.placer.apply(placement, weights, self.engines, self.state.step, self.elapsed_s(), force)
        self.engines = placed.engines
        if placed.start is not None:
            self.engine_start_s = placed.start.seconds
            self.engine_starts.append(placed.start)
            self._route(len(self.engines))
        self.reshard = placed.reshard or self.reshard
        self.plan_events.setdefault(self.state.step, []).extend(event_row(e) for e in placed.events)
        return placed.restarted

    def follow_hosts(self, step: int) -> str:
        """Before iteration `step`: when hosts left or came back since the run was placed (a Ray
        cluster), place it anew by its placement's rule on the hosts there are (engines and trainer
        restarted from the trainer's weights; Libra's plan controller starts over, its history was
        another cluster's). Why, or '' when nothing changed."""
        change = self.placer.follow_hosts(step, self.elapsed_s()) if self.placer is not None else None
        if change is None:
            return ""
        self._note_hosts(step, change)
        self.controller = None
        self.apply(initial_placement(self.config.placement.policy, change.after, self.config.placement.hybrids),
                   force=True)
        return self.replaced

    def await_departure(self, host: str, timeout_s: float) -> bool:
        """Wait until the cluster no longer counts `host` alive; whether it left within `timeout_s`."""
        return self.placer.site.await_departure(host, timeout_s) if self.placer is not None else True

    def _note_hosts(self, step: int, change: HostChange) -> None:
        """The run moves to other hosts at `step`: their rows among the step's, and why in words."""
        self.plan_events.setdefault(step, []).extend(event_row(e) for e in change.events)
        self.replaced = change.reason

    def _route(self, instances: int) -> None:
        """The router over `instances` buckets, keeping what it learned (Libra's router)."""
        from libra.rollout.envs import expert_bounds
        from libra.scheduler.policies import Buckets
        from libra.scheduler.replay import make_router

        if self.router.buckets.count == instances:
            return
        buckets = Buckets(expert_bounds(self.env, instances, self.tokenizer))
        carried = getattr(self.router, "carried_to", None)
        self.router = carried(buckets) if carried else make_router(self.config.rollout.router, buckets, {}, self.config.scheduler)

    # -- the stages of an iteration ------------------------------------------------------------

    def rollout(self, step: int, evaluation: bool = False) -> float:
        """Roll out iteration `step`'s tasks (or the held-out ones) on the engines; seconds taken."""
        from libra.rollout.agent import rollout
        from libra.rollout.sandbox import make_workroot

        r = self.config.rollout
        spec = rollout_spec(self.config.trainer, r, step, evaluation)
        workroot = make_workroot("libra-train-")
        for engine in self.engines:  # what the engines timed before (an evaluation's steps) is not this batch's
            engine.timer.drain()
        began = self.clock.now()
        try:
            result = rollout(self.env, self.env.tasks(spec.prompts, seed=spec.task_seed), spec.samples, self.engines,
                             self.router, self.tokenizer, max_turns=r.max_turns, max_tokens_per_turn=spec.max_tokens_per_turn,
                             min_tokens_per_turn=spec.min_tokens_per_turn, max_context=r.max_context,
                             temperature=spec.temperature, seed=spec.seed, workroot=workroot, tool_threads=r.tool_threads,
                             model_version=self.engine_version, score=False)
        except BaseException:
            shutil.rmtree(workroot, ignore_errors=True)
            raise
        seconds = self.clock.now() - began
        decode = tuple(EngineTiming(engine.size, timing) for engine in self.engines for timing in engine.timer.drain())
        self.batches.rolled_out(EVALUATION if evaluation else step, Rolled(result, workroot, decode))
        return seconds

    def score(self, step: int) -> Batch:
        """Reward every trajectory of batch `step` with its environment's reward; the batch is then
        ready to train on (and its working directories are gone)."""
        from libra.rollout.agent import score_rewards

        rolled = self.batches.rolled_batch(step)
        try:
            score_rewards(rolled.result.trajectories)
        finally:
            shutil.rmtree(rolled.workroot, ignore_errors=True)
        runs = rolled.result.trajectories
        stats = RolloutStats.of(rolled.result, self.engine_version)
        batch = Batch(step, tuple(to_samples(runs, self.config.trainer.normalize_std)), tuple(rolled.result.records()), stats,
                      rolled.decode)
        self.batches.scored(batch)
        return batch

    def update(self, step: int) -> Update:
        """One GRPO update on batch `step`, its trajectories beyond the staleness bound dropped."""
        batch = self.batches.take_for_update(step)
        admission = admit(batch.samples, self.trainer.updates, self.config.trainer.max_staleness)
        if not admission.admitted:
            raise LibraError(f"iteration {step}: all {len(batch.samples)} trajectories are more than "
                             f"{self.config.trainer.max_staleness} updates old; nothing to train on")
        if self.config.placement.hybrids:
            assert self.placement is not None  # a run with hybrids is placed (the configuration says so)
            self.trainer.set_desired(hybrids_wanted(self.config.placement.hybrid_schedule, len(self.placement.hybrids),
                                                    step))
        try:
            stats = self.trainer.train_step(admission.admitted)
        except RankLostError as exc:
            host = self.placer.host_of_rank(exc.rank) if self.placer is not None else None
            if host is None:
                raise
            raise HostLostError(host, f"{exc} on host {host}") from None
        timing = TrainTiming(stats.seconds, stats.sequences, sum(len(s.token_ids) for s in admission.admitted),
                             max(len(s.token_ids) for s in admission.admitted),
                             layout_of(self.trainer, self.placement, stats.hybrids))
        return Update(stats, len(admission.admitted), len(admission.dropped), admission.staleness_max,
                      admission.staleness_mean, timing)

    def sync(self) -> float:
        """The trainer's weights into every engine, in place (through an HF-format directory that
        every engine kind loads); the engines' version is then the trainer's."""
        began = self.clock.now()
        with tempfile.TemporaryDirectory(prefix="libra-sync-", dir=self.root) as directory:  # every host reads it
            self.trainer.save_weights(directory)
            for engine in self.engines:
                engine.update_weights(directory)
        self.engine_version = self.trainer.updates
        return self.clock.now() - began

    def evaluate(self) -> float:
        """Mean reward on the held-out tasks (one sample each, greedy by default) with the engines' weights."""
        self.rollout(EVALUATION, evaluation=True)
        return self.score(EVALUATION).stats.reward_mean

    def note_evaluation(self, version: int, reward: float) -> None:
        self.state = replace(self.state, summary={**self.state.summary,
                                                  "heldout": {**self.state.summary.get("heldout", {}), str(version): reward}})

    def finish_iteration(self, step: int, update: Update, seconds: dict[str, float],
                         heldout_reward: float | None) -> IterationRecord:
        """The record of iteration `step`: its batch, update, seconds, engine starts and pool events."""
        batch = self.batches.recorded(step)
        starts, self.engine_starts = tuple(self.engine_starts), []
        events = tuple(self.pool_events[:])  # the pool's monitor thread appends; take what is there now
        del self.pool_events[:len(events)]
        return IterationRecord(step, batch, update, seconds, heldout_reward, self.elapsed_s(), self.trainer.updates,
                               self.config.placement.policy, self.placement, starts, events)

    def checkpoint(self, record: IterationRecord, mlflow_run_id: str = "") -> Path:
        """The state after iteration `record.step`: weights, optimizer, RNG, the batches rolled out
        ahead, and the iteration's record (re-recorded on resume if the process died before)."""
        summary = {**self.state.summary, "elapsed_s": record.start_s + record.seconds["iteration"],
                   "generated_tokens": self.state.summary.get("generated_tokens", 0) + record.batch.stats.generated_tokens}
        if record.heldout_reward is not None:
            summary["heldout"] = {**summary.get("heldout", {}), str(record.version): record.heldout_reward}
        self.state = replace(self.state, step=record.step + 1, version=self.trainer.updates,
                             mlflow_run_id=mlflow_run_id or self.state.mlflow_run_id, summary=summary)
        self.last_record = record
        return save_checkpoint(self.root, self.state, self.trainer.save_weights,
                               {"trainer": self.trainer.optimizer_state(), "rng": rng_state(), "pending": self.pending,
                                "record": record, "planning": self.planning_state()}, copy_from=self.policy,
                               keep=self.config.trainer.keep_checkpoints)

    # -- what the records need -------------------------------------------------------------------

    def elapsed_s(self) -> float:
        """Training seconds since the run began, as of the last checkpoint."""
        return float(self.state.summary.get("elapsed_s", 0.0))

    def hardware_name(self) -> str:
        """The planner's name for this machine's workers (the `timings` rows' hardware)."""
        return self.cluster.planner_cluster().hardware.name if self.cluster else f"local-{self.config.rollout.device}"

    def model_name(self) -> str:
        return Path(self.config.trainer.policy).name

    def planning_state(self) -> dict | None:
        """What a resumed run needs to place itself as before: the placement and the controller."""
        if self.placement is None:
            return None
        return {"placement": self.placement, "controller": self.controller, "plan_events": self.plan_events,
                "cluster": self.cluster}

    def close(self) -> None:
        for rolled in self.batches.discard():
            shutil.rmtree(rolled.workroot, ignore_errors=True)
        for engine in self.engines:
            engine.close()
        self.engines = []
        self.trainer.close()
        if self.placer is not None:
            self.placer.close()
        if self.lock is not None:
            self.lock.close()  # releases the run's lock
            self.lock = None
