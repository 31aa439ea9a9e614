"""What every environment provides: seeded tasks, an episode per trajectory with its tools and its
reward, and a scripted expert whose demonstrations warm-start the policy."""

from __future__ import annotations

import os
import random
import stat
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

    def partial_credit(self) -> float:
        """The share of the task a wrong answer got right, in [0, 1], from what this episode's tools
        were asked (0 where the environment grades no partial work: `Env.grades_partial_work`)."""
        ...


class Env(Protocol):
    name: str
    tools: tuple[str, ...]
    instructions: str
    grades_partial_work: bool  # its episodes' partial_credit means something (trainer.partial_credit)

    def tasks(self, count: int, seed: int) -> list[Task]: ...

    def open(self, task: Task, workdir: Path) -> Episode: ...

    def expert(self, task: Task) -> Callable[[str], str]:
        """A scripted solver: given the transcript so far, the next model turn."""
        ...

    def problem(self, task: Task) -> str:
        """What makes two tasks the same problem, whatever their wording: supervision on other seeds
        leaves out the held-out tasks' problems."""
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


class WorkFileError(Exception):
    """A working-directory file a tool may not use as it stands (not a plain file, or too large)."""


def read_work_file(workdir: Path, name: str, limit: int = 1 << 20) -> str:
    """Read the plain file `name` of a working directory that sandboxed code could write to, as the
    host: never through a link, a FIFO or a device the code may have put in its place."""
    try:
        fd = os.open(workdir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise WorkFileError(f"{name} cannot be read ({_reason(exc)})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WorkFileError(f"{name} is not a plain file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise WorkFileError(f"{name} is larger than {limit} bytes")
    return data.decode("utf-8", "replace")


def write_work_file(workdir: Path, name: str, text: str) -> None:
    """(Re)write the file `name` of a working directory as the host: whatever stands there (a link
    included) is removed first, and the new file is created, never opened through a link. What the
    sandboxed code did to the directory (a directory in the file's place, the directory filled up)
    is a `WorkFileError`, the tool's answer to the model, not a failure of the environment."""
    path = workdir / name
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise WorkFileError(f"{name} is a directory") from None
    except OSError as exc:
        raise WorkFileError(f"{name} cannot be replaced ({_reason(exc)})") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise WorkFileError(f"{name} cannot be written ({_reason(exc)})") from None


def _reason(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()
