from types import SimpleNamespace

from tasks.sim_records import hybrid_lifecycle


def test_simulated_hybrids_follow_the_pool_lifecycle_table():
    step = SimpleNamespace(step=4, step_s=10.0, hybrid_events=((2.0, "leave_rollout", 8), (1.0, "leave_rollout", 8),
                                                              (3.5, "join_training", 8)))
    rows = [(e.worker_id, e.time_s, e.from_state, e.to_state, e.event) for e in hybrid_lifecycle("libra", step, 100.0)]
    assert rows == [
        ("libra/hybrid-0", 101.0, "rollout", "joining", "join_requested"),
        ("libra/hybrid-0", 103.5, "joining", "training", "activated"),
        ("libra/hybrid-0", 110.0, "training", "leaving", "leave_requested"),
        ("libra/hybrid-0", 110.0, "leaving", "rollout", "released"),
        ("libra/hybrid-1", 102.0, "rollout", "joining", "join_requested"),
        ("libra/hybrid-1", 110.0, "joining", "rollout", "cancelled"),  # training ended before its fetch did
    ]


def test_the_stored_steps_add_up_to_each_systems_run(tmp_path):
    """A one-step-off run trains its last batch after its last rollout: the last step's row carries
    that training's seconds with its tokens, so the rows' tokens over their seconds is the run's."""
    import pytest

    from flows.simulate import simulation_request
    from libra.config import PlannerConfig, StoreConfig
    from libra.planner.planner import PlannerSettings
    from libra.sim.runner import draw, simulate_system
    from storage.catalog import Catalog
    from tasks.sim_records import record_store
    from tasks.sim_tasks import request_cost

    planner = PlannerConfig()
    request = simulation_request("search-r1", "2x8:a800", steps=6, systems="libra,verl-colocated", run="sums")
    cost = request_cost(request, planner)
    drawn = draw(request.spec(), cost, request.steps, request.seed)
    runs = {p: simulate_system(p, drawn, PlannerSettings.of(planner), planner) for p in request.systems}
    assert runs["libra"].tail_train_s > 0 and runs["verl-colocated"].tail_train_s == 0  # one-step-off, colocated
    record_store(runs, "sums", StoreConfig(root=str(tmp_path), fsync=False))
    with Catalog(tmp_path, "sums") as catalog:
        rows = {r["policy"]: r for r in catalog.query(
            "SELECT policy, sum(step_s) AS seconds, sum(trained_tokens) AS tokens, max(start_s + step_s) AS end_s "
            "FROM steps GROUP BY policy").to_pylist()}
        last = catalog.query("SELECT step_s, train_s FROM steps WHERE policy = 'libra' ORDER BY step DESC LIMIT 1").to_pylist()[0]
    for name, run in runs.items():
        assert rows[name]["seconds"] == pytest.approx(run.total_time_s)
        assert rows[name]["end_s"] == pytest.approx(run.total_time_s)
        assert rows[name]["tokens"] == run.trained_tokens
    libra_last = runs["libra"].steps[-1]
    assert (last["step_s"], last["train_s"]) == pytest.approx((libra_last.step_s + runs["libra"].tail_train_s,
                                                               libra_last.train_s + runs["libra"].tail_train_s))
