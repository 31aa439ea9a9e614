"""Where a training run's engines and trainer run: one placement reconciler over two kinds of site.

    placer = Placer.open(site, trainer, config)            # remembers the process's cores and threads
    placed = placer.apply(placement, weights, engines)      # engines restarted only when theirs change
    change = placer.follow_hosts(step, time_s)              # hosts left or came back (a Ray cluster)
    placer.close()                                          # the process's cores and threads given back

`Placer.apply` is the reconcile: it compares the placement in force with the new one, restarts the
engines when their workers change (or the cluster did: `force`), and has the site put the trainer on
its workers (threads and cores here, megatron's ranks resharded or pinned, the elastic pool's ranks
moved to other hosts). A site is where the workers are: this machine's cores or GPUs (`LocalSite`)
or the hosts of a Ray cluster (`RaySite`); it starts an engine on given workers and places the
trainer, and nothing else. What happened comes back as a typed `Placed` with `PoolEvent`s (placed,
host_lost, host_joined) for the store's `pool_events` rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from libra.clock import Clock, Deadline, WallClock, sleep
from libra.config import LibraConfig
from libra.pools.states import PoolEvent
from libra.rl.cluster import LocalCluster, Placement, cluster_of_hosts, hybrid_workers
from libra.rl.planning import EngineStart
from libra.rl.trainers import Reshard, place_trainer
from libra.trainer.protocol import ElasticTrainer, Trainer

if TYPE_CHECKING:
    from libra.rl.ray_cluster import RayCluster
    from libra.rollout.engines import Engine


class Event:
    """The `event` names of placement rows in the store's `pool_events` table."""

    PLACED = "placed"  # where an engine, a core rank or a hybrid runs (on a Ray cluster)
    HOST_LOST = "host_lost"
    HOST_JOINED = "host_joined"


@dataclass(frozen=True)
class TrainerPlaced:
    """What a site did to put the trainer on a placement's workers."""

    reshard: Reshard | None = None  # megatron's ranks restarted in another layout
    hybrids: tuple[int, ...] | None = None  # the workers the pool's hybrids run on, where the site says (Ray)


@dataclass(frozen=True)
class Placed:
    """The outcome of one `Placer.apply`."""

    engines: list[Engine]  # the engines that serve the placement (the same list when none restarted)
    restarted: bool
    start: EngineStart | None  # the engines' (re)start, measured
    reshard: Reshard | None
    events: tuple[PoolEvent, ...]  # `placed` rows, at the step the run is at


@dataclass(frozen=True)
class HostChange:
    """The cluster's hosts differ from those the run was placed on."""

    before: LocalCluster
    after: LocalCluster
    events: tuple[PoolEvent, ...]  # host_lost / host_joined, one per host
    reason: str  # in words, for the plan row


class WorkerSite(Protocol):
    """Where the workers of a cluster are, and how an engine or the trainer gets onto them."""

    cluster: LocalCluster
    spans_hosts: bool  # whether a lost rank means a lost host (the run then recovers on the hosts left)

    def start_engine(self, index: int, workers: tuple[int, ...], weights: Path) -> Engine: ...

    def engines_stopped(self, before: int, after: int) -> None:
        """The old engines are closed (`before` of them; `after` will start): free what held them."""
        ...

    def place_trainer(self, trainer: Trainer, placement: Placement, previous: Placement | None,
                      force: bool) -> TrainerPlaced: ...

    def survey(self) -> LocalCluster:
        """The cluster as it is now (hosts may have left or joined)."""
        ...

    def await_departure(self, host: str, timeout_s: float) -> bool: ...

    def close(self) -> None: ...


class LocalSite:
    """This machine's cores (groups of `placement.cores_per_worker`) or GPUs (one a worker). vLLM's
    engines run in processes of their own and inherit the cores of this process when they start:
    all of them, then this process is pinned to the trainer's."""

    def __init__(self, cluster: LocalCluster, config: LibraConfig) -> None:
        self.cluster = cluster
        self.config = config
        self.spans_hosts = False

    def start_engine(self, index: int, workers: tuple[int, ...], weights: Path) -> Engine:
        from libra.rollout.engines import make_engine

        r, (cores, gpus) = self.config.rollout, self.cluster.cores_and_gpus(workers)
        return make_engine(r.engine, weights, len(cores or gpus), cores, gpus, r.max_context)

    def engines_stopped(self, before: int, after: int) -> None:
        if self.cluster.device == "cpu" and self.config.rollout.engine == "vllm":  # engines inherit these cores
            from libra.rollout.engines import pin_process

            pin_process(self.cluster.units(tuple(range(self.cluster.size))))

    def place_trainer(self, trainer: Trainer, placement: Placement, previous: Placement | None,
                      force: bool) -> TrainerPlaced:
        """The trainer's threads (and, beside vLLM's engine processes, this process's cores) on its
        workers; megatron's ranks resharded or pinned; the pool's hybrid i on the i-th worker before
        the trainer's."""
        cluster = self.cluster
        if cluster.device == "cpu":
            cores = cluster.units(placement.train)
            trainer.set_threads(len(cores))
            if self.config.rollout.engine == "vllm":  # the engines run in processes of their own
                from libra.rollout.engines import pin_process

                pin_process(cores)
        reshard = place_trainer(trainer, self.config, placement, cluster)
        hybrids = self.config.placement.hybrids
        if hybrids:  # it trains when the plan says
            assert isinstance(trainer, ElasticTrainer)  # a run with hybrids trains in the elastic pool
            trainer.arrange(cluster.units(placement.train),
                            [cluster.units((w,)) for w in hybrid_workers(placement.train[0], hybrids)])
        return TrainerPlaced(reshard)

    def survey(self) -> LocalCluster:
        return self.cluster

    def await_departure(self, host: str, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


class RaySite:
    """The hosts of a Ray cluster: each engine an actor in a placement group on its workers' host;
    the trainer's pool a core rank per training worker on that worker's host, hybrid i on the i-th
    of the placement's hybrid workers (then the last rollout workers)."""

    def __init__(self, ray: RayCluster, cluster: LocalCluster, config: LibraConfig, clock: Clock) -> None:
        self.ray = ray
        self.cluster = cluster
        self.config = config
        self.clock = clock
        self.spans_hosts = True

    def start_engine(self, index: int, workers: tuple[int, ...], weights: Path) -> Engine:
        r, (cores, gpus) = self.config.rollout, self.cluster.cores_and_gpus(workers)
        return self.ray.engine(f"engine-{index}", self.cluster.host_of(workers[0]), r.engine, weights,
                               len(cores or gpus), cores, gpus, r.max_context)

    def engines_stopped(self, before: int, after: int) -> None:
        for i in range(after, before):  # the groups of engines that do not start again
            self.ray.release(f"engine-{i}")

    def place_trainer(self, trainer: Trainer, placement: Placement, previous: Placement | None,
                      force: bool) -> TrainerPlaced:
        cluster, ray = self.cluster, self.ray
        hybrids = tuple(dict.fromkeys(placement.hybrids + tuple(reversed(placement.rollout_workers))))[
            :self.config.placement.hybrids]
        if force or previous is None or (previous.train, previous.hybrids) != (placement.train, placement.hybrids):
            from libra.trainer.pooled import PoolSite

            core_hosts = [cluster.host_of(w) for w in placement.train]
            hybrid_hosts = [cluster.host_of(w) for w in hybrids]

            def site() -> PoolSite:
                core, hybrid = ray.pool_providers(core_hosts, hybrid_hosts)
                return PoolSite(len(core_hosts), core, hybrid, ray.here())

            assert isinstance(trainer, ElasticTrainer)  # a Ray cluster's trainer is the elastic pool
            trainer.relocate(site)
            trainer.arrange_ranks([cluster.units((w,)) for w in placement.train], [cluster.units((w,)) for w in hybrids])
        return TrainerPlaced(hybrids=hybrids)

    def survey(self) -> LocalCluster:
        p = self.config.placement
        return cluster_of_hosts(self.ray.hosts(), p.cores_per_worker, self.config.rollout.device)

    def await_departure(self, host: str, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Wait until Ray no longer counts `host` alive (it notices a dead host after missed health
        checks); whether it left within `timeout_s` (a lost actor on a live host: it stays)."""
        deadline = Deadline(self.clock, timeout_s)
        while any(h.address == host for h in self.ray.hosts()):
            if deadline.left() < 0:
                return False
            sleep(self.clock, poll_s)
        return True

    def close(self) -> None:
        self.ray.close()


@dataclass
class Placer:
    """The placement in force on a site, and the reconcile to a new one."""

    site: WorkerSite
    trainer: Trainer
    clock: Clock = field(default_factory=WallClock)
    placement: Placement | None = None
    affinity: tuple[int, ...] = ()  # this process's cores before placement pinned it; given back at close
    threads: int = 0  # the trainer's threads before placement set them; given back at close

    @classmethod
    def open(cls, site: WorkerSite, trainer: Trainer, clock: Clock | None = None) -> Placer:
        affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
        return cls(site, trainer, clock or WallClock(), None, affinity, trainer.threads())

    @property
    def cluster(self) -> LocalCluster:
        return self.site.cluster

    def apply(self, placement: Placement, weights: Path, engines: list[Engine], step: int, time_s: float,
              force: bool = False) -> Placed:
        """Run the engines and the trainer where `placement` says: the engines (re)started from
        `weights` when their workers change (or `force`: the cluster changed), the trainer put on its
        workers. `step`, `time_s`: where the run is, for the events."""
        previous = self.placement
        restart = force or previous is None or previous.engines != placement.engines or not engines
        start = None
        if restart:
            for engine in engines:
                engine.close()
            self.site.engines_stopped(len(previous.engines) if previous else 0, len(placement.engines))
            began = self.clock.now()
            engines = [self.site.start_engine(i, workers, weights) for i, workers in enumerate(placement.engines)]
            start = EngineStart(len(placement.rollout_workers), self.clock.now() - began)
        moved = self.site.place_trainer(self.trainer, placement, previous, force)
        events = () if moved.hybrids is None else placed_events(self.cluster, placement, moved.hybrids, step, time_s)
        self.placement = placement
        return Placed(engines, restart, start, moved.reshard, events)

    def move(self, placement: Placement, policy: Path, scratch: Path, engines: list[Engine], step: int, time_s: float,
             force: bool = False) -> Placed:
        """`apply` with the trainer's weights now: engines that restart load them (an HF-format
        directory under `scratch` with the policy's other files)."""
        with tempfile.TemporaryDirectory(prefix="libra-place-", dir=scratch) as directory:
            shutil.copytree(policy, directory, dirs_exist_ok=True)
            for stale in Path(directory).glob("*.safetensors"):
                stale.unlink()
            self.trainer.save_weights(directory)
            return self.apply(placement, Path(directory), engines, step, time_s, force)

    def restart_engine(self, index: int, weights: Path) -> Engine:
        """Engine `index` of the placement in force started again on its workers from `weights` (the
        one that failed; the caller has closed it)."""
        assert self.placement is not None
        return self.site.start_engine(index, self.placement.engines[index], weights)

    def host_of_rank(self, rank: int) -> str | None:
        """The host of the trainer's core rank `rank`, when losing a rank means losing a host."""
        if not self.site.spans_hosts or self.placement is None:
            return None
        return self.cluster.host_of(self.placement.train[rank])

    def follow_hosts(self, step: int, time_s: float) -> HostChange | None:
        """The hosts there are now, when they are not those the run is placed on (the caller places
        the run anew on them); None when nothing changed."""
        now = self.site.survey()
        if now == self.cluster:
            return None
        change = host_change(step, time_s, self.cluster, now)
        self.site.cluster = now
        return change

    def close(self) -> None:
        """Give the process its cores and the trainer its threads back (the process may train another
        run next: a benchmark, a test), and leave the site."""
        self.site.close()
        if self.affinity:
            from libra.rollout.engines import pin_process

            pin_process(self.affinity)
            self.affinity = ()
        if self.threads:
            self.trainer.set_threads(self.threads)
            self.threads = 0


def placed_events(cluster: LocalCluster, placement: Placement, hybrids: tuple[int, ...], step: int,
                  time_s: float) -> tuple[PoolEvent, ...]:
    """Where each engine, trainer rank and hybrid runs, as `placed` events."""
    where = [(f"engine-{i}", ws) for i, ws in enumerate(placement.engines)] + \
        [(f"core-{r}", (w,)) for r, w in enumerate(placement.train)] + [(f"hybrid-{i}", (w,)) for i, w in enumerate(hybrids)]
    kind = "gpus" if cluster.device == "cuda" else "cores"
    return tuple(PoolEvent(step, time_s, who, len(ws), "", "serving", Event.PLACED,
                           f"host {cluster.host_of(ws[0])} {kind} {','.join(map(str, cluster.units(ws)))} "
                           f"(workers {','.join(map(str, ws))})") for who, ws in where)


def host_change(step: int, time_s: float, before: LocalCluster, after: LocalCluster) -> HostChange:
    """The run moves from `before`'s hosts to `after`'s at `step`: a host_lost or host_joined event
    per host, and why in words."""
    old, new = set(before.host_names), set(after.host_names)
    events = tuple(PoolEvent(step, time_s, f"host-{h}", before.hosts.count(h) if h in old else after.hosts.count(h),
                             "serving" if h in old else "absent", "absent" if h in old else "serving",
                             Event.HOST_LOST if h in old else Event.HOST_JOINED,
                             f"{after.size} workers on {len(new)} host(s) after it") for h in sorted(old ^ new))
    lost, joined = sorted(old - new), sorted(new - old)
    reason = "; ".join(part for part in (f"lost host {', '.join(lost)}" if lost else "",
                                         f"host {', '.join(joined)} back" if joined else "") if part) + \
        f": placed anew on {after.size} workers of {len(new)} host(s)"
    return HostChange(before, after, events, reason)


def event_row(event: PoolEvent) -> dict:
    """A placement event as a row of the store's `pool_events` table."""
    return {"step": event.step, "time_s": event.time_s, "worker_id": event.worker_id, "gpus": event.gpus,
            "from_state": event.from_state, "to_state": event.to_state, "event": event.event, "detail": event.detail}


def local_cluster(config: LibraConfig) -> LocalCluster:
    """This machine's workers: groups of `placement.cores_per_worker` of the cores this process may
    use (CPU), or one GPU each (rollout.device cuda)."""
    from libra.devices import machine_memory_bytes, require_gpus

    if config.rollout.device == "cuda":
        count = require_gpus(1, "rollout.device is cuda", "set it to cpu")
        return LocalCluster(tuple((g,) for g in range(count)), "cuda")
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else tuple(range(os.cpu_count() or 1))
    return LocalCluster.of_cores(cores, config.placement.cores_per_worker, float(machine_memory_bytes()))


def site_of(config: LibraConfig, ray: RayCluster | None, clock: Clock) -> WorkerSite:
    """The site a placed run's workers are on: the Ray cluster's hosts, or this machine."""
    if ray is None:
        return LocalSite(local_cluster(config), config)
    return RaySite(ray, cluster_of_hosts(ray.hosts(), config.placement.cores_per_worker, config.rollout.device), config,
                   clock)
