"""Building the local policy outside a flow run: `libra policy init` calls `policy_settings` to check
its flags and `build_policy` to train (or reuse) the policy; `libra policy tune` calls
`tune_settings` and `tune`, which continues its supervision on one environment. Plain functions, not Prefect flows:
the build reports its own progress and starts no Prefect server; the training flow builds the
default policy itself when it is missing (`tasks.train_tasks.prepare_policy_task`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from libra.checks import Names, as_parameter, in_range
from libra.config import SandboxConfig
from libra.rollout.policy import PolicySettings, TuneSettings


def policy_settings(steps: int | None = None, demos: int | None = None, names: Names = as_parameter) -> PolicySettings:
    """The default settings with the given supervised training steps and demonstrations per
    environment, or a LibraError naming the value out of range."""
    settings = PolicySettings()
    in_range(names("steps"), steps, 1, 1_000_000)
    in_range(names("demos"), demos, settings.batch, 1_000_000)
    if steps is not None:
        settings = replace(settings, steps=steps)
    if demos is not None:
        settings = replace(settings, demos_per_env=demos)
    return settings


def build_policy(out: str | Path, settings: PolicySettings, sandbox: SandboxConfig, rebuild: bool,
                 log: Callable[[str], None], progress: Callable[[int, int, float], None]) -> dict:
    """Train the policy in `out` (or keep the one there, or copy the shipped one, when built with
    `settings`, unless `rebuild`); its record (`libra.rollout.policy.init_policy`)."""
    from libra.rollout.policy import init_policy

    return init_policy(out, settings, log=log, progress=progress, sandbox=sandbox, rebuild=rebuild)


def tune_settings(env: str | None = None, demos: int | None = None, lr: float | None = None, batch: int | None = None,
                  held_out: int | None = None, names: Names = as_parameter) -> TuneSettings:
    """The default tuning with the given environment, demonstrations, learning rate, batch and
    held-out tasks left out, or a LibraError naming the value out of range."""
    settings = TuneSettings()
    in_range(names("demos"), demos, 1, 10_000_000)
    in_range(names("batch"), batch, 1, 65_536)
    in_range(names("lr"), lr, 1e-8, 1.0)
    in_range(names("held_out"), held_out, 0, 1_000_000)
    changes = {k: v for k, v in {"env": env, "demonstrations": demos, "lr": lr, "batch": batch,
                                 "held_out": held_out}.items() if v is not None}
    return replace(settings, **changes)  # TuneSettings checks the environment and that a batch fits


def tune(out: str | Path, base: str | Path, settings: TuneSettings, sandbox: SandboxConfig, rebuild: bool,
         log: Callable[[str], None], progress: Callable[[int, int, float], None]) -> dict:
    """The policy in `base` tuned with `settings` into `out` (or the one there kept, or the shipped one
    copied, when tuned from the same weights with `settings`, unless `rebuild`); its record
    (`libra.rollout.policy.tune_policy`)."""
    from libra.rollout.policy import tune_policy

    return tune_policy(out, base, settings, log=log, progress=progress, sandbox=sandbox, rebuild=rebuild)
