"""The routing flows: the routers scored on a per-turn trace, and a causal prefix tree rebuilt
from a store run.

    libra-eval-router   replay-routers: C-MLFQ, Libra's router and the baselines over the trace in RL
                        order (warm-up on the first 30% of steps), and the clairvoyant bound
    libra-tree          read-paths, save-tree: the run's trajectories and tool returns into a tree,
                        saved atomically as JSON for a router to load

`libra eval-router` and `libra tree` call these flows; `router_request` and `tree_request` check
the parameters before anything starts, naming each as the caller spells it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow

from libra.checks import Names, as_parameter, field_range, in_range, token_bounds
from libra.config import LibraConfig, TracesConfig
from libra.errors import LibraError
from libra.scheduler.causal_tree import is_tree_file
from tasks.routing_tasks import ReplayProgress

MAX_DECISIONS = 20_000_000  # routing decisions one router's replay may record (about 100 bytes each)


@dataclass(frozen=True)
class RouterRequest:
    """A checked evaluation: which trace, bucketed how, replayed in which order, by which routers."""

    trace: str
    buckets: tuple[int, ...] | None  # bucket bounds in tokens (None: the warm-up's p50/p90)
    order: str  # 'group' or 'epochs:N'
    routers: tuple[str, ...]
    prompts_per_step: int


def router_request(trace: str, config: LibraConfig, buckets: str = "auto", order: str = "group",
                   routers: str | list[str] | None = None, prompts_per_step: int | None = None,
                   names: Names = as_parameter) -> RouterRequest:
    """The request, or a LibraError saying which parameter is wrong and what to give instead. The
    trace is read whole here: a bad one is the caller's error, found before anything starts."""
    from libra.scheduler.replay import ROUTERS, check_routers, parse_order
    from libra.traces import read_trace

    in_range(names("prompts_per_step"), prompts_per_step, *field_range(TracesConfig, "prompts_per_step"))
    per_step = prompts_per_step if prompts_per_step is not None else config.traces.prompts_per_step
    epochs = parse_order(order, names("order"))
    bounds = None if buckets == "auto" else tuple(token_bounds(names("buckets"), buckets))
    if routers is None:
        chosen = list(ROUTERS)
    else:
        given = routers.split(",") if isinstance(routers, str) else list(routers)
        chosen = list(dict.fromkeys(r.strip() for r in given if r.strip()))
        if not chosen:
            raise LibraError(f"{names('routers')} {routers!r}: name at least one router, or leave it out for all")
    check_routers(chosen, ROUTERS, names("routers"))
    rows = read_trace(trace).rows
    if epochs * rows > MAX_DECISIONS:
        raise LibraError(f"{names('order')} {order}: {epochs:,} epochs of {rows:,} turns make up to {epochs * rows:,} "
                         f"routing decisions per router, more than the {MAX_DECISIONS:,} a replay may hold; "
                         "use fewer epochs")
    return RouterRequest(trace, bounds, order, tuple(chosen), per_step)


@flow(name="libra-eval-router", log_prints=False)
def eval_router_flow(trace: str, buckets: str = "auto", order: str = "group", routers: str | list[str] | None = None,
                     prompts_per_step: int | None = None, config: LibraConfig | str | None = None,
                     progress: ReplayProgress | None = None, policies: str | list[str] | None = None) -> dict[str, Any]:
    """Per router: accuracy, balanced accuracy, rank correlation of its remaining-length estimate,
    migrated-token ratio, decisions and decision latency; and the clairvoyant bound. `progress`
    hears of each step replayed (the CLI's progress bar); `policies` is the old name of `routers`."""
    from flows.runtime import flow_config
    from libra.renames import renamed_parameter
    from tasks.routing_tasks import replay_task

    routers = renamed_parameter("policies", "routers", policies, routers, None)
    settings = flow_config(config, tracking=False)
    request = router_request(trace, settings, buckets, order, routers, prompts_per_step)
    return replay_task(request, settings, progress)


@dataclass(frozen=True)
class TreeRequest:
    run: str
    out: str
    last_steps: int  # 0: all
    granularity: str  # 'fine' (tool names as recorded) or 'coarse' (by family)


def tree_request(run: str, out: str, last_steps: int = 0, granularity: str = "coarse",
                 names: Names = as_parameter) -> TreeRequest:
    from storage.writer import check_run_name

    in_range(names("last_steps"), last_steps, 0, 1_000_000_000)
    target = Path(out)
    if not out or target.name in ("", ".", "..") or out.endswith("/"):
        raise LibraError(f"{names('out')} {out!r} does not name a file; give FILE.json")
    folder = target.parent
    if not folder.is_dir():
        raise LibraError(f"cannot write {out}: {folder} is not a directory; create it or name another {names('out')}")
    if os.path.lexists(target) and not is_tree_file(target):  # what is there is never replaced by a tree
        raise LibraError(f"{names('out')} {out} exists and is not a causal tree file (a file of another kind, a "
                         f"directory, a device, a FIFO or a link); remove it or name another {names('out')}")
    if granularity not in ("fine", "coarse"):
        raise LibraError(f"{names('granularity')} {granularity!r}: use 'fine' or 'coarse'")
    return TreeRequest(check_run_name(run), out, last_steps, granularity)


@flow(name="libra-tree", log_prints=False)
def tree_flow(run: str, out: str, last_steps: int = 0, granularity: str = "coarse",
              config: LibraConfig | str | None = None, store: str | None = None) -> dict[str, Any]:
    """The tree's size and where it was saved."""
    from flows.runtime import flow_config
    from tasks.routing_tasks import read_paths_task, save_tree_task

    settings = flow_config(config, {"store.root": store}, tracking=False)
    request = tree_request(run, out, last_steps, granularity)
    paths = read_paths_task(request.run, request.last_steps, settings)
    if not paths.lengths:  # a pool's or a simulation's run: no trajectories to build a tree from (it saved 1 node)
        raise LibraError(f"run {request.run!r} holds no trajectories to build a tree from (a pool's or a simulation's "
                         "run); name an imported trace's or a training run (libra runs)")
    return {"run": request.run, **save_tree_task(paths, request.granularity, request.out, settings)}
