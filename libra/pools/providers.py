"""Where the pool's workers run: local processes, or Ray actors. Hybrids run `elastic.hybrid_main`,
core ranks `elastic.core_main`; the pool only launches, checks liveness and kills (SIGKILL) through
this interface. A core rank is a `CoreHandle` (a process's surface: alive, join, exit code, kill)
whichever provider started it.

On a Ray cluster each worker id ("core-0", "hybrid-1") may be told where to run
(`RayActors(strategies=...)`: a Ray scheduling strategy, the bundle of a placement group the run's
plan made), and each actor sets gloo's network interface to the one that carries its node's
address before it joins a group, so that its ranks reach those on other hosts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Mapping
from typing import Any, Protocol

from libra.errors import first_line
from libra.pools.elastic import core_main, core_process, hybrid_main
from libra.pools.spec import WorkerSpec


class CoreHandle(Protocol):
    name: str

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    @property
    def exitcode(self) -> int | None: ...

    def kill(self) -> None: ...


class Provider(Protocol):
    name: str

    def launch(self, hid: str, spec: WorkerSpec, fault: str = "") -> None: ...

    def launch_core(self, rank: int, spec: WorkerSpec) -> CoreHandle: ...

    def alive(self, hid: str) -> bool: ...

    def exit_detail(self, hid: str) -> str: ...

    def kill(self, hid: str) -> None: ...

    def close(self, timeout_s: float) -> None: ...


class LocalProcesses:
    """Each worker is a spawned Python process on this machine."""

    name = "local"

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, mp.process.BaseProcess] = {}

    def launch(self, hid: str, spec: WorkerSpec, fault: str = "") -> None:
        proc = self.ctx.Process(target=hybrid_main, args=(hid, spec, fault), name=f"libra-{hid}", daemon=True)
        proc.start()
        self.procs[hid] = proc

    def launch_core(self, rank: int, spec: WorkerSpec) -> CoreHandle:
        proc = self.ctx.Process(target=core_process, args=(rank, spec), name=f"libra-core-{rank}", daemon=True)
        proc.start()
        return proc

    def alive(self, hid: str) -> bool:
        return self.procs[hid].is_alive()

    def exit_detail(self, hid: str) -> str:
        code = self.procs[hid].exitcode
        if code is not None and code < 0:
            return f"process {self.procs[hid].pid} killed by {signal.Signals(-code).name}"
        return f"process {self.procs[hid].pid} exited with status {code}"

    def kill(self, hid: str) -> None:
        proc = self.procs[hid]
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)

    def close(self, timeout_s: float) -> None:
        for proc in self.procs.values():
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


class RayActors:
    """Each worker is a Ray actor (one process each) running the same loop; `ray.init` must have
    been called (a local Ray instance, or a connection to a cluster). `strategies`: where each
    worker id runs (a Ray scheduling strategy; unnamed ones go where Ray puts them); `cpus`: the
    CPUs each holds (its bundle's; default none)."""

    name = "ray"

    def __init__(self, strategies: Mapping[str, Any] | None = None, cpus: Mapping[str, float] | None = None) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayActors needs ray.init() first (e.g. ray.init(num_cpus=2) for a local instance)")
        self.ray = ray
        self.strategies = dict(strategies or {})
        self.cpus = dict(cpus or {})
        self.actors: dict[str, tuple[object, object, int]] = {}  # hid -> (actor, run ref, pid)

    def _actor(self, who: str, spec: WorkerSpec) -> tuple[Any, int]:
        gpus = spec.gpus_per_worker if spec.device == "cuda" else 0  # Ray gives the actor its own GPUs
        options: dict[str, Any] = {"num_cpus": self.cpus.get(who, 0), "num_gpus": gpus, "max_restarts": 0}
        if who in self.strategies:
            options["scheduling_strategy"] = self.strategies[who]
        actor = _WorkerActor().options(**options).remote()  # type: ignore[attr-defined]
        return actor, self.ray.get(actor.pid.remote())

    def launch(self, hid: str, spec: WorkerSpec, fault: str = "") -> None:
        actor, pid = self._actor(hid, spec)
        self.actors[hid] = (actor, actor.run.remote(hid, spec, fault), pid)

    def launch_core(self, rank: int, spec: WorkerSpec) -> CoreHandle:
        actor, pid = self._actor(spec.core_id(rank), spec)
        return RayCore(f"libra-core-{rank}", actor, actor.run_core.remote(rank, spec), pid, self.ray)

    def alive(self, hid: str) -> bool:
        _, ref, _ = self.actors[hid]
        done, _ = self.ray.wait([ref], timeout=0)
        return not done

    def exit_detail(self, hid: str) -> str:
        _, ref, pid = self.actors[hid]
        try:
            self.ray.get(ref, timeout=1)
            return f"actor process {pid} returned"
        except Exception as exc:  # ActorDiedError and friends
            return f"actor process {pid}: {type(exc).__name__}"

    def kill(self, hid: str) -> None:
        actor, _, pid = self.actors[hid]
        try:
            os.kill(pid, signal.SIGKILL)  # an actor of this machine dies as a local process does
        except OSError:  # on another host (or gone): Ray kills it
            self.ray.kill(actor)

    def close(self, timeout_s: float) -> None:
        refs = [ref for _, ref, _ in self.actors.values()]
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for actor, _, _ in self.actors.values():
            self.ray.kill(actor)


class RayCore:
    """A core rank's Ray actor behind a process's surface. Its exit code: 0 once `core_main`
    returned, 1 if it raised, -9 if the actor (or its host) died."""

    def __init__(self, name: str, actor: Any, ref: Any, pid: int, ray: Any) -> None:
        self.name, self.actor, self.ref, self.pid, self.ray = name, actor, ref, pid, ray
        self._code: int | None = None
        self.error = ""  # what it raised, once it has

    def is_alive(self) -> bool:
        done, _ = self.ray.wait([self.ref], timeout=0)
        return not done

    def join(self, timeout: float | None = None) -> None:
        self.ray.wait([self.ref], timeout=timeout)

    @property
    def exitcode(self) -> int | None:
        if self._code is None and not self.is_alive():
            from ray.exceptions import RayActorError

            try:
                self.ray.get(self.ref)
                self._code = 0
            except RayActorError:
                self._code = -signal.SIGKILL
            except Exception as exc:  # noqa: BLE001 - the rank's own error, reported by the trainer
                self._code = 1
                cause = getattr(exc, "cause", None) or exc  # a RayTaskError wraps what the rank raised
                self.error = first_line(cause, typed=True)
            self.ray.kill(self.actor)
        return self._code

    def kill(self) -> None:
        self.ray.kill(self.actor)


def gloo_interface(address: str) -> str | None:
    """The network interface that carries `address` on this host (gloo's GLOO_SOCKET_IFNAME), or None."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return None


def use_node_interface() -> None:
    """Inside a Ray worker: gloo's sockets on the interface of this node's address (gloo would
    otherwise take the address its host name resolves to, which need not be the cluster's)."""
    import ray

    if "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = gloo_interface(ray.util.get_node_ip_address())
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface


def _WorkerActor():  # noqa: N802 - builds the Ray actor class lazily, so importing this module needs no Ray
    import ray

    @ray.remote
    class WorkerActor:
        def __init__(self) -> None:
            use_node_interface()

        def pid(self) -> int:
            return os.getpid()

        def run(self, hid: str, spec: WorkerSpec, fault: str) -> None:
            hybrid_main(hid, spec, fault)

        def run_core(self, rank: int, spec: WorkerSpec) -> None:
            core_main(rank, spec)

    return WorkerActor
