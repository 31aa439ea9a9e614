"""Prefect tasks of the rollout flow (`flows/rollout.py`). The engines, the router, the environment
and the tokenizer live in a `LiveRollout` that `start-engines` returns and the flow passes to the
batches' tasks and to `close-engines`; a batch's task returns its `RolloutResult` (the figures the
summary needs), after writing its trajectories and turns to the store in one commit."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.config import LibraConfig


class LiveRollout:
    """A rollout flow run's live engines, tokenizer, environment and router in this process. A plain
    class, not a dataclass: Prefect passes it to tasks as it is (it does not look inside or copy it)."""

    __slots__ = ("request", "config", "engines", "tokenizer", "env", "router", "bounds")

    def __init__(self, request: Any, config: LibraConfig, engines: list, tokenizer: Any, env: Any, router: Any,
                 bounds: tuple[int, ...]) -> None:
        self.request = request  # the flow's RolloutRequest
        self.config = config
        self.engines = engines
        self.tokenizer = tokenizer
        self.env = env
        self.router = router
        self.bounds = bounds  # the router's bucket bounds (tokens)


@task(name="start-engines", cache_policy=NO_CACHE)
def start_engines_task(request, config: LibraConfig) -> LiveRollout:
    """Start the request's engines and its router."""
    from transformers import AutoTokenizer

    from libra.rollout.engines import make_engines
    from libra.rollout.envs import expert_bounds, make_env
    from libra.scheduler.replay import make_router
    from libra.scheduler.routers import Buckets

    tokenizer = AutoTokenizer.from_pretrained(request.policy)
    env = make_env(request.env, config.sandbox)
    buckets = Buckets(request.buckets) if request.buckets else Buckets(expert_bounds(env, request.instances, tokenizer))
    engines = make_engines(request.engine, request.policy, request.instances, request.device, config.rollout.max_context)
    return LiveRollout(request, config, engines, tokenizer, env, make_router(request.router, buckets, {}, config.scheduler),
                       tuple(buckets.bounds))


@task(name="close-engines", cache_policy=NO_CACHE)
def close_engines_task(live: LiveRollout) -> None:
    for engine in live.engines:
        engine.close()


@task(name="rollout-batch", cache_policy=NO_CACHE)
def rollout_batch_task(live: LiveRollout, batch: int):
    """Batch `batch` of the run (tasks drawn with seed + batch), its trajectories and turns written
    to the store as step `batch` (together, replacing that step)."""
    from libra.rollout.agent import rollout
    from storage.ingest import writer_for
    from storage.records import trajectories_table, turns_table

    request, config, env = live.request, live.config, live.env
    run = request.run
    result = rollout(env, env.tasks(request.prompts, seed=request.seed + batch), request.samples, live.engines,
                     live.router, live.tokenizer, max_turns=request.max_turns,
                     max_tokens_per_turn=config.rollout.max_tokens_per_turn, max_context=config.rollout.max_context,
                     temperature=request.temperature, tool_threads=config.rollout.tool_threads,
                     tool_timeout_s=config.rollout.tool_timeout_s,  # (the rollout command had ignored both limits)
                     trajectory_timeout_s=config.rollout.trajectory_timeout_s, seed=request.seed * 1000 + batch)
    records = result.records()
    step_of = {t.prompt_id: batch for t in records}
    with writer_for(config.store).transaction(run, origin="rollout") as tx:
        tx.write_step("trajectories", batch, trajectories_table(run, records, step_of))
        tx.write_step("turns", batch, turns_table(run, records, step_of))
    return result


def summarize(request, results: list) -> dict[str, Any]:
    """The batches' throughput, solved share, lengths, migrations and prefix-cache use."""
    from libra.scheduler.metrics import quantile

    generated = sum(r.generated_tokens for r in results)
    wall = sum(r.wall_s for r in results)
    trajectories = [t for r in results for t in r.trajectories]
    lengths = sorted(len(t.ids) - t.prompt_tokens for t in trajectories)
    return {
        "run": request.run, "env": request.env, "engine": request.engine, "device": request.device,
        "instances": request.instances, "router": request.router, "batches": request.batches,
        "trajectories": len(trajectories), "failed_trajectories": sum(len(r.failed) for r in results),
        "generated_tokens": generated,
        "tokens_per_s": generated / wall if wall > 0 else 0.0, "wall_s": wall,
        "solved_fraction": sum(t.reward > 0 for t in trajectories) / len(trajectories),
        "migrations": sum(r.migrations for r in results),
        "migrated_tokens": sum(t.migrated_tokens for t in trajectories),
        "context_tokens": sum(turn.context_tokens for t in trajectories for turn in t.turns),
        "prefill_tokens": sum(r.prefill_tokens for r in results),
        "turns_mean": sum(len(t.turns) for t in trajectories) / len(trajectories),
        "length_p50": quantile(lengths, 0.5), "length_p90": quantile(lengths, 0.9),
        "makespan_s": [r.wall_s for r in results],
    }


@task(name="track-rollout", cache_policy=NO_CACHE)
def track_rollout_task(summary: dict[str, Any], request, config: LibraConfig) -> str:
    from tasks.tracking_tasks import log_run

    params = {k: summary[k] for k in ("env", "engine", "device", "instances", "router", "batches")} | {
        "prompts": request.prompts, "samples": request.samples, "buckets": summary["buckets"]}
    metrics = {k: float(summary[k]) for k in ("tokens_per_s", "solved_fraction", "migrations", "migrated_tokens",
                                              "generated_tokens", "prefill_tokens", "wall_s")}
    return log_run(config.tracking.experiment("rollout"), config.tracking.artifact_root, summary["run"],
                   params, metrics)
