"""A batch's lifecycle: every state change is a move of the table, and nothing else."""

from pathlib import Path

import pytest

from libra.pools.states import IllegalTransition
from libra.rl.batches import EVALUATION, TRANSITIONS, Batches, BatchState, Rolled
from libra.rl.records import Batch, RolloutStats


def batch(step: int) -> Batch:
    return Batch(step, (), (), RolloutStats(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0))


def rolled() -> Rolled:
    return Rolled(None, Path("/nonexistent"), ())  # type: ignore[arg-type]  # the ledger never reads the result


def test_a_training_batch_goes_rolled_scored_trained_recorded():
    b = Batches()
    b.rolled_out(3, rolled())
    assert b.state(3) is BatchState.ROLLED and b.awaiting_rewards()
    b.rolled_batch(3)
    b.scored(batch(3))
    assert b.state(3) is BatchState.SCORED and b.waiting() == {3: batch(3)} and not b.awaiting_rewards()
    assert b.take_for_update(3) == batch(3)
    assert b.state(3) is BatchState.TRAINED and b.waiting() == {}
    assert b.recorded(3) == batch(3)
    assert b.state(3) is None


def test_one_step_off_keeps_two_batches_alive_each_in_its_own_state():
    b = Batches.restored({4: batch(4)})  # scored ahead, kept by the checkpoint
    b.rolled_out(5, rolled())
    b.take_for_update(4)
    assert (b.state(4), b.state(5)) == (BatchState.TRAINED, BatchState.ROLLED)


def test_the_evaluations_batch_ends_once_scored():
    b = Batches()
    b.rolled_out(EVALUATION, rolled())
    b.scored(batch(EVALUATION))
    assert b.state(EVALUATION) is None and b.waiting() == {}
    b.rolled_out(EVALUATION, rolled())  # the next evaluation
    assert b.state(EVALUATION) is BatchState.ROLLED


@pytest.mark.parametrize("act", [
    lambda b: b.rolled_out(1, rolled()),  # rolled out twice
    lambda b: b.take_for_update(1),  # trained before its rewards
    lambda b: b.recorded(1),  # recorded before it was trained
    lambda b: b.scored(batch(2)),  # scored without a rollout
    lambda b: b.rolled_batch(2),
])
def test_moves_the_table_does_not_list_are_refused(act):
    b = Batches()
    b.rolled_out(1, rolled())
    with pytest.raises((IllegalTransition, RuntimeError)):
        act(b)
    assert b.state(1) is BatchState.ROLLED


def test_closing_discards_what_awaits_rewards_and_every_move_is_named():
    b = Batches.restored({7: batch(7)})
    b.rolled_out(8, rolled())
    assert len(b.discard()) == 1 and b.state(8) is None and b.state(7) is BatchState.SCORED
    assert set(TRANSITIONS.values()) == {"rolled_out", "scored", "discarded", "trained", "evaluated", "recorded"}
