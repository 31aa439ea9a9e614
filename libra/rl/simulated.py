"""The live run's placement strategies in the simulator: what `libra train --placement colocated|static|libra`
does on one machine's workers, replayed on the simulator's physics, so that the simulator's
prediction for the three strategies can be set beside what the live runs measured.

    batches = batches_from_turns(turn_rows)                     # a run's trajectories, step by step
    runs = predict(batches, cost, cluster, planner_config, engine_start_s)
    runs["libra"].total_time_s / runs["static"].total_time_s

- The workload is a live run's own trajectories (the store's `turns` rows): prompt, generated and
  tool tokens per turn, and each tool call's measured latency.
- The physics is the cost model of the machine's workers (`LocalCluster.planner_cluster`), with the
  coefficients fitted to the runs' timing samples (`libra.planner.calibrate.fit`), and the measured
  engine start as the price of moving workers (a move that keeps the engines costs nothing: the
  trainer's threads move for free).
- The strategies place engines and the trainer as the live ones do (`libra.rl.cluster`): `colocated`
  one engine on every worker, then the trainer on every worker; `static` the initial split, never
  moved; `libra` that split, then the planning flow's decisions: the same `PlanController` over the
  same variants (`libra.rl.planning.live_variants`: split or colocated), fed the same way (the
  measured rollout time corrects the plan in force, the pooled recent steps are the workload, a move
  must pay off within the steps left), its plans placed by the same `placement_of`. No offload:
  colocated stages on CPU workers take turns without moving state.

It sits with the training loop it replays: the simulator (`libra.sim`) is below it and knows nothing
of the live run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from libra.config import PlannerConfig
from libra.errors import LibraError
from libra.planner.calibrate import calibration_wait
from libra.planner.controller import PlanController
from libra.planner.cost_model import CostModel
from libra.planner.trigger import TriggerSettings
from libra.planner.workload import Workload
from libra.rl.cluster import STRATEGIES, LocalCluster, Placement, initial_placement, placement_of
from libra.rl.planning import adopt_placement, live_variants, move_held
from libra.sim.modes import RolloutMode
from libra.sim.rollout import InstanceSpec
from libra.sim.runner import Drawn, SystemRun
from libra.sim.systems import StepConfig, System
from libra.sim.training import workload_of
from libra.sim.workloads import SimTrajectory, SimTurn
from libra.types import NO_TOOL


def batches_from_turns(rows: Sequence[dict]) -> list[list[SimTrajectory]]:
    """A run's trajectories per step, from `turns` rows (step, trajectory_id, prompt_id, turn_idx,
    context_tokens, gen_tokens, tool_name, tool_payload_tokens, tool_status, tool_latency_s), in
    step order; held-out evaluations (negative steps) are left out."""
    by_step: dict[int, dict[str, list[dict]]] = {}
    for row in rows:
        if int(row["step"]) >= 0:
            by_step.setdefault(int(row["step"]), {}).setdefault(str(row["trajectory_id"]), []).append(row)
    batches = []
    for step in sorted(by_step):
        batch = []
        for tid, turns in by_step[step].items():
            turns.sort(key=lambda r: int(r["turn_idx"]))
            if [int(r["turn_idx"]) for r in turns] != list(range(len(turns))):
                raise LibraError(f"step {step}, trajectory {tid}: turns {[r['turn_idx'] for r in turns]} are not 0..n-1")
            sim = tuple(SimTurn(int(r["gen_tokens"]), NO_TOOL if i == len(turns) - 1 else str(r["tool_name"]),
                                0 if i == len(turns) - 1 else int(r["tool_payload_tokens"] or 0),
                                "none" if i == len(turns) - 1 else str(r["tool_status"]),
                                0.0 if i == len(turns) - 1 else float(r["tool_latency_s"] or 0.0))
                        for i, r in enumerate(turns))
            batch.append(SimTrajectory(f"{step}/{tid}", str(turns[0]["prompt_id"]), int(turns[0]["context_tokens"]), sim))
        batches.append(batch)
    return batches


class LocalPlacement(System):
    """`libra train --placement NAME` on `cluster`'s workers."""

    def __init__(self, strategy: str, cluster: LocalCluster, cost: CostModel, config: PlannerConfig,
                 trigger: TriggerSettings, steps: int, mode: RolloutMode | None = None, group_size: int = 1) -> None:
        if strategy not in STRATEGIES:
            raise LibraError(f"unknown placement strategy {strategy!r}; strategies: {', '.join(STRATEGIES)}")
        self.variants = live_variants(cluster, config)
        super().__init__(cost, self.variants[0], trigger, mode, group_size)
        self.name = strategy
        self.cluster = cluster
        self.steps = steps
        self.recent_steps = config.recent_steps
        self.placement = initial_placement(strategy, cluster)
        self.controller = PlanController(cost, trigger=trigger, variants=self.variants) if strategy == "libra" else None
        self.history: list[list[SimTrajectory]] = []

    def _config(self, placement: Placement, workload: Workload, switch_s: float, reason: str) -> StepConfig:
        layout = tuple(InstanceSpec(len(engine), 0) for engine in placement.engines)
        train = len(placement.train)
        mode = "colocated" if placement.colocated else "one_step_off"
        return StepConfig(mode, train, self._best_train(workload, train), layout, (), switch_s, reason)

    def _workload(self) -> Workload:
        recent = self.history[-self.recent_steps:] if self.recent_steps > 0 else self.history
        return self.planned_workload([t for batch in recent for t in batch], steps=len(recent))

    def configure(self, step, previous, upcoming, times):
        if step > 0:  # step 0's `previous` is the warm-up batch, not a step of the run
            self.history.append(previous)
        if self.config is None:
            self.config = self._config(self.placement, workload_of(previous), 0.0, "initial")
            return self.config
        quiet = replace(self.config, switch_cost_s=0.0, plan_reason="")
        controller = self.controller
        if controller is None:
            return quiet
        if times is not None and controller.current is not None:  # as the planning-due task does
            controller.record(times.t_rollout_s, controller.current.t_rollout_s)
        if controller.due(step, times, force=True) is None:
            return quiet
        workload = self._workload()
        if controller.current is None:  # as the plan task does: the first plan is weighed against the start
            adopt_placement(controller, self.placement, workload)
        # as live: a move waits until the calibration has the training samples its fit needs (one
        # per recent step done; the engines' decode samples come many a step, so they never hold it)
        trained = min(step, self.recent_steps) if self.recent_steps > 0 else step
        calibrating = calibration_wait({"train_step": trained}, kinds=("train_step",))
        event = controller.observe(step, workload, times, force=True, steps_left=self.steps - step,
                                   hold=lambda plan: move_held(plan, self.cluster, f"plan-{step}", calibrating))
        if event is None or not event.applied:
            return quiet
        placement = placement_of(event.candidate, self.cluster, f"plan-{step}")
        # what the move costs on these workers: restarting the engines when theirs change (the
        # trainer's threads move for free); the planner's own estimate only decided whether to move
        switch = self.trigger.engine_start_s if placement.engines != self.placement.engines else 0.0
        self.placement = placement
        self.config = self._config(placement, workload, switch, event.reason)
        return self.config


def predict(batches: Sequence[list[SimTrajectory]], cost: CostModel, cluster: LocalCluster, config: PlannerConfig,
            engine_start_s: float, strategies: Sequence[str] = STRATEGIES) -> dict[str, SystemRun]:
    """Each placement strategy over the same steps (`batches`; the first also stands in for the
    warm-up batch the initial placement is sized on), on `cost`'s physics."""
    if not batches:
        raise LibraError("no steps to simulate: the run recorded no turns")
    trigger = TriggerSettings.of(config).model_copy(update={"engine_start_s": engine_start_s})
    settings = live_variants(cluster, config)[0]
    drawn = Drawn(cost, RolloutMode(), list(batches), batches[0], [])
    return {name: drawn.run(LocalPlacement(name, cluster, cost, config, trigger, len(batches)), settings)
            for name in strategies}


LIVE_MODES = {"one_step_off": "sync", "partial": "partial", "async": "async"}  # the loop's names -> the simulator's


def predict_modes(batches: Sequence[list[SimTrajectory]], cost: CostModel, cluster: LocalCluster, config: PlannerConfig,
                  strategy: str, overprovision: float, max_staleness: int) -> dict[str, SystemRun]:
    """The training loop's modes (one-step-off, partial rollouts, asynchronous: `LIVE_MODES`) over a
    run's steps (`batches`, its one-step-off trajectories) on placement `strategy`, in `cost`'s
    physics. Partial runs start more groups than they train: they draw the extra ones from the run's
    first two batches again (renamed), as a live run draws new tasks."""
    if not batches:
        raise LibraError("no steps to simulate: the run recorded no turns")
    trigger = TriggerSettings.of(config)
    settings = live_variants(cluster, config)[0]
    spare = [[replace(t, trajectory_id=f"again/{t.trajectory_id}") for t in batch] for batch in batches[:2]]
    runs = {}
    for live, name in LIVE_MODES.items():
        drawn = Drawn(cost, RolloutMode(name, overprovision, max_staleness), list(batches), batches[0], spare)
        system = LocalPlacement(strategy, cluster, cost, config, trigger, len(batches), drawn.mode, drawn.group_size)
        runs[live] = drawn.run(system, settings)
    return runs
