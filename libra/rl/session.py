"""A training run's live objects in one process, and one method per stage of an iteration.

    session = open_session(config)               # libra.rl.runs: resumes from the newest checkpoint, if any
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
`libra.rl.trainers`; opening a run (its lock, what a resume must share, where it starts) is `libra.rl.runs`.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from libra.clock import Clock, Stopwatch, WallClock
from libra.config import LibraConfig
from libra.errors import HostLostError, LibraError, RankLostError
from libra.files import discard_tree
from libra.partial import carry_over, groups_to_start
from libra.pools.states import PoolEvent
from libra.rl.batches import EVALUATION, Batches, Rolled
from libra.rl.cluster import LocalCluster, Placement, initial_placement
from libra.rl.placing import HostChange, Placed, Placer, event_row
from libra.rl.planning import EngineStart, EngineTiming, TrainTiming
from libra.rl.records import (  # (also where older checkpoints' pickles find them)
    Batch,
    IterationRecord,
    RolloutStats,
    Update,
    advanced,
)
from libra.rl.routes import router_for
from libra.rl.schedule import (
    admit,
    hybrids_wanted,
    iteration_tasks,
    loss_bearing,
    rollout_spec,
    select_groups,
    trained_rewards,
    whole_groups,
)
from libra.rl.trainers import Reshard, layout_of
from libra.trainer.checkpoint import CheckpointState, load_blob, rng_state, save_checkpoint
from libra.trainer.protocol import ElasticTrainer, Trainer
from libra.trainer.samples import to_samples

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from libra.planner.controller import PlanController
    from libra.rollout.engines import Engine
    from libra.rollout.envs.base import Env
    from libra.rollout.suspend import Suspended
    from libra.scheduler.routers import Router


@dataclass(frozen=True)
class PlanningState:
    """What a resumed placed run needs to place itself as before: its placement and plan controller,
    the planning rows not recorded yet, and the cluster it was placed on."""

    placement: Placement
    controller: PlanController | None
    plan_events: dict[int, list[dict]]
    cluster: LocalCluster

    @classmethod
    def of(cls, saved: object) -> PlanningState | None:
        """The state as a checkpoint kept it (older checkpoints kept a dict of these fields)."""
        if saved is None or isinstance(saved, PlanningState):
            return saved
        if isinstance(saved, dict):
            return cls(saved["placement"], saved.get("controller"), saved.get("plan_events", {}), saved["cluster"])
        raise LibraError(f"a checkpoint's planning state is a {type(saved).__name__}, not one Libra wrote; start "
                         "the run over (--restart)")


@dataclass(frozen=True)
class Saved:
    """What a checkpoint keeps beside the weights and its `CheckpointState`, a file each
    (`<field>.pt`): the optimizer, the RNGs, the batches rolled out ahead, the suspended
    trajectories, the last iteration's record and a placed run's planning state."""

    trainer: dict | None
    rng: dict | None
    pending: dict[int, Batch]
    suspended: tuple[Suspended, ...]
    record: IterationRecord | None
    planning: PlanningState | None

    def blobs(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def load(cls, checkpoint: Path) -> Saved:
        """The checkpoint's saved state (a missing file: none of it)."""
        blob = {f.name: load_blob(checkpoint, f.name) for f in fields(cls)}
        return cls(blob["trainer"], blob["rng"], blob["pending"] or {}, tuple(blob["suspended"] or ()), blob["record"],
                   PlanningState.of(blob["planning"]))


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
    dead_engines: tuple[int, ...] = ()  # engines that failed in a rollout, started again at the next sync
    suspended: tuple[Suspended, ...] = ()  # partial rollouts: the groups the last batch left to continue
    updates_done: dict[int, threading.Event] = field(default_factory=dict)  # async pipeline: update k done
    events_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # a rollout's thread asks too

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
        assert self.placer is not None
        restarted = self.took(self.placer.move(placement, self.policy, self.root, self.engines, self.state.step,
                                               self.elapsed_s(), force))
        if restarted:
            self.engine_version = self.trainer.updates
        return restarted

    def took_engines(self, started: tuple[list[Engine], EngineStart]) -> None:
        """An unplaced run's engines, started."""
        self.engines, start = started
        self.engine_start_s = start.seconds
        self.engine_starts.append(start)

    def took(self, placed: Placed) -> bool:
        """Take what a placing did: the engines (and the router over them), their start, a reshard, the events."""
        self.engines = placed.engines
        if placed.restarted:  # every engine is new, those that had failed included
            self.dead_engines = ()
        if placed.start is not None:
            self.engine_start_s = placed.start.seconds
            self.engine_starts.append(placed.start)
            self.router = router_for(self.config, self.env, self.tokenizer, len(self.engines), self.router)
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
        self.note_hosts(step, change)
        self.controller = None
        self.apply(initial_placement(self.config.placement.strategy, change.after, self.config.placement.hybrids),
                   force=True)
        return self.replaced

    def await_departure(self, host: str, timeout_s: float) -> bool:
        """Wait until the cluster no longer counts `host` alive; whether it left within `timeout_s`."""
        return self.placer.site.await_departure(host, timeout_s) if self.placer is not None else True

    def note_hosts(self, step: int, change: HostChange) -> None:
        """The run moves to other hosts at `step`: their rows among the step's, and why in words."""
        self.plan_events.setdefault(step, []).extend(event_row(e) for e in change.events)
        self.replaced = change.reason

    # -- the stages of an iteration ------------------------------------------------------------

    def rollout(self, step: int, evaluation: bool = False, beside: int | None = None) -> float:
        """Roll out iteration `step`'s tasks (or the held-out ones) on the engines; seconds taken.
        With partial rollouts (rollout.partial) the suspended groups fresh enough to be trained on
        continue, new groups fill the over-provision, the batch closes at prompts_per_step complete
        groups and the rest stay suspended for the next iteration. `beside`: the asynchronous
        pipeline's update this rollout runs beside; its batch does not close before that update is
        done (generation goes on meanwhile)."""
        from libra.rollout.agent import rollout
        from libra.rollout.workroots import make_workroot

        r, t = self.config.rollout, self.config.trainer
        spec = rollout_spec(t, r, step, evaluation)
        partial = r.partial and not evaluation
        carried = carry_over(self.suspended if partial else (), self.trained_at(step), t.max_staleness)
        prompts = groups_to_start(t.prompts_per_step, r.overprovision, len({s.prompt_id for s in carried.resumed})) \
            if partial else spec.prompts
        tasks = [] if not prompts else self.env.tasks(prompts, seed=spec.task_seed) if evaluation \
            else iteration_tasks(self.env, prompts, spec.task_seed, t, self.state.summary.get("curriculum"))
        workroot = make_workroot("libra-train-")
        for engine in self.engines:  # what the engines timed before (an evaluation's steps) is not this batch's
            engine.timer.drain()
        began = self.clock.now()
        try:
            result = rollout(self.env, tasks, spec.samples, self.engines, self.router, self.tokenizer, max_turns=r.max_turns,
                             max_tokens_per_turn=spec.max_tokens_per_turn, min_tokens_per_turn=spec.min_tokens_per_turn,
                             max_context=r.max_context, temperature=spec.temperature, seed=spec.seed, workroot=workroot,
                             tool_threads=r.tool_threads, model_version=self.engine_version, score=False,
                             tool_timeout_s=r.tool_timeout_s, trajectory_timeout_s=r.trajectory_timeout_s,
                             resume=carried.resumed, close_after=t.prompts_per_step if partial else None,
                             suspend_bytes=r.suspend_bytes, suspend_total_bytes=r.suspend_total_bytes,
                             hold=self.update_done(beside) if partial and beside is not None else None)
        except BaseException:
            discard_tree(workroot)
            raise
        seconds = self.clock.now() - began
        if partial:
            self.suspended = result.suspended
        self.dead_engines = tuple(sorted(set(self.dead_engines) | set(result.dead_engines)))
        decode = tuple(EngineTiming(engine.size, timing) for i, engine in enumerate(self.engines)
                       if i not in self.dead_engines for timing in engine.timer.drain())
        self.batches.rolled_out(EVALUATION if evaluation else step, Rolled(result, workroot, decode, len(carried.dropped)))
        return seconds

    def update_done(self, step: int) -> threading.Event:
        """Set once update `step` has run (or failed): what an asynchronous rollout beside it waits for."""
        with self.events_lock:
            return self.updates_done.setdefault(step, threading.Event())

    def trained_at(self, step: int) -> int:
        """The weights version the update of batch `step` starts from: one update per iteration
        after the last checkpoint's (batch k + 1 rolls out beside update k, one version behind)."""
        return self.state.version + step - self.state.step

    def score(self, step: int) -> Batch:
        """Reward every trajectory of batch `step` with its environment's reward; the batch is then
        ready to train on (and its working directories are gone)."""
        from libra.rollout.agent import score_rewards

        rolled = self.batches.rolled_batch(step)
        try:
            score_rewards(rolled.result.trajectories, self.config.rollout.tool_threads)
        finally:
            discard_tree(rolled.workroot)
        kept = whole_groups(rolled.result.trajectories)  # a group that lost a sample to a failure is left out
        if not kept:
            failed = rolled.result.failed
            raise LibraError(f"{'the evaluation' if step == EVALUATION else f'iteration {step}'}: every group lost a "
                             f"sample to a failure ({len(failed)} of {len(rolled.result.trajectories)} trajectories "
                             f"failed; the first: {failed[0].failure})")
        t = self.config.trainer
        # the groups the update takes (dynamic sampling leaves those whose rewards are all equal out);
        # the store records every whole group, trained on or not
        # what each is trained on: its reward, or a wrong answer's partial credit (trainer.partial_credit);
        # the store and the held-out reward keep the environment's reward
        rewards = trained_rewards(kept, t.partial_credit if step != EVALUATION else 0.0)
        selection = select_groups(kept, t.dynamic_sampling and step != EVALUATION, t.prompts_per_step, rewards)
        stats = RolloutStats.of(rolled.result, kept, self.engine_version, selection, rolled.stale_dropped)
        samples = loss_bearing(to_samples(selection.trained, t.normalize_std,
                                          [rewards[r.trajectory_id] for r in selection.trained]),
                               selection.trained, t.overlong_filter and step != EVALUATION)
        batch = Batch(step, tuple(samples), tuple(r.record() for r in kept),
                      stats, rolled.decode)
        self.batches.scored(batch)
        return batch

    def update(self, step: int) -> Update:
        """One GRPO update on batch `step`, its trajectories beyond the staleness bound dropped."""
        try:
            return self._update(step)
        finally:
            self.update_done(step).set()
            self.updates_done.pop(step - 1, None)

    def _update(self, step: int) -> Update:
        batch = self.batches.take_for_update(step)
        admission = admit(batch.samples, self.trainer.updates, self.config.trainer.max_staleness)
        if not admission.admitted:
            raise LibraError(f"iteration {step}: all {len(batch.samples)} trajectories are more than "
                             f"{self.config.trainer.max_staleness} updates old; nothing to train on")
        if self.config.placement.hybrids:
            assert self.placement is not None and isinstance(self.trainer, ElasticTrainer)  # placed, in the pool
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
                      admission.staleness_mean, timing, admission.offpolicy_share, admission.token_gap_mean,
                      admission.token_gap_max)

    def sync(self) -> float:
        """The trainer's weights into every engine, in place (through an HF-format directory that
        every engine kind loads); the engines' version is then the trainer's."""
        began = self.clock.now()
        with tempfile.TemporaryDirectory(prefix="libra-sync-", dir=self.root) as directory:  # every host reads it
            self.trainer.save_weights(directory)
            for i, engine in enumerate(self.engines):
                if i not in self.dead_engines:
                    engine.update_weights(directory)
            self._restart_dead(Path(directory))
        self.engine_version = self.trainer.updates
        return self.clock.now() - began

    def _restart_dead(self, weights: Path) -> None:
        """The engines that failed in a rollout, started again from `weights` (the trainer's, which the
        live engines have just loaded) on their workers; the restarts count as engine starts."""
        from libra.rollout.engines import make_share_engine

        r = self.config.rollout
        for i in self.dead_engines:
            with contextlib.suppress(Exception):  # what is left of it
                self.engines[i].close()
            watch = Stopwatch(self.clock)
            self.engines[i] = self.placer.restart_engine(i, weights) if self.placer is not None else \
                make_share_engine(r.engine, weights, len(self.engines), i, r.device, r.max_context)
            self.engine_starts.append(EngineStart(1, watch.seconds()))
        self.dead_engines = ()

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
                               self.config.placement.strategy, self.placement, starts, events)

    def checkpoint(self, record: IterationRecord, mlflow_run_id: str = "") -> Path:
        """The state after iteration `record.step`: weights, optimizer, RNG, the batches rolled out
        ahead, the suspended trajectories (partial rollouts) and the iteration's record (re-recorded
        on resume if the process died before)."""
        self.state = advanced(self.state, record, self.trainer.updates, mlflow_run_id, self.config.trainer.curriculum_decay)
        self.last_record = record
        saved = Saved(self.trainer.optimizer_state(), rng_state(), self.pending, self.suspended, record,
                      self.planning_state())
        return save_checkpoint(self.root, self.state, self.trainer.save_weights, saved.blobs(), copy_from=self.policy,
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

    def planning_state(self) -> PlanningState | None:
        """What a resumed run needs to place itself as before: the placement and the controller."""
        if self.placement is None or self.cluster is None:
            return None
        return PlanningState(self.placement, self.controller, self.plan_events, self.cluster)

    def close(self) -> None:
        for rolled in self.batches.discard():
            discard_tree(rolled.workroot)
        for engine in self.engines:
            engine.close()
        self.engines = []
        self.trainer.close()
        if self.placer is not None:
            self.placer.close()
        if self.lock is not None:
            self.lock.close()  # releases the run's lock
            self.lock = None
