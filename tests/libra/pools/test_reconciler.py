import pytest

from libra.pools.reconciler import Action, reconcile
from libra.pools.states import State

R, J, T, L, F = State.ROLLOUT, State.JOINING, State.TRAINING, State.LEAVING, State.FAILED


def test_joins_take_the_lowest_numbered_idle_hybrids():
    states = {"hybrid-10": R, "hybrid-2": R, "hybrid-1": T, "hybrid-3": R}
    assert reconcile(3, states) == [Action("join", "hybrid-2"), Action("join", "hybrid-3")]


def test_leaves_cancel_pending_joins_before_releasing_training_hybrids():
    states = {"hybrid-0": T, "hybrid-1": T, "hybrid-2": J, "hybrid-3": T}
    assert reconcile(1, states) == [Action("leave", "hybrid-2"), Action("leave", "hybrid-3"),
                                    Action("leave", "hybrid-1")]


def test_requests_in_flight_are_not_repeated():
    states = {"hybrid-0": R, "hybrid-1": R}
    assert reconcile(1, states, {"hybrid-0": "join"}) == []
    assert reconcile(0, {"hybrid-0": T}, {"hybrid-0": "leave"}) == []


def test_failed_hybrids_restart_only_when_needed():
    states = {"hybrid-0": F, "hybrid-1": R, "hybrid-2": L}
    assert reconcile(1, states) == [Action("join", "hybrid-1")]
    assert reconcile(2, states) == [Action("join", "hybrid-1"), Action("restart", "hybrid-0")]
    assert reconcile(0, states) == []  # a leaving hybrid already counts as gone


def test_negative_target_is_refused():
    with pytest.raises(ValueError, match=">= 0"):
        reconcile(-1, {})
