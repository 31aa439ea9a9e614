"""Recording simulation results: the store's steps, plans and pool_events tables, and MLflow runs
with plots. Plain functions; the simulation flow's tasks (`tasks/sim_tasks.py`) call them."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from libra.config import LibraConfig, StoreConfig
from storage.ingest import writer_for
from storage.manifest import RunExistsError, read_manifest


def record_store(runs: dict, run: str, store: StoreConfig, replace: bool = False, origin: str = "simulation") -> None:
    """Each system's steps, plans and hybrid events, as store run `run`, created whole in one commit
    (`replace`: replacing a run of that name whole; without it, one that exists is refused, unless
    it is this simulation's own, committed already under the same `origin`: a retry). A
    one-step-off run trains its last batch after its last rollout (`tail_train_s`): the last step's
    row holds that training's tokens and so also its seconds, so that the rows add up to the run
    (its tokens over its total time)."""
    steps, plans, events = [], [], []
    for name, r in runs.items():
        clock = 0.0
        last = len(r.steps) - 1
        for i, s in enumerate(r.steps):
            tail_s = r.tail_train_s if i == last else 0.0
            plan_id = f"{name}/{s.step}"
            steps.append({"step": s.step, "policy": name, "plan_id": plan_id, "start_s": clock,
                          "rollout_s": s.rollout_s, "train_s": s.train_s + tail_s, "step_s": s.step_s + tail_s,
                          "trajectories": None, "gen_tokens": s.gen_tokens, "trained_tokens": s.trained_tokens,
                          "idle_rollout_gpu_s": s.idle_rollout_gpu_s + s.rollout_gpus * tail_s,
                          "idle_train_gpu_s": s.idle_train_gpu_s,
                          "train_gpus": s.train_gpus, "rollout_gpus": s.rollout_gpus, "hybrid_gpus": s.hybrid_gpus,
                          "offpolicy_share": s.offpolicy_share, "version_gap_mean": s.version_gap_mean,
                          "version_gap_max": s.version_gap_max, "suspended": s.suspended, "resumed": s.resumed,
                          "stale_dropped": s.stale_dropped})
            if s.plan_reason:
                c = s.train_config
                plans.append({"step": s.step, "plan_id": plan_id, "applied": True, "reason": f"{name}: {s.plan_reason}",
                              "train_gpus": s.train_gpus, "rollout_gpus": s.rollout_gpus, "hybrid_gpus": s.hybrid_gpus,
                              "train_tp": c.tp, "train_pp": c.pp, "train_dp": c.dp, "train_ep": c.ep,
                              "micro_batch": c.micro_batch, "switch_cost_s": s.switch_cost_s,
                              "rollout_instances": json.dumps([{"tp": tp, "count": n} for tp, n in s.instances])})
            events += [asdict(e) for e in hybrid_lifecycle(name, s, clock)]
            clock += s.step_s + tail_s
    writer = writer_for(store)
    try:
        with writer.transaction(run, mode="replace" if replace else "create", origin=origin, wait_s=0) as tx:
            for table, rows in (("steps", steps), ("plans", plans), ("pool_events", events)):
                if rows:
                    tx.write_run(table, pa.Table.from_pylist(rows))
    except RunExistsError:
        existing = read_manifest(writer.root, run)
        if existing is None or existing.origin != origin:
            raise


def hybrid_lifecycle(system: str, step, start_s: float) -> list:
    """A simulated step's hybrids through the pool's lifecycle table (`libra.pools.states`): each
    leaves the rollout for its tail (join requested), is activated when its snapshot fetch is done,
    and is released at the end of the step; one whose fetch outlasts the training is cancelled."""
    from libra.pools.states import PoolEvent, Role, State, Worker

    released = sorted((at, gpus) for at, event, gpus in step.hybrid_events if event == "leave_rollout")
    joined = sorted(at for at, event, _ in step.hybrid_events if event == "join_training")
    out: list[PoolEvent] = []
    for i, (left, gpus) in enumerate(released):
        times = iter([left] + ([joined[i]] if i < len(joined) else []) + [step.step_s, step.step_s])
        worker = Worker(f"{system}/hybrid-{i}", Role.HYBRID, gpus, out.append, lambda times=times: start_s + next(times))
        worker.move(State.JOINING, "join_requested", step.step, "left the rollout's tail")
        if i < len(joined):
            worker.move(State.TRAINING, "activated", step.step, "snapshot fetched")
            worker.move(State.LEAVING, "leave_requested", step.step, "step done")
            worker.move(State.ROLLOUT, "released", step.step)
        else:
            worker.move(State.ROLLOUT, "cancelled", step.step, "training finished before the fetch")
    return out


def plot_runs(runs: dict, out_dir: Path) -> list[Path]:
    from storage.plots import lines_png

    throughput = {name: ([s.step for s in r.steps], [s.trained_tokens / s.step_s if s.step_s else 0 for s in r.steps])
                  for name, r in runs.items()}
    split = {f"{name} train": ([s.step for s in r.steps], [s.train_gpus for s in r.steps]) for name, r in runs.items()}
    return [lines_png(throughput, "step", "trained tokens / s", out_dir / "throughput.png"),
            lines_png(split, "step", "training GPUs (rest: rollout and hybrid)", out_dir / "gpu_split.png")]


def record_mlflow(runs: dict, summary: dict[str, Any], request: Any, config: LibraConfig) -> str:
    """`request`: the flow's SimulationRequest (its cluster, model, steps and seed are the params)."""
    from tasks.tracking_tasks import log_run

    experiment = config.tracking.experiment(f"sim-{summary['workload']}").replace(":", "-").replace("/", "-")[:200]
    params = {"workload": summary["workload"], "cluster": request.cluster, "model": request.model,
              "steps": request.steps, "seed": request.seed, "rollout_mode": request.rollout_mode}
    with tempfile.TemporaryDirectory() as tmp:
        parent = log_run(experiment, config.tracking.artifact_root, f"{summary['workload']}-{request.cluster}", params, {},
                         artifacts=plot_runs(runs, Path(tmp)), texts={"summary.json": json.dumps(summary, indent=2)})
    for name, r in runs.items():
        m = summary["policies"][name]
        metrics = {"tokens_per_s": m["tokens_per_s"], "step_time_mean_s": m["step_time_mean_s"],
                   "step_time_p99_s": m["step_time_p99_s"], "total_time_s": m["total_time_s"],
                   "idle_rollout_gpu_s": m["idle_gpu_s"]["rollout"], "idle_train_gpu_s": m["idle_gpu_s"]["train"],
                   "offpolicy_token_share": m["offpolicy_share"], "untrained_tokens": m["untrained_tokens"]}
        steps = [(s.step, {"step_s": s.step_s, "rollout_s": s.rollout_s, "train_s": s.train_s, "train_gpus": s.train_gpus})
                 for s in r.steps]
        log_run(experiment, config.tracking.artifact_root, name, {**params, "policy": name}, metrics, steps=steps,
                parent=parent)
    return parent
