"""Where a training run's stages run: the workers of one machine, and how a plan places the rollout
engines and the trainer on them.

A *worker* is the unit the planner moves, the local stand-in for a GPU: a set of CPU cores
(`cores_per_worker` of them, pinned) on a CPU machine, one GPU on a GPU machine. The planner sees the
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

The policies a run can follow (`libra train --policy`):

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

PolicyName = Literal["libra", "static", "colocated"]
POLICIES: tuple[str, ...] = ("libra", "static", "colocated")

# One CPU core as a planner device, before calibration: ~50 GFLOP/s fp32 GEMM, a share of DDR
# bandwidth, loopback between processes. The calibration replaces what matters (the per-step fixed
# costs and the compute and memory coefficients) with the run's own measurements.
CORE_FLOPS = 50e9
CORE_MEMORY_BANDWIDTH = 10 * GB
LOOPBACK_BANDWIDTH = 5 * GB


@dataclass(frozen=True)
class LocalCluster:
    """The workers of this machine: each a tuple of CPU cores (device cpu) or of one GPU index (cuda)."""

    workers: tuple[tuple[int, ...], ...]
    device: str = "cpu"
    memory_bytes: float = 16 * 2**30  # memory a worker may use (host RAM share, or the GPU's)

    def __post_init__(self) -> None:
        if not self.workers:
            raise LibraError("a local cluster needs at least one worker")
        seen = [unit for worker in self.workers for unit in worker]
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
                             "cluster.cores_per_worker")
        ordered = sorted(cores)
        workers = tuple(tuple(ordered[i * cores_per_worker:(i + 1) * cores_per_worker]) for i in range(count))
        return cls(workers, "cpu", memory_bytes / count)

    @property
    def size(self) -> int:
        return len(self.workers)

    def units(self, workers: tuple[int, ...]) -> tuple[int, ...]:
        """The cores (or GPUs) of `workers`, in order."""
        return tuple(unit for w in workers for unit in self.workers[w])

    def planner_cluster(self) -> Cluster:
        """These workers as a one-node cluster the planner plans: one device per worker."""
        cores = len(self.workers[0])
        hardware = HardwareProfile(
            f"local-{self.device}-worker", CORE_FLOPS * cores, self.memory_bytes, CORE_MEMORY_BANDWIDTH * cores,
            LOOPBACK_BANDWIDTH, LOOPBACK_BANDWIDTH, self.size, 2e-5, 2e-5)
        return Cluster(1, self.size, hardware)


@dataclass(frozen=True)
class Placement:
    """Which workers each rollout engine and the trainer use, and whether the stages take turns."""

    engines: tuple[tuple[int, ...], ...]  # per engine instance: its workers
    train: tuple[int, ...]  # the trainer's workers
    colocated: bool
    plan_id: str = "initial"
    hybrids: tuple[int, ...] = ()  # rollout workers that also train (hybrid i first), each its own engine's

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


def initial_placement(policy: str, cluster: LocalCluster, hybrids: int = 0) -> Placement:
    """Where a run starts. `colocated`: one engine on every worker, then the trainer on every worker.
    `static` and `libra`: half the workers roll out (the larger half, with an odd count; rollout is
    the longer stage of agentic RL) on one engine, the rest train; a one-worker machine can only
    take turns, so it starts colocated whatever the policy. With `hybrids`, that many rollout
    workers (those nearest the trainer's) each run an engine of their own and train as hybrids."""
    if policy not in POLICIES:
        raise LibraError(f"unknown placement policy {policy!r}; policies: {', '.join(POLICIES)}")
    everyone = tuple(range(cluster.size))
    if hybrids and (policy == "colocated" or cluster.size == 1):
        raise LibraError(f"{hybrids} hybrid worker(s) need a split placement: policy static or libra, and at least two "
                         f"workers (this machine has {cluster.size})")
    if policy == "colocated" or cluster.size == 1:
        return Placement((everyone,), everyone, True)
    rollout = (cluster.size + 1) // 2
    if hybrids > rollout:
        raise LibraError(f"{hybrids} hybrid worker(s) but {rollout} rollout worker(s) on {cluster.size} workers: lower "
                         "placement.hybrids")
    core = everyone[:rollout - hybrids]
    singles = tuple((w,) for w in everyone[rollout - hybrids:rollout])  # the hybrids' engines
    return Placement(((core,) if core else ()) + singles, everyone[rollout:], False,
                     hybrids=hybrid_workers(rollout, hybrids))


def placement_of(plan: Plan, cluster: LocalCluster, plan_id: str) -> Placement:
    """A plan in this machine's terms: its rollout instance groups as engines on the first workers
    (one engine per instance, `tp` workers each), its hybrids next (an engine of one worker each),
    its training pool on the rest; a colocated plan puts its instances on every worker and the
    trainer on all of them."""
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
    if colocated:
        return Placement(tuple(engines), tuple(range(cluster.size)), True, plan_id)
    first_train = plan.rollout_gpus + plan.hybrid_gpus
    engines += [(w,) for w in range(plan.rollout_gpus, first_train)]
    return Placement(tuple(engines), tuple(range(first_train, cluster.size)), False, plan_id,
                     hybrid_workers(first_train, plan.hybrid_gpus))
