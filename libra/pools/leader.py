"""The elastic pool's leader (core rank 0): the hybrids' state machines, the snapshots and update
logs that joining hybrids catch up from, and the membership (generation) of each step.

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
to rollout. Whether a join enters, replays or times out is the join policy's decision
(`libra.pools.joins.decide`).
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from libra.clock import Clock, Deadline, EpochClock, sleep
from libra.pools import snapshot as snapshots
from libra.pools.control import DONE, Control
from libra.pools.joins import JoinAction, JoinProgress, decide
from libra.pools.replica import model_device, state_of
from libra.pools.spec import WorkerSpec
from libra.pools.states import PoolEvent, Role, State, Worker


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
    seconds since the pool's start unless another is injected), which also times its waits."""

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
        deadline = Deadline(self.clock, self.spec.failure_grace_s)
        while deadline.left() > 0 and any(self.workers[h].state is not State.FAILED for h in failed):
            messages, self.offset = self.control.read("requests", self.offset)
            for message in messages:
                if message["type"] == "died":
                    self._handle(message)
                else:
                    self.deferred.append(message)
            sleep(self.clock, 0.01)
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
        deadline = Deadline(self.clock, 5.0)
        while deadline.left() > 0 and any(w.state is State.LEAVING for w in self.workers.values()):
            messages, self.offset = self.control.read("requests", self.offset)
            for message in messages:
                self._handle(message)
            sleep(self.clock, 0.02)
        self.control.put("finished", steps)
