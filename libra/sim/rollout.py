"""Rollout instances with continuous batching, driven by a router, on simulated time.

An instance of TP `tp` holds up to `max_batch` sequences whose reserved KV (context plus the turn's
generation) fits its KV pool (the HBM its GPUs have left after weights and activations: millions of
tokens at TP8); the rest wait in its queue. A single sequence is also held to the engine's context
limit, a separate check. All its active sequences decode one
token per step, and a step takes the cost model's decode time at the current batch and mean
context (plus, when one process drives every instance, the host's per-sequence work of the other
instances' sequences: `CostModel.host_wait_s`), so between events every sequence advances at the
same rate. Admitting a turn first
prefills its new tokens (the prompt, the tool result, or the whole context after a migration),
during which the instance makes no decode progress. Between turns a trajectory waits for its tool
and holds no GPU. The router picks a bucket at the start and at each tool return; within a bucket
a trajectory stays on its instance (its KV prefix is cached there), and a new one goes to the
least-loaded instance, or, if that one would queue it, to an instance of a longer bucket that can
start it now (work-conserving dispatch), and stays there until the router names another bucket.
A turn that cannot fit its bucket's instances at all goes
to the smallest instance that holds it (physics, not policy).

Partial rollouts (`Close`): the rollout closes once `needed` groups are complete (and not before
`hold_s`: the asynchronous mode's update beside it), and every trajectory still running is
suspended where it stands (`Progress`): mid-turn with the tokens it has generated, or in a tool
call with the call's time left. A later rollout resumes it on the instance its router names: the
whole context so far (prompt, turns, tool results, the interrupted turn's tokens) is prefilled
again there, as the live loop re-prefills a continued turn, and the turn goes on from its last token.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from libra.errors import InfeasibleError
from libra.planner.cost_model import CostModel
from libra.scheduler.causal_tree import TrajectoryPath, path_from_turns
from libra.scheduler.keys import ToolReturn
from libra.scheduler.routers import Lane, Router
from libra.sim.engine import Event, EventLoop
from libra.sim.workloads import SimTrajectory


@dataclass(frozen=True)
class InstanceSpec:
    tp: int
    bucket: int  # the router bucket this instance serves
    hybrid: bool = False  # leaves for training once the rollout is down to its tail


def mean_context(trajectories: Sequence[SimTrajectory]) -> float:
    """Mean context over a trajectory's life (its prompt plus half of what follows), over a batch."""
    if not trajectories:
        return 1.0
    return sum(t.prompt_tokens + (t.total_tokens - t.prompt_tokens) / 2 for t in trajectories) / len(trajectories)


def lanes(cost: CostModel, layout: Sequence[InstanceSpec], context: float) -> tuple[Lane, ...]:
    """What a router needs to know of each bucket's instances (hybrids serve the first bucket until
    they leave): how many there are and their decode step time at each batch size, at `context`
    tokens of mean context."""
    buckets: dict[int, list[InstanceSpec]] = {}
    for spec in layout:
        buckets.setdefault(spec.bucket, []).append(spec)
    out = []
    for b in range(max(buckets) + 1):
        specs = buckets.get(b) or buckets[min(buckets, key=lambda k: abs(k - b))]
        tp = max(spec.tp for spec in specs)
        out.append(Lane(len(specs), tuple(cost.decode_step_s(tp, n, context)
                                          for n in range(1, cost.rollout.max_batch + 1))))
    return tuple(out)


@dataclass(frozen=True)
class Progress:
    """Where a suspended trajectory stopped: in turn `turn` with `done` of its tokens generated, or,
    with `tool_left_s` > 0, waiting that much longer for the tool call before turn `turn` (done 0)."""

    turn: int
    done: int = 0
    tool_left_s: float = 0.0

    def context(self, trajectory: SimTrajectory) -> int:
        """Context tokens so far: the prompt, the turns before `turn` with their tool results, and
        the interrupted turn's tokens (all prefilled again when it resumes)."""
        before = trajectory.turns[:self.turn]
        return trajectory.prompt_tokens + sum(u.gen_tokens + u.payload_tokens for u in before) + self.done


@dataclass(frozen=True)
class Close:
    """When a partial rollout closes: once `needed` whole groups are complete (`groups`: each
    trajectory's group), and not before the update beside it is done (the asynchronous mode):
    `hold_s`, or `hold(released)` of the hybrids released by then. With `hold`, hybrids leave as
    soon as the batch is full (their turns suspended) to join that update; the hold is its end."""

    groups: Mapping[str, str]
    needed: int
    hold_s: float = 0.0
    hold: Callable[[list[tuple[int, float]]], float] | None = None


@dataclass
class _Seq:
    trajectory: SimTrajectory
    turn: int
    done_at: float  # instance virtual token count at which this turn's generation ends
    reserved: int  # KV tokens reserved (context + this turn's generation)
    context: int  # context tokens when the turn started
    gen: int = 0  # tokens this turn generates here (fewer than the turn's when it resumes mid-turn)
    earlier: int = 0  # tokens of this turn generated by an earlier rollout


class Instance:
    def __init__(self, index: int, spec: InstanceSpec, cost: CostModel, loop: EventLoop, on_done,
                 on_load=None) -> None:
        """`on_done(instance, seq)`: a turn finished; `on_load(instance)`: its load changed."""
        self.index = index
        self.on_load = on_load
        self.tp = spec.tp
        self.bucket = spec.bucket
        self.cost = cost
        self.loop = loop
        self.on_done = on_done
        self.capacity = cost.kv_capacity_tokens(spec.tp)  # the KV pool, shared by the active sequences
        self.max_context = cost.rollout.max_context_tokens  # one sequence's limit
        self.max_batch = cost.rollout.max_batch
        self.active: dict[int, _Seq] = {}
        self.heap: list[tuple[float, int, int]] = []  # (done at, admission order: ties end in it, key)
        self.admitted = 0
        self.queue: deque[tuple[_Seq, int]] = deque()  # (sequence, tokens to prefill)
        self.kv_used = 0
        self.virtual = 0.0  # tokens each active sequence has decoded since the instance started
        self.synced_at = 0.0
        self.stall_until = 0.0
        self.step_s = 0.0
        self.context_sum = 0
        self.event: Event | None = None
        self.busy_s = 0.0
        self.hybrid = spec.hybrid
        self.draining = False
        self.released_at: float | None = None  # when a draining hybrid held no work any more
        self.sequences_elsewhere = 0  # active sequences of the other instances (a shared host's wait)
        self.shared_host = cost.rollout.shared_host

    @property
    def load(self) -> int:
        return len(self.active) + len(self.queue)

    def fits(self, tokens: int) -> bool:
        """Whether one sequence of `tokens` could ever run here (alone, if need be)."""
        return tokens <= min(self.capacity, self.max_context)

    def can_start(self, tokens: int) -> bool:
        """Whether a new turn needing `tokens` of KV would be admitted now rather than queued."""
        return not self.queue and len(self.active) < self.max_batch and self.kv_used + tokens <= self.capacity

    def _sync(self) -> None:
        """Advance decode progress to now (none while prefilling)."""
        now = self.loop.now
        start = max(self.synced_at, self.stall_until)
        if self.active and now > start and self.step_s > 0:
            self.virtual += (now - start) / self.step_s
        if self.active or self.stall_until > self.synced_at:
            self.busy_s += now - self.synced_at
        self.synced_at = now

    def submit(self, seq: _Seq, prefill_tokens: int) -> None:
        self._sync()
        self.queue.append((seq, prefill_tokens))
        self._admit()
        self._reschedule()
        if self.on_load is not None:
            self.on_load(self)

    def _admit(self) -> None:
        while self.queue and len(self.active) < self.max_batch:
            seq, prefill = self.queue[0]
            if self.kv_used + seq.reserved > self.capacity and self.active:
                break
            self.queue.popleft()
            now = self.loop.now
            self.stall_until = max(now, self.stall_until) + self.cost.prefill_s(self.tp, prefill, seq.context)
            seq.done_at = self.virtual + seq.gen
            key = id(seq)
            self.active[key] = seq
            self.admitted += 1
            heapq.heappush(self.heap, (seq.done_at, self.admitted, key))
            self.kv_used += seq.reserved
            self.context_sum += seq.context
        self._rate()

    def _rate(self) -> None:
        if self.active:
            mean_context = self.context_sum / len(self.active)
            self.step_s = self.cost.decode_step_s(self.tp, len(self.active), mean_context)
            if self.shared_host:  # (else the wait is 0.0, and adding it changes nothing)
                self.step_s += self.cost.host_wait_s(self.sequences_elsewhere)

    def share_host(self, sequences_elsewhere: int) -> None:
        """The other instances now hold `sequences_elsewhere` active sequences (one process drives
        them all): progress so far at the old step time, the rest at the new one."""
        if sequences_elsewhere != self.sequences_elsewhere:
            self._sync()
            self.sequences_elsewhere = sequences_elsewhere
            self._rate()
            self._reschedule()

    def _reschedule(self) -> None:
        if self.event is not None:
            self.event.cancelled = True
            self.event = None
        if not self.heap:
            return
        start = max(self.loop.now, self.stall_until)
        when = start + max(0.0, self.heap[0][0] - self.virtual) * self.step_s
        self.event = self.loop.at(when, self._complete)

    def _complete(self) -> None:
        self.event = None
        self._sync()
        finished = []
        while self.heap and self.heap[0][0] <= self.virtual + 1e-9:
            _, _, key = heapq.heappop(self.heap)
            seq = self.active.pop(key)
            self.kv_used -= seq.reserved
            self.context_sum -= seq.context
            finished.append(seq)
        self._admit()
        self._reschedule()
        if finished and self.on_load is not None:
            self.on_load(self)
        self.release_if_idle()
        for seq in finished:
            self.on_done(self, seq)

    def release_if_idle(self) -> None:
        if self.draining and self.released_at is None and not self.active and not self.queue:
            self._sync()
            self.released_at = self.loop.now

    def evict(self) -> list[tuple[_Seq, int]]:
        """Stop every turn here now and leave: (sequence, tokens of its turn generated so far)."""
        self._sync()
        out = [(seq, self.generated(seq)) for seq in self.active.values()] + [(seq, seq.earlier) for seq, _ in self.queue]
        self.active.clear()
        self.heap.clear()
        self.queue.clear()
        self.kv_used = self.context_sum = 0
        if self.event is not None:
            self.event.cancelled = True
            self.event = None
        self.draining = True
        self.released_at = self.loop.now
        return out

    def generated(self, seq: _Seq) -> int:
        """Tokens of `seq`'s turn generated so far (all of them once the turn is done); a queued
        sequence has generated none here."""
        started = seq.done_at - seq.gen
        if id(seq) not in self.active:
            return seq.earlier
        return seq.earlier + min(seq.gen - 1, max(0, int(self.virtual - started + 1e-9)))


@dataclass
class RolloutResult:
    makespan_s: float
    gen_tokens: int
    total_tokens: int
    migrated_tokens: int  # context re-prefilled on migration
    migrations: int
    busy_gpu_s: float
    idle_gpu_s: float
    finish_s: dict[str, float] = field(default_factory=dict)
    events: int = 0
    hybrid_released_s: list[tuple[int, float]] = field(default_factory=list)  # (GPUs, when they left rollout)
    generated: dict[str, int] = field(default_factory=dict)  # tokens each trajectory generated in this rollout
    completed_groups: list[str] = field(default_factory=list)  # a partial rollout's complete groups, in order
    group_crowd: list[int] = field(default_factory=list)  # turns on instances (decoding or queued) as each completed
    suspended: dict[str, Progress] = field(default_factory=dict)  # where the unfinished trajectories stopped
    resumed: int = 0  # trajectories continued from an earlier rollout
    resumed_prefill_tokens: int = 0  # context prefilled again to continue them


class RolloutSim:
    """Runs one step's trajectories through a set of instances and a router."""

    def __init__(self, cost: CostModel, layout: Sequence[InstanceSpec], router: Router,
                 hybrid_leave_fraction: float = 0.0) -> None:
        """`hybrid_leave_fraction`: hybrid instances stop taking turns once at most this share of the
        step's trajectories is unfinished (of a partial rollout's groups still to complete), and
        leave when their last turn ends."""
        if not layout or all(spec.hybrid for spec in layout):
            raise ValueError("a rollout needs at least one core instance")
        self.hybrid_leave_fraction = hybrid_leave_fraction
        self.unfinished = 0
        self.total = 0
        self.cost = cost
        self.loop = EventLoop()
        self.router = router
        self.instances = [Instance(i, spec, cost, self.loop, self._turn_done, self._load_changed)
                          for i, spec in enumerate(layout)]
        self.shared_host = cost.rollout.shared_host and cost.coefficients.decode_seq_s > 0 and len(self.instances) > 1
        self.by_bucket: dict[int, list[Instance]] = {}
        for inst in self.instances:
            self.by_bucket.setdefault(inst.bucket, []).append(inst)
        # per bucket, a heap of (load, index) entries: the least-loaded instance in O(log n); an entry is
        # current while it matches its instance's load (stale ones are dropped when they surface)
        self.loads = {b: [(0, i.index) for i in insts] for b, insts in self.by_bucket.items()}
        self._live: list[int] | None = None  # buckets with an instance that is not draining
        self.placed: dict[str, Instance] = {}
        self.routed: dict[str, int] = {}  # the bucket the router last named for each trajectory
        self.position: dict[str, int] = {}
        self.result = RolloutResult(0.0, 0, 0, 0, 0, 0.0, 0.0)
        self.close: Close | None = None
        self.running: dict[str, _Seq] = {}  # trajectories with a turn on an instance (queued or active)
        self.in_tool: dict[str, tuple[int, float]] = {}  # trajectories in a tool call: (next turn, when it returns)
        self.group_left: dict[str, int] = {}  # a partial rollout's unfinished trajectories per group
        self.closing: Event | None = None

    def _pick(self, bucket: int, need: int, previous: Instance | None = None, rerouted: bool = True) -> Instance:
        """The trajectory's previous instance if it serves `bucket`, or if the router kept the
        trajectory where it was (`rerouted` False: its work-conserving spill to a longer bucket's
        instance stands); its KV prefix is cached there. Else the least-loaded instance of the bucket."""
        if (previous is not None and (previous.bucket == bucket or not rerouted) and previous.fits(need)
                and not previous.draining):
            return previous
        if self._live is None:
            self._live = sorted(b for b, insts in self.by_bucket.items() if any(not i.draining for i in insts))
        live = self._live
        if bucket not in live:  # no instance serves it: the nearest bucket that has some
            bucket = min(live, key=lambda b: (abs(b - bucket), -b))
        chosen = self._least_loaded(bucket)
        if chosen is None or not chosen.fits(need) or chosen.draining:
            candidates = [i for i in self.by_bucket.get(bucket, []) if i.fits(need) and not i.draining]
            if not candidates:  # too long for this bucket's instances (or they left): the smallest that holds it
                candidates = [i for i in self.instances if i.fits(need) and not i.draining]
                if not candidates:
                    raise InfeasibleError(f"a context of {need} tokens fits no rollout instance")
                smallest = min(i.tp for i in candidates)
                candidates = [i for i in candidates if i.tp == smallest]
            chosen = min(candidates, key=lambda i: (i.load, i.index))
        if previous is None and not chosen.can_start(need):  # work-conserving: a new trajectory does not
            spill = [i for i in self.instances  # queue while an instance of a longer bucket could start it
                     if i.bucket > bucket and not i.draining and i.can_start(need)]
            if spill:
                chosen = min(spill, key=lambda i: (i.bucket, i.load, i.index))
        return chosen

    def _least_loaded(self, bucket: int) -> Instance | None:
        """The bucket's instance with the least (load, index), or None if the bucket has none."""
        heap = self.loads.get(bucket)
        while heap:
            load, index = heap[0]
            if self.instances[index].load == load:
                return self.instances[index]
            heapq.heappop(heap)
        return None

    def _load_changed(self, instance: Instance) -> None:
        heapq.heappush(self.loads[instance.bucket], (instance.load, instance.index))
        if self.shared_host:
            total = sum(len(i.active) for i in self.instances)
            for other in self.instances:
                if other is not instance:
                    other.share_host(total - len(other.active))

    def _send(self, trajectory: SimTrajectory, turn: int, bucket: int, new_tokens: int, done: int = 0) -> None:
        """Turn `turn` of `trajectory` to an instance of `bucket`, `new_tokens` of its context not yet
        prefilled anywhere (a resumed trajectory's whole context) and `done` of its tokens generated
        by an earlier rollout."""
        tid = trajectory.trajectory_id
        context = self.position[tid]
        gen = trajectory.turns[turn].gen_tokens - done
        need = context + gen
        previous = self.placed.get(tid)
        instance = self._pick(bucket, need, previous, rerouted=self.routed.get(tid) != bucket)
        self.routed[tid] = bucket
        prefill = new_tokens
        if previous is not None and previous is not instance:
            prefill = context  # migration: the whole context is prefilled again
            self.result.migrated_tokens += context - new_tokens
            self.result.migrations += 1
        self.placed[tid] = instance
        seq = _Seq(trajectory, turn, 0.0, need, context, gen, done)
        self.running[tid] = seq
        instance.submit(seq, prefill)

    def _turn_done(self, instance: Instance, seq: _Seq) -> None:
        trajectory, turn = seq.trajectory, seq.turn
        step = trajectory.turns[turn]
        tid = trajectory.trajectory_id
        del self.running[tid]
        self.result.gen_tokens += seq.gen
        self.result.generated[tid] = self.result.generated.get(tid, 0) + seq.gen
        self.position[tid] += seq.gen
        if turn == len(trajectory.turns) - 1:
            self.result.finish_s[tid] = self.loop.now
            self.router.finish(tid, self.position[tid])
            self.unfinished -= 1
            if self._tail_reached():
                for inst in self.instances:
                    if inst.hybrid and not inst.draining:
                        inst.draining = True
                        self._live = None
                        inst.release_if_idle()
            if self.close is not None:
                self._group_done(self.close.groups[tid])
            return

        def tool_returns() -> None:
            del self.in_tool[tid]
            self.position[tid] += step.payload_tokens
            decision = self.router.on_return(tid, ToolReturn(step.tool_name, step.payload_tokens, step.status),
                                             self.position[tid])
            self._send(trajectory, turn + 1, decision.bucket, step.payload_tokens)

        self.in_tool[tid] = (turn + 1, self.loop.now + step.tool_latency_s)
        self.loop.after(step.tool_latency_s, tool_returns)

    def _tail_reached(self) -> bool:
        """Whether hybrids leave now: at most `hybrid_leave_fraction` of the trajectories (of a
        partial rollout, of the groups it still needs) is unfinished."""
        if self.hybrid_leave_fraction <= 0:
            return False
        if self.close is None:
            return self.unfinished <= self.hybrid_leave_fraction * self.total
        return self.close.needed - len(self.result.completed_groups) <= self.hybrid_leave_fraction * self.close.needed

    def _group_done(self, group: str) -> None:
        self.group_left[group] -= 1
        if self.group_left[group]:
            return
        self.result.completed_groups.append(group)
        self.result.group_crowd.append(len(self.running))
        assert self.close is not None
        if len(self.result.completed_groups) >= self.close.needed and self.closing is None:
            self._schedule_close()

    def _schedule_close(self) -> None:
        """The batch is full: close now or when the update beside it is done (its hybrids leaving now)."""
        close = self.close
        assert close is not None
        hold = close.hold_s
        if close.hold is not None:
            for inst in self.instances:
                if inst.hybrid and inst.released_at is None:
                    for seq, done in inst.evict():
                        self._stop(seq, done)
                    self._live = None
                    self._load_changed(inst)
            hold = close.hold([(i.tp, i.released_at) for i in self.instances if i.hybrid])  # type: ignore[misc]
        self.closing = self.loop.at(max(self.loop.now, hold), self._suspend_all)

    def _stop(self, seq: _Seq, done: int) -> None:
        """`seq`'s trajectory is suspended with `done` tokens of its turn generated."""
        tid = seq.trajectory.trajectory_id
        del self.running[tid]
        self.result.generated[tid] = self.result.generated.get(tid, 0) + done - seq.earlier
        self.result.gen_tokens += done - seq.earlier
        self.result.suspended[tid] = Progress(seq.turn, done)

    def _suspend_all(self) -> None:
        """The batch is closed: every unfinished trajectory stops where it stands (`Progress`)."""
        now = self.loop.now
        for inst in self.instances:
            inst._sync()
        for tid, seq in list(self.running.items()):
            self._stop(seq, self.placed[tid].generated(seq))
        for tid, (turn, returns_at) in self.in_tool.items():
            self.result.suspended[tid] = Progress(turn, 0, max(1e-9, returns_at - now))
        for inst in self.instances:
            if inst.hybrid and inst.released_at is None:
                inst.released_at = now
        self.loop.stop()

    def _resume(self, trajectory: SimTrajectory, progress: Progress) -> None:
        """Continue a suspended trajectory: its context prefilled again on the instance its router
        names (the bucket it last named, or, at a tool return, the bucket it names now; a router
        that never saw it decides as at a start)."""
        tid = trajectory.trajectory_id
        self.result.resumed += 1
        position = progress.context(trajectory)

        def go() -> None:
            self.in_tool.pop(tid, None)
            self.position[tid] = position
            if tid not in self.router.current:
                bucket = self.router.start(tid, trajectory.prompt_id, position).bucket
            elif progress.tool_left_s > 0:
                before = trajectory.turns[progress.turn - 1]
                bucket = self.router.on_return(tid, ToolReturn(before.tool_name, before.payload_tokens, before.status),
                                               position).bucket
            else:
                bucket = self.router.current[tid]
            self.result.resumed_prefill_tokens += position
            self._send(trajectory, progress.turn, bucket, position, progress.done)

        if progress.tool_left_s > 0:
            self.in_tool[tid] = (progress.turn, progress.tool_left_s)
            self.loop.after(progress.tool_left_s, go)
        else:
            go()

    def run(self, trajectories: Sequence[SimTrajectory], resume: Mapping[str, Progress] | None = None,
            close: Close | None = None) -> RolloutResult:
        """Roll `trajectories` out: those in `resume` continue where they stopped, the others start.
        With `close`, the rollout closes as it says and suspends the rest (`result.suspended`)."""
        resume = resume or {}
        self.close = close
        self.total = self.unfinished = len(trajectories)
        if close is not None:
            for t in trajectories:
                group = close.groups[t.trajectory_id]
                self.group_left[group] = self.group_left.get(group, 0) + 1
            if close.needed <= 0:
                self._schedule_close()
        for t in trajectories:
            if t.trajectory_id in resume:
                self._resume(t, resume[t.trajectory_id])
                continue
            self.position[t.trajectory_id] = t.prompt_tokens
            decision = self.router.start(t.trajectory_id, t.prompt_id, t.prompt_tokens)
            self._send(t, 0, decision.bucket, t.prompt_tokens)
        self.loop.run()
        makespan = self.loop.now
        for inst in self.instances:
            inst._sync()
        gpu_s = sum(i.tp for i in self.instances) * makespan
        busy = sum(i.busy_s * i.tp for i in self.instances)
        self.result.makespan_s = makespan
        self.result.busy_gpu_s = busy
        self.result.idle_gpu_s = max(0.0, gpu_s - busy)
        self.result.total_tokens = sum(t.total_tokens for t in trajectories)
        self.result.events = self.loop.processed
        self.result.hybrid_released_s = [(i.tp, i.released_at if i.released_at is not None else makespan)
                                         for i in self.instances if i.hybrid]
        # the rollout is over: no cycle through its instances (their callbacks, a pending completion's
        # event) keeps it in memory until the garbage collector's next pass (its heaps hold 10^5 entries)
        for inst in self.instances:
            inst.on_done = inst.on_load = inst.event = None
        self.closing = None
        return self.result


def path_of(trajectory: SimTrajectory) -> TrajectoryPath:
    """The causal tree's view of a simulated trajectory."""
    return path_from_turns(trajectory.prompt_id, trajectory.prompt_tokens,
                           [(t.gen_tokens, t.tool_name, t.payload_tokens, t.status) for t in trajectory.turns])
