"""Libra's flows as Prefect deployments on a process work pool.

    prefect server start --host 127.0.0.1                     # a Prefect server (SQLite)
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    libra deploy                                              # the pool `libra` and every deployment below
    prefect worker start --pool libra                         # runs deployment runs as local processes
    prefect deployment run 'libra-train/demo' --param steps=3 --watch

A deployment's code is this checkout (its flow file, the entrypoint) and its working directory is
the checkout's root, so the parameters' relative paths (`configs/demo.yaml`, `.libra/store`) mean
what they mean to `libra` run there: a deployment run writes to the same store, checkpoints and
MLflow database as the command. Each deployment's default parameters are a small job; any
parameter of the flow can be given with `--param`.

Retries: no deployment retries a flow run (a training run is resumed by running it again with the
same run name, which continues from its newest checkpoint); within a flow only the recording tasks
retry, since their writes replace a step's rows and so land once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libra.errors import LibraError

ROOT = Path(__file__).resolve().parents[1]
WORK_POOL = "libra"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: a flow (its file and function), a name, its default parameters."""

    entrypoint: str  # flows/<file>.py:<flow function>
    flow_name: str  # the flow's Prefect name: the deployment runs as '<flow_name>/<name>'
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    description: str = ""


DEPLOYMENTS: tuple[DeploymentSpec, ...] = (
    DeploymentSpec("flows/train.py:train_flow", "libra-train", "demo", {"config": "configs/demo.yaml"},
                   "GRPO training of the local policy (the main job); resumes a run of the same name"),
    DeploymentSpec("flows/cluster_plan.py:plan_flow", "libra-plan", "search-r1",
                   {"cluster": "6x8:a800", "model": "qwen3-14b", "trace": "data/traces/fireact_hotpotqa.csv"},
                   "a resource plan from a store run's or a trace's lengths (offline: it moves no workers)"),
    DeploymentSpec("flows/simulate.py:simulate_flow", "libra-simulate", "search-r1",
                   {"workload": "search-r1", "steps": 50, "replace": True},
                   "the simulated systems (whole-system variants) on a simulated cluster, a task per system; each "
                   "run replaces the store run the last one wrote"),
    DeploymentSpec("flows/simulate.py:simulate_sweep_flow", "libra-simulate-sweep", "search-r1-seeds",
                   {"workload": "search-r1", "steps": 50, "seeds": [0, 1, 2], "replace": True},
                   "the simulation once per seed; each run replaces the store runs the last one wrote"),
    DeploymentSpec("flows/trace_analysis.py:trace_analysis_flow", "libra-trace-analysis", "bundled", {},
                   "import agent traces into the store, their statistics into MLflow"),
    DeploymentSpec("flows/rollout.py:rollout_flow", "libra-rollout", "math", {"env": "math", "prompts": 8, "samples": 4},
                   "agentic rollouts on real engines, routed across instances (no training)"),
    DeploymentSpec("flows/pool.py:pool_flow", "libra-pool", "drill", {"steps": 40, "schedule": "5:all,30:0", "verify": True},
                   "the elastic hybrid pool: hybrids join and leave on a schedule"),
)


def server_url() -> str:
    """The Prefect server deployments go to; a LibraError when none is named (a flow without a
    server runs in its own process; deployments need one that outlives it)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise LibraError("deployments live on a Prefect server: start one (`prefect server start --host 127.0.0.1`) "
                         "and set PREFECT_API_URL=http://127.0.0.1:4200/api")
    from flows.runtime import PREFECT_SERVER, reach_server

    reach_server(url, server=PREFECT_SERVER)
    return url


def ensure_work_pool(name: str = WORK_POOL) -> bool:
    """The process work pool `name`, created when missing; whether it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            return True
    if pool.type != "process":
        raise LibraError(f"work pool {name!r} is a {pool.type} pool; Libra's deployments run on a process pool: "
                         "name another (--pool)")
    return False


def deploy(specs: tuple[DeploymentSpec, ...] = DEPLOYMENTS, work_pool: str = WORK_POOL,
           root: Path = ROOT) -> list[str]:
    """Register `specs` on the server (created or updated) for `work_pool`; their names,
    '<flow name>/<deployment name>'."""
    from prefect import flow

    server_url()
    ensure_work_pool(work_pool)
    names = []
    for spec in specs:
        source = flow.from_source(str(root), spec.entrypoint)
        source.deploy(spec.name, work_pool_name=work_pool, parameters=spec.parameters, description=spec.description,
                      build=False, push=False, print_next_steps=False, tags=["libra"])
        if source.name != spec.flow_name:
            raise RuntimeError(f"{spec.entrypoint} is flow {source.name!r}, not {spec.flow_name!r}")
        names.append(f"{spec.flow_name}/{spec.name}")
    return names
