"""The live placement strategies in the simulator: a run's turns as the simulator's trajectories, and
colocated / static / libra on a two-worker machine, checked by the runner's own accounting."""

import json
from pathlib import Path

import pytest

from libra.config import PlannerConfig
from libra.errors import LibraError
from libra.rl.cluster import LocalCluster
from libra.rl.planning import local_cost_model
from libra.rl.simulated import LocalPlacement, batches_from_turns, predict
from libra.sim.workloads import SimTrajectory, SimTurn
from libra.types import NO_TOOL

POLICY = Path(__file__).resolve().parents[3] / "data" / "policy" / "config.json"
CLUSTER = LocalCluster.of_cores((0, 1))


def turn(step, tid, idx, context, gen, tool="python", payload=10, status="ok", latency=0.5):
    return {"step": step, "trajectory_id": tid, "prompt_id": tid.split("/")[0], "turn_idx": idx,
            "context_tokens": context, "gen_tokens": gen, "tool_name": tool, "tool_payload_tokens": payload,
            "tool_status": status, "tool_latency_s": latency}


def test_turn_rows_become_one_batch_per_step_with_the_tool_calls_between_turns():
    rows = [turn(1, "p/1", 1, 70, 5, "none", 0, "none", None), turn(1, "p/1", 0, 50, 10),
            turn(0, "q/0", 0, 40, 7, "none", 0, "none", None), turn(-1, "e/0", 0, 40, 9)]
    batches = batches_from_turns(rows)
    assert batches == [
        [SimTrajectory("0/q/0", "q", 40, (SimTurn(7, NO_TOOL, 0, "none", 0.0),))],
        [SimTrajectory("1/p/1", "p", 50, (SimTurn(10, "python", 10, "ok", 0.5), SimTurn(5, NO_TOOL, 0, "none", 0.0)))],
    ]
    with pytest.raises(LibraError, match=r"trajectory p/1: turns \[0, 2\] are not 0..n-1"):
        batches_from_turns([turn(0, "p/1", 0, 50, 10), turn(0, "p/1", 2, 80, 5)])


def batch(step: int, gen: int, count: int = 16) -> list[SimTrajectory]:
    return [SimTrajectory(f"{step}/{p}/{i}", str(p), 60, (SimTurn(gen, "python", 20, "ok", 0.2),
                                                         SimTurn(gen // 2, NO_TOOL, 0, "none", 0.0)))
            for p in range(count // 4) for i in range(4)]


def cost():
    return local_cost_model(CLUSTER, "policy", json.loads(POLICY.read_text()), PlannerConfig())


def runs(batches, engine_start_s=30.0, **config):
    return predict(batches, cost(), CLUSTER, PlannerConfig(**config), engine_start_s)


def test_every_strategy_trains_every_batch_once_whatever_it_switches():
    batches = [batch(k, 40 * (k + 1)) for k in range(8)]  # generation grows 8x over the run
    result = runs(batches, period_steps=2, min_relative_gain=0.0)
    tokens = sum(t.total_tokens for b in batches for t in b)
    for run in result.values():
        assert run.trained_tokens == tokens
        assert run.total_time_s == pytest.approx(sum(s.step_s for s in run.steps) + run.tail_train_s)


def test_colocated_takes_turns_on_both_workers_and_static_never_moves():
    batches = [batch(k, 200) for k in range(4)]
    result = runs(batches)
    sync = cost().weight_sync_s()
    for s in result["colocated"].steps:
        assert (s.train_gpus, s.rollout_gpus) == (2, 2)
        assert s.step_s == pytest.approx(s.rollout_s + s.train_s + sync)  # no offload on CPU workers
    static = result["static"].steps
    assert {(s.train_gpus, s.rollout_gpus) for s in static} == {(1, 1)}
    assert static[0].train_s == 0.0  # one step off: nothing to train while the first batch rolls out
    for s in static[1:]:
        assert s.step_s == pytest.approx(max(s.rollout_s, s.train_s) + sync)


def test_a_libra_move_pays_the_measured_engine_start_and_is_planned_as_live():
    batches = [batch(k, 20 * 3 ** k) for k in range(6)]  # the rollout's share grows fast
    config = PlannerConfig(period_steps=1, min_relative_gain=0.0)
    placement = LocalPlacement("libra", CLUSTER, cost(), config, config, len(batches))
    assert placement.placement.describe() == "split: rollout 1 (1x1) | train 1"
    result = runs(batches, engine_start_s=42.0, period_steps=1, min_relative_gain=0.0)["libra"]
    moves = [s for s in result.steps if s.switch_cost_s > 0]
    assert moves and all(s.switch_cost_s == 42.0 for s in moves)  # each move restarted the engines
    assert [s.plan_reason for s in result.steps[:2]] == ["initial", ""]  # no plan during warm-up
    # it moved to colocation (both workers roll out, then both train), first training the batch
    # rolled out ahead: that step's training is both batches'
    move = moves[0]
    assert (move.train_gpus, move.rollout_gpus, move.plan_reason) == (2, 2, "periodic")
    colocated = runs(batches, engine_start_s=42.0)["colocated"].steps[move.step]
    assert move.train_s > colocated.train_s


def test_libra_waits_for_the_training_samples_its_calibration_needs_before_it_moves():
    """As live: the first plan (step 2) has two training samples, fewer than the four the fit
    needs, so a move that pays waits until step 4; the decision itself is the planner's."""
    batches = [batch(k, 2000) for k in range(6)]
    result = runs(batches, engine_start_s=5.0, period_steps=1, min_relative_gain=0.0)["libra"]
    assert [(s.step, s.train_gpus, s.rollout_gpus) for s in result.steps if s.switch_cost_s > 0] == [(4, 2, 2)]
    assert [(s.train_gpus, s.rollout_gpus) for s in result.steps[:4]] == [(1, 1)] * 4


def test_the_loops_modes_replayed_on_a_split_train_whole_groups_each_generated_once():
    from libra.rl.simulated import predict_modes

    batches = [batch(k, 40 * (k + 1)) for k in range(6)]
    result = predict_modes(batches, cost(), CLUSTER, PlannerConfig(), "static", 1.5, 4)
    assert set(result) == {"one_step_off", "partial", "async"}
    assert result["one_step_off"].trained_tokens == sum(t.total_tokens for b in batches for t in b)
    assert result["one_step_off"].mode == "sync" and result["async"].mode == "async"
    for name in ("partial", "async"):
        run = result[name]
        trained = [t for b in run.trained for t in b]
        assert len({t.trajectory_id for t in trained}) == len(trained)
        assert all(len(b) % 4 == 0 for b in run.trained)  # whole groups of 4
        assert sum(s.gen_tokens for s in run.steps) == sum(t.gen_tokens for t in trained) + run.untrained_tokens
        assert sum(s.suspended for s in run.steps) > 0  # the close cut something
