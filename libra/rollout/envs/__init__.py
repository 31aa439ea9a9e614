"""The three local environments: `search`, `math`, `repo` (see each module)."""

from __future__ import annotations

from libra.errors import LibraError
from libra.rollout.envs.base import Env, Task, demonstration, prompt
from libra.rollout.envs.math_env import MathEnv
from libra.rollout.envs.repo_env import RepoEnv
from libra.rollout.envs.search_env import SearchEnv

ENVS = ("search", "math", "repo")


def make_env(name: str) -> Env:
    factories = {"search": SearchEnv, "math": MathEnv, "repo": RepoEnv}
    if name not in factories:
        raise LibraError(f"unknown environment {name!r}; environments: {', '.join(ENVS)}")
    return factories[name]()


__all__ = ["ENVS", "Env", "Task", "demonstration", "make_env", "prompt"]
