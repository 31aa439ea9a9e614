"""The coordinator: hosts the control-plane store, launches the core ranks (local processes) and the
hybrids (through a provider), and runs a monitor thread that

- drains the leader's pool events (the authoritative state of every hybrid),
- reports hybrids whose process died to the leader,
- reconciles the desired hybrid count (set by the planner, or a schedule over steps) into join,
  leave and restart requests.

    pool = ElasticPool(RegressionTask(), steps=50, hybrids=2)
    pool.start(); pool.set_desired(2); result = pool.wait()
    result.events  # every transition, also written to the store's pool_events by `record`
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist

from libra.clock import Clock, Deadline, EpochClock, WallClock, sleep
from libra.devices import gpu_count
from libra.errors import LibraError
from libra.pools import snapshot as snapshots
from libra.pools.control import Control
from libra.pools.elastic import FAULTS
from libra.pools.joins import JoinSettings
from libra.pools.providers import CoreHandle, LocalProcesses, Provider
from libra.pools.reconciler import Action, reconcile
from libra.pools.spec import WorkerSpec
from libra.pools.states import PoolEvent, State
from libra.pools.task import TrainTask


@dataclass(frozen=True)
class PoolResult:
    model: dict[str, torch.Tensor]  # final weights (core rank 0)
    optimizer: dict  # final optimizer state
    steps: list[dict]  # per step: seconds, replicas, active replicas, retried
    events: list[PoolEvent]
    out_dir: str


@dataclass
class _Monitor:
    events: list[PoolEvent] = field(default_factory=list)
    states: dict[str, State] = field(default_factory=dict)
    in_flight: dict[str, tuple[str, float]] = field(default_factory=dict)  # hid -> (op, sent at)
    dead: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    progress: int = -1


def _check_device(device: str, local_workers: int) -> None:
    """NCCL cannot put two ranks of one group on the same GPU: each local worker needs its own."""
    if device == "cpu":
        return
    if device != "cuda":
        raise LibraError(f"pool device {device!r}: use 'cpu' (gloo) or 'cuda' (NCCL)")
    found = gpu_count()
    if found < local_workers:
        raise LibraError(f"pool device 'cuda' needs one GPU per local worker process ({local_workers}); this machine "
                         f"has {found}: use device 'cpu', fewer core ranks or hybrids, or hybrids on Ray actors")


class ElasticPool:
    def __init__(self, task: TrainTask, *, steps: int, core_ranks: int = 2, hybrids: int = 2,
                 out_dir: str | Path | None = None, provider: Provider | None = None,
                 gpus_per_worker: int = 1, group_timeout_s: float = 30.0,
                 join_timeout_s: float = JoinSettings.join_timeout_s, max_catchup_steps: int = 64,
                 enter_gap: int = JoinSettings.enter_gap, min_step_s: float = 0.0, poll_s: float = 0.05,
                 schedule: Mapping[int, int] | None = None, faults: Mapping[str, str] | None = None,
                 on_event: Callable[[PoolEvent], None] | None = None,
                 affinity: Mapping[str, tuple[int, ...]] | None = None, device: str = "cpu",
                 core_provider: Provider | None = None, control_host: str = "127.0.0.1",
                 clock: Clock | None = None) -> None:
        """`schedule`: desired hybrid count from a step on ({0: 0, 10: 2} = none, then two from step
        10); without one, `set_desired` or explicit `request_join`/`request_leave` drive the pool.
        `faults`: fault injection for tests and drills (hybrid id -> one of `elastic.FAULTS`).
        `affinity`: CPU pinning per worker id ("core-0", "hybrid-1") and for the leader's
        "snapshot-writer" thread. `device`: "cpu" (gloo) or "cuda" (NCCL; every worker process needs
        its own GPU: local processes take GPUs 0, 1, ... in the order core ranks, then hybrids).
        `core_provider`: where the core ranks run (default: local processes; Ray actors on a
        cluster); `control_host`: the address the workers reach this process's control store at
        (this host's own, when they run on others). `clock` times this process's waits (monotonic
        wall time unless another is injected); the workers time the pool's events from its start
        in epoch seconds (`EpochClock`), which every machine shares."""
        if steps < 1 or core_ranks < 1 or hybrids < 0:
            raise LibraError(f"need steps >= 1, core_ranks >= 1, hybrids >= 0; got {steps}, {core_ranks}, {hybrids}")
        self.provider = provider or LocalProcesses()
        self.core_provider = core_provider or LocalProcesses()
        self.control_host = control_host
        _check_device(device, (core_ranks if isinstance(self.core_provider, LocalProcesses) else 0)
                      + (hybrids if isinstance(self.provider, LocalProcesses) else 0))
        self.task = task
        self.steps = steps
        self.core_ranks = core_ranks
        self.hybrid_ids = tuple(f"hybrid-{i}" for i in range(hybrids))
        self.out_dir = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="libra-pool-"))
        self.settings = dict(gpus_per_worker=gpus_per_worker, group_timeout_s=group_timeout_s,
                             join_timeout_s=join_timeout_s, max_catchup_steps=max_catchup_steps, enter_gap=enter_gap,
                             min_step_s=min_step_s, device=device,
                             affinity=tuple((k, tuple(v)) for k, v in (affinity or {}).items()))
        self.poll_s = poll_s
        self.clock = clock or WallClock()
        self.schedule = dict(sorted((schedule or {}).items()))
        self.desired: int | None = None
        self.faults = dict(faults or {})
        unknown = {h: f for h, f in self.faults.items() if f not in FAULTS or h not in self.hybrid_ids}
        if unknown:
            raise LibraError(f"bad faults {unknown}; hybrids: {', '.join(self.hybrid_ids)}; faults: {', '.join(FAULTS[1:])}")
        self.on_event = on_event
        self.monitor = _Monitor(states={h: State.ROLLOUT for h in self.hybrid_ids})
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._events_offset = self._errors_offset = 0  # read positions in the leader's channels
        self.core: list[CoreHandle] = []

    # lifecycle --------------------------------------------------------------------------------
    def start(self, wait_for_hybrids_s: float = 0.0) -> ElasticPool:
        """Launch the hybrids, then the core ranks; with `wait_for_hybrids_s` > 0, start training
        only once every hybrid process reports ready (or raise after that long)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.control = Control(self.store, self.clock)
        started = EpochClock(0.0).now()  # epoch seconds: the origin of every worker's clock
        self.spec = WorkerSpec(self.control_host, self.store.port, self.task, self.core_ranks, self.hybrid_ids, self.steps,
                               str(self.out_dir), started, **self.settings)
        for hid in self.hybrid_ids:
            self.provider.launch(hid, self.spec, self.faults.get(hid, ""))
        if wait_for_hybrids_s > 0:
            deadline = Deadline(self.clock, wait_for_hybrids_s)
            while (missing := [h for h in self.hybrid_ids if not self.control.has(f"ready/{h}")]):
                if deadline.left() < 0:
                    self.provider.close(1.0)
                    raise LibraError(f"hybrids {', '.join(missing)} not ready after {wait_for_hybrids_s} s "
                                     f"({self.provider.name} provider); raise the wait or check the workers' logs")
                sleep(self.clock, self.poll_s)
        for rank in range(self.core_ranks):
            self.core.append(self.core_provider.launch_core(rank, self.spec))
        self._thread = threading.Thread(target=self._run, name="libra-pool-monitor", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout_s: float = 600.0) -> PoolResult:
        """Wait for the core to finish every step; stop the hybrids; return the result."""
        deadline = Deadline(self.clock, timeout_s)
        for proc in self.core:
            proc.join(max(0.0, deadline.left()))
        failed = [p for p in self.core if p.exitcode != 0]
        self._stop.set()
        self._thread.join()
        self._drain(Control(self.store, self.clock))
        for hid in self.hybrid_ids:
            self.control.send(hid, {"op": "stop"})
        self.provider.close(10.0)
        if failed:
            for proc in self.core:
                if proc.is_alive():
                    proc.kill()
            detail = self.monitor.errors[-1].strip().splitlines()[-1] if self.monitor.errors else "no error reported"
            raise LibraError(f"core training failed ({', '.join(f'{p.name}: exit {p.exitcode}' for p in failed)}): {detail}")
        final, _ = snapshots.read(self.out_dir / "final.snap")
        steps = json.loads((self.out_dir / "steps.json").read_text())
        return PoolResult(final["model"], final["optimizer"], steps, list(self.monitor.events), str(self.out_dir))

    def abort(self) -> None:
        """End the pool before its steps are done (the run driving it stopped): the core ranks are
        killed, the hybrids told to stop (and killed if they do not)."""
        for proc in self.core:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        self._stop.set()
        self._thread.join()
        for hid in self.hybrid_ids:
            self.control.send(hid, {"op": "stop"})
        self.provider.close(2.0)

    # driving ------------------------------------------------------------------------------------
    def set_desired(self, hybrids: int) -> None:
        if not 0 <= hybrids <= len(self.hybrid_ids):
            raise LibraError(f"desired hybrids must be 0..{len(self.hybrid_ids)}, got {hybrids}")
        self.desired = hybrids

    def request_join(self, hid: str) -> None:
        self._request("join", self._known(hid))

    def request_leave(self, hid: str) -> None:
        self._request("leave", self._known(hid))

    def kill(self, hid: str) -> None:
        """SIGKILL a hybrid's process (failure tests and drills)."""
        self.provider.kill(self._known(hid))

    def state(self, hid: str) -> State:
        with self.lock:
            return self.monitor.states[self._known(hid)]

    @property
    def events(self) -> list[PoolEvent]:
        with self.lock:
            return list(self.monitor.events)

    @property
    def progress(self) -> int:
        return self.monitor.progress

    @property
    def running(self) -> bool:
        """Whether any core rank is still training."""
        return any(p.is_alive() for p in self.core)

    def wait_for(self, predicate: Callable[[list[PoolEvent]], bool], timeout_s: float = 60.0) -> list[PoolEvent]:
        deadline = Deadline(self.clock, timeout_s)
        while deadline.left() > 0:
            events = self.events
            if predicate(events):
                return events
            if all(not p.is_alive() for p in self.core):
                raise TimeoutError(f"training ended before the pool condition was met; events: "
                                   f"{[(e.worker_id, e.event) for e in self.events]}")
            sleep(self.clock, self.poll_s)
        raise TimeoutError(f"pool condition not met within {timeout_s} s; events so far: "
                           f"{[(e.worker_id, e.event) for e in self.events]}")

    def _known(self, hid: str) -> str:
        if hid not in self.hybrid_ids:
            raise LibraError(f"unknown hybrid {hid!r}; hybrids: {', '.join(self.hybrid_ids)}")
        return hid

    def _request(self, op: str, hid: str, control: Control | None = None) -> None:
        (control or self.control).post("requests", {"type": op, "hid": hid})
        with self.lock:
            self.monitor.in_flight[hid] = (op, self.clock.now())

    # the monitor thread -------------------------------------------------------------------------
    def _run(self) -> None:
        control = Control.connect("127.0.0.1", self.store.port, clock=self.clock)  # its own client: stores are not shared across threads
        while not self._stop.is_set():
            self._drain(control)
            for hid in self.hybrid_ids:
                if hid not in self.monitor.dead and not self.provider.alive(hid):
                    self.monitor.dead.add(hid)
                    control.post("requests", {"type": "died", "hid": hid, "detail": self.provider.exit_detail(hid)})
            desired = self._target()
            if desired is not None:
                with self.lock:
                    now = self.clock.now()
                    self.monitor.in_flight = {h: v for h, v in self.monitor.in_flight.items() if now - v[1] < 5.0}
                    actions = reconcile(desired, self.monitor.states, {h: op for h, (op, _) in self.monitor.in_flight.items()})
                for action in actions:
                    self._act(action, control)
            sleep(self.clock, self.poll_s)

    def _target(self) -> int | None:
        target = self.desired
        for step, count in self.schedule.items():
            if step <= self.monitor.progress:
                target = count
        return target

    def _act(self, action: Action, control: Control) -> None:
        if action.op == "restart":  # the new process reports itself ready; the leader then marks it restarted
            self.provider.launch(action.worker_id, self.spec)
            with self.lock:
                self.monitor.dead.discard(action.worker_id)
                self.monitor.in_flight[action.worker_id] = ("restart", self.clock.now())
        else:
            self._request(action.op, action.worker_id, control)

    def _drain(self, control: Control) -> None:
        events, self._events_offset = control.read("events", self._events_offset)
        errors, self._errors_offset = control.read("errors", self._errors_offset)
        progress = control.get("progress") if control.has("progress") else -1
        with self.lock:
            self.monitor.progress = progress
            self.monitor.errors += [e["error"] for e in errors]
            for raw in events:
                event = PoolEvent(**raw)
                self.monitor.events.append(event)
                self.monitor.states[event.worker_id] = State(event.to_state)
                self.monitor.in_flight.pop(event.worker_id, None)
        for raw in events:
            if self.on_event is not None:
                self.on_event(PoolEvent(**raw))


def events_table(events: list[PoolEvent]) -> pa.Table:
    """Pool events as rows of the store's `pool_events` table (the writer adds the run)."""
    return pa.Table.from_pylist([asdict(e) for e in events])
