"""Where hybrid workers run: local processes, or Ray actors. Both run `elastic.hybrid_main`; the
pool only launches, checks liveness and kills (SIGKILL) through this interface."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from typing import Protocol

from libra.pools.elastic import hybrid_main
from libra.pools.spec import WorkerSpec


class Provider(Protocol):
    name: str

    def launch(self, hid: str, spec: WorkerSpec, fault: str = "") -> None: ...

    def alive(self, hid: str) -> bool: ...

    def exit_detail(self, hid: str) -> str: ...

    def kill(self, hid: str) -> None: ...

    def close(self, timeout_s: float) -> None: ...


class LocalProcesses:
    """Each hybrid is a spawned Python process on this machine."""

    name = "local"

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, mp.process.BaseProcess] = {}

    def launch(self, hid: str, spec: WorkerSpec, fault: str = "") -> None:
        proc = self.ctx.Process(target=hybrid_main, args=(hid, spec, fault), name=f"libra-{hid}", daemon=True)
        proc.start()
        self.procs[hid] = proc

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
    """Each hybrid is a Ray actor (one process each) running the same worker loop; `ray.init` must
    have been called (a local Ray instance in tests)."""

    name = "ray"

    def __init__(self) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayActors needs ray.init() first (e.g. ray.init(num_cpus=2) for a local instance)")
        self.ray = ray
        self.actors: dict[str, tuple[object, object, int]] = {}  # hid -> (actor, run ref, pid)

    def launch(self, hid: str, spec: WorkerSpec, fault: str = "") -> None:
        gpus = spec.gpus_per_worker if spec.device == "cuda" else 0  # Ray gives the actor its own GPUs
        actor = _HybridActor().options(name=f"libra-{hid}-{os.getpid()}", num_cpus=0,  # type: ignore[attr-defined]
                                       num_gpus=gpus).remote()
        pid = self.ray.get(actor.pid.remote())
        self.actors[hid] = (actor, actor.run.remote(hid, spec, fault), pid)

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
        _, _, pid = self.actors[hid]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self, timeout_s: float) -> None:
        refs = [ref for _, ref, _ in self.actors.values()]
        self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for actor, _, _ in self.actors.values():
            self.ray.kill(actor)


def _HybridActor():  # noqa: N802 - builds the Ray actor class lazily, so importing this module needs no Ray
    import ray

    @ray.remote
    class HybridActor:
        def pid(self) -> int:
            return os.getpid()

        def run(self, hid: str, spec: WorkerSpec, fault: str) -> None:
            hybrid_main(hid, spec, fault)

    return HybridActor
