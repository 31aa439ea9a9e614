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
