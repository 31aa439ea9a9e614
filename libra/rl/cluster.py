"""Where a training run's stages run: the workers of one machine, and how a plan places the rollout
engines and the trainer on them.

A *worker* is the unit the planner moves, the local stand-in for a GPU: a set of CPU cores
(`cores_per_worker` of them, pinned) on a CPU machine, one GPU on a GPU machine. On a Ray cluster
(`cluster.ray_address`) the workers are those of every host (`LocalCluster.hosts` names each
worker's host; its cores are that host's) and an engine's workers are always on one host
(`spread_over_hosts`). The planner sees the
workers as a one-node cluster whose device is one worker (`LocalCluster.planner_cluster`); the
calibration (`libra.planner.calibrate`) then fits the cost model's coefficients to what the run
measures, so the same planner that plans 48 A800s plans these workers.

A `Placement` is the planner's decision in this machine's terms:

- split (one-step-off): the engines run on their own workers while the trainer runs on the others,
  at the same time (the rollout of iteration k + 1 beside the update of k);
- colocated: every engine and the trainer use every worker, one after the other (rollout, then
  update).

A split may have *hybrid* workers (`placement.hybrids`): rollout workers, each with an engine of its
own, that also train beside the trainer as hybrids of the elastic pool (its core rank is the
trainer, on the training workers, which stay where they are while hybrids train). Hybrid i is the
i-th worker before the trainer's first: the planner's hybrid count says how many of them train.

The strategies a run can follow (`placement.strategy`, `libra train --placement`):

- `colocated`: every worker rolls out, then every worker trains (verl's colocated placement);
- `static`: the initial split, never moved (a fixed rollout/train split, AReaL-style);
- `libra`: the initial split, then whatever the planning flow decides from the run's statistics.

Everything here is pure: which cores exist is passed in, nothing is read or started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from libra.errors import LibraError
from libra.planner.planner import Plan
from libra.planner.profiles import GB, Cluster, HardwareProfile
from libra.trainer.layout import Layout

StrategyName = Literal["libra", "static", "colocated"]  # placement.strategy of a placed run
STRATEGIES: tuple[str, ...] = ("libra", "static", "colocated")

# One CPU core as a planner device, before calibration: ~50 GFLOP/s fp32 GEMM, a share of DDR
# bandwidth, loopback between processes. The calibration replaces what matters (the per-step fixed
# costs and the compute and memory coefficients) with the run's own measurements.
CORE_FLOPS = 50e9
CORE_MEMORY_BANDWIDTH = 10 * GB
LOOPBACK_BANDWIDTH = 5 * GB


@dataclass(frozen=True)
class LocalCluster:
    """The workers the run may use: each a tuple of CPU cores (device cpu) or of one GPU index
    (cuda), on this machine or, with `hosts`, on the host each names."""

    workers: tuple[tuple[int, ...], ...]
    device: str = "cpu"
    memory_bytes: float = 16 * 2**30  # memory a worker may use (host RAM share, or the GPU's)
    hosts: tuple[str, ...] = ()  # per worker: its host (a Ray node's address); empty: all on this machine

    def __post_init__(self) -> None:
        if not self.workers:
            raise LibraError("a local cluster needs at least one worker")
        if self.hosts and len(self.hosts) != len(self.workers):
            raise LibraError(f"{len(self.hosts)} hosts named for {len(self.workers)} workers")
        seen = [(self.host_of(w), unit) for w, worker in enumerate(self.workers) for unit in worker]
        if len(seen) != len(set(seen)):
            raise LibraError(f"local cluster workers overlap: {self.workers}")

    @classmethod
    def of_cores(cls, cores: tuple[int, ...], cores_per_worker: int = 1, memory_bytes: float = 16 * 2**30) -> LocalCluster:
        """Workers of `cores_per_worker` consecutive cores (a remainder that makes no whole worker is
        left out); `memory_bytes` is the machine's memory, shared equally."""
        if cores_per_worker < 1:
            raise LibraError(f"cores_per_worker must be at least 1, got {cores_per_worker}")
        count = len(cores) // cores_per_worker
        if count < 1:
            raise LibraError(f"{len(cores)} core(s) make no worker of {cores_per_worker} cores; lower "
                             "placement.cores_per_worker")
        ordered = sorted(cores)
        workers = tuple(tuple(ordered[i * cores_per_worker:(i + 1) * cores_per_worker]) for i in range(count))
        return cls(workers, "cpu", memory_bytes / count)

    @property
    def size(self) -> int:
        return len(self.workers)

    def host_of(self, worker: int) -> str:
        return self.hosts[worker] if self.hosts else ""

    @property
    def host_names(self) -> tuple[str, ...]:
        """The hosts, in the order of their first worker."""
        return tuple(dict.fromkeys(self.hosts))

    @property
    def per_host(self) -> int:
        """Workers on the host that has the fewest (every worker, on one machine)."""
        return min(self.hosts.count(h) for h in self.host_names) if self.hosts else self.size

    def units(self, workers: tuple[int, ...]) -> tuple[int, ...]:
        """The cores (or GPUs) of `workers`, in order (on their host)."""
        return tuple(unit for w in workers for unit in self.workers[w])

    def cores_and_gpus(self, workers: tuple[int, ...]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """The units of `workers` as an engine takes them: (cores, None) on CPU workers, (None, GPUs) on GPU ones."""
        units = self.units(workers)
        return (None, units) if self.device == "cuda" else (units, None)

    def planner_cluster(self) -> Cluster:
        """These workers as a cluster the planner plans, one device per worker: a node per host when
        every host has as many workers (the planner's nodes are alike), else one node."""
        cores = len(self.workers[0])
        uniform = self.hosts and self.per_host * len(self.host_names) == self.size
        nodes, per_node = (len(self.host_names), self.per_host) if uniform else (1, self.size)
        hardware = HardwareProfile(
            f"local-{self.device}-worker", CORE_FLOPS * cores, self.memory_bytes, CORE_MEMORY_BANDWIDTH * cores,
            LOOPBACK_BANDWIDTH, LOOPBACK_BANDWIDTH, per_node, 2e-5, 2e-5)
        return Cluster(nodes, per_node, hardware)


@dataclass(frozen=True)
class Placement:
    """Which workers each rollout engine and the trainer use, and whether the stages take turns."""

    engines: tuple[tuple[int, ...], ...]  # per engine instance: its workers
    train: tuple[int, ...]  # the trainer's workers
    colocated: bool
    plan_id: str = "initial"
    hybrids: tuple[int, ...] = ()  # rollout workers that also train (hybrid i first), each its own engine's
    layout: Layout | None = None  # the plan's training layout on the trainer's workers (None: no plan chose one)

    def __post_init__(self) -> None:
        if not self.engines or any(not e for e in self.engines) or not self.train:
            raise LibraError(f"a placement needs at least one engine and a trainer, each on a worker: {self}")
        rollout = [w for e in self.engines for w in e]
        if len(rollout) != len(set(rollout)):
            raise LibraError(f"engines share workers: {self.engines}")
        if not self.colocated and set(rollout) & set(self.train):
            raise LibraError(f"a split placement gives every worker to one stage: {self.engines} / {self.train}")
        if self.hybrids and (self.colocated or any((w,) not in self.engines for w in self.hybrids)):
            raise LibraError(f"hybrid workers {self.hybrids} must each run an engine of their own in a split placement: "
                             f"{self.engines}")
        if self.layout is not None and self.layout.world > len(self.train):
            raise LibraError(f"a training layout of {self.layout.world} ranks ({self.layout}) on {len(self.train)} "
                             "training workers: a rank needs a worker of its own")

    @property
    def rollout_workers(self) -> tuple[int, ...]:
        return tuple(sorted(w for e in self.engines for w in e))

    @property
    def pipeline(self) -> str:
        """The trainer's pipeline: the stages take turns when colocated, else they overlap."""
        return "sync" if self.colocated else "one_step_off"

    def engine_sizes(self) -> tuple[int, ...]:
        return tuple(len(e) for e in self.engines)

    def describe(self) -> str:
        sizes = self.engine_sizes()
        engines = ", ".join(f"{sizes.count(s)}x{s}" for s in sorted(set(sizes)))
        if self.colocated:
            return f"colocated: {len(self.rollout_workers)} workers roll out ({engines}), then train"
        hybrids = f" + {len(self.hybrids)} hybrid" if self.hybrids else ""
        return f"split: rollout {len(self.rollout_workers)} ({engines}) | train {len(self.train)}{hybrids}"


def hybrid_workers(first_train: int, count: int) -> tuple[int, ...]:
    """Hybrid i is worker `first_train - 1 - i`: the rollout workers nearest the trainer's."""
    return tuple(first_train - 1 - i for i in range(count))


def initial_placement(strategy: str, cluster: LocalCluster, hybrids: int = 0) -> Placement:
    """Where a run starts. `colocated`: one engine on every worker, then the trainer on every worker.
    `static` and `libra`: half the workers roll out (the larger half, with an odd count; rollout is
    the longer stage of agentic RL) on one engine, the rest train; a one-worker machine can only
    take turns, so it starts colocated whatever the strategy. With `hybrids`, that many rollout
    workers (those nearest the trainer's) each run an engine of their own and train as hybrids."""
    if strategy not in STRATEGIES:
        raise LibraError(f"unknown placement strategy {strategy!r}; strategies: {', '.join(STRATEGIES)}")
    everyone = tuple(range(cluster.size))
    if hybrids and (strategy == "colocated" or cluster.size == 1):
        raise LibraError(f"{hybrids} hybrid worker(s) need a split placement: strategy static or libra, and at least two "
                         f"workers (this machine has {cluster.size})")
    hosts = len(cluster.host_names)
    if strategy == "colocated" or cluster.size == 1:
        engines = (everyone,) if hosts < 2 else tuple((w,) for w in everyone)
        return spread_over_hosts(Placement(engines, everyone, True), cluster)
    rollout = (cluster.size + 1) // 2
    if hybrids > rollout:
        raise LibraError(f"{hybrids} hybrid worker(s) but {rollout} rollout worker(s) on {cluster.size} workers: lower "
                         "placement.hybrids")
    core = everyone[:rollout - hybrids]
    singles = tuple((w,) for w in everyone[rollout - hybrids:rollout])  # the hybrids' engines
    if hosts > 1:  # one engine per rollout worker: no engine may straddle hosts
        singles, core = tuple((w,) for w in core) + singles, ()
    return spread_over_hosts(Placement(((core,) if core else ()) + singles, everyone[rollout:], False,
                                       hybrids=hybrid_workers(rollout, hybrids)), cluster)


def placement_of(plan: Plan, cluster: LocalCluster, plan_id: str) -> Placement:
    """A plan in this machine's terms: its rollout instance groups as engines on the first workers
    (one engine per instance, `tp` workers each), its hybrids next (an engine of one worker each),
    its training pool on the rest; a colocated plan puts its instances on every worker and the
    trainer on all of them. The plan's training configuration is the placement's `layout` (its tp,
    pp and dp: a megatron trainer with `trainer.layout: planned` runs it)."""
    colocated = plan.mode == "colocated"
    if plan.gpus != cluster.size and not (colocated and plan.train_gpus == cluster.size):
        raise LibraError(f"plan {plan_id} is for {plan.gpus} workers; this machine has {cluster.size}")
    engines: list[tuple[int, ...]] = []
    nxt = 0
    for group in sorted(plan.rollout.groups, key=lambda g: g.tp):
        for _ in range(group.count):
            engines.append(tuple(range(nxt, nxt + group.tp)))
            nxt += group.tp
    limit = cluster.size if colocated else plan.rollout_gpus
    if nxt > limit or not engines:
        raise LibraError(f"plan {plan_id}: its instances need {nxt} workers, its rollout pool has {limit}")
    layout = Layout(plan.train.config.tp, plan.train.config.pp, plan.train.config.dp) if plan.train else None
    if colocated:
        return spread_over_hosts(Placement(tuple(engines), tuple(range(cluster.size)), True, plan_id, layout=layout),
                                 cluster)
    first_train = plan.rollout_gpus + plan.hybrid_gpus
    engines += [(w,) for w in range(plan.rollout_gpus, first_train)]
    return spread_over_hosts(Placement(tuple(engines), tuple(range(first_train, cluster.size)), False, plan_id,
                                       hybrid_workers(first_train, plan.hybrid_gpus), layout), cluster)


def spread_over_hosts(placement: Placement, cluster: LocalCluster) -> Placement:
    """`placement` on a cluster of several hosts: each engine's workers on one host (its
    tensor-parallel group), engines placed largest first, each on the host with the most free
    workers; the trainer's ranks on the workers left, taken from the hosts in turn (spread, so its
    data-parallel replicas are on as many hosts as there are). Engine sizes, their order, the
    trainer's rank count and which engines are hybrids' stay. With one host: `placement` itself."""
    if len(cluster.host_names) < 2:
        return placement
    free = {h: [w for w in range(cluster.size) if cluster.host_of(w) == h] for h in cluster.host_names}
    engines: list[tuple[int, ...]] = [()] * len(placement.engines)
    for i in sorted(range(len(engines)), key=lambda i: -len(placement.engines[i])):
        size = len(placement.engines[i])
        host = max((h for h in free if len(free[h]) >= size), key=lambda h: len(free[h]), default=None)
        if host is None:
            raise LibraError(f"plan {placement.plan_id}: an engine of {size} workers fits on no host (free workers per "
                             f"host: {', '.join(f'{h} {len(ws)}' for h, ws in free.items())})")
        engines[i], free[host] = tuple(free[host][:size]), free[host][size:]
    moved = {old: new for old_engine, new_engine in zip(placement.engines, engines, strict=True)
             for old, new in zip(old_engine, new_engine, strict=True)}
    if placement.colocated:
        train = tuple(range(cluster.size))
    else:
        left, train_list = [list(ws) for ws in free.values()], []
        while len(train_list) < len(placement.train):
            if not any(left):
                raise LibraError(f"plan {placement.plan_id}: {len(placement.train)} training workers do not fit beside "
                                 "its engines")
            for ws in sorted(left, key=len, reverse=True):
                if ws and len(train_list) < len(placement.train):
                    train_list.append(ws.pop(0))
        train = tuple(sorted(train_list))
    return Placement(tuple(engines), train, placement.colocated, placement.plan_id,
                     tuple(moved[w] for w in placement.hybrids), placement.layout)


@dataclass(frozen=True)
class Host:
    """A host of a Ray cluster as the run sees it: its address and what Ray says it offers."""

    address: str  # its node's IP address (Ray's node:<address> resource)
    cpus: int
    gpus: int = 0
    memory_bytes: float = 16 * 2**30


def cluster_of_hosts(hosts: tuple[Host, ...], cores_per_worker: int = 1, device: str = "cpu") -> LocalCluster:
    """The workers of `hosts`, in the order of their addresses: `cores_per_worker` CPUs each (a
    host's cores 0, 1, ...; a remainder that makes no whole worker is left out), or one GPU each;
    a host with no worker is left out (a head that only coordinates)."""
    if cores_per_worker < 1:
        raise LibraError(f"cores_per_worker must be at least 1, got {cores_per_worker}")
    workers: list[tuple[int, ...]] = []
    names: list[str] = []
    memory = []
    for host in sorted(hosts, key=lambda h: tuple(int(p) if p.isdigit() else p for p in h.address.split("."))):
        count = host.gpus if device == "cuda" else host.cpus // cores_per_worker
        for i in range(count):
            workers.append((i,) if device == "cuda" else tuple(range(i * cores_per_worker, (i + 1) * cores_per_worker)))
            names.append(host.address)
        if count:
            memory.append(host.memory_bytes / count)
    if not workers:
        raise LibraError(f"the Ray cluster's {len(hosts)} host(s) offer no worker of {cores_per_worker} CPU(s)"
                         + (" or GPU" if device == "cuda" else "") + "; start hosts with more CPUs, or lower "
                         "placement.cores_per_worker")
    return LocalCluster(tuple(workers), device, min(memory), tuple(names))
