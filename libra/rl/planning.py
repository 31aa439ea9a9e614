"""The live run's planning, as pure functions: what the run measured -> the planner's inputs, and
the planner's outputs -> the store's rows.

    timing_rows(step, decode, update, placement, cluster, model)   # one iteration's samples, for the store
    live_variants(cluster, config)                                  # the placements the planner searches
    move_held(plan, cluster, plan_id, calibrating)                  # why a move that pays must wait
    plan_row(...), move_rows(...)                                   # a plan and the moves it made, as rows

The planning flow (`flows/replanning.py`) reads the rows back with DuckDB, fits the cost model to them
(`libra.planner.calibrate.fit`), and lets the `PlanController` decide, so the planner that plans a
simulated cluster plans this machine too, from what this run measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from libra.config import PlannerConfig
from libra.errors import LibraError
from libra.planner.controller import PlanController, PlanEvent
from libra.planner.cost_model import CostModel
from libra.planner.planner import Plan, Planner, PlannerSettings, evaluate
from libra.planner.profiles import ModelProfile
from libra.planner.training_search import TrainingTable
from libra.planner.trigger import StepTimes
from libra.planner.workload import TrajectoryLength, Workload, build_workload
from libra.rl.cluster import LocalCluster, Placement, placement_of
from libra.rollout.engines import DecodeTiming
from libra.trainer.layout import Layout


@dataclass(frozen=True)
class EngineTiming:
    """One engine's decode steps at one batch size during a rollout, and the engine's size in workers."""

    workers: int
    timing: DecodeTiming


@dataclass(frozen=True)
class TrainTiming:
    """One update: what it trained and how long it took, in which parallel layout (the torch trainer
    on k workers: data-parallel degree k; megatron: its ranks' tp, pp and dp)."""

    seconds: float
    sequences: int
    tokens: int  # the sequences' tokens (prompt, generations, tool returns), without padding: the
    # basis the planner's workloads count (`Workload.tokens`); the fitted coefficient absorbs padding
    max_tokens: int  # the longest sequence
    layout: Layout

    def __setstate__(self, state: dict) -> None:
        """A record pickled before layouts (a checkpoint's) counted workers: data parallel over them."""
        if "layout" not in state:
            state = {k: v for k, v in state.items() if k != "workers"} | {"layout": Layout(dp=state.get("workers", 1))}
        self.__dict__.update(state)


@dataclass(frozen=True)
class EngineStart:
    """Rollout engines (re)started on `workers` workers, taking `seconds` (all of them, one after another)."""

    workers: int
    seconds: float


def model_profile_of(name: str, hf_config: dict) -> ModelProfile:
    """A Hugging Face `config.json` (Qwen2/Llama-style fields) as the planner's model profile."""
    heads = int(hf_config["num_attention_heads"])
    hidden = int(hf_config["hidden_size"])
    return ModelProfile(
        name, int(hf_config["num_hidden_layers"]), hidden, int(hf_config["intermediate_size"]), heads,
        int(hf_config.get("num_key_value_heads", heads)), int(hf_config.get("head_dim") or hidden // heads),
        int(hf_config["vocab_size"]), bool(hf_config.get("tie_word_embeddings", False)),
        qkv_bias=hf_config.get("model_type") == "qwen2", qk_norm=hf_config.get("model_type") == "qwen3")


def local_cost_model(cluster: LocalCluster, model: str, hf_config: dict, config: PlannerConfig) -> CostModel:
    """The planner's cost model of `cluster`'s workers for the policy whose HF config is `hf_config`
    (default coefficients: `libra.planner.calibrate.fit` replaces them with the run's). The run's
    one process drives every engine (its agent loop polls them in turn), so the engines share its
    host time per sequence (`RolloutSettings.shared_host`): on two cores, two one-core engines roll
    out no faster than one."""
    cost = CostModel.configured(cluster.planner_cluster(), model_profile_of(model, hf_config), config)
    return replace(cost, rollout=cost.rollout.model_copy(update={"shared_host": True}))


def policy_cost_model(cluster: LocalCluster, policy: str | Path, config: PlannerConfig) -> CostModel:
    """`local_cost_model` for the HF policy in `policy` (its config.json; named as its folder): what
    the run's planning flow plans with, and what a planned trainer's first layout is chosen by."""
    hf_config = json.loads((Path(policy) / "config.json").read_text())
    return local_cost_model(cluster, Path(policy).name, hf_config, config)


def timing_rows(step: int, decode: Sequence[EngineTiming], train: TrainTiming | None, hardware: str,
                model: str, starts: Sequence[EngineStart] = ()) -> list[dict]:
    """An iteration's measured samples as rows of the store's `timings` table: one decode_step row
    per (engine, batch size), weighted by nothing (each row is a mean of its steps), one train_step
    row, and one engine_start row per (re)start of the engines before or during it (`tp`: the
    workers they were started on; the cost of moving workers, not a cost-model sample). An engine
    of k workers is tensor-parallel degree k to the cost model; a trainer on k workers is
    data-parallel degree k."""
    def row(kind: str, seconds: float, **sizes) -> dict:  # every row has every column (one table schema)
        return {"step": step, "kind": kind, "seconds": seconds, "hardware": hardware, "model": model, "tp": 1, "pp": 1,
                "dp": 1, "ep": 1, "micro_batch": None, "sequences": None, "tokens": None, "max_tokens": None,
                "batch": None, "context_tokens": None} | sizes

    rows = [row("decode_step", e.timing.seconds, tp=e.workers, batch=float(e.timing.batch),
                context_tokens=e.timing.context_tokens) for e in decode if e.timing.steps > 0]
    if train is not None and train.seconds > 0 and train.sequences > 0:
        rows.append(row("train_step", train.seconds, tp=train.layout.tp, pp=train.layout.pp, dp=train.layout.dp,
                        micro_batch=1, sequences=float(train.sequences), tokens=float(train.tokens),
                        max_tokens=train.max_tokens))
    rows += [row("engine_start", start.seconds, tp=start.workers) for start in starts if start.seconds > 0]
    return rows


def prior_workload(trajectories: int, max_context: int) -> Workload:
    """What a run plans its trainer's first layout for, before it has measured a trajectory: a step
    of `trajectories` sequences, each as long as the engines allow (`rollout.max_context`): the
    longest step its configuration admits, so the layout fits its memory whatever the lengths."""
    longest = TrajectoryLength(prompt_tokens=0, gen_tokens=max_context, payload_tokens=0, turns=1)
    return build_workload([longest], trajectories)


def planned_layout(cost: CostModel, workload: Workload, workers: int) -> Layout:
    """The planner's training layout for `workers` training workers (its training search: the
    fastest tp x pp x dp that fits, on at most that many workers)."""
    best = TrainingTable(cost, workload).best(workers)
    if best is None:
        raise LibraError(f"the planner finds no training layout on {workers} worker(s) that fits the policy's "
                         f"memory for sequences of {workload.max_tokens} tokens; give the trainer more workers")
    return Layout(best.config.tp, best.config.pp, best.config.dp)


def step_times(row: dict) -> StepTimes:
    """A `steps` row as the trigger's measured stage times."""
    return StepTimes(int(row["step"]), float(row["rollout_s"] or 0.0), float(row["train_s"] or 0.0))


def live_variants(cluster: LocalCluster, config: PlannerConfig, hybrids: int = 0) -> tuple[PlannerSettings, ...]:
    """The placements a live run may take, each a planner variant the controller searches side by
    side: split (one-step-off; when there are two workers or more) and colocated. No offload between
    colocated stages (the engines' memory stays allocated on CPU), instance sizes that are powers of
    two up to the machine's workers. Hybrids only with `hybrids` (the run's hybrid processes): up to
    that many, in the split alone (the trainer's workers are the pool's core, which stays), with no
    switch cost: a hybrid stays joined and shares its worker between its engine and its training
    shard, which is the planner's fluid share of a hybrid's time."""
    tps = tuple(t for t in (1, 2, 4, 8) if t <= cluster.size)
    fraction = min(1.0, (hybrids + 0.5) / cluster.size) if hybrids else 0.0  # the planner takes int(workers x fraction)
    base = PlannerSettings(max_hybrid_fraction=fraction, hybrid_shares=config.hybrid_shares, hybrid_switch_s=0.0,
                           granularity=1, offload_s=0.0, rollout_tps=tps)
    colocated = PlannerSettings(mode="colocated", max_hybrid_fraction=0.0, granularity=1, offload_s=0.0, rollout_tps=tps)
    if hybrids:
        return (base,)
    return (base, colocated) if cluster.size >= 2 else (colocated,)


def adopt_placement(controller: PlanController, placement: Placement, workload: Workload,
                    layout: Layout | None = None) -> None:
    """Give `controller` the run's own placement as the plan in force (its variant: colocated or
    split), so the first plan it makes is weighed against where the run is, not applied outright;
    with `layout` (the megatron trainer's), costed in that training layout rather than the best one
    for its workers, so a plan that only changes the layout is weighed as a move too. The planning
    flow and the simulator's replay of it (`libra.rl.simulated`) both start this way."""
    variant = 1 if placement.colocated and len(controller.variants) > 1 else 0
    planner = Planner(controller.cost, workload, controller.variants[variant])
    if placement.colocated:
        current = planner.plan()
    elif placement.hybrids and len(placement.rollout_workers) > len(placement.hybrids):
        shares = planner.shares()  # the planner's middle share: a hybrid's worker is its engine's and its shard's
        current = planner.plan_at(len(placement.train), len(placement.hybrids), shares[len(shares) // 2])
    else:  # without a core rollout pool the planner has no hybrids: they count as rollout workers
        current = planner.plan_at(len(placement.train))
    if layout is not None and current.train is not None:
        running = replace(current.train.config, tp=layout.tp, pp=layout.pp, dp=layout.dp)
        estimate = controller.cost.train_time(running, workload)
        current = replace(current, train=estimate, t_train_s=estimate.seconds * current.t_train_s / current.train.seconds)
        current = replace(current, t_iter_s=evaluate(planner, current))
    controller.adopt(current, variant)


def move_held(plan: Plan, cluster: LocalCluster, plan_id: str, calibrating: str | None,
              core: Placement | None = None, ranks: Layout | None = None) -> str | None:
    """Why a move to `plan` that pays must still wait, or None: the cost model is `calibrating`
    (`libra.planner.calibrate.calibration_wait`), this machine cannot place the plan, it would
    move the trainer's workers while hybrids train beside them (`core`: the placement whose
    training workers are the elastic pool's core, which stays), or it leaves fewer training
    workers than the trainer's fixed layout has ranks (`ranks`: `trainer.layout: fixed`). The
    planning flow and the simulator's replay of it hold moves on it."""
    if calibrating is not None:
        return calibrating
    try:
        placement = placement_of(plan, cluster, plan_id)
    except LibraError as exc:
        return f"not placed: {exc}"
    if ranks is not None and ranks.world > len(placement.train):
        return (f"the trainer's fixed layout ({ranks}) has {ranks.world} ranks; {placement.describe()} leaves it "
                f"{len(placement.train)} worker(s)")
    if core is not None and (placement.train != core.train or placement.colocated):
        return (f"the trainer's workers {list(core.train)} are the elastic pool's core, which stays while hybrids "
                f"train beside it ({placement.describe()} would move them)")
    return None


def plan_row(step: int, plan_id: str, event: PlanEvent) -> dict:
    """A planner decision as a row of the store's `plans` table."""
    plan = event.candidate
    train = plan.train.config if plan.train else None
    decision = event.decision
    held = f"not moved: {event.held}" if event.held else ""
    reason = "; ".join(part for part in (event.reason, decision.reason if decision else "", held) if part)
    return {"step": step, "plan_id": plan_id, "applied": event.applied, "reason": reason,
            "train_gpus": plan.train_gpus, "rollout_gpus": plan.rollout_gpus, "hybrid_gpus": plan.hybrid_gpus,
            "train_tp": train.tp if train else None, "train_pp": train.pp if train else None,
            "train_dp": train.dp if train else None, "train_ep": train.ep if train else None,
            "micro_batch": train.micro_batch if train else None,
            "rollout_instances": json.dumps([{"tp": g.tp, "count": g.count, "max_tokens": g.max_tokens}
                                             for g in plan.rollout.groups]),
            "t_train_s": plan.t_train_s, "t_rollout_s": plan.t_rollout_s, "t_iter_s": plan.t_iter_s,
            "switch_cost_s": decision.switch_cost_s if decision else 0.0, "search_ms": plan.search_ms}


def placement_row(step: int, plan_id: str, placement: Placement, reason: str) -> dict:
    """A placement the run took without the planner (placed anew on the hosts there are) as a row
    of the store's `plans` table: its split and engines; the planner's predictions are absent."""
    sizes = placement.engine_sizes()
    return {"step": step, "plan_id": plan_id, "applied": True, "reason": f"{reason} ({placement.describe()})",
            "train_gpus": len(placement.train), "rollout_gpus": 0 if placement.colocated else len(placement.rollout_workers),
            "hybrid_gpus": len(placement.hybrids), "train_tp": 1, "train_pp": 1, "train_dp": len(placement.train),
            "train_ep": 1, "micro_batch": None,
            "rollout_instances": json.dumps([{"tp": tp, "count": sizes.count(tp), "max_tokens": None}
                                             for tp in sorted(set(sizes))]),
            "t_train_s": None, "t_rollout_s": None, "t_iter_s": None, "switch_cost_s": None, "search_ms": None}


def role(placement: Placement, worker: int) -> str:
    if placement.colocated:
        return "colocated"
    return "rollout" if worker in placement.rollout_workers else "train" if worker in placement.train else "idle"


def move_rows(step: int, time_s: float, old: Placement, new: Placement, cluster: LocalCluster) -> list[dict]:
    """The workers whose role changes from `old` to `new`, as rows of the store's `pool_events`
    table (one per worker moved)."""
    rows = []
    for w in range(cluster.size):
        before, after = role(old, w), role(new, w)
        if before != after:
            rows.append({"step": step, "time_s": time_s, "worker_id": f"worker-{w}", "gpus": 1, "from_state": before,
                         "to_state": after, "event": "moved",
                         "detail": f"plan {new.plan_id}: {','.join(map(str, cluster.workers[w]))}"})
    return rows
