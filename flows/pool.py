"""The elastic hybrid pool as a Prefect flow: core ranks train a small MLP while hybrids join and
leave on a schedule of desired counts (as the planner would set them), with workers killed on cue.

    train-pool       the pool's processes (local, or Ray actors), the schedule and the kills
    record-events    every hybrid transition into the store's `pool_events`
    verify-pool      (optional) a core-only run of the same steps, compared parameter by parameter
    track-pool       the run in MLflow

`libra pool` and the `libra-pool` deployment call `pool_flow`; `pool_request` checks the
parameters first.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from prefect import flow

from libra.checks import Names, as_parameter, count_of, in_range
from libra.config import LibraConfig, PoolConfig
from libra.errors import LibraError

MAX_STEPS = 1_000_000  # a pool run's steps at most


@dataclass(frozen=True)
class PoolRequest:
    """A checked pool run."""

    steps: int
    core: int  # core ranks
    hybrids: int
    schedule: tuple[tuple[int, int], ...]  # (from step, desired hybrids), by step
    kills: tuple[tuple[str, int], ...]  # (hybrid, at step): SIGKILL once training reaches it
    provider: str  # local or ray
    hidden: int  # the MLP's width
    batch: int  # the global batch
    pace: float  # least seconds a step takes
    run: str


def pool_request(steps: int = 60, schedule: str = "10:all,40:0", kill: list[str] | None = None, core: int | None = None,
                 hybrids: int | None = None, provider: str | None = None, hidden: int = 256, batch: int = 48,
                 pace: float = 0.05, run: str | None = None, pool: PoolConfig | None = None,
                 names: Names = as_parameter) -> PoolRequest:
    """The request (core ranks, hybrids and provider from `pool`, the config's section, when not
    given), or a LibraError naming the parameter that is wrong."""
    from storage.writer import check_run_name

    settings = pool or PoolConfig()
    for name, value, high in (("steps", steps, MAX_STEPS), ("core", core, 4_096), ("hybrids", hybrids, 4_096),
                              ("hidden", hidden, 65_536), ("batch", batch, 1_000_000), ("pace", pace, 60.0)):
        in_range(names(name), value, -math.inf, high)  # the least values are checked below, together
    core = settings.core_ranks if core is None else core
    hybrids = settings.hybrids if hybrids is None else hybrids
    provider = provider or settings.provider
    if provider not in ("local", "ray"):
        raise LibraError(f"{names('provider')} {provider!r}: providers are local and ray")
    if steps < 1 or core < 1 or hybrids < 0 or hidden < 1 or batch < core + hybrids or pace < 0:
        raise LibraError(f"need {names('steps')} >= 1, {names('core')} >= 1, {names('hybrids')} >= 0, "
                         f"{names('hidden')} >= 1, {names('pace')} >= 0 and {names('batch')} >= core + hybrids "
                         f"({core + hybrids}); got {steps}, {core}, {hybrids}, {hidden}, {pace}, {batch}")
    return PoolRequest(steps, core, hybrids, tuple(sorted(parse_schedule(schedule, hybrids, names).items())),
                       tuple(parse_kills(kill or [], hybrids, steps, names)), provider, hidden, batch, pace,
                       check_run_name(run or time.strftime("pool-%Y%m%d-%H%M%S")))


def parse_schedule(text: str, hybrids: int, names: Names = as_parameter) -> dict[int, int]:
    """`10:all,40:0` -> {10: hybrids, 40: 0} (a step past the run's end never comes: the default
    schedule's, in a short run)."""
    schedule = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        step, _, count = part.partition(":")
        step, count = step.strip(), count.strip()
        if not (step.isascii() and step.isdigit() and (count == "all" or (count.isascii() and count.isdigit()))):
            raise LibraError(f"{names('schedule')} entry {part[:40]!r} is not STEP:COUNT (e.g. 10:2,40:0)")
        at, value = count_of(step, MAX_STEPS), hybrids if count == "all" else count_of(count, hybrids)
        if at is None or value is None:
            raise LibraError(f"{names('schedule')} entry {part[:40]!r}: need STEP <= {MAX_STEPS:,} (the most "
                             f"{names('steps')} allows) and 0 <= COUNT <= {hybrids} hybrids")
        if at in schedule:
            raise LibraError(f"{names('schedule')} gives step {at} twice; give each step once (e.g. 10:2,40:0)")
        schedule[at] = value
    if not schedule:
        raise LibraError(f"{names('schedule')} {text!r} gives no STEP:COUNT; give at least one (e.g. 10:2,40:0)")
    return schedule


def parse_kills(items: list[str], hybrids: int, steps: int, names: Names = as_parameter) -> list[tuple[str, int]]:
    """`hybrid-1@20` -> ("hybrid-1", 20); a step at or past `steps` would never come, and is refused."""
    kills = []
    known = {f"hybrid-{i}" for i in range(hybrids)}
    for item in items:
        worker, _, step = item.partition("@")
        if worker not in known or not (step.isascii() and step.isdigit()):
            raise LibraError(f"{names('kill')} {item[:60]!r}: expected HYBRID@STEP with HYBRID one of "
                             f"{', '.join(sorted(known)) or '(no hybrids)'}")
        at = count_of(step, steps - 1)
        if at is None:
            raise LibraError(f"{names('kill')} {item[:60]!r}: step {step[:20]} is past the run's {steps} steps "
                             f"({names('steps')}); give a STEP below {steps}")
        kills.append((worker, at))
    return kills


@flow(name="libra-pool", log_prints=False)
def pool_flow(steps: int = 60, schedule: str = "10:all,40:0", kill: list[str] | None = None, core: int | None = None,
              hybrids: int | None = None, provider: str | None = None, hidden: int = 256, batch: int = 48,
              pace: float = 0.05, verify: bool = False, run: str | None = None, track: bool = True,
              config: LibraConfig | str | None = None, store: str | None = None) -> dict[str, Any]:
    """The run's summary (steps, replicas, retried steps, events by kind; with `verify`, the largest
    parameter difference from a core-only run) and its transitions (PoolEvent records, in order)."""
    from flows.runtime import flow_config
    from storage.writer import ANOTHER, refuse_existing
    from tasks.pool_tasks import (
        record_events_task,
        summarize,
        track_pool_task,
        train_pool_task,
        verify_pool_task,
    )

    settings = flow_config(config, {"store.root": store}, tracking=track)
    request = pool_request(steps, schedule, kill, core, hybrids, provider, hidden, batch, pace, run, settings.pool)
    refuse_existing(settings.store.root, request.run, ANOTHER)  # its events would join that run's
    outcome = train_pool_task(request, settings.pool)
    record_events_task(request.run, outcome.events, settings.store)
    summary = summarize(request, outcome)
    if verify:
        summary["max_abs_diff_vs_core_only"] = verify_pool_task(request, settings.pool, outcome.model)
    if track:
        summary["mlflow_run_id"] = track_pool_task(summary, request, outcome, settings)
    return summary | {"transitions": outcome.events}
