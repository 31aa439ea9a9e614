"""The three local environments: `search`, `math`, `repo` (see each module)."""

from __future__ import annotations

from libra.config import SandboxConfig
from libra.errors import LibraError
from libra.rollout.envs.base import Env, Task, demonstration, prompt
from libra.rollout.envs.math_env import MathEnv
from libra.rollout.envs.repo_env import RepoEnv
from libra.rollout.envs.search_env import SearchEnv
from libra.rollout.workroots import temporary_workroot

ENVS = ("search", "math", "repo")
HELD_OUT_SEED = 0  # the held-out tasks' seed: what a training run evaluates on (and `libra rollout`'s default)


def make_env(name: str, sandbox: SandboxConfig | None = None) -> Env:
    """The environment `name`; the ones that run code run it in the sandbox `sandbox` configures."""
    if name not in ENVS:
        raise LibraError(f"unknown environment {name!r}; environments: {', '.join(ENVS)}")
    if name == "search":
        return SearchEnv()
    return (MathEnv if name == "math" else RepoEnv)(sandbox=sandbox)


def fresh_tasks(env: Env, count: int, seed: int, held_out: int, hint: str) -> list[Task]:
    """The first `count` tasks of `seed` whose problem (`Env.problem`) is none of the first
    `held_out` held-out tasks', or a LibraError ending in `hint` when they are too rare to find:
    what supervision and training draw, so that the held-out reward measures problems not seen."""
    taken = {env.problem(task) for task in env.tasks(held_out, seed=HELD_OUT_SEED)}
    drawn = count
    while True:
        fresh = [task for task in env.tasks(drawn, seed=seed) if env.problem(task) not in taken]
        if len(fresh) >= count:
            return fresh[:count]
        if drawn >= 16 * count:
            raise LibraError(f"only {len(fresh)} of {drawn} {env.name} tasks are problems outside the first {held_out} "
                             f"held-out tasks, short of {count}: {hint}")
        drawn *= 2


def expert_bounds(env: Env, instances: int, tokenizer, tasks: int = 24) -> tuple[int, ...]:
    """Bucket bounds for `instances` buckets at quantiles of the expert's trajectory lengths (tokens
    after the prompt) on `tasks` held-out tasks: the buckets a router starts from."""
    lengths = []
    for task in env.tasks(tasks, seed=20_000):
        with temporary_workroot("libra-bounds-") as workdir:
            text, _ = demonstration(env, task, workdir)
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"])
                       - len(tokenizer(prompt(env, task), add_special_tokens=False)["input_ids"]))
    lengths.sort()
    bounds = sorted({max(1, lengths[min(len(lengths) - 1, len(lengths) * (i + 1) // instances)]) for i in range(instances - 1)})
    return tuple(bounds) or (max(lengths),)


__all__ = ["ENVS", "HELD_OUT_SEED", "Env", "Task", "demonstration", "expert_bounds", "fresh_tasks", "make_env", "prompt"]
