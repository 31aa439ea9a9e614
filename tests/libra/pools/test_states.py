import pytest

from libra.pools.states import TRANSITIONS, IllegalTransition, PoolEvent, Role, State, Worker


def make(role=Role.HYBRID):
    events = []
    clock = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).__next__
    return Worker("hybrid-0", role, 4, events.append, clock), events


def test_a_full_join_and_leave_cycle_records_each_transition():
    worker, events = make()
    worker.move(State.JOINING, "join_requested", 3)
    worker.note("snapshot_loaded", 4, "step 3")
    worker.move(State.TRAINING, "activated", 5)
    worker.move(State.LEAVING, "leave_requested", 9)
    worker.move(State.ROLLOUT, "released", 10, "after step 9")
    assert events == [
        PoolEvent(3, 1.0, "hybrid-0", 4, "rollout", "joining", "join_requested", ""),
        PoolEvent(4, 2.0, "hybrid-0", 4, "joining", "joining", "snapshot_loaded", "step 3"),
        PoolEvent(5, 3.0, "hybrid-0", 4, "joining", "training", "activated", ""),
        PoolEvent(9, 4.0, "hybrid-0", 4, "training", "leaving", "leave_requested", ""),
        PoolEvent(10, 5.0, "hybrid-0", 4, "leaving", "rollout", "released", "after step 9"),
    ]
    assert worker.state is State.ROLLOUT


def test_illegal_moves_raise_and_leave_the_state_alone():
    worker, events = make()
    with pytest.raises(IllegalTransition, match=r"rollout -> training on 'activated'.*join_requested -> joining"):
        worker.move(State.TRAINING, "activated", 0)
    with pytest.raises(IllegalTransition):
        worker.move(State.JOINING, "released", 0)  # right states, wrong cause
    assert worker.state is State.ROLLOUT and events == []


def test_core_workers_cannot_become_hybrids():
    core, _ = make(Role.CORE_TRAINING)
    assert core.state is State.TRAINING
    with pytest.raises(IllegalTransition):
        core.move(State.LEAVING, "leave_requested", 0)
    core.move(State.FAILED, "died", 0)
    with pytest.raises(IllegalTransition):  # a failed core worker is not a rollout worker
        core.move(State.ROLLOUT, "restarted", 0)


def test_every_live_state_can_fail_and_failed_only_restarts():
    for state in (State.ROLLOUT, State.JOINING, State.TRAINING, State.LEAVING):
        assert "died" in TRANSITIONS[(state, State.FAILED)]
    assert [to for (a, to) in TRANSITIONS if a is State.FAILED] == [State.ROLLOUT]
