"""A batch of agentic rollouts on real engines as a Prefect flow (no training).

    start-engines     the policy's engines on their share of the cores or GPUs, the router, the environment
    rollout-batch     one task per batch: the trajectories (tools sandboxed), written to the store;
                      the router learns between batches
    close-engines     always, also after a failure
    track-rollout     the batches' figures as an MLflow run

`libra rollout` and the `libra-rollout` deployment call `rollout_flow`; `rollout_request` checks
the parameters first (the config's rollout section gives what they leave open).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prefect import flow

from libra.checks import Names, as_parameter, context_beyond_policy, in_range, missing_policy, token_bounds
from libra.config import LibraConfig, RolloutConfig
from libra.errors import LibraError


@dataclass(frozen=True)
class RolloutRequest:
    """A checked batch of rollouts."""

    env: str  # search, math or repo
    prompts: int  # tasks per batch
    samples: int  # samples per task
    batches: int
    engine: str  # vllm or hf
    instances: int
    device: str  # cpu or cuda
    router: str
    buckets: tuple[int, ...]  # bucket bounds in tokens (empty: quantiles of the environment's expert lengths)
    policy: str  # HF-format policy directory
    temperature: float
    max_turns: int
    seed: int
    run: str


def rollout_request(env: str, prompts: int = 32, samples: int = 8, batches: int = 1, engine: str | None = None,
                    instances: int | None = None, device: str | None = None, router: str | None = None,
                    buckets: str = "auto", policy: str = ".libra/policy", temperature: float | None = None,
                    max_turns: int | None = None, seed: int = 0, run: str | None = None,
                    rollout: RolloutConfig | None = None, names: Names = as_parameter) -> RolloutRequest:
    """The request (what it leaves open from `rollout`, the config's section), or a LibraError
    naming the parameter that is wrong."""
    from libra.rollout.envs import ENVS
    from libra.scheduler.replay import LIVE_ROUTERS, check_routers
    from storage.writer import check_run_name

    r = rollout or RolloutConfig()
    def given(value, default):
        return default if value is None else value

    engine, instances, device = given(engine, r.engine), given(instances, r.instances), given(device, r.device)
    router, temperature, max_turns = given(router, r.router), given(temperature, r.temperature), given(max_turns, r.max_turns)
    if env not in ENVS:
        raise LibraError(f"unknown environment {env!r}; environments: {', '.join(ENVS)}")
    for name, value, high in (("prompts", prompts, 10_000), ("samples", samples, 1_024), ("batches", batches, 10_000),
                              ("instances", instances, 256), ("max_turns", max_turns, 1_000)):
        in_range(names(name), value, 1, high)
    in_range(names("temperature"), temperature, 0.0, 100.0)
    in_range(names("seed"), seed, 0, 2**31 - 1)
    if engine not in ("vllm", "hf"):
        raise LibraError(f"{names('engine')} {engine!r}: engines are vllm and hf")
    if device not in ("cpu", "cuda"):
        raise LibraError(f"{names('device')} {device!r}: devices are cpu and cuda")
    check_routers([router], LIVE_ROUTERS, names("router"))
    bounds = () if buckets == "auto" else tuple(token_bounds(names("buckets"), buckets))
    if (missing := missing_policy(policy, names("policy"))) is not None:
        raise LibraError(missing)
    if (beyond := context_beyond_policy(policy, r.max_context)) is not None:  # (vLLM's 226-line traceback)
        raise LibraError(beyond)
    if device == "cuda":
        from libra.devices import require_gpus

        require_gpus(instances, f"{names('device')} cuda with {instances} instance(s)",
                     f"use fewer {names('instances')} or {names('device')} cpu")
    run = check_run_name(run or time.strftime(f"rollout-{env}-%Y%m%d-%H%M%S"))
    return RolloutRequest(env, prompts, samples, batches, engine, instances, device, router, bounds, policy,
                          temperature, max_turns, seed, run)


@flow(name="libra-rollout", log_prints=False)
def rollout_flow(env: str, prompts: int = 32, samples: int = 8, batches: int = 1, engine: str | None = None,
                 instances: int | None = None, device: str | None = None, router: str | None = None,
                 buckets: str = "auto", policy: str = ".libra/policy", temperature: float | None = None,
                 max_turns: int | None = None, seed: int = 0, run: str | None = None, track: bool = True,
                 config: LibraConfig | str | None = None, store: str | None = None) -> dict[str, Any]:
    """The batches' throughput and trajectory statistics (`tasks.rollout_tasks.summarize`)."""
    from flows.runtime import flow_config, quiet_engines
    from storage.writer import ANOTHER, refuse_existing
    from tasks.rollout_tasks import (
        close_engines_task,
        rollout_batch_task,
        start_engines_task,
        summarize,
        track_rollout_task,
    )

    settings = flow_config(config, {"store.root": store}, tracking=track)
    request = rollout_request(env, prompts, samples, batches, engine, instances, device, router, buckets, policy,
                              temperature, max_turns, seed, run, settings.rollout)
    refuse_existing(settings.store.root, request.run, ANOTHER)  # its batches would replace that run's steps
    quiet_engines()
    live = start_engines_task(request, settings)
    try:
        results = [rollout_batch_task(live, batch) for batch in range(request.batches)]
    finally:
        close_engines_task(live)
    summary = summarize(request, results) | {"buckets": list(live.bounds)}
    if track:
        summary["mlflow_run_id"] = track_rollout_task(summary, request, settings)
    return summary
