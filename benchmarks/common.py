"""Shared helpers: timing, machine description and result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libra.config import LibraConfig
    from libra.planner.calibrate import FitResult
    from libra.planner.cost_model import CostModel
    from libra.rl.cluster import LocalCluster
    from libra.sim.workloads import SimTrajectory

OUT = Path(__file__).resolve().parent / "out"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){memory}, Python {platform.python_version()}"


# the measurements the simulator's default decode coefficients are fitted to (libra/planner/cost_model.py):
# simulator benchmarks record it, so a table measured under an earlier physics says so
DECODE_FIT = "data/gpu/h200_qwen3_14b_tp1.json"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    times = [timed(fn)[0] for _ in range(repeats)]
    return statistics.median(times), times


def spread(values: list[float]) -> dict[str, float]:
    """The mean and range of a figure over runs (seeds)."""
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def save(name: str, result: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2) + "\n")
    return path


def saved(name: str) -> dict[str, Any]:
    """A benchmark's saved result (to keep the parts a partial run does not measure again)."""
    path = OUT / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run the whole benchmark once before measuring one part")
    return json.loads(path.read_text())


def run_locations(base: Path) -> dict[str, Any]:
    """Config sections that put a benchmark's training runs (store, MLflow, Prefect) under `base`."""
    return {"store": {"root": str(base / "store"), "fsync": False},
            "tracking": {"tracking_uri": f"sqlite:///{base / 'mlflow.db'}", "artifact_root": str(base / "artifacts")},
            "orchestration": {"prefect_home": str(base / "prefect")}}


def quiet_engines() -> None:
    """vLLM's logs at errors only and no transformers progress bars (the benchmark prints its own lines)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


@dataclass(frozen=True)
class Replay:
    """Live runs as the simulator replays them: one run's trajectories, step by step, and this
    machine's physics fitted to the timings of all of them."""

    batches: list[list[SimTrajectory]]
    cost: CostModel  # the machine's cost model with the fitted coefficients
    cluster: LocalCluster
    calibration: FitResult
    timings: list[dict]  # the runs' timing rows


def replay_of(config: LibraConfig, runs: Sequence[str], trajectories_of: str) -> Replay:
    """The store runs `runs` (under `config.store`) fitted (`calibrate.fit`, as `libra plan
    --calibrate` does) and run `trajectories_of`'s turns as the simulator's batches."""
    from dataclasses import replace

    from libra.planner.calibrate import fit, samples_from_rows
    from libra.rl.placing import local_cluster
    from libra.rl.planning import local_cost_model
    from libra.rl.simulated import batches_from_turns
    from libra.rollout.policy import SHIPPED
    from storage.catalog import Catalog

    timings: list[dict] = []
    turns: list[dict] = []
    for run in runs:
        with Catalog(config.store.root, run) as catalog:
            timings += catalog.query("SELECT * FROM timings").to_pylist()
            if run == trajectories_of:
                turns = catalog.query("SELECT * FROM turns").to_pylist()
    cluster = local_cluster(config)
    cost = local_cost_model(cluster, SHIPPED.name, json.loads((SHIPPED / "config.json").read_text()), config.planner)
    fitted = fit(cost, samples_from_rows(timings))
    return Replay(batches_from_turns(turns), replace(cost, coefficients=fitted.coefficients), cluster, fitted, timings)
