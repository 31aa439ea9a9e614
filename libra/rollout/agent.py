"""The agent loop: generate until a tool call or the answer, run the tool, append the observation,
and before the next turn ask the router which instance bucket continues the trajectory.

One `rollout` call runs a batch (tasks x samples) over several engine instances. Each round, every
instance generates one turn for all the trajectories routed to it (one batched call; instances run
side by side in threads), the tools run in a thread pool (sandboxed where they execute code), and
the router places each trajectory for its next turn. Bucket b runs on instance min(b, instances-1);
a trajectory whose instance changes is re-prefilled there (a migration: its whole context counts
as migrated tokens). Every turn is recorded with its tokens, tool, payload, status, instance,
bucket, latencies and model version; at the end the router learns from the finished trajectories
(`observe_step`), as after an RL step.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from libra.rollout.engines import Engine
from libra.rollout.envs import Env, Task, prompt
from libra.rollout.protocol import STOPS, observation, parse
from libra.scheduler.causal_tree import TrajectoryPath, path_from_turns
from libra.scheduler.keys import ToolReturn
from libra.scheduler.policies import Router


@dataclass
class TurnRecord:
    turn_idx: int
    context_tokens: int
    gen_tokens: int
    tool_name: str  # "none" on the final turn
    tool_payload_tokens: int
    tool_status: str  # ok | error | timeout | none
    instance: int
    bucket: int
    migrated: bool
    gen_latency_s: float
    tool_latency_s: float
    finish: str  # stop | length


@dataclass
class TrajectoryRun:
    trajectory_id: str
    prompt_id: str
    sample_id: str
    task: Task
    prompt_tokens: int
    ids: list[int]
    instance: int
    bucket: int
    workdir: Path
    episode: object = None
    turns: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    answer: str | None = None
    done: bool = False
    migrated_tokens: int = 0
    started: float = 0.0
    finished: float = 0.0

    @property
    def generated_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)


@dataclass
class RolloutResult:
    trajectories: list[TrajectoryRun]
    wall_s: float
    generate_s: float  # summed over instances' batched calls
    rounds: int

    @property
    def generated_tokens(self) -> int:
        return sum(t.generated_tokens for t in self.trajectories)

    @property
    def migrations(self) -> int:
        return sum(turn.migrated for t in self.trajectories for turn in t.turns)

    @property
    def solved_fraction(self) -> float:
        return sum(t.reward > 0 for t in self.trajectories) / len(self.trajectories) if self.trajectories else 0.0


def rollout(env: Env, tasks: Sequence[Task], samples: int, engines: Sequence[Engine], router: Router, tokenizer, *,
            max_turns: int = 8, max_tokens_per_turn: int = 96, max_context: int = 1536, temperature: float = 1.0,
            seed: int = 0, workroot: str | Path | None = None, tool_threads: int = 4) -> RolloutResult:
    began = time.perf_counter()
    root = Path(workroot or tempfile.mkdtemp(prefix="libra-rollout-"))
    runs: list[TrajectoryRun] = []
    for task in tasks:
        ids = tokenizer(prompt(env, task), add_special_tokens=False)["input_ids"]
        for s in range(samples):
            tid = f"{task.task_id}/{s}"
            workdir = root / tid.replace("/", "_")
            workdir.mkdir(parents=True, exist_ok=True)
            decision = router.start(tid, task.task_id, len(ids))
            instance = min(decision.bucket, len(engines) - 1)
            run = TrajectoryRun(tid, task.task_id, str(s), task, len(ids), list(ids), instance, decision.bucket,
                                workdir, env.open(task, workdir), started=time.perf_counter())
            runs.append(run)
    generate_s, rounds = 0.0, 0
    with ThreadPoolExecutor(max_workers=max(len(engines), tool_threads)) as pool:
        while active := [r for r in runs if not r.done]:
            rounds += 1
            groups = {i: [r for r in active if r.instance == i] for i in range(len(engines))}
            futures = {i: pool.submit(engines[i].generate, [r.ids for r in group], max_tokens_per_turn, STOPS,
                                      temperature, seed + 7919 * rounds)
                       for i, group in groups.items() if group}
            outputs = {i: f.result() for i, f in futures.items()}
            generate_s += sum(gens[0].seconds for gens in outputs.values())
            steps = []
            for i, gens in outputs.items():
                for run, gen in zip(groups[i], gens, strict=True):
                    steps.append((run, gen))
            results = list(pool.map(lambda rg: _act(env, rg[0], rg[1]), steps))
            for (run, gen), (action_kind, tool, obs_text, status, tool_s) in zip(steps, results, strict=True):
                context = len(run.ids)
                run.ids += gen.token_ids
                final = action_kind == "answer"
                payload = [] if final else tokenizer(obs_text, add_special_tokens=False)["input_ids"]
                run.ids += payload
                record = TurnRecord(len(run.turns), context, len(gen.token_ids), "none" if final else tool,
                                    len(payload), "none" if final else status, run.instance, run.bucket,
                                    bool(run.turns) and run.turns[-1].instance != run.instance,
                                    gen.seconds, tool_s, gen.finish)
                run.turns.append(record)
                if final or len(run.turns) >= max_turns or len(run.ids) + max_tokens_per_turn > max_context:
                    run.reward = run.episode.reward(run.answer or "") if final else 0.0
                    run.done, run.finished = True, time.perf_counter()
                    router.finish(run.trajectory_id)
                    continue
                decision = router.on_return(run.trajectory_id, ToolReturn(tool, len(payload), status), len(run.ids))
                run.bucket = decision.bucket
                instance = min(decision.bucket, len(engines) - 1)
                if instance != run.instance:
                    run.migrated_tokens += len(run.ids)
                    run.instance = instance
        router.observe_step([path_of(r) for r in runs], {r.prompt_id: r.prompt_tokens for r in runs})
    return RolloutResult(runs, time.perf_counter() - began, generate_s, rounds)


def _act(env: Env, run: TrajectoryRun, gen) -> tuple[str, str, str, str, float]:
    """Parse a generated turn and run its tool: (kind, tool, observation text, status, tool seconds)."""
    action = parse(gen.text, env.tools)
    if action.kind == "answer":
        run.answer = action.argument
        return "answer", "none", "", "none", 0.0
    if action.kind == "malformed":
        return "malformed", action.name or "malformed", observation(action.error, "error"), "error", 0.0
    began = time.perf_counter()
    try:
        output, status = run.episode.call(action.name, action.argument)
    except Exception as exc:  # a tool bug must not stop the batch
        output, status = f"tool failed: {type(exc).__name__}: {exc}", "error"
    return "tool", action.name, observation(output, status), status, time.perf_counter() - began


def path_of(run: TrajectoryRun) -> TrajectoryPath:
    """The finished trajectory as the causal tree stores it."""
    return path_from_turns(run.prompt_id, run.prompt_tokens,
                           [(t.gen_tokens, t.tool_name, t.tool_payload_tokens, t.tool_status) for t in run.turns])
