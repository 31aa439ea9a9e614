"""Tasks of the routing flows (`flows/routing.py`): a trace replayed through the routers, and a
causal prefix tree rebuilt from a store run and saved."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from libra.clock import WallClock
from libra.config import LibraConfig
from libra.errors import LibraError

ReplayProgress = Callable[[str, int, int], None]  # told (router, steps replayed, steps) as a replay goes on


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


@task(name="replay-routers", cache_policy=NO_CACHE)
def replay_task(request, config: LibraConfig, progress: ReplayProgress | None = None) -> dict[str, Any]:
    """Every router of `request` (`flows.routing.RouterRequest`) over its trace in RL order, and
    the clairvoyant bound: the report `libra eval-router` prints. `progress` hears of each step
    replayed (the CLI's progress bar)."""
    from libra.scheduler.replay import replay
    from libra.traces import read_trace

    trace = read_trace(request.trace)

    def step_done(name: str, done: int, steps: int) -> None:
        if progress is not None:
            progress(name, done, steps)

    result = replay(trace.trajectories, prompts_per_step=request.prompts_per_step, order=request.order,
                    bounds=None if request.buckets is None else list(request.buckets), routers=list(request.routers),
                    settings=config.scheduler, clock=WallClock(), progress=step_done)
    return {
        "trace": request.trace,
        "order": request.order,
        "buckets": list(result.buckets),
        "steps": result.steps,
        "warmup_steps": result.warmup_steps,
        "policies": {name: {k: _clean(v) for k, v in asdict(r).items()} for name, r in result.routers.items()},
        "bound": None if result.bound is None else {k: _clean(v) for k, v in asdict(result.bound).items()},
    }


@dataclass(frozen=True)
class StorePaths:
    """A run's rows for a tree: a row per trajectory (its lengths) and a row per tool return."""

    lengths: list[dict]
    returns: list[dict]


@task(name="read-paths", cache_policy=NO_CACHE)
def read_paths_task(run: str, last_steps: int, config: LibraConfig) -> StorePaths:
    """The run's trajectories' lengths and tool returns (named queries trajectory_lengths and
    remaining_length_paths) over its last `last_steps` steps (0: all)."""
    from storage.catalog import Catalog
    from storage.queries import run_named

    with Catalog(config.store.root, run, threads=config.store.duckdb_threads) as catalog:
        rows = run_named(catalog, "trajectory_lengths", last_steps=last_steps).to_pylist()
        returns = run_named(catalog, "remaining_length_paths", last_steps=last_steps).to_pylist()
    return StorePaths(rows, returns)


@task(name="save-tree", cache_policy=NO_CACHE)
def save_tree_task(paths: StorePaths, granularity: str, out: str, config: LibraConfig) -> dict[str, Any]:
    """The causal prefix tree of those paths (the scheduler's payload classes, window and node
    bound), saved atomically as JSON; its size."""
    from libra.scheduler.causal_tree import GLOBAL, CausalTree, paths_from_rows
    from libra.scheduler.keys import KeyScheme

    s = config.scheduler
    tree = CausalTree(KeyScheme(granularity, tuple(s.payload_bounds)), s.window, s.max_nodes, size_roots=True)
    tree.rebuild(paths_from_rows(paths.lengths, paths.returns))
    try:
        tree.save(out)
    except OSError as exc:
        raise LibraError(f"cannot write {out}: {exc.strerror}") from None
    return {"out": out, "trajectories": len(paths.lengths), "tool_returns": len(paths.returns), "nodes": tree.nodes,
            "roots": len(tree.roots), "global_root_samples": tree.roots[GLOBAL].count}
