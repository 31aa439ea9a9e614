from dataclasses import replace

import pytest

from libra.errors import InfeasibleError
from libra.planner.cost_model import CostModel
from libra.planner.planner import PlannerSettings
from libra.planner.profiles import MODELS, parse_cluster
from libra.scheduler.routers import Buckets, LeastLoad
from libra.sim.engine import EventLoop
from libra.sim.rollout import InstanceSpec, RolloutSim
from libra.sim.runner import simulate
from libra.sim.training import train_seconds, workload_of
from libra.sim.workloads import SimTrajectory, SimTurn, WorkloadGenerator, WorkloadSpec, workload_spec

COST = CostModel(parse_cluster("6x8:a800"), MODELS["qwen3-14b"])


def test_event_loop_orders_and_cancels() -> None:
    loop, seen = EventLoop(), []
    loop.at(2.0, lambda: seen.append("b"))
    loop.at(1.0, lambda: seen.append("a"))
    dropped = loop.at(1.5, lambda: seen.append("x"))
    loop.at(2.0, lambda: seen.append("c"))
    dropped.cancelled = True
    loop.run()
    assert seen == ["a", "b", "c"] and loop.now == 2.0
    with pytest.raises(ValueError):
        loop.at(1.0, lambda: None)


def test_single_turn_time_is_prefill_plus_decode_steps() -> None:
    t = SimTrajectory("p/0", "p", 50, (SimTurn(100, "none", 0, "none", 0.0),))
    result = RolloutSim(COST, [InstanceSpec(2, 0)], LeastLoad(Buckets(()))).run([t])
    expected = COST.prefill_s(2, 50, 50) + 100 * COST.decode_step_s(2, 1, 50)
    assert result.makespan_s == pytest.approx(expected)
    assert (result.gen_tokens, result.migrated_tokens) == (100, 0)


def test_an_instance_batches_as_many_sequences_as_its_kv_pool_holds() -> None:
    """A TP8 instance's KV pool is the HBM of 8 GPUs left after weights: 3.29M tokens of Qwen3-14B,
    so 200 sequences of 16K decode side by side (not one context limit's worth, 131K tokens)."""
    assert COST.kv_capacity_tokens(8) == 3_286_519
    batch = [SimTrajectory(f"p{i}/0", f"p{i}", 1000, (SimTurn(15_000, "none", 0, "none", 0.0),)) for i in range(200)]
    result = RolloutSim(COST, [InstanceSpec(8, 0)], LeastLoad(Buckets(()))).run(batch)
    expected = 200 * COST.prefill_s(8, 1000, 1000) + 15_000 * COST.decode_step_s(8, 200, 1000)
    assert result.makespan_s == pytest.approx(expected)
    # one sequence is still held to the engine's context limit
    too_long = SimTrajectory("q/0", "q", 1000, (SimTurn(COST.rollout.max_context_tokens, "none", 0, "none", 0.0),))
    with pytest.raises(InfeasibleError):
        RolloutSim(COST, [InstanceSpec(8, 0)], LeastLoad(Buckets(()))).run([too_long])


def test_tool_calls_hold_no_gpu_and_add_their_latency() -> None:
    t = SimTrajectory("p/0", "p", 50, (SimTurn(10, "search", 20, "ok", 3.0), SimTurn(10, "none", 0, "none", 0.0)))
    result = RolloutSim(COST, [InstanceSpec(1, 0)], LeastLoad(Buckets(()))).run([t])
    decode = COST.decode_step_s(1, 1, 50) * 10 + COST.decode_step_s(1, 1, 80) * 10
    prefill = COST.prefill_s(1, 50, 50) + COST.prefill_s(1, 20, 80)
    assert result.makespan_s == pytest.approx(decode + prefill + 3.0)
    assert result.idle_gpu_s == pytest.approx(3.0, rel=1e-6)  # the instance waited for the tool


def test_same_seed_same_numbers() -> None:
    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    cost = CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"])
    first = simulate(spec, cost, 3, ["static-uniform", "libra"], seed=3)
    second = simulate(spec, cost, 3, ["static-uniform", "libra"], seed=3)
    for name in first:
        assert [s.step_s for s in first[name].steps] == [s.step_s for s in second[name].steps]
        assert first[name].tokens_per_s == second[name].tokens_per_s
    other = simulate(spec, cost, 3, ["static-uniform"], seed=4)
    assert other["static-uniform"].tokens_per_s != first["static-uniform"].tokens_per_s


def test_long_tail_holds_most_of_a_static_rollout() -> None:
    """dapo-math (long reasoning): the last 10% of trajectories to finish take over half the wall time."""
    batch = WorkloadGenerator(workload_spec("dapo-math"), seed=0).step(0)
    result = RolloutSim(COST, [InstanceSpec(2, 0)] * 12, LeastLoad(Buckets(()))).run(batch)
    finish = sorted(result.finish_s.values())
    p90 = finish[int(0.9 * len(finish)) - 1]
    assert (result.makespan_s - p90) / result.makespan_s > 0.5


def test_rollout_to_training_ratio_grows_with_length_as_the_cost_model_says() -> None:
    from libra.planner.planner import Planner

    simulated, planned = [], []
    for scale in (1.0, 8.0):
        spec = WorkloadSpec("scaled", "fireact_hotpotqa.csv", gen_scale=scale, prompts_per_step=16)
        batch = WorkloadGenerator(spec, seed=1).step(0)
        planner = Planner(COST, workload_of(batch), PlannerSettings(rollout_tps=(2,)))
        config = planner.training.best(24).config
        rollout = RolloutSim(COST, [InstanceSpec(2, 0)] * 12, LeastLoad(Buckets(()))).run(batch).makespan_s
        simulated.append(rollout / train_seconds(COST, config, 24, batch, PlannerSettings())[0])
        planned.append(planner.t_rollout(24) / planner.t_train(24))
    sim_growth, model_growth = simulated[1] / simulated[0], planned[1] / planned[0]
    assert sim_growth > 1.3 and model_growth > 1.3
    assert 0.5 < sim_growth / model_growth < 2.0


def test_oracle_schedule_is_the_best_sequence_of_its_candidates() -> None:
    """The oracle's dynamic program over per-step candidate plans equals brute force over every
    sequence, and running its schedule takes exactly the time the program predicted."""
    import itertools

    from libra.planner.trigger import TriggerSettings
    from libra.sim.systems import OracleSystem
    from libra.sim.training import with_hybrids

    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    cost = CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"])
    cost = replace(cost, training=cost.training.model_copy(update={"min_sequence_tokens": min(spec.max_tokens, cost.rollout.max_context_tokens)}))
    generator = WorkloadGenerator(spec, 5)
    batches = [generator.step(k) for k in range(3)]
    oracle = OracleSystem(cost, PlannerSettings(), TriggerSettings())
    options = []
    for batch in batches:
        step = []
        for config in oracle._candidates(batch):
            rollout = RolloutSim(cost, config.layout, oracle.router(config, batch), oracle.hybrid_leave_fraction).run(batch)
            train_s, train_config = train_seconds(cost, config.train_config, config.train_gpus, batch, oracle.planner_settings)
            step.append((config, rollout.makespan_s, rollout.hybrid_released_s, train_s, train_config))
        options.append(step)
    assert all(len(step) >= 2 for step in options)

    def total(choice) -> float:
        time = options[0][choice[0]][1]
        for k in range(1, len(options)):
            _, _, _, train_s, train_config = options[k - 1][choice[k - 1]]
            trained, _ = with_hybrids(cost, train_s, train_config, options[k][choice[k]][2])
            time += max(options[k][choice[k]][1], trained)
        return time + options[-1][choice[-1]][3]

    best = min(itertools.product(*[range(len(step)) for step in options]), key=total)
    oracle.plan_ahead(batches)
    assert oracle.schedule == [options[k][c][0] for k, c in enumerate(best)]
    # the run takes the scheduled rollouts as plan_ahead ran them (the same as running them again)
    assert [r.makespan_s for r in oracle.planned] == [options[k][c][1] for k, c in enumerate(best)]
    assert all(oracle.rollout(k, oracle.schedule[k], batches[k]) is oracle.planned[k] for k in range(3))
    run = simulate(spec, cost, 3, ["oracle"], seed=5)["oracle"]
    assert run.total_time_s == pytest.approx(total(best) + 3 * cost.weight_sync_s())


def test_each_stage_probes_plans_with_its_own_router_and_a_probe_teaches_it_nothing() -> None:
    """+cmlfq probes heterogeneous plans with Libra's router as it stands (its trees, its prompt-length
    model), not with MLFQ; the replay runs on a detached copy, so the live router is as it was."""
    import pickle

    from libra.planner.trigger import TriggerSettings
    from libra.scheduler.libra_router import LibraRouter
    from libra.scheduler.routers import MLFQ
    from libra.sim.systems import make_system

    spec = workload_spec("search-r1", group_size=4, prompts_per_step=8)
    cost = CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"])
    generator = WorkloadGenerator(spec, 2)
    system = make_system("+cmlfq", cost, PlannerSettings(), TriggerSettings())
    previous, times = generator.step(-1), None
    for k in range(3):
        batch = generator.step(k)
        config = system.configure(k, previous, batch, times)
        system.rollout(k, config, batch)
        system.observe(batch)
        previous = batch
    live = system._router
    assert isinstance(live, LibraRouter) and live.lengths is not None
    state = pickle.dumps((live.lengths, live.truth_counts, live.tokens, live.price, live.score))
    layout = (InstanceSpec(1, 0), InstanceSpec(4, 1))
    probe = system._make_router(layout, (2000,), (0.5, 0.5), detached=True)
    assert isinstance(probe, LibraRouter) and probe.trees == live.trees and probe.lengths is not live.lengths
    assert probe.lanes is not None and [lane.instances for lane in probe.lanes] == [1, 1]
    assert system.probe(system.controller.current) > 0
    assert pickle.dumps((live.lengths, live.truth_counts, live.tokens, live.price, live.score)) == state
    assert isinstance(make_system("+hetero-tp", cost, PlannerSettings(), TriggerSettings())
                      ._make_router(layout, (2000,), (), detached=True), MLFQ)


def test_simulated_hybrids_join_by_the_pool_join_policy() -> None:
    """A released hybrid speeds training up from when it has fetched its snapshot, unless the
    pool's join policy has timed the join out by then (the same `decide` the pool's leader uses)."""
    from libra.planner.cost_model import TrainConfig
    from libra.pools.joins import JoinSettings
    from libra.sim.training import join_seconds, with_hybrids

    cost = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-8b"])
    config = TrainConfig(1, 1, 2, 1, 1)
    join_s = join_seconds(cost, config)
    train_s = 100.0
    joined, events = with_hybrids(cost, train_s, config, [(1, 10.0)])
    at = 10.0 + join_s  # the core alone (2 replicas) until then, then 3 replicas for the rest
    assert events == [(at, "join_training", 1)]
    assert joined == pytest.approx(at + (1 - at / train_s) * train_s * 2 / 3)
    refused, none = with_hybrids(cost, train_s, config, [(1, 10.0)], JoinSettings(join_timeout_s=join_s * 0.9))
    assert (refused, none) == (train_s, [])


@pytest.mark.parametrize("closed", [False, True])
def test_a_rollout_leaves_nothing_for_the_garbage_collector(closed: bool) -> None:
    """A rollout that ended (whole, or closed early with turns and completions pending) is freed
    as soon as it is dropped: a cycle through its instances kept every rollout's heaps (10^5
    entries at 1,024 GPUs) in memory until the collector's next pass, which a simulation runs once
    a step. And a simulation leaves the collector on, as it found it."""
    import gc

    from libra.sim.rollout import Close

    batch = WorkloadGenerator(workload_spec("search-r1", prompts_per_step=4), 0).step(0)
    groups = {t.trajectory_id: t.prompt_id for t in batch}
    router = LeastLoad(Buckets((2_000,)), measure="total")
    layout = [InstanceSpec(2, 0), InstanceSpec(4, 1), InstanceSpec(2, 0, hybrid=True)]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = RolloutSim(COST, layout, router, hybrid_leave_fraction=0.3).run(
            batch, close=Close(groups, 2) if closed else None)
        assert bool(result.suspended) == closed
        gc.collect()
        # a cycle through the rollout holds libra's objects (other threads of the test process, Prefect's
        # event loop among them, may leave garbage of their own meanwhile)
        left = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("libra.")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
    simulate(workload_spec("search-r1", prompts_per_step=4), COST, 2, ["libra"], seed=0)
    assert gc.isenabled()
