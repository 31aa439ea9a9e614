"""Elastic data-parallel training: core ranks that never change, hybrids that join and leave.

Processes and groups:
- The core ranks form the core group (`init_process_group` over a `core/` key prefix) once, at the
  start; it is never rebuilt. Core rank 0 is the leader: it owns the hybrids' state machines.
- The replicas of a step (core ranks, then hybrids by id) form a *generation*. A generation with
  hybrids gets its own group (`gen/<g>/` key prefix; gloo on CPU, NCCL with one GPU per worker on
  `device="cuda"`), built when the membership changes; a
  generation without hybrids uses the core group, so a run whose hybrids never join executes exactly
  the code (and produces exactly the bits) of a run without hybrids.

A step's arithmetic is `replica.py`'s; the hybrids' joins and leaves, and each step's membership,
are the leader's (`leader.py`, on core rank 0). This module is the processes: a core rank runs
every step; a hybrid waits in rollout until told to load a snapshot and enter, trains until left
out, and returns to rollout.

Failure: when a step's all-reduce over a generation with hybrids fails (a member died, or timed out),
the core ranks agree on it over the core group (a one-element MAX all-reduce), drop the step's
partial results, and redo the whole step core-only over the full batch. Every hybrid of that
generation is rolled back to rollout (one whose death is reported within `failure_grace_s` is
marked failed instead; a later report moves it from rollout to failed); none of their gradients
counts, and no sample is lost. A hybrid that dies while fetching the snapshot is not in any group yet: it is
marked failed and the core does not notice. A join that takes longer than `join_timeout_s` is
cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

from libra.clock import Clock, EpochClock, Stopwatch, WallClock, sleep
from libra.errors import first_line
from libra.pools import snapshot as snapshots
from libra.pools.control import DONE, Control
from libra.pools.leader import Leader
from libra.pools.replica import (
    apply_update,
    generation_group,
    mean_update,
    model_device,
    state_of,
    step_payload,
)
from libra.pools.spec import WorkerSpec

__all__ = ["FAULTS", "WorkerSpec", "core_process", "exit_done", "hybrid_main"]


def core_main(rank: int, spec: WorkerSpec, clock: Clock | None = None) -> None:
    """A core training rank: runs every step of the run. Its steps are timed on `clock` (monotonic
    wall time unless another is injected), from the pool's start (`spec.t0`, epoch seconds)."""
    clock = clock or WallClock()
    spec.pin(spec.core_id(rank))
    torch.set_num_threads(spec.threads)
    control = Control.connect(spec.host, spec.port, clock=clock)
    # the core group first: a task whose model needs a default process group (megatron's) has it
    dist.init_process_group(spec.backend, store=dist.PrefixStore("core", control.store), rank=rank,
                            world_size=spec.core_ranks, timeout=timedelta(seconds=spec.group_timeout_s * 4))
    model, optimizer = spec.build(rank)
    leader = Leader(control, spec, model, optimizer) if rank == 0 else None
    core = [spec.core_id(r) for r in range(spec.core_ranks)]
    me = spec.core_id(rank)

    def core_only(step: int) -> torch.Tensor:
        """The step over the core alone: the full batch shared by the core ranks, summed in the core group."""
        payload = step_payload(spec.task, model, step, core, me)
        dist.all_reduce(payload)
        return payload

    gen, info, group = 0, None, None
    log = []
    clock0 = clock.now() - EpochClock(spec.t0).now()  # `clock`'s reading at the pool's start
    try:
        for step in range(spec.steps):
            began = clock.now()
            g, new = leader.boundary(step) if leader is not None else (control.get(f"step/{step}"), None)
            if g != gen:
                new = new or control.get(f"gen/{g}")
                if info is None or new["members"] != info["members"]:
                    group = None
                gen, info = g, new
            assert info is not None
            failed = ""
            marks = [clock.now()]
            if len(info["members"]) == len(core):  # core-only: the core group, exactly as without hybrids
                payload = core_only(step)
            else:
                active = core + info["active"]
                try:
                    if group is None:
                        group = generation_group(control, spec, gen, rank, len(info["members"]))
                        if leader is not None:
                            leader.catch_up(group, info)
                    payload = step_payload(spec.task, model, step, active, me)
                    group.allreduce([payload]).wait()
                except Exception as exc:  # a member died or timed out
                    failed = first_line(exc, typed=True)
                flag = torch.tensor([1.0 if failed else 0.0], device=model_device(model))
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if flag.item() > 0:  # redo the whole step core-only; nothing from the failed attempt counts
                    group, info = None, {"members": core, "active": []}
                    payload = core_only(step)
                    if leader is not None:
                        leader.on_failure(step, failed or "another core rank saw the failure")
            reduced = mean_update(spec.task, payload)
            marks.append(clock.now())
            if leader is not None:
                leader.before_update()
            applied = apply_update(spec.task, model, optimizer, step, reduced.update)
            if leader is not None:
                leader.record_update(step, reduced.update)
                spec.task.publish(model, optimizer, step, reduced, len(info["active"]), applied)
            marks.append(clock.now())
            if spec.min_step_s > 0:
                sleep(clock, max(0.0, spec.min_step_s - (clock.now() - began)))
            log.append({"step": step, "start_s": began - clock0, "seconds": clock.now() - began,
                        "boundary_s": marks[0] - began, "gradient_s": marks[1] - marks[0], "update_s": marks[2] - marks[1],
                        "replicas": len(info["members"]), "active": len(core) + len(info["active"]), "retried": bool(failed)})
        if leader is not None:
            leader.finish(spec.steps)
            snapshots.write(state_of(model, optimizer), Path(spec.out_dir) / "final.snap", {"step": spec.steps})
            Path(spec.out_dir, "steps.json").write_text(json.dumps(log))
        dist.barrier()  # every core rank is done before any tears its groups down
    except Exception:
        control.post("errors", {"worker": me, "error": traceback.format_exc()})
        raise
    finally:
        dist.destroy_process_group()


def exit_done() -> NoReturn:
    """End a process whose work is complete and written, without running destructors: gloo's and
    the store client's threads can abort interpreter teardown ("terminate called without an active
    exception"), which would read as a failed process."""
    os._exit(0)


def core_process(rank: int, spec: WorkerSpec) -> None:
    """A core rank's process: `core_main`, then `exit_done`."""
    core_main(rank, spec)
    exit_done()


FAULTS = ("", "die_fetching", "die_entering", "slow_fetch")


def hybrid_main(hid: str, spec: WorkerSpec, fault: str = "", clock: Clock | None = None) -> None:
    """A hybrid worker: serves rollout (here: waits) until told to load a snapshot and enter a
    generation; trains with it until left out, then returns to rollout. `fault` injects a failure
    for tests and drills: SIGKILL itself on receiving the snapshot (`die_fetching`) or the order to
    enter (`die_entering`), or take 2 s more to fetch (`slow_fetch`). Fetches are timed and
    delayed on `clock` (monotonic wall time unless another is injected)."""
    clock = clock or WallClock()
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; faults: {', '.join(f for f in FAULTS if f)}")
    spec.pin(hid)
    torch.set_num_threads(spec.threads)
    control = Control.connect(spec.host, spec.port, clock=clock)
    offset = control.inbox_offset(hid)  # a replacement process skips what was sent to its predecessor
    index = spec.core_ranks + spec.hybrids.index(hid)
    model, optimizer = spec.build(index)
    control.put(f"ready/{hid}", os.getpid())
    control.post("requests", {"type": "ready", "hid": hid, "detail": f"process {os.getpid()}"})
    loaded: int | None = None
    while True:
        message = control.receive(hid, offset, timeout_s=1.0)
        if message is None:
            continue
        offset += 1
        op = message["op"]
        if op == "stop":
            return
        if op == "cancel":
            loaded = None
        elif op == "snapshot":
            if fault == "die_fetching":
                os.kill(os.getpid(), signal.SIGKILL)
            fetch = Stopwatch(clock)
            if fault == "slow_fetch":
                sleep(clock, 2.0)
            try:
                state, extra = snapshots.read(Path(message["path"]))
            except FileNotFoundError:  # replaced by a newer snapshot meanwhile; the leader sends that one
                continue
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loaded = extra["step"]
            control.post("requests", {"type": "loaded", "what": "snapshot", "hid": hid, "step": loaded,
                                      "bytes": message["bytes"], "seconds": fetch.seconds()})
        elif op == "replay" and loaded is not None:
            try:
                state, extra = snapshots.read(Path(message["path"]))
            except FileNotFoundError:
                continue
            Path(message["path"]).unlink(missing_ok=True)
            if extra["first"] != loaded:
                continue  # not the updates after this state (a cancelled attempt's): wait for the leader
            for i, update in enumerate(state["updates"]):
                apply_update(spec.task, model, optimizer, loaded + i, update.to(model_device(model)))
            loaded += len(state["updates"])
            control.post("requests", {"type": "loaded", "what": "updates", "hid": hid, "step": loaded})
        elif op == "enter" and loaded is not None:
            if fault == "die_entering":
                os.kill(os.getpid(), signal.SIGKILL)
            last = _member(hid, spec, control, model, optimizer, message["gen"], message["step"], loaded)
            loaded = None
            control.post("requests", {"type": "exited", "hid": hid, "step": last})
            model, optimizer = spec.build(index)  # back to rollout; a later join loads a fresh snapshot


def _member(hid: str, spec: WorkerSpec, control: Control, model: nn.Module, optimizer: torch.optim.Optimizer,
            gen: int, step: int, since: int) -> int:
    """Train as a member of generation `gen` from `step` until left out (its state is at step
    `since`: the leader first sends the updates of steps since..step-1); returns the last step done."""
    info = control.get(f"gen/{gen}")
    group = generation_group(control, spec, gen, info["members"].index(hid), len(info["members"]))
    device = model_device(model)
    try:
        count = torch.zeros(1, device=device)
        group.recv([count], 0, 0).wait()
        if count.item() > 0:
            size = sum(p.numel() for p in model.parameters())
            block = torch.zeros(int(count.item()), size, dtype=next(model.parameters()).dtype, device=device)
            group.recv([block], 0, 1).wait()
            for i, update in enumerate(block):
                apply_update(spec.task, model, optimizer, since + i, update)
        core = [spec.core_id(r) for r in range(spec.core_ranks)]
        last = step - 1
        while True:
            g = control.get(f"step/{step}")
            if g == DONE:
                return last
            if g != gen:
                new = control.get(f"gen/{g}")
                if hid not in new["members"]:
                    return last
                if new["members"] != info["members"]:
                    group = generation_group(control, spec, g, new["members"].index(hid), len(new["members"]))
                gen, info = g, new
            payload = step_payload(spec.task, model, step, core + info["active"], hid)
            group.allreduce([payload]).wait()
            apply_update(spec.task, model, optimizer, step, mean_update(spec.task, payload).update)
            last, step = step, step + 1
    except Exception:  # the generation failed: the leader rolls this hybrid back
        return step - 1
