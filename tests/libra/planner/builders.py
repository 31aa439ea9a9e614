"""Builders for planner tests."""

from pathlib import Path

from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.planner.workload import Workload, build_workload, lengths_from_trajectories
from libra.traces import read_trace

TRACES = Path(__file__).resolve().parents[3] / "data" / "traces"


def trace_workload(name: str, batch: int = 512, scale: float = 1.0) -> Workload:
    trace = read_trace(TRACES / f"{name}.csv")
    return build_workload(lengths_from_trajectories(trace.trajectories), batch).scaled(scale)


def a800_14b(cluster: str = "6x8:a800") -> CostModel:
    return CostModel(parse_cluster(cluster), MODELS["qwen3-14b"])
