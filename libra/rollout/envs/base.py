"""What every environment provides: seeded tasks, an episode per trajectory with its tools and its
reward, and a scripted expert whose demonstrations warm-start the policy."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from libra.rollout.protocol import observation, parse


@dataclass(frozen=True)
class Task:
    env: str
    task_id: str  # the prompt id (samples of a task share it)
    question: str
    answer: str  # the reference the reward checks
    data: dict = field(default_factory=dict, hash=False, compare=False)


class Episode(Protocol):
    def call(self, name: str, argument: str) -> tuple[str, str]:
        """Run a tool: (output, status ok | error | timeout)."""
        ...

    def reward(self, answer: str) -> float: ...


class Env(Protocol):
    name: str
    tools: tuple[str, ...]
    instructions: str

    def tasks(self, count: int, seed: int) -> list[Task]: ...

    def open(self, task: Task, workdir: Path) -> Episode: ...

    def expert(self, task: Task) -> Callable[[str], str]:
        """A scripted solver: given the transcript so far, the next model turn."""
        ...


def prompt(env: Env, task: Task) -> str:
    return f"{env.instructions}\nTools: {', '.join(env.tools)}.\nQuestion: {task.question}\n"


def demonstration(env: Env, task: Task, workdir: Path, max_turns: int = 12) -> tuple[str, list[tuple[int, int]]]:
    """The expert's transcript with real tool outputs, and the character spans the model wrote
    (the parts a supervised loss trains on)."""
    episode = env.open(task, workdir)
    solver = env.expert(task)
    text = prompt(env, task)
    spans = []
    for _ in range(max_turns):
        turn = solver(text)
        spans.append((len(text), len(text) + len(turn)))
        text += turn
        action = parse(turn, env.tools)
        if action.kind == "answer":
            break
        output, status = episode.call(action.name, action.argument) if action.kind == "tool" else (action.error, "error")
        text += observation(output, status)
    return text, spans


def rng_for(seed: int, index: int, salt: str) -> random.Random:
    return random.Random(f"{salt}:{seed}:{index}")
