"""What every worker process of the elastic pool is given: the run's settings and its task
(picklable; sent to spawned processes and Ray actors)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from libra.pools.joins import JoinSettings
from libra.pools.task import TrainTask


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs (picklable; sent to spawned processes and Ray actors)."""

    host: str
    port: int
    task: TrainTask
    core_ranks: int
    hybrids: tuple[str, ...]
    steps: int
    out_dir: str
    t0: float  # the pool's start (epoch seconds); events are timed from it
    gpus_per_worker: int = 1
    group_timeout_s: float = 30.0
    join_timeout_s: float = JoinSettings.join_timeout_s
    max_catchup_steps: int = 64
    enter_gap: int = JoinSettings.enter_gap  # a joining hybrid enters once at most this many updates behind
    failure_grace_s: float = 0.25  # how long a failed step waits for death notices (the core waits too)
    min_step_s: float = 0.0  # pace: a step takes at least this long (emulates a real trainer's step)
    threads: int = 1
    device: str = "cpu"  # "cpu": gloo groups; "cuda": NCCL groups, one GPU per worker process
    # CPU pinning (Linux): worker id or "snapshot-writer" -> CPUs; unlisted threads are not pinned
    affinity: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def pin(self, who: str) -> None:
        cpus = dict(self.affinity).get(who)
        if cpus and hasattr(os, "sched_setaffinity"):
            from libra.devices import host_cores

            os.sched_setaffinity(0, host_cores(cpus))  # the calling thread only

    @property
    def joins(self) -> JoinSettings:
        return JoinSettings(self.enter_gap, self.join_timeout_s)

    def core_id(self, rank: int) -> str:
        return f"core-{rank}"

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def build(self, index: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The task's model and optimizer on this worker's device: on "cuda", GPU `index` (the core
        rank, or core ranks + the hybrid's number) modulo the GPUs this process sees (one under Ray,
        which gives each actor its own). Moving the model keeps its parameter objects, so the
        optimizer built with them stays valid; its state is created on the device at the first step."""
        model, optimizer = self.task.build()
        if self.device == "cuda":
            device = torch.device("cuda", index % torch.cuda.device_count())
            torch.cuda.set_device(device)
            # a failed collective raises in the waiting call and aborts only its own communicator,
            # so the core can redo the step without the hybrid (the default would end the process)
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
            model.to(device)
        return model, optimizer
