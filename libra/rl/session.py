"""A training run's live objects in one process, and one method per stage of an iteration.

    session = TrainingSession.open(config)      # resumes from the run's newest checkpoint, if any
    session.rollout(k); session.score(k)         # batch k: trajectories with rewards
    session.update(k)                            # one GRPO update on batch k (stale ones dropped)
    session.sync()                               # the new weights into every engine
    session.evaluate()                           # held-out reward of the engines' weights
    session.checkpoint(record)                   # the state after iteration k, atomically

Engines, the trainer and the rolled-out batches stay here, never in a flow's arguments; the flows
(flows/) call the stages in order through Prefect tasks that name the run. Decisions (which tasks
an iteration sees, what is fresh enough to train on) are in `libra.rl.schedule`; what an iteration
produced is in `libra.rl.records`; which trainer runs, and where, in `libra.rl.trainers`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from libra.config import LibraConfig
from libra.errors import HostLostError, LibraError, RankLostError
from libra.pools.states import PoolEvent
from libra.rl.cluster import LocalCluster, Placement, cluster_of_hosts, hybrid_workers, initial_placement
from libra.rl.planning import EngineStart, EngineTiming, TrainTiming
from libra.rl.ray_cluster import RayCluster, address_of
from libra.rl.records import (  # (also where older checkpoints' pickles find them)
    Batch,
    IterationRecord,
    RolloutStats,
    Update,
)
from libra.rl.schedule import EVAL_SEED, Admission, admit, hybrids_wanted, tokens_per_turn, train_task_seed
from libra.rl.trainers import Reshard, layout_of, open_trainer, place_trainer, with_first_layout
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


def config_digest(config: LibraConfig) -> str:
    """What a resumed run must share with the run it continues: what it trains on and how (the
    environment, the policy, the rollout, the trainer's settings), not where files go or how they
    are written, how often it is evaluated or kept, nor its step count (a run may be extended;
    with a cosine schedule the count shapes the learning rate, so it counts there)."""
    rollout = config.rollout.model_dump(mode="json")
    rollout.pop("tool_threads")
    trainer = config.trainer.model_dump(mode="json")
    for key in ("run", "eval_every", "checkpoint_dir", "keep_checkpoints") + (("steps",) if config.trainer.schedule != "cosine" else ()):
        trainer.pop(key)
    if trainer["layout"] == "fixed":  # the default, which runs from before layouts were planned left out
        trainer.pop("layout")
    trainer["policy"] = str(Path(config.trainer.policy).resolve())
    data = {"run": config.trainer.run_name(), "rollout": rollout, "trainer": trainer,
            "scheduler": config.scheduler.model_dump(mode="json"), "placement": config.placement.policy}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TrainingSession:
    config: LibraConfig
    run: str
    root: Path  # the run's checkpoints
    policy: Path  # the initial policy
    state: CheckpointState
    trainer: Any  # PolicyTrainer, MegatronTrainer or PooledTrainer (libra.rl.trainers)
    engines: list
    env: Any
    tokenizer: Any
    router: Any
    pending: dict[int, Batch] = field(default_factory=dict)  # scored batches not trained on yet
    rolled: dict[int, tuple[Any, Path]] = field(default_factory=dict)  # rollouts awaiting their rewards
    engine_version: int = 0
    trained: Batch | None = None  # the batch of the last update
    last_record: IterationRecord | None = None
    lock: Any = None  # the run's lock file, held open while the session lives
    cluster: LocalCluster | None = None  # this machine's workers (None: no placement policy)
    placement: Placement | None = None  # where the engines and the trainer run now
    controller: Any = None  # the planning flow's PlanController (libra policy), kept across iterations
    engine_start_s: float = 0.0  # measured: the last (re)start of the engines
    engine_starts: list[EngineStart] = field(default_factory=list)  # (re)starts not in a record yet
    affinity: tuple[int, ...] = ()  # this process's cores before placement pinned it; given back at close
    threads: int = 0  # torch's threads before placement set them; given back at close
    pool_events: list[PoolEvent] = field(default_factory=list)  # the hybrids' transitions not in a record yet
    plan_events: dict[int, list[dict]] = field(default_factory=dict)  # a step's planning rows (pool_events)
    ray: RayCluster | None = None  # the Ray cluster the workers are on (None: this machine's cores)
    replaced: str = ""  # why the run was placed anew on the hosts there are (hosts lost or back), until recorded
    reshard: Reshard | None = None  # the megatron trainer's last layout change, until recorded

    @classmethod
    def open(cls, config: LibraConfig, restart: bool = False) -> TrainingSession:
        """The run's session: from its newest checkpoint when one exists, else from the policy. The
        run is locked for this process until `close`; `restart` removes its checkpoints first."""
        t, r = config.trainer, config.rollout
        run = t.run_name()
        policy = Path(t.policy)
        if not (policy / "config.json").is_file():
            raise LibraError(f"no policy in {policy}: run `libra policy init --out {policy}` (or set trainer.policy to an "
                             "HF-format checkpoint)")
        root = Path(t.checkpoint_dir) / run
        positions = json.loads((policy / "config.json").read_text()).get("max_position_embeddings")
        if positions and r.max_context > positions:
            raise LibraError(f"rollout.max_context {r.max_context} is more than the policy's {positions} positions; "
                             f"set it to at most {positions}")
        lock = hold_run(root)
        try:
            if restart:
                for entry in root.iterdir():
                    if entry.name != ".lock":
                        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            return cls._open(config, run, policy, root, lock)
        except BaseException:
            lock.close()
            raise

    @classmethod
    def _open(cls, config: LibraConfig, run: str, policy: Path, root: Path, lock) -> TrainingSession:
        from transformers import AutoTokenizer

        from libra.rollout.envs import expert_bounds, make_env
        from libra.scheduler.policies import Buckets
        from libra.scheduler.replay import make_router

        t, r = config.trainer, config.rollout
        latest = latest_checkpoint(root)
        digest = config_digest(config)
        state = CheckpointState(run, 0, 0, digest)
        weights = policy
        if latest is not None:
            state = load_state(latest)
            if state.config_digest != digest:
                raise LibraError(f"run {run!r} was trained with another configuration (checkpoints in {root}); name a new "
                                 "run (trainer.run) or pass --restart to train this one again from the policy")
            weights = latest
        tokenizer = AutoTokenizer.from_pretrained(weights)
        env = make_env(t.env, config.sandbox)
        buckets = Buckets(expert_bounds(env, r.instances, tokenizer))
        router = make_router(r.router, buckets, {}, config.scheduler)
        pool_events: list[PoolEvent] = []
        address = address_of(config)
        ray = RayCluster.connect(address, config.cluster.start_timeout_s) if address else None
        planning = load_blob(latest, "planning") if latest is not None else None
        cluster = placement = None
        placed = False
        if config.placement.policy != "none":
            cluster = local_cluster(config) if ray is None else \
                cluster_of_hosts(ray.hosts(), config.placement.cores_per_worker, r.device)
            placed = planning is not None and planning.get("cluster", cluster) == cluster
            placement = planning["placement"] if placed else initial_placement(config.placement.policy, cluster,
                                                                               config.placement.hybrids)
            placement = with_first_layout(config, placement, cluster, policy)
        trainer = open_trainer(config, weights, policy, root, placement, cluster, pool_events.append,
                               pooled=bool(config.placement.hybrids) or ray is not None)
        session = cls(config, run, root, policy, state, trainer, [], env, tokenizer, router,
                      engine_version=state.version, lock=lock, pool_events=pool_events, ray=ray, cluster=cluster)
        try:
            session._start(latest, weights, placement, planning, placed)
        except BaseException:  # nothing started is left running (the caller releases the lock)
            session.lock = None
            session.close()
            raise
        return session

    def _start(self, latest: Path | None, weights: Path, placement: Placement | None, planning: dict | None,
               placed: bool) -> None:
        """Start the engines (where `placement` says, when the run has one) and restore a resumed
        run's optimizer, RNG, batches ahead and last record from `latest`."""
        from libra.rollout.engines import make_engines

        r = self.config.rollout
        if placement is None:
            began = time.perf_counter()
            self.engines = make_engines(r.engine, weights, r.instances, r.device, r.max_context)
            self.engine_start_s = time.perf_counter() - began
            self.engine_starts.append(EngineStart(r.instances, self.engine_start_s))
        else:
            assert self.cluster is not None
            self.affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
            self.threads = self.trainer.threads()
            self.plan_events = planning.get("plan_events", {}) if planning else {}
            if planning is not None and not placed:  # hosts were lost (or came back) since the checkpoint
                self.note_hosts(self.state.step, planning["cluster"], self.cluster)
            self.controller = planning["controller"] if placed else None
            self._place(placement, weights)
        if latest is not None:
            self.trainer.load_optimizer_state(load_blob(latest, "trainer"))
            restore_rng(load_blob(latest, "rng"))
            self.pending = load_blob(latest, "pending") or {}
            self.last_record = load_blob(latest, "record")

    # -- placement -----------------------------------------------------------------------------

    def _place(self, placement: Placement, weights: Path, force: bool = False) -> bool:
        """Run the engines and the trainer where `placement` says: engines (re)started from `weights`
        when their workers change (or `force`: the cluster changed), the trainer's threads (and, with
        vLLM's engines in processes of their own, the cores of this process) set to its workers; on
        a Ray cluster, `_place_on_hosts`. Returns whether engines restarted."""
        from libra.rollout.engines import make_engine, pin_process

        if self.ray is not None:
            return self._place_on_hosts(placement, weights, force)
        r, cluster = self.config.rollout, self.cluster
        assert cluster is not None
        restart = self.placement is None or self.placement.engines != placement.engines or not self.engines
        if restart:
            for engine in self.engines:
                engine.close()
            self.engines = []
            if cluster.device == "cpu" and r.engine == "vllm":  # engines inherit this process's cores: all of them
                pin_process(cluster.units(tuple(range(cluster.size))))
            began = time.perf_counter()
            gpu = cluster.device == "cuda"
            for workers in placement.engines:
                units = cluster.units(workers)
                self.engines.append(make_engine(r.engine, weights, len(units), None if gpu else units,
                                                units if gpu else None, r.max_context))
            self.engine_start_s = time.perf_counter() - began
            self.engine_starts.append(EngineStart(len(placement.rollout_workers), self.engine_start_s))
            self._route(len(self.engines))
        if cluster.device == "cpu":
            cores = cluster.units(placement.train)
            self.trainer.set_threads(len(cores))
            if r.engine == "vllm":  # the engines run in processes of their own: this process is the trainer's
                pin_process(cores)
        self.reshard = place_trainer(self.trainer, self.config, placement, cluster) or self.reshard
        hybrids = self.config.placement.hybrids
        if hybrids:  # the pool's hybrid i on the i-th worker before the trainer's (it trains when the plan says)
            self.trainer.arrange(cluster.units(placement.train),
                                 [cluster.units((w,)) for w in hybrid_workers(placement.train[0], hybrids)])
        self.placement = placement
        return restart

    def _place_on_hosts(self, placement: Placement, weights: Path, force: bool) -> bool:
        """`_place` on a Ray cluster: each engine an actor on its workers' host (its placement group),
        the trainer's pool moved (`PooledTrainer.relocate`) when its workers change: a core rank per
        training worker on that worker's host, hybrid i on the i-th of the placement's hybrid
        workers (then the last rollout workers)."""
        r, cluster, ray = self.config.rollout, self.cluster, self.ray
        assert cluster is not None and ray is not None
        gpu = cluster.device == "cuda"
        restart = force or self.placement is None or self.placement.engines != placement.engines or not self.engines
        if restart:
            for engine in self.engines:
                engine.close()
            self.engines = []
            began = time.perf_counter()
            for i, workers in enumerate(placement.engines):
                units = cluster.units(workers)
                self.engines.append(ray.engine(f"engine-{i}", cluster.host_of(workers[0]), r.engine, weights, len(units),
                                               None if gpu else units, units if gpu else None, r.max_context))
            for i in range(len(placement.engines), len(self.placement.engines) if self.placement else 0):
                ray.release(f"engine-{i}")
            self.engine_start_s = time.perf_counter() - began
            self.engine_starts.append(EngineStart(len(placement.rollout_workers), self.engine_start_s))
            self._route(len(self.engines))
        hybrids = self.config.placement.hybrids
        hybrid_workers_ = tuple(dict.fromkeys(placement.hybrids + tuple(reversed(placement.rollout_workers))))[:hybrids]
        if force or self.placement is None or (self.placement.train, self.placement.hybrids) != (placement.train,
                                                                                                 placement.hybrids):
            from libra.trainer.pooled import PoolSite

            core_hosts = [cluster.host_of(w) for w in placement.train]
            hybrid_hosts = [cluster.host_of(w) for w in hybrid_workers_]

            def site() -> PoolSite:
                core, hybrid = ray.pool_providers(core_hosts, hybrid_hosts)
                return PoolSite(len(core_hosts), core, hybrid, ray.here())

            self.trainer.relocate(site)
            self.trainer.arrange_ranks([cluster.units((w,)) for w in placement.train],
                                       [cluster.units((w,)) for w in hybrid_workers_])
        self._note_placed(placement, hybrid_workers_)
        self.placement = placement
        return restart

    def _note_placed(self, placement: Placement, hybrids: tuple[int, ...]) -> None:
        """Where each engine, trainer rank and hybrid runs, as `placed` pool_events rows at the next step."""
        assert self.cluster is not None
        time_s = float(self.state.summary.get("elapsed_s", 0.0))
        where = [(f"engine-{i}", ws) for i, ws in enumerate(placement.engines)] + \
            [(f"core-{r}", (w,)) for r, w in enumerate(placement.train)] + [(f"hybrid-{i}", (w,)) for i, w in enumerate(hybrids)]
        self.plan_events.setdefault(self.state.step, []).extend(
            {"step": self.state.step, "time_s": time_s, "worker_id": who, "gpus": len(ws), "from_state": "",
             "to_state": "serving", "event": "placed",
             "detail": f"host {self.cluster.host_of(ws[0])} {'gpus' if self.cluster.device == 'cuda' else 'cores'} "
                       f"{','.join(map(str, self.cluster.units(ws)))} (workers {','.join(map(str, ws))})"}
            for who, ws in where)

    def follow_hosts(self, step: int) -> str:
        """On a Ray cluster, before iteration `step`: when hosts left or came back since the run was
        placed, place it anew by its policy's rule on the hosts there are (engines and trainer
        restarted from the trainer's weights; Libra's plan controller starts over, its history was
        another cluster's). Why, or '' when nothing changed."""
        if self.ray is None:
            return ""
        assert self.cluster is not None
        now = cluster_of_hosts(self.ray.hosts(), self.config.placement.cores_per_worker, self.config.rollout.device)
        if now == self.cluster:
            return ""
        self.note_hosts(step, self.cluster, now)
        self.cluster, self.controller = now, None
        self.apply(initial_placement(self.config.placement.policy, now, self.config.placement.hybrids), force=True)
        return self.replaced

    def await_departure(self, host: str, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Wait until Ray no longer counts `host` alive (it notices a dead host after missed health
        checks); whether it left within `timeout_s` (a lost actor on a live host: it stays)."""
        if self.ray is None:
            return True
        deadline = time.monotonic() + timeout_s
        while any(h.address == host for h in self.ray.hosts()):
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        return True

    def note_hosts(self, step: int, before: LocalCluster, after: LocalCluster) -> None:
        """Record that the run moves from `before`'s hosts to `after`'s at `step` (pool_events rows
        at the step: a host_lost or host_joined row per host; `replaced` says it in words)."""
        old, new = set(before.host_names), set(after.host_names)
        time_s = float(self.state.summary.get("elapsed_s", 0.0))
        rows = [{"step": step, "time_s": time_s, "worker_id": f"host-{h}", "gpus": before.hosts.count(h) if h in old
                 else after.hosts.count(h), "from_state": "serving" if h in old else "absent",
                 "to_state": "absent" if h in old else "serving", "event": "host_lost" if h in old else "host_joined",
                 "detail": f"{after.size} workers on {len(new)} host(s) after it"} for h in sorted(old ^ new)]
        self.plan_events.setdefault(step, []).extend(rows)
        lost, joined = sorted(old - new), sorted(new - old)
        self.replaced = "; ".join(part for part in (f"lost host {', '.join(lost)}" if lost else "",
                                                    f"host {', '.join(joined)} back" if joined else "") if part) + \
            f": placed anew on {after.size} workers of {len(new)} host(s)"

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

    def apply(self, placement: Placement, force: bool = False) -> bool:
        """Move to `placement` between iterations: the engines restart from the trainer's weights
        (the version they serve stays the trainer's); returns whether they restarted. `force`:
        restart everything (the cluster changed)."""
        import tempfile

        if self.rolled:
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

    # -- the stages of an iteration ------------------------------------------------------------

    def rollout(self, step: int, evaluation: bool = False) -> float:
        """Roll out iteration `step`'s tasks (or the held-out ones) on the engines; seconds taken."""
        from libra.rollout.agent import rollout
        from libra.rollout.sandbox import make_workroot

        t, r = self.config.trainer, self.config.rollout
        tasks = self.env.tasks(t.eval_prompts, seed=EVAL_SEED) if evaluation else \
            self.env.tasks(t.prompts_per_step, seed=train_task_seed(t.seed, step))
        per_turn = r.max_tokens_per_turn if evaluation else tokens_per_turn(r.max_tokens_per_turn, r.turn_growth, step,
                                                                             r.max_context)
        floor = 0 if evaluation or not r.min_tokens_per_turn else \
            tokens_per_turn(r.min_tokens_per_turn, r.turn_growth, step, per_turn)
        workroot = make_workroot("libra-train-")
        for engine in self.engines:  # what the engines timed before (an evaluation's steps) is not this batch's
            engine.timer.drain()
        began = time.perf_counter()
        try:
            result = rollout(self.env, tasks, 1 if evaluation else t.samples_per_prompt, self.engines, self.router,
                             self.tokenizer, max_turns=r.max_turns, max_tokens_per_turn=per_turn, min_tokens_per_turn=floor,
                             max_context=r.max_context, temperature=t.eval_temperature if evaluation else r.temperature,
                             seed=t.seed * 1_000_003 + step,
                             workroot=workroot, tool_threads=r.tool_threads, model_version=self.engine_version,
                             score=False)
        except BaseException:
            shutil.rmtree(workroot, ignore_errors=True)
            raise
        seconds = time.perf_counter() - began
        decode = tuple(EngineTiming(engine.size, timing) for engine in self.engines for timing in engine.timer.drain())
        self.rolled[-1 if evaluation else step] = (result, workroot, decode)
        return seconds

    def score(self, step: int) -> Batch:
        """Reward every trajectory of batch `step` with its environment's reward; the batch is then
        ready to train on (and its working directories are gone)."""
        from libra.rollout.agent import score_rewards

        result, workroot, decode = self.rolled.pop(step)
        try:
            score_rewards(result.trajectories)
        finally:
            shutil.rmtree(workroot, ignore_errors=True)
        runs = result.trajectories
        rewards = [r.reward for r in runs]
        stats = RolloutStats(len(runs), result.generated_tokens, result.wall_s, statistics.fmean(rewards),
                             statistics.pstdev(rewards), sum(x > 0 for x in rewards) / len(runs),
                             statistics.fmean(len(r.turns) for r in runs),
                             statistics.fmean(len(r.ids) - r.prompt_tokens for r in runs), result.migrations,
                             self.engine_version)
        batch = Batch(step, tuple(to_samples(runs, self.config.trainer.normalize_std)), tuple(result.records()), stats,
                      decode)
        if step >= 0:
            self.pending[step] = batch
        return batch

    def update(self, step: int) -> Update:
        batch = self.trained = self.pending.pop(step)
        admission: Admission = admit(batch.samples, self.trainer.updates, self.config.trainer.max_staleness)
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
            if self.ray is None or self.placement is None:
                raise
            host = self.cluster.host_of(self.placement.train[exc.rank]) if self.cluster else ""
            raise HostLostError(host, f"{exc} on host {host}") from None
        timing = TrainTiming(stats.seconds, stats.sequences, sum(len(s.token_ids) for s in admission.admitted),
                             max(len(s.token_ids) for s in admission.admitted),
                             layout_of(self.trainer, self.placement, stats.hybrids))
        return Update(stats, len(admission.admitted), len(admission.dropped), admission.staleness_max,
                      admission.staleness_mean, timing)

    def finish_iteration(self, step: int, update: Update, seconds: dict[str, float],
                         heldout_reward: float | None) -> IterationRecord:
        if self.trained is None or self.trained.step != step:
            raise RuntimeError(f"iteration {step} has not been trained")
        starts, self.engine_starts = tuple(self.engine_starts), []
        events = tuple(self.pool_events[:])  # the pool's monitor thread appends; take what is there now
        del self.pool_events[:len(events)]
        return IterationRecord(step, self.trained, update, seconds, heldout_reward,
                               float(self.state.summary.get("elapsed_s", 0.0)), self.trainer.updates,
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
                                "record": record, "planning": self.planning_state()}, copy_from=self.policy, keep=self.config.trainer.keep_checkpoints)

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

    def sync(self) -> float:
        """The trainer's weights into every engine, in place (through an HF-format directory that
        every engine kind loads); the engines' version is then the trainer's."""
        import tempfile

        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="libra-sync-", dir=self.root) as directory:  # every host reads it
            self.trainer.save_weights(directory)
            for engine in self.engines:
                engine.update_weights(directory)
        self.engine_version = self.trainer.updates
        return time.perf_counter() - began

    def evaluate(self) -> float:
        """Mean reward on the held-out tasks (one sample each, greedy by default) with the engines' weights."""
        self.rollout(-1, evaluation=True)
        return self.score(-1).stats.reward_mean

    def note_evaluation(self, version: int, reward: float) -> None:
        self.state = replace(self.state, summary={**self.state.summary,
                                                  "heldout": {**self.state.summary.get("heldout", {}), str(version): reward}})

    def close(self) -> None:
        for _, workroot, _ in self.rolled.values():
            shutil.rmtree(workroot, ignore_errors=True)
        for engine in self.engines:
            engine.close()
        self.engines = []
        self.trainer.close()
        if self.ray is not None:
            self.ray.close()
        if self.affinity:  # the process may train another run next (a benchmark, a test): all its cores again
            from libra.rollout.engines import pin_process

            pin_process(self.affinity)
            self.affinity = ()
        if self.threads:
            self.trainer.set_threads(self.threads)
            self.threads = 0
        if self.lock is not None:
            self.lock.close()  # releases the run's lock
            self.lock = None


def local_cluster(config: LibraConfig) -> LocalCluster:
    """This machine's workers: groups of `placement.cores_per_worker` of the cores this process may
    use (CPU), or one GPU each (rollout.device cuda)."""
    from libra.devices import gpu_count

    if config.rollout.device == "cuda":
        count = gpu_count()
        if count < 1:
            raise LibraError("rollout.device is cuda but torch sees no GPU; use device cpu")
        return LocalCluster(tuple((g,) for g in range(count)), "cuda")
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else tuple(range(os.cpu_count() or 1))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 16 * 2**30
    return LocalCluster.of_cores(cores, config.placement.cores_per_worker, float(memory))


def hold_run(root: Path):
    """Lock the run's checkpoint directory for this process (the kernel releases it if the process
    dies); a second process training the same run is refused."""
    import fcntl
    import os

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
