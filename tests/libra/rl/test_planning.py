"""The live run's measurements as the planner's inputs, and its decisions as the store's rows (pure)."""

import pytest

from libra.config import PlannerConfig
from libra.errors import LibraError
from libra.planner.calibrate import TimingSample, samples_from_rows
from libra.rl.cluster import LocalCluster, Placement, initial_placement
from libra.rl.planning import (
    EngineStart,
    EngineTiming,
    TrainTiming,
    live_variants,
    local_cost_model,
    model_profile_of,
    move_held,
    move_rows,
    step_times,
    timing_rows,
)
from libra.rollout.engines import DecodeTimer, DecodeTiming
from libra.trainer.layout import Layout
from tests.libra.rl.test_cluster import plan

QWEN = {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": True}


def test_a_qwen2_config_is_the_planner_model_with_qkv_bias_and_grouped_heads():
    model = model_profile_of("tiny", QWEN)
    assert (model.layers, model.hidden, model.intermediate, model.heads, model.kv_heads, model.head_dim) == (2, 64, 128, 4, 2, 16)
    assert model.vocab == 1000 and model.tied_embeddings and model.qkv_bias and not model.qk_norm
    llama = model_profile_of("l", {**QWEN, "model_type": "llama", "num_key_value_heads": 4, "head_dim": 32})
    assert llama.kv_heads == 4 and llama.head_dim == 32 and not llama.qkv_bias


def test_the_decode_timer_keeps_means_per_batch_size_until_drained():
    timer = DecodeTimer()
    for batch, context, seconds in [(4, 100, 0.02), (4, 120, 0.04), (2, 50, 0.01), (0, 10, 1.0), (3, 10, 0.0)]:
        timer.record(batch, context, seconds)
    assert timer.drain() == [DecodeTiming(2, 1, 0.01, 50.0), DecodeTiming(4, 2, pytest.approx(0.03), 110.0)]
    assert timer.drain() == []


def test_an_iteration_becomes_one_row_per_engine_batch_size_and_one_training_row():
    decode = (EngineTiming(2, DecodeTiming(4, 10, 0.03, 110.0)), EngineTiming(1, DecodeTiming(1, 0, 0.0, 0.0)))
    rows = timing_rows(7, decode, TrainTiming(1.5, 8, 4096, 600, Layout(dp=3)), "local-cpu-worker", "tiny")
    nothing = dict.fromkeys(["micro_batch", "sequences", "tokens", "max_tokens", "batch", "context_tokens"])
    assert rows == [
        {"step": 7, "kind": "decode_step", "seconds": 0.03, "hardware": "local-cpu-worker", "model": "tiny", "tp": 2,
         "pp": 1, "dp": 1, "ep": 1, **nothing, "batch": 4.0, "context_tokens": 110.0},
        {"step": 7, "kind": "train_step", "seconds": 1.5, "hardware": "local-cpu-worker", "model": "tiny", "tp": 1,
         "pp": 1, "dp": 3, "ep": 1, **nothing, "micro_batch": 1, "sequences": 8.0, "tokens": 4096.0, "max_tokens": 600}]
    assert [list(r) for r in rows][0] == [list(r) for r in rows][1]  # one schema: pyarrow infers it from the first row
    samples = samples_from_rows([{**r, "step": None, "batch": r.get("batch")} for r in rows])
    assert samples[0] == TimingSample("decode_step", 0.03, tp=2, batch=4.0, context_tokens=110.0)
    assert samples[1].dp == 3 and samples[1].tokens == 4096.0 and samples[1].batch == TimingSample.batch
    assert timing_rows(1, (), TrainTiming(0.0, 0, 0, 0, Layout()), "h", "m") == []
    megatron = timing_rows(2, (), TrainTiming(2.0, 8, 4096, 600, Layout(tp=2, pp=2, dp=1)), "h", "m")
    assert [(r["tp"], r["pp"], r["dp"]) for r in megatron] == [(2, 2, 1)]  # the ranks' layout, for the fit
    old = TrainTiming.__new__(TrainTiming)  # as a checkpoint's record pickled before layouts holds it
    old.__setstate__({"seconds": 1.5, "sequences": 8, "tokens": 4096, "max_tokens": 600, "workers": 3})
    assert old == TrainTiming(1.5, 8, 4096, 600, Layout(dp=3))


def test_an_engine_restart_is_a_timing_row_that_calibration_leaves_out():
    rows = timing_rows(4, (), None, "h", "m", (EngineStart(2, 31.5), EngineStart(1, 0.0)))
    nothing = dict.fromkeys(["micro_batch", "sequences", "tokens", "max_tokens", "batch", "context_tokens"])
    assert rows == [{"step": 4, "kind": "engine_start", "seconds": 31.5, "hardware": "h", "model": "m", "tp": 2, "pp": 1,
                     "dp": 1, "ep": 1, **nothing}]
    assert samples_from_rows(rows) == []


def test_a_steps_row_is_the_trigger_measured_times():
    times = step_times({"step": 3, "rollout_s": 12.5, "train_s": None})
    assert (times.step, times.t_rollout_s, times.t_train_s) == (3, 12.5, 0.0)


def test_the_live_run_searches_split_and_colocated_without_hybrids_on_its_own_sizes():
    split, colocated = live_variants(LocalCluster.of_cores(tuple(range(3))), PlannerConfig())
    assert split.mode == "one_step_off" and colocated.mode == "colocated"
    assert split.max_hybrid_fraction == colocated.max_hybrid_fraction == 0.0
    assert split.rollout_tps == (1, 2) and split.granularity == 1 and colocated.offload_s == 0.0
    (only,) = live_variants(LocalCluster(((0,),)), PlannerConfig())
    assert only.mode == "colocated" and only.rollout_tps == (1,)


def test_a_run_with_hybrids_searches_splits_with_up_to_its_hybrids_and_no_switch_cost():
    four = LocalCluster.of_cores(tuple(range(4)))
    (split,) = live_variants(four, PlannerConfig(), hybrids=1)
    assert split.mode == "one_step_off" and int(4 * split.max_hybrid_fraction) == 1 and split.hybrid_switch_s == 0.0
    (split,) = live_variants(LocalCluster.of_cores(tuple(range(7))), PlannerConfig(), hybrids=3)
    assert int(7 * split.max_hybrid_fraction) == 3


def test_the_planner_puts_a_hybrid_where_the_balance_falls_between_whole_workers():
    """Four one-core workers, default coefficients: with long generations three trainers are too
    many and two too few, so a hybrid shares its worker (a quarter of its time rolling out)."""
    import json
    from pathlib import Path

    from libra.planner.planner import Planner
    from libra.planner.workload import TrajectoryLength, build_workload
    from libra.rl.cluster import placement_of
    from libra.rl.planning import local_cost_model

    four = LocalCluster.of_cores(tuple(range(4)))
    policy = json.loads((Path(__file__).resolve().parents[3] / "data" / "policy" / "config.json").read_text())
    cost = local_cost_model(four, "policy", policy, PlannerConfig())
    (split,) = live_variants(four, PlannerConfig(), hybrids=1)
    short = Planner(cost, build_workload([TrajectoryLength(400, 2_000, 100, 3, 0.5)] * 64, 64), split).plan()
    assert (short.train_gpus, short.rollout_gpus, short.hybrid_gpus) == (3, 1, 0)
    long = Planner(cost, build_workload([TrajectoryLength(400, 16_000, 100, 3, 0.5)] * 64, 64), split).plan()
    assert (long.train_gpus, long.rollout_gpus, long.hybrid_gpus, long.hybrid_rollout_share) == (2, 1, 1, 0.25)
    placed = placement_of(long, four, "plan-7")
    assert (placed.engines, placed.train, placed.hybrids) == (((0,), (1,)), (2, 3), (1,))


def test_a_move_waits_for_the_calibration_then_for_a_place_and_keeps_the_pools_core():
    four = LocalCluster.of_cores(tuple(range(4)))
    core = initial_placement("libra", four, hybrids=1)  # rollout (0), hybrid (1), train (2, 3)
    assert move_held(plan(2, 1, [(1, 1)], hybrid=1), four, "p", "calibrating: ...", core) == "calibrating: ..."
    assert move_held(plan(2, 2, [(2, 1)]), four, "p", None, core) is None  # the hybrid stops training
    assert move_held(plan(2, 1, [(1, 1)], hybrid=1), four, "p", None, core) is None
    moved = move_held(plan(1, 2, [(1, 2)], hybrid=1), four, "p", None, core)
    assert moved == ("the trainer's workers [2, 3] are the elastic pool's core, which stays while hybrids train "
                     "beside it (split: rollout 3 (3x1) | train 1 + 1 hybrid would move them)")
    assert move_held(plan(1, 2, [(1, 2)], hybrid=1), four, "p", None) is None  # no pool: the trainer may move
    assert move_held(plan(2, 4, [(1, 4)]), four, "p", None).startswith("not placed: plan p is for 6 workers")
    fewer = move_held(plan(1, 3, [(1, 3)]), four, "p", None, None, Layout(dp=2))
    assert fewer == "the trainer's fixed layout (tp=1 pp=1 dp=2) has 2 ranks; split: rollout 3 (3x1) | train 1 leaves it 1 worker(s)"
    assert move_held(plan(2, 2, [(1, 2)]), four, "p", None, None, Layout(dp=2)) is None


def test_each_worker_that_changes_stage_is_one_move():
    cluster = LocalCluster.of_cores(tuple(range(4)))
    old = Placement(((0, 1),), (2, 3), False)
    new = Placement(((0,), (1, 2)), (3,), False, "plan-5")
    assert move_rows(5, 40.0, old, new, cluster) == [
        {"step": 5, "time_s": 40.0, "worker_id": "worker-2", "gpus": 1, "from_state": "train", "to_state": "rollout",
         "event": "moved", "detail": "plan plan-5: 2"}]
    together = Placement(((0, 1, 2, 3),), (0, 1, 2, 3), True, "plan-6")
    assert [r["to_state"] for r in move_rows(6, 50.0, new, together, cluster)] == ["colocated"] * 4
    assert move_rows(6, 50.0, new, new, cluster) == []


QWEN_1_5B = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}


def test_the_first_layout_is_the_planners_for_the_longest_step_the_config_admits():
    """A 1.5B Qwen2 on workers of 16 GiB (default coefficients): its weights and AdamW state (24 GB)
    fit on no one or two workers, so four split the model over two tensor-parallel ranks and the
    batch over two replicas; a tiny policy takes plain data parallelism."""
    from libra.rl.planning import planned_layout, prior_workload

    workload = prior_workload(64, 4096)
    assert workload.trajectories == 64 and workload.max_tokens == 4096
    for workers, want in ((4, Layout(tp=2, dp=2)), (8, Layout(tp=2, dp=4))):
        cluster = LocalCluster.of_cores(tuple(range(workers)), 1, 16 * 2**30 * workers)
        assert planned_layout(local_cost_model(cluster, "q", QWEN_1_5B, PlannerConfig()), workload, workers) == want
    two = LocalCluster.of_cores((0, 1), 1, 32 * 2**30)
    with pytest.raises(LibraError, match="no training layout on 2 worker\\(s\\) that fits the policy's memory for "
                                         "sequences of 4096 tokens"):
        planned_layout(local_cost_model(two, "q", QWEN_1_5B, PlannerConfig()), workload, 2)
    # 14 query heads on 2 key/value groups: tensor parallelism of 2 at most, however many workers
    fourteen = {**QWEN_1_5B, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                "intermediate_size": 4864}
    sixteen = LocalCluster.of_cores(tuple(range(16)), 1, 8 * 2**30 * 16)
    assert planned_layout(local_cost_model(sixteen, "f", fourteen, PlannerConfig()), workload, 16) == Layout(tp=2, dp=8)
    tiny = {**QWEN_1_5B, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 768, "vocab_size": 512}
    assert planned_layout(local_cost_model(two, "t", tiny, PlannerConfig()), prior_workload(64, 1536), 2) == Layout(dp=2)


def test_the_run_in_force_is_costed_in_the_trainers_own_layout_and_a_plan_carries_its_layout():
    """The plan in force is the megatron trainer's layout, not the best one for its workers: a plan
    that only reshards the trainer is then a move the trigger weighs (its switch cost includes the
    resharding); the plan applied gives its layout to the placement."""
    from libra.planner.controller import PlanController
    from libra.planner.cost_model import TrainConfig
    from libra.planner.planner import Planner, evaluate
    from libra.rl.cluster import placement_of
    from libra.rl.planning import adopt_placement, prior_workload

    eight = LocalCluster.of_cores(tuple(range(8)), 1, 16 * 2**30 * 8)
    cost = local_cost_model(eight, "q", QWEN_1_5B, PlannerConfig())
    workload = prior_workload(64, 4096)
    running = Placement(((0, 1, 2, 3),), (4, 5, 6, 7), False, layout=Layout(tp=4))
    costed = {}
    for layout in (None, Layout(tp=4)):
        controller = PlanController(cost, variants=live_variants(eight, PlannerConfig()))
        adopt_placement(controller, running, workload, layout)
        config = controller.current.train.config
        costed[layout] = evaluate(Planner(cost, workload, controller.variants[0]), controller.current)
        assert (config.tp, config.pp, config.dp) == ((2, 1, 2) if layout is None else (4, 1, 1))
    assert costed[Layout(tp=4)] > costed[None]  # the running layout is the slower one: a move may pay
    event = controller.observe(10, workload, None, force=True, steps_left=100)
    assert event.applied
    placed = placement_of(event.candidate, eight, "plan-10")
    c = event.candidate.train.config
    assert placed.layout == Layout(c.tp, c.pp, c.dp) and placed.layout.world <= len(placed.train)
    assert c != TrainConfig(4, 1, 1, 1, c.micro_batch)
