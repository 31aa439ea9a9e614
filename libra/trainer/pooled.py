"""The policy trainer as the elastic pool's core: a live run's updates go through an `ElasticPool`
(one core rank in a process of its own, hybrids that join and leave training), behind the part of
`PolicyTrainer`'s interface the training session uses (`train_step`, `save_weights`, the optimizer
state, `updates`).

    trainer = PooledTrainer(policy_dir, config.trainer, config.rollout, config.pool, work_dir, hybrids=1)
    trainer.arrange(core=(0,), hybrids=((1,),))     # the cores of the core rank and of each hybrid
    trainer.set_desired(1)                          # hybrids wanted in training (the pool joins them)
    stats = trainer.train_step(samples)             # one update, by the core and the active hybrids

An update: its samples are published to the replicas (`pool_task.write_step`), the pool trains on
them with the hybrids that are active, and core rank 0 publishes the state after it
(`GRPOTask.publish`), which this reads back: the statistics for the run's records, the weights for
the engines and the checkpoints, the optimizer state for the checkpoints. The pool starts at the
first update, from the weights and optimizer state the run resumes from, for the updates the run
has left; a hybrid that dies costs the step in flight a core-only redo, never a gradient.

On a Ray cluster the core is one rank per training worker, each a Ray actor on its worker's host
(`relocate` says where the ranks and the hybrids run: the providers that launch them and the
address their control store is reached at). A pool is started for a placement and ended when the
placement moves the trainer: the next update starts a new pool, on the new workers, from the
weights and optimizer state the last update published (each pool its own step files), so a move
costs the pool's start and no update.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from libra.clock import Clock, Stopwatch, WallClock, sleep
from libra.config import PoolConfig, RolloutConfig, TrainerConfig
from libra.errors import LibraError, RankLostError
from libra.pools.pool import ElasticPool
from libra.pools.providers import Provider
from libra.pools.states import PoolEvent
from libra.trainer.pool_task import GRPOTask, published_path, write_step
from libra.trainer.samples import TrainingSample
from libra.trainer.trainer import UpdateStats

OWN_FILES = ("optimizer.pt", "update.json")  # a published update's files that are not the HF weights


@dataclass(frozen=True)
class PoolSite:
    """Where a pool's workers run: its core ranks and hybrids through these providers, its control
    store reached at `control_host`."""

    core_ranks: int
    core: Provider
    hybrids: Provider
    control_host: str


class PooledTrainer:
    def __init__(self, policy_dir: str | Path, trainer: TrainerConfig, rollout: RolloutConfig, pool: PoolConfig,
                 work_dir: str | Path, *, hybrids: int, reference_dir: str | Path | None = None,
                 on_event: Callable[[PoolEvent], None] | None = None, poll_s: float = 0.02,
                 site: Callable[[], PoolSite] | None = None, clock: Clock | None = None) -> None:
        """`policy_dir`: the weights to start from; `work_dir`: the pool's files (emptied now);
        `hybrids`: hybrid workers launched (each may join training); `on_event`: told of every
        hybrid's transition (from the pool's monitor thread); `site`: where a pool's workers run,
        asked at each pool's start (None: one core rank and the hybrids, local processes); `clock`:
        what an update's seconds and the pool's start are read on (default: wall time)."""
        if hybrids < 0:
            raise LibraError(f"a pooled trainer's hybrids must be >= 0, got {hybrids}")
        self.policy_dir = Path(policy_dir)
        self.reference_dir = Path(reference_dir or policy_dir)
        self.config, self.rollout, self.settings = trainer, rollout, pool
        self.work_dir = Path(work_dir)
        shutil.rmtree(self.work_dir, ignore_errors=True)  # a pool of an earlier session: its steps are trained
        self.work_dir.mkdir(parents=True)
        self.hybrids = hybrids
        self.on_event = on_event
        self.poll_s = poll_s
        self.clock = clock or WallClock()
        self.updates = 0  # updates applied: the version of the weights held
        self.first = 0  # the update the pool started from
        self.pool: ElasticPool | None = None
        self.start_s = 0.0  # measured: starting the pool's processes until the core awaits its first step
        self._resumed: dict | None = None
        self._affinity: dict[str, tuple[int, ...]] = {}
        self._desired = 0
        self.site = site
        self._steps = self.work_dir / "steps"  # the running pool's step files

    # -- before the first update ----------------------------------------------------------------

    def load_optimizer_state(self, state: dict) -> None:
        """Resume: the optimizer state and update count of a checkpoint (the pool starts from them)."""
        if self.pool is not None:
            raise RuntimeError("the pool is training already; load the optimizer state before the first update")
        self._resumed = state
        self.updates = int(state["updates"])

    def arrange(self, core: Sequence[int], hybrids: Sequence[Sequence[int]]) -> None:
        """The CPU cores of the core rank and of each hybrid (for a pool that has not started; a
        running pool keeps where its processes are: the core's workers do not move)."""
        if len(hybrids) != self.hybrids:
            raise LibraError(f"{len(hybrids)} hybrid placements for {self.hybrids} hybrids")
        self._affinity = {"core-0": tuple(core), "snapshot-writer": tuple(core)} | \
            {f"hybrid-{i}": tuple(cores) for i, cores in enumerate(hybrids)}

    def arrange_ranks(self, core: Sequence[Sequence[int]], hybrids: Sequence[Sequence[int]]) -> None:
        """`arrange` for a core of several ranks (a cluster's: each rank's cores on its host)."""
        if len(hybrids) != self.hybrids:
            raise LibraError(f"{len(hybrids)} hybrid placements for {self.hybrids} hybrids")
        self._affinity = {f"core-{r}": tuple(cores) for r, cores in enumerate(core)} | \
            {"snapshot-writer": tuple(core[0])} | {f"hybrid-{i}": tuple(cores) for i, cores in enumerate(hybrids)}

    def set_desired(self, hybrids: int) -> None:
        """How many hybrids should train (the pool joins or leaves them at step boundaries)."""
        if not 0 <= hybrids <= self.hybrids:
            raise LibraError(f"desired hybrids must be 0..{self.hybrids}, got {hybrids}")
        self._desired = hybrids
        if self.pool is not None:
            self.pool.set_desired(hybrids)

    def relocate(self, site: Callable[[], PoolSite]) -> None:
        """Run the next pools where `site` says. A running pool is ended after its last update (the
        weights and optimizer state it published are where the next pool starts from)."""
        if self.pool is not None:
            if self.updates > self.first:
                latest = self._latest()
                assert latest is not None
                self._resumed = self.optimizer_state()
                self.policy_dir = latest
            pool, self.pool = self.pool, None
            pool.abort()
        self.site = site

    def _start(self) -> ElasticPool:
        optimizer_path = ""
        self._steps = self.work_dir / f"steps-from-{self.updates}"  # a pool's own: it reads step 0, 1, ...
        if self._resumed is not None:
            optimizer_path = str(self.work_dir / f"resumed-optimizer-{self.updates}.pt")
            torch.save(self._resumed["optimizer"], optimizer_path)
        self.first = self.updates
        left = self.config.steps - self.first
        if left < 1:
            raise LibraError(f"the run has had all {self.config.steps} of its updates; raise trainer.steps to train on")
        kind = GRPOTask
        if self.config.backend == "megatron":  # every replica megatron's GPTModel (TP = PP = 1)
            from libra.trainer.megatron_task import MegatronGRPOTask

            kind = MegatronGRPOTask
        task = kind(str(self.policy_dir), self.config, str(self._steps), self.rollout.temperature,
                    first_update=self.first, reference_dir=str(self.reference_dir), optimizer_path=optimizer_path,
                    publish_dir=str(self.work_dir / "published"))
        s = self.settings
        site = self.site() if self.site is not None else None
        where = {} if site is None else {"core_provider": site.core, "provider": site.hybrids,
                                         "control_host": site.control_host}
        pool = ElasticPool(task, steps=left, core_ranks=site.core_ranks if site else 1, hybrids=self.hybrids,
                           out_dir=self.work_dir / f"pool-from-{self.first}", group_timeout_s=s.group_timeout_s,
                           join_timeout_s=s.join_timeout_s, max_catchup_steps=s.max_catchup_steps,
                           enter_gap=s.enter_gap, poll_s=s.poll_s, on_event=self.on_event, affinity=self._affinity,
                           device=s.device, **where)
        pool.start(wait_for_hybrids_s=s.join_timeout_s)
        pool.set_desired(self._desired)
        while pool.progress < 0 and pool.running:  # the core rank's start (loading the policy) is not an update's
            sleep(WallClock(), self.poll_s)
        return pool

    # -- the trainer's interface -----------------------------------------------------------------

    def train_step(self, samples: Sequence[TrainingSample]) -> UpdateStats:
        """One update on the step's samples, by the core rank and the hybrids active for it."""
        if self.pool is None:  # its processes' start is not the update's time (`start_s` keeps it)
            starting = Stopwatch(self.clock)
            self.pool = self._start()
            self.start_s = starting.seconds()
        watch = Stopwatch(self.clock)
        write_step(self._steps, self.updates - self.first, list(samples))
        published = published_path(self.work_dir / "published", self.updates + 1)
        while not published.is_dir():
            if not all(rank.is_alive() for rank in self.pool.core) and not published.is_dir():
                self._rank_stopped()  # one rank gone (before it published): the others wait in vain
            sleep(WallClock(), self.poll_s)
        record = json.loads((published / "update.json").read_text())
        self.updates += 1
        return UpdateStats(**(record["stats"] | {"seconds": watch.seconds()}))

    def _rank_stopped(self) -> None:
        """A core rank stopped mid-update: RankLostError if a rank was killed (its process, or its
        host), else LibraError with the error a rank reported. A rank whose peer's host went away
        fails at once (its collective's connection closed), while Ray counts the peer's actor dead
        only after missed health checks: so the ranks get the core's collective timeout to settle
        (every rank stopped, or one killed) before a failure is taken for an error of its own."""
        core = self.pool.core
        waited = Stopwatch()
        while True:
            killed = [r for r, rank in enumerate(core) if not rank.is_alive() and (rank.exitcode or 0) < 0]
            if killed or not any(rank.is_alive() for rank in core) or waited.seconds() > 4 * self.settings.group_timeout_s:
                break
            sleep(WallClock(), self.poll_s)
        errors = self.pool.monitor.errors + [e for rank in core if (e := getattr(rank, "error", ""))]
        detail = errors[-1].strip().splitlines()[-1] if errors else "no error reported"
        message = f"the training pool's core rank stopped before update {self.updates + 1}: {detail}"
        if killed:  # killed (or its host gone), not failed
            raise RankLostError(killed[0], message + f" (rank {killed[0]} killed)")
        raise LibraError(message)

    def _latest(self) -> Path | None:
        return published_path(self.work_dir / "published", self.updates) if self.updates > self.first else None

    def save_weights(self, directory: str | Path) -> None:
        """The weights in HF format (the newest update's, or those the pool starts from)."""
        source = self._latest()
        if source is None:
            for file in self.policy_dir.glob("*.safetensors"):
                shutil.copy2(file, Path(directory) / file.name)
            shutil.copy2(self.policy_dir / "config.json", Path(directory) / "config.json")
            return
        for file in source.iterdir():
            if file.name not in OWN_FILES:
                shutil.copy2(file, Path(directory) / file.name)

    def optimizer_state(self) -> dict:
        source = self._latest()
        if source is None:
            if self._resumed is None:
                raise RuntimeError("no update yet: there is no optimizer state to save")
            return self._resumed
        return {"optimizer": torch.load(source / "optimizer.pt", weights_only=False), "updates": self.updates}

    def set_threads(self, count: int) -> None:
        """This process's intra-op threads (it trains nothing itself: the core rank's process does)."""
        torch.set_num_threads(max(1, count))

    def threads(self) -> int:
        return torch.get_num_threads()

    def kill(self, hybrid: int) -> None:
        """SIGKILL hybrid `hybrid`'s process (drills and tests)."""
        if self.pool is None:
            raise RuntimeError("the pool has not started")
        self.pool.kill(f"hybrid-{hybrid}")

    def close(self) -> None:
        """Stop the pool: waited for when it has trained every update of the run, else ended."""
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        if pool.running or any(rank.exitcode for rank in pool.core):  # unfinished, or a rank failed (told already)
            pool.abort()
        else:
            pool.wait(60.0)
