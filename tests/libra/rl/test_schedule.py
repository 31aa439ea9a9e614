"""The training run's pure decisions."""

import pytest

from libra.rl.schedule import admit, evaluate_after, hybrids_wanted, rolled_ahead, train_task_seed
from libra.trainer.samples import TrainingSample


def sample(tid: str, version: int) -> TrainingSample:
    return TrainingSample(tid, "p", (1, 2), (0, 1), (0.0, -1.0), 0.5, 1.0, version)


def test_only_trajectories_within_the_staleness_bound_are_admitted():
    samples = [sample("a", 5), sample("b", 4), sample("c", 3), sample("d", 1)]
    admission = admit(samples, trainer_version=5, bound=1)
    assert [s.trajectory_id for s in admission.admitted] == ["a", "b"]
    assert admission.dropped == ("c", "d")
    assert admission.staleness_max == 4 and admission.staleness_mean == pytest.approx((0 + 1 + 2 + 4) / 4)
    assert [s.trajectory_id for s in admit(samples, 5, 0).admitted] == ["a"]
    assert admit([], 5, 1).admitted == ()


def test_a_trajectory_from_newer_weights_than_the_trainer_is_a_bug():
    with pytest.raises(ValueError, match="newer than the trainer's version 2"):
        admit([sample("a", 3)], trainer_version=2, bound=1)


def test_evaluation_at_the_start_every_n_and_at_the_end():
    assert [c for c in range(0, 13) if evaluate_after(c, steps=12, every=5)] == [0, 5, 10, 12]


def test_one_step_off_rolls_out_the_next_iteration_beside_the_update():
    assert rolled_ahead("one_step_off", 3, 10) == 4
    assert rolled_ahead("one_step_off", 9, 10) is None
    assert rolled_ahead("sync", 3, 10) is None


def test_each_iteration_has_its_own_tasks_away_from_the_held_out_seed():
    seeds = {train_task_seed(seed, step) for seed in range(3) for step in range(1000)}
    assert len(seeds) == 3000 and min(seeds) >= 1_000_000


def test_drifting_turn_limits_compound_per_iteration_up_to_the_context():
    from libra.rl.schedule import tokens_per_turn

    assert [tokens_per_turn(100, 0.5, step, 400) for step in range(5)] == [100, 150, 225, 338, 400]
    assert tokens_per_turn(100, 0.0, 50, 400) == 100


def test_hybrids_follow_the_schedule_from_the_last_iteration_it_names_else_the_placement():
    assert [hybrids_wanted({2: 1, 5: 0}, 3, step) for step in range(7)] == [0, 0, 1, 1, 1, 0, 0]
    assert [hybrids_wanted({}, 2, step) for step in range(3)] == [2, 2, 2]
