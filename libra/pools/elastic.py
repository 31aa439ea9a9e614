"""Elastic data-parallel training: core ranks that never change, hybrids that join and leave.

Processes and groups:
- The core ranks form the core group (`init_process_group` over a `core/` key prefix) once, at the
  start; it is never rebuilt. Core rank 0 is the leader: it owns the hybrids' state machines.
- The replicas of a step (core ranks, then hybrids by id) form a *generation*. A generation with
  hybrids gets its own group (`gen/<g>/` key prefix; gloo on CPU, NCCL with one GPU per worker on
  `device="cuda"`), built when the membership changes; a
  generation without hybrids uses the core group, so a run whose hybrids never join executes exactly
  the code (and produces exactly the bits) of a run without hybrids.

A step: every replica computes the summed loss gradient of its shard of the step's global batch
and the shard's weight (what the task's loss sums over: samples, or GRPO's policy tokens;
`batching.shards`; a replica that is not active contributes zeros and a zero weight), the gradients
and weights are summed by one all-reduce, and every replica applies `sum / weight` through the
task's own optimizer step, so all replicas stay identical.

Join (hybrid h, requested at step boundary s0): the leader snapshots weights and optimizer state
(staged by a memory copy that overlaps the step's forward and backward, written to disk by a
background thread, so the core keeps training) and logs every later update (the mean gradient it
applied). h loads the snapshot and reports the step its state is at. While it is more than
`enter_gap` steps behind (and getting closer), the leader writes the updates it misses to a file
and h replays them, again off the core's path. Then, at a boundary s1, h enters the generation:
the leader sends it the updates it still misses over the new group and h replays them (bitwise the
core's state: same tensors, same optimizer). If that was at most `enter_gap` updates, h takes its
shard of step s1 at once; if it stopped getting closer (a longer replay at entry) it takes part in
s1 contributing zeros. Once s1 has gone through, h is activated (training) at s1+1. Leave: at a
boundary the hybrid is left out of the next generation; it has finished its last step and returns
to rollout.

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
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

from libra.clock import Clock, EpochClock
from libra.pools import snapshot as snapshots
from libra.pools.batching import shards
from libra.pools.control import DONE, Control
from libra.pools.joins import JoinAction, JoinProgress, JoinSettings, decide
from libra.pools.states import PoolEvent, Role, State, Worker
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
            os.sched_setaffinity(0, cpus)  # the calling thread only

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


# -- one replica's arithmetic --------------------------------------------------------------------

def _payload(task: TrainTask, model: nn.Module, step: int, shard: range | None) -> torch.Tensor:
    """[summed loss gradient of the shard..., its weight] on the model's device; zeros for a replica
    without a shard. The weight is what the task's sum is over (samples, or GRPO's policy tokens)."""
    params = [p for p in model.parameters()]
    dtype, device = params[0].dtype, params[0].device
    if shard is None or len(shard) == 0:
        size = sum(p.numel() for p in params)
        return torch.zeros(size + 1, dtype=dtype, device=device)
    model.zero_grad(set_to_none=True)
    weight = task.accumulate(model, step, shard)
    grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=dtype, device=device)
             for p in params]
    return torch.cat(grads + [torch.tensor([float(weight)], dtype=dtype, device=device)])


def _step_payload(task: TrainTask, model: nn.Module, step: int, active: list[str], me: str) -> torch.Tensor:
    """`me`'s payload for `step` when `active` replicas (rank order) share the batch; zeros if `me`
    is not among them."""
    return _payload(task, model, step, shards(task.step_size(step), active).get(me))


def _apply(task: TrainTask, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, update: torch.Tensor) -> None:
    """Load step `step`'s mean gradient `update` into the parameters' grads (copies: the update stays
    as it was, for the log that joining hybrids replay) and let the task take the optimizer step."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = update[offset:offset + n].view_as(p).clone()
        offset += n
    task.update(model, optimizer, step)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _mean(payload: torch.Tensor) -> torch.Tensor:
    """The summed gradient over the summed weight; a zero gradient when nothing had weight (a GRPO
    step without policy tokens), as the trainer's token mean."""
    return payload[:-1] / payload[-1] if payload[-1] > 0 else torch.zeros_like(payload[:-1])


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """References to the weights and optimizer state (copy them before the next optimizer step)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _group(control: Control, spec: WorkerSpec, gen: int, rank: int, size: int) -> dist.ProcessGroup:
    """Generation `gen`'s group: its own communicator (gloo or NCCL), apart from the core group."""
    store = dist.PrefixStore(f"gen/{gen}", control.store)
    timeout = timedelta(seconds=spec.group_timeout_s)
    if spec.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


# -- the leader: hybrids' state machines and the membership of each step --------------------------

@dataclass
class _Join:
    started: float
    synced: int | None = None  # the step the hybrid's state is at (before it), None while it fetches or replays
    gap: int | None = None  # steps it was behind when last sent updates to replay
    gap_from: int = 0  # the first of those steps
    entered: int | None = None  # the step it entered the generation

    def progress(self) -> JoinProgress:
        return JoinProgress(self.started, self.synced, self.gap, self.entered)


@dataclass
class _Snapshot:
    step: int  # the state before this step
    path: Path
    bytes: int = 0
    written: bool = False
    waiting: list[str] = field(default_factory=list)


class Leader:
    """Runs on core rank 0. At each step boundary it reads the request channel, moves the hybrids'
    state machines, and publishes the step's generation. Whether a join enters, replays or times
    out is the join policy's decision (`libra.pools.joins.decide`) on the leader's clock (wall
    seconds since the pool's start unless another is injected)."""

    def __init__(self, control: Control, spec: WorkerSpec, model: nn.Module, optimizer: torch.optim.Optimizer,
                 clock: Clock | None = None) -> None:
        self.clock = clock or EpochClock(spec.t0)
        self.control = control
        self.spec = spec
        self.model, self.optimizer = model, optimizer
        self.workers = {h: Worker(h, Role.HYBRID, spec.gpus_per_worker, self._emit, self._now) for h in spec.hybrids}
        self.offset = 0
        self.gen = 0
        self.members: list[str] = []  # hybrids in the current generation, in rank order
        self.active: set[str] = set()
        self.joins: dict[str, _Join] = {}
        self.leave_requested: set[str] = set()
        self.snapshot: _Snapshot | None = None
        self.updates: dict[int, torch.Tensor] = {}  # step -> applied mean gradient, while a join needs them
        self.lock = threading.Lock()
        self.step = 0
        self.published: tuple | None = None
        self.packing: threading.Event | None = None
        self.info: dict = {}
        self.writer_control: Control | None = None
        self.deferred: list[dict] = []  # requests read during a failure, handled at the next boundary

    def _now(self) -> float:
        return self.clock.now()

    def _emit(self, event: PoolEvent) -> None:
        self.control.post("events", asdict(event))

    # requests -------------------------------------------------------------------------------
    def _handle(self, message: dict) -> None:
        kind, hid = message["type"], message.get("hid", "")
        worker = self.workers.get(hid)
        if worker is None:
            return
        state = worker.state
        if kind == "join" and state is State.ROLLOUT:
            worker.move(State.JOINING, "join_requested", self.step, message.get("detail", ""))
            self.joins[hid] = _Join(self._now())
            self._send_snapshot(hid)
        elif kind == "loaded" and state is State.JOINING and hid in self.joins:
            join = self.joins[hid]
            if not self._logged_since(message["step"]):
                self._send_snapshot(hid)  # the log no longer reaches back to it: fetch a newer one
                return
            if message["what"] == "snapshot":
                worker.note("snapshot_loaded", self.step, f"step {message['step']}, {message['bytes']} bytes in "
                            f"{message['seconds']:.3f} s")
            else:
                worker.note("updates_replayed", self.step, f"steps {join.gap_from}..{message['step'] - 1}")
            join.synced = message["step"]
        elif kind == "leave":
            if state is State.TRAINING:
                self.leave_requested.add(hid)
            elif state is State.JOINING:
                self._drop(hid)
                worker.move(State.ROLLOUT, "cancelled", self.step, "leave requested during the join")
                self.control.send(hid, {"op": "cancel"})
        elif kind == "exited" and state is State.LEAVING:
            worker.move(State.ROLLOUT, "released", self.step, f"after step {message['step']}")
        elif kind == "died" and state is not State.FAILED:
            self._drop(hid)
            worker.move(State.FAILED, "died", self.step, message.get("detail", ""))
        elif kind == "ready" and state is State.FAILED:  # a replacement process is up
            worker.move(State.ROLLOUT, "restarted", self.step, message.get("detail", ""))

    def _drop(self, hid: str) -> None:
        self.joins.pop(hid, None)
        self.leave_requested.discard(hid)
        self.active.discard(hid)
        if hid in self.members:
            self.members.remove(hid)
        with self.lock:
            if self.snapshot is not None and hid in self.snapshot.waiting:
                self.snapshot.waiting.remove(hid)

    # snapshots ------------------------------------------------------------------------------
    def _send_snapshot(self, hid: str) -> None:
        """Point `hid` at a snapshot whose later updates are still logged, writing one if needed."""
        with self.lock:
            if self._fresh():
                assert self.snapshot is not None
                if self.snapshot.written:
                    Leader._tell_with(self.control, hid, self.snapshot)
                else:
                    self.snapshot.waiting.append(hid)
                return
            path = Path(self.spec.out_dir) / f"snapshot-{self.step}.snap"
            self.snapshot = snapshot = _Snapshot(self.step, path, waiting=[hid])
            self.updates = {s: u for s, u in self.updates.items() if s >= self.step}
        # written while this step's forward and backward run (they do not modify the state); the
        # optimizer step waits until every byte is copied out (`before_update`)
        self.packing = threading.Event()
        writer = threading.Thread(target=self._write, args=(snapshot, self.packing), daemon=True)
        writer.start()

    def before_update(self) -> None:
        if self.packing is not None:
            self.packing.wait()
            self.packing = None

    def _fresh(self) -> bool:
        """Whether the last snapshot can serve a new join: recent, and every update since is logged."""
        s = self.snapshot
        return s is not None and self.step - s.step <= self.spec.max_catchup_steps // 2 and self._logged_since(s.step)

    def _logged_since(self, step: int) -> bool:
        """Whether the update of every step from `step` up to now is in the log."""
        return all(t in self.updates for t in range(step, self.step))

    def _writer_control(self) -> Control:
        """The writer threads' own store client (clients are not thread-safe); call holding the lock."""
        if self.writer_control is None:
            self.writer_control = Control.connect(self.spec.host, self.spec.port)
        return self.writer_control

    def _write(self, snapshot: _Snapshot, packing: threading.Event) -> None:
        self.spec.pin("snapshot-writer")
        with self.lock:
            control = self._writer_control()
        try:
            size = snapshots.write(state_of(self.model, self.optimizer), snapshot.path, {"step": snapshot.step}, packing,
                                   durable=False)
        except Exception:  # e.g. a full disk: the waiting joins time out and are cancelled
            with self.lock:
                control.post("errors", {"worker": "snapshot-writer", "error": traceback.format_exc()})
            return
        for old in Path(self.spec.out_dir).glob("snapshot-*.snap"):
            if old != snapshot.path:
                old.unlink(missing_ok=True)
        with self.lock:
            snapshot.bytes, snapshot.written = size, True
            for hid in snapshot.waiting:
                Leader._tell_with(control, hid, snapshot)
            snapshot.waiting.clear()

    @staticmethod
    def _tell_with(control: Control, hid: str, snapshot: _Snapshot) -> None:
        control.send(hid, {"op": "snapshot", "path": str(snapshot.path), "step": snapshot.step, "bytes": snapshot.bytes})

    def _send_updates(self, hid: str, gap: int) -> None:
        updates = [self.updates[t] for t in range(self.step - gap, self.step)]
        path = Path(self.spec.out_dir) / f"updates-{hid}-{self.step}.snap"
        writer = threading.Thread(target=self._write_updates, args=(hid, updates, self.step - gap, path), daemon=True)
        writer.start()

    def _write_updates(self, hid: str, updates: list[torch.Tensor], first: int, path: Path) -> None:
        self.spec.pin("snapshot-writer")
        snapshots.write({"updates": updates}, path, {"first": first}, durable=False)  # logged updates are never modified
        with self.lock:
            self._writer_control().send(hid, {"op": "replay", "path": str(path)})

    def record_update(self, step: int, update: torch.Tensor) -> None:
        """Keep the step's applied mean gradient while some join may need to replay it."""
        if any(j.entered is None for j in self.joins.values()):
            self.updates[step] = update  # a fresh tensor every step, never written to after the update
            while len(self.updates) > self.spec.max_catchup_steps:  # too slow a join: it will get a newer snapshot
                del self.updates[min(self.updates)]
        else:
            self.updates.clear()

    # boundaries -----------------------------------------------------------------------------
    def boundary(self, step: int) -> tuple[int, dict]:
        """Apply requests and publish step `step`'s generation; returns its number and description."""
        self.step = step
        messages, self.offset = self.control.read("requests", self.offset)
        messages, self.deferred = self.deferred + messages, []
        for message in messages:
            self._handle(message)
        now, settings = self._now(), self.spec.joins
        for hid, join in list(self.joins.items()):
            if decide(join.progress(), step, now, settings) is JoinAction.TIMED_OUT:
                self._drop(hid)
                self.workers[hid].move(State.ROLLOUT, "join_timed_out", step, f"after {now - join.started:.1f} s")
                self.control.send(hid, {"op": "cancel"})
        for hid in list(self.members):
            worker = self.workers[hid]
            if worker.state is State.JOINING:  # its entering step went through: the join is complete
                self.active.add(hid)
                self.joins.pop(hid, None)
                worker.move(State.TRAINING, "activated", step)
            elif hid in self.leave_requested:
                self.members.remove(hid)
                self.active.discard(hid)
                self.leave_requested.discard(hid)
                worker.move(State.LEAVING, "leave_requested", step)
        entering = {}
        for hid, join in self.joins.items():
            if self.workers[hid].state is not State.JOINING:
                continue
            action = decide(join.progress(), step, now, settings)
            if action in (JoinAction.ENTER, JoinAction.ENTER_IDLE):
                assert join.synced is not None
                entering[hid] = join.synced  # close enough (or not getting closer): the rest comes at entry
                join.entered = step
                if action is JoinAction.ENTER:  # a short replay at entry: it takes its shard of this step
                    self.active.add(hid)
            elif action is JoinAction.REPLAY:  # replay the logged updates from a file while the core goes on
                assert join.synced is not None
                gap = step - join.synced
                join.gap, join.gap_from, join.synced = gap, join.synced, None
                self._send_updates(hid, gap)
        self.members = sorted(set(self.members) | set(entering))
        key = (tuple(self.members), tuple(sorted(self.active)))
        if key != self.published or entering:
            self.gen += 1
            self.published = key
            self.info = {"members": [self.spec.core_id(r) for r in range(self.spec.core_ranks)] + self.members,
                         "active": sorted(self.active), "entering": entering, "step": step}
            self.control.put(f"gen/{self.gen}", self.info)
            for hid in entering:
                self.control.send(hid, {"op": "enter", "gen": self.gen, "step": step})
        self.control.put_many({f"step/{step}": self.gen, "progress": step})
        return self.gen, self.info

    def catch_up(self, group: dist.ProcessGroup, info: dict) -> None:
        """Send each entering hybrid the updates since its snapshot."""
        for hid, since in info["entering"].items():
            missing = [s for s in range(since, info["step"]) if s not in self.updates]
            if missing:
                raise RuntimeError(f"updates for steps {missing[:3]}... are no longer logged")
            updates = [self.updates[s] for s in range(since, info["step"])]
            rank = info["members"].index(hid)
            group.send([torch.tensor([float(len(updates))], device=model_device(self.model))], rank, 0).wait()
            if updates:
                group.send([torch.stack(updates)], rank, 1).wait()

    def on_failure(self, step: int, error: str) -> None:
        """A generation with hybrids failed at `step`. Wait `failure_grace_s` for death notices
        (only those: other requests wait for the next boundary), so a dead member is recorded as
        failed from the state it died in; roll back every other hybrid of the generation. The next
        boundary publishes a core-only generation."""
        failed = list(self.members)
        deadline = time.time() + self.spec.failure_grace_s
        while time.time() < deadline and any(self.workers[h].state is not State.FAILED for h in failed):
            messages, self.offset = self.control.read("requests", self.offset)
            for message in messages:
                if message["type"] == "died":
                    self._handle(message)
                else:
                    self.deferred.append(message)
            time.sleep(0.01)
        for hid in failed:
            worker = self.workers[hid]
            if worker.state in (State.JOINING, State.TRAINING):
                self._drop(hid)
                worker.move(State.ROLLOUT, "rolled_back", step, f"step {step} failed: {error[:200]}")
        self.members, self.active = [], set()
        self.published = None

    def finish(self, steps: int) -> None:
        """Training is over: every hybrid still training leaves; wait (bounded) for them to exit."""
        self.step = steps
        for hid in list(self.members):
            worker = self.workers[hid]
            if worker.state is State.TRAINING:
                worker.move(State.LEAVING, "leave_requested", steps, "training finished")
            elif worker.state is State.JOINING:
                worker.move(State.ROLLOUT, "cancelled", steps, "training finished")
        for hid in list(self.joins):
            if self.workers[hid].state is State.JOINING:
                self.workers[hid].move(State.ROLLOUT, "cancelled", steps, "training finished")
                self.control.send(hid, {"op": "cancel"})
        self.control.put(f"step/{steps}", DONE)
        deadline = time.time() + 5.0
        while time.time() < deadline and any(w.state is State.LEAVING for w in self.workers.values()):
            messages, self.offset = self.control.read("requests", self.offset)
            for message in messages:
                self._handle(message)
            time.sleep(0.02)
        self.control.put("finished", steps)


# -- processes --------------------------------------------------------------------------------

def core_main(rank: int, spec: WorkerSpec) -> None:
    """A core training rank: runs every step of the run."""
    spec.pin(spec.core_id(rank))
    torch.set_num_threads(spec.threads)
    control = Control.connect(spec.host, spec.port)
    model, optimizer = spec.build(rank)
    dist.init_process_group(spec.backend, store=dist.PrefixStore("core", control.store), rank=rank,
                            world_size=spec.core_ranks, timeout=timedelta(seconds=spec.group_timeout_s * 4))
    leader = Leader(control, spec, model, optimizer) if rank == 0 else None
    core = [spec.core_id(r) for r in range(spec.core_ranks)]
    me = spec.core_id(rank)

    def core_only(step: int) -> torch.Tensor:
        """The step over the core alone: the full batch shared by the core ranks, summed in the core group."""
        payload = _step_payload(spec.task, model, step, core, me)
        dist.all_reduce(payload)
        return payload

    gen, info, group = 0, None, None
    log = []
    clock0 = time.perf_counter() - (time.time() - spec.t0)  # perf_counter reading at the pool's start
    try:
        for step in range(spec.steps):
            began = time.perf_counter()
            g, new = leader.boundary(step) if leader is not None else (control.get(f"step/{step}"), None)
            if g != gen:
                new = new or control.get(f"gen/{g}")
                if info is None or new["members"] != info["members"]:
                    group = None
                gen, info = g, new
            assert info is not None
            failed = ""
            marks = [time.perf_counter()]
            if len(info["members"]) == len(core):  # core-only: the core group, exactly as without hybrids
                payload = core_only(step)
            else:
                active = core + info["active"]
                try:
                    if group is None:
                        group = _group(control, spec, gen, rank, len(info["members"]))
                        if leader is not None:
                            leader.catch_up(group, info)
                    payload = _step_payload(spec.task, model, step, active, me)
                    group.allreduce([payload]).wait()
                except Exception as exc:  # a member died or timed out
                    failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
                flag = torch.tensor([1.0 if failed else 0.0], device=model_device(model))
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if flag.item() > 0:  # redo the whole step core-only; nothing from the failed attempt counts
                    group, info = None, {"members": core, "active": []}
                    payload = core_only(step)
                    if leader is not None:
                        leader.on_failure(step, failed or "another core rank saw the failure")
            update = _mean(payload)
            marks.append(time.perf_counter())
            if leader is not None:
                leader.before_update()
            _apply(spec.task, model, optimizer, step, update)
            if leader is not None:
                leader.record_update(step, update)
            marks.append(time.perf_counter())
            if spec.min_step_s > 0:
                time.sleep(max(0.0, spec.min_step_s - (time.perf_counter() - began)))
            log.append({"step": step, "start_s": began - clock0, "seconds": time.perf_counter() - began,
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


def hybrid_main(hid: str, spec: WorkerSpec, fault: str = "") -> None:
    """A hybrid worker: serves rollout (here: waits) until told to load a snapshot and enter a
    generation; trains with it until left out, then returns to rollout. `fault` injects a failure
    for tests and drills: SIGKILL itself on receiving the snapshot (`die_fetching`) or the order to
    enter (`die_entering`), or take 2 s more to fetch (`slow_fetch`)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; faults: {', '.join(f for f in FAULTS if f)}")
    spec.pin(hid)
    torch.set_num_threads(spec.threads)
    control = Control.connect(spec.host, spec.port)
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
            began = time.perf_counter()
            if fault == "slow_fetch":
                time.sleep(2.0)
            try:
                state, extra = snapshots.read(Path(message["path"]))
            except FileNotFoundError:  # replaced by a newer snapshot meanwhile; the leader sends that one
                continue
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loaded = extra["step"]
            control.post("requests", {"type": "loaded", "what": "snapshot", "hid": hid, "step": loaded,
                                      "bytes": message["bytes"], "seconds": time.perf_counter() - began})
        elif op == "replay" and loaded is not None:
            try:
                state, extra = snapshots.read(Path(message["path"]))
            except FileNotFoundError:
                continue
            Path(message["path"]).unlink(missing_ok=True)
            if extra["first"] != loaded:
                continue  # not the updates after this state (a cancelled attempt's): wait for the leader
            for i, update in enumerate(state["updates"]):
                _apply(spec.task, model, optimizer, loaded + i, update.to(model_device(model)))
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
    group = _group(control, spec, gen, info["members"].index(hid), len(info["members"]))
    device = model_device(model)
    try:
        count = torch.zeros(1, device=device)
        group.recv([count], 0, 0).wait()
        if count.item() > 0:
            size = sum(p.numel() for p in model.parameters())
            block = torch.zeros(int(count.item()), size, dtype=next(model.parameters()).dtype, device=device)
            group.recv([block], 0, 1).wait()
            for i, update in enumerate(block):
                _apply(spec.task, model, optimizer, since + i, update)
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
                    group = _group(control, spec, g, new["members"].index(hid), len(new["members"]))
                gen, info = g, new
            payload = _step_payload(spec.task, model, step, core + info["active"], hid)
            group.allreduce([payload]).wait()
            _apply(spec.task, model, optimizer, step, _mean(payload))
            last, step = step, step + 1
    except Exception:  # the generation failed: the leader rolls this hybrid back
        return step - 1
