"""The training run's pure decisions."""

from types import SimpleNamespace

import pytest

from libra.config import TrainerConfig
from libra.partial import carry_over, groups_to_start, oldest_version
from libra.rl.schedule import (
    admit,
    evaluate_after,
    hybrids_wanted,
    rolled_ahead,
    rolled_prompts,
    select_groups,
    train_task_seed,
    trained_rewards,
)
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


def test_admitted_tokens_are_counted_by_the_weights_that_generated_each():
    """A trajectory continued by a partial rollout holds tokens of several versions: it is admitted
    by its oldest, and the off-policy figures count every policy token at its own version."""
    mixed = TrainingSample("m", "p", (1, 2, 3, 4), (0, 1, 1, 1), (0.0,) * 4, 0.5, 1.0, 3, (-1, 3, 4, 5))
    fresh = TrainingSample("f", "p", (1, 2), (0, 1), (0.0, 0.0), 0.5, 1.0, 5)
    admission = admit([mixed, fresh], trainer_version=5, bound=2)
    assert [s.trajectory_id for s in admission.admitted] == ["m", "f"]
    assert (admission.staleness_max, admission.token_gap_max) == (2, 2)
    assert admission.offpolicy_share == pytest.approx(2 / 4) and admission.token_gap_mean == pytest.approx(3 / 4)
    assert admit([mixed], trainer_version=5, bound=1).admitted == ()  # its oldest token is 2 updates old
    with pytest.raises(ValueError, match="newer than the trainer's version 4"):
        admit([mixed], trainer_version=4, bound=2)


def suspended(tid: str, oldest: int) -> SimpleNamespace:
    return SimpleNamespace(trajectory_id=tid, prompt_id=tid.split("/")[0], oldest_version=oldest)


def test_suspended_groups_are_continued_or_dropped_whole_by_their_oldest_token():
    held = [suspended("a/0", 3), suspended("a/1", 1), suspended("b/0", 2), suspended("b/1", 3), suspended("c/0", 4)]
    carried = carry_over(held, trained_at=4, bound=2)
    assert [s.trajectory_id for s in carried.resumed] == ["b/0", "b/1", "c/0"]
    assert [s.trajectory_id for s in carried.dropped] == ["a/0", "a/1"] and carried.dropped_groups == 1
    assert carry_over(held, trained_at=4, bound=0).resumed == tuple(held[4:])  # on-policy: only what version 4 made
    assert carry_over([], 4, 1).resumed == ()


def test_a_trajectorys_staleness_is_its_oldest_policy_tokens_or_the_version_that_opened_it():
    assert oldest_version([4, -1, 3, 5], opened=2) == 3  # -1: a token the policy did not generate
    assert oldest_version([-1, -1], opened=2) == 2 and oldest_version((), opened=7) == 7
    assert oldest_version(iter([6, 7]), opened=6) == 6  # any iterable (a generator: each version read once)


def test_a_partial_rollout_starts_groups_up_to_the_overprovision():
    assert groups_to_start(8, 1.5, 0) == 12
    assert groups_to_start(8, 1.5, 5) == 7
    assert groups_to_start(8, 1.5, 12) == 0 and groups_to_start(8, 1.0, 20) == 0
    assert groups_to_start(3, 1.1, 0) == 4  # ceil(3.3)


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


def test_training_tasks_leave_out_the_held_out_problems_and_keep_the_rest_in_order():
    from libra.errors import LibraError
    from libra.rl.schedule import training_tasks
    from libra.rollout.envs import make_env

    math = make_env("math")  # the main job: 30 iterations of 8 prompts, 128 held-out tasks, seed 0
    held = {math.problem(t) for t in math.tasks(128, seed=0)}
    by_seed = [math.tasks(8, seed=train_task_seed(0, step)) for step in range(30)]
    seen = [t for tasks in by_seed for t in tasks if math.problem(t) in held]
    assert [t.task_id for t in seen] == ["math-1000014-2", "math-1000020-3", "math-1000025-3", "math-1000027-2"]
    drawn = [training_tasks(math, 8, train_task_seed(0, step), 128) for step in range(30)]
    assert not [t for tasks in drawn for t in tasks if math.problem(t) in held]
    assert [t.task_id for t in drawn[14]] == [t.task_id for t in by_seed[14] if t.task_id != "math-1000014-2"] \
        + ["math-1000014-8"]
    assert drawn[0] == by_seed[0]  # an iteration without a held-out problem keeps its tasks
    search = make_env("search")  # 72 problems; 1,024 held-out tasks hold them all
    with pytest.raises(LibraError, match=r"^only 0 of 128 search tasks are problems outside the first 1024 held-out "
                                         r"tasks, short of 8: lower trainer.eval_prompts"):
        training_tasks(search, 8, train_task_seed(0, 0), 1024)


def test_drifting_turn_limits_compound_per_iteration_up_to_the_context():
    from libra.rl.schedule import tokens_per_turn

    assert [tokens_per_turn(100, 0.5, step, 400) for step in range(5)] == [100, 150, 225, 338, 400]
    assert tokens_per_turn(100, 0.0, 50, 400) == 100


def test_hybrids_follow_the_schedule_from_the_last_iteration_it_names_else_the_placement():
    assert [hybrids_wanted({2: 1, 5: 0}, 3, step) for step in range(7)] == [0, 0, 1, 1, 1, 0, 0]
    assert [hybrids_wanted({}, 2, step) for step in range(3)] == [2, 2, 2]


def run(prompt: str, reward: float, category: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(prompt_id=prompt, reward=reward, category=category)


def test_dynamic_sampling_trains_on_the_first_groups_whose_rewards_differ():
    rewards = {"a": [0, 0], "b": [1, 0], "c": [1, 1], "d": [0, 1], "e": [1, 0]}
    runs = [run(p, r) for p, rs in rewards.items() for r in rs]
    chosen = select_groups(runs, dynamic=True, wanted=2)
    assert [r.prompt_id for r in chosen.trained] == ["b", "b", "d", "d"]
    assert (chosen.groups, chosen.uniform, chosen.trained_groups) == (5, 2, 2)
    everything = select_groups(runs, dynamic=False, wanted=2)  # without it every group is trained on
    assert everything.trained == tuple(runs) and (everything.uniform, everything.trained_groups) == (2, 5)
    short = select_groups(runs, dynamic=True, wanted=10)  # fewer groups differ than wanted: those there are
    assert [r.prompt_id for r in short.trained] == ["b", "b", "d", "d", "e", "e"]


def test_partial_credit_trains_a_wrong_answer_on_its_share_and_never_a_right_one_or_none():
    def scored(tid: str, prompt: str, reward: float, answer: str | None, credit: float) -> SimpleNamespace:
        return SimpleNamespace(trajectory_id=tid, prompt_id=prompt, reward=reward, answer=answer, category=None,
                               episode=SimpleNamespace(partial_credit=lambda: credit))

    runs = [scored("a0", "a", 1.0, "7", 1.0), scored("a1", "a", 0.0, "8", 2 / 3), scored("a2", "a", 0.0, None, 1.0),
            scored("b0", "b", 0.0, "1", 1 / 3), scored("b1", "b", 0.0, "2", 2 / 3)]
    assert trained_rewards(runs, 0.0) == {"a0": 1.0, "a1": 0.0, "a2": 0.0, "b0": 0.0, "b1": 0.0}
    shaped = trained_rewards(runs, 0.5)
    assert shaped == {"a0": 1.0, "a1": pytest.approx(1 / 3), "a2": 0.0, "b0": pytest.approx(1 / 6),
                      "b1": pytest.approx(1 / 3)}
    # group b's answers are both wrong, so without the credit it carries no gradient; with it, it does
    assert select_groups(runs, dynamic=False, wanted=2).uniform == 1
    assert select_groups(runs, dynamic=False, wanted=2, rewards=shaped).uniform == 0
    with pytest.raises(ValueError, match="less than 1"):
        TrainerConfig(partial_credit=1.0)


def test_a_batch_whose_groups_all_have_equal_rewards_is_trained_on_whole_and_counted():
    runs = [run("a", 0.0), run("a", 0.0), run("b", 1.0), run("b", 1.0)]
    chosen = select_groups(runs, dynamic=True, wanted=1)
    assert chosen.trained == tuple(runs) and chosen.uniform == chosen.trained_groups == 2


def test_over_sampling_rolls_out_more_prompts_and_needs_dynamic_sampling():
    assert rolled_prompts(TrainerConfig(prompts_per_step=8)) == 8
    assert rolled_prompts(TrainerConfig(prompts_per_step=8, oversample=1.5, dynamic_sampling=True)) == 12
    assert rolled_prompts(TrainerConfig(prompts_per_step=7, oversample=1.5, dynamic_sampling=True)) == 11
    with pytest.raises(ValueError, match="trainer.oversample 2 rolls out groups that only dynamic sampling uses"):
        TrainerConfig(oversample=2.0)


def test_partial_rollout_settings_that_cannot_work_are_refused_in_one_line():
    from pydantic import ValidationError

    from libra.config import LibraConfig, RolloutConfig

    with pytest.raises(ValueError, match="rollout.overprovision 1.5 starts groups beyond the batch that only partial"):
        RolloutConfig(overprovision=1.5)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        RolloutConfig(partial=True, overprovision=0.5)
    with pytest.raises(ValueError, match="rollout.partial closes the batch at prompts_per_step complete groups and "
                                         "trainer.dynamic_sampling picks among over-sampled ones: use one of them"):
        LibraConfig.model_validate({"rollout": {"partial": True},
                                    "trainer": {"dynamic_sampling": True, "oversample": 2.0}})
    with pytest.raises(ValueError, match="trainer.partial_credit 0.5 grades a trajectory's tool calls, which "
                                         "rollout.partial's resumed trajectories made in an earlier episode"):
        LibraConfig.model_validate({"rollout": {"partial": True, "overprovision": 1.5},
                                    "trainer": {"partial_credit": 0.5}})
    with pytest.raises(ValueError, match="trainer.pipeline async generates past the batch .* set rollout.partial: true"):
        LibraConfig.model_validate({"trainer": {"pipeline": "async"}})
    for pipeline in ("one_step_off", "async"):  # every suspended group would be dropped as stale
        with pytest.raises(ValueError, match=f"rollout.partial with trainer.pipeline {pipeline}: a suspended group is "
                                             "trained 2 updates after the weights that started it, so "
                                             "trainer.max_staleness 1 would drop every one; set trainer.max_staleness 2"):
            LibraConfig.model_validate({"rollout": {"partial": True, "overprovision": 1.5}, "trainer": {"pipeline": pipeline}})
        LibraConfig.model_validate({"rollout": {"partial": True, "overprovision": 1.5},
                                    "trainer": {"pipeline": pipeline, "max_staleness": 2}})
    LibraConfig.model_validate({"rollout": {"partial": True, "overprovision": 1.5},
                                "trainer": {"pipeline": "sync", "max_staleness": 1}})
    with pytest.raises(ValueError, match="pipeline async trains on batches 1 update old: max_staleness must be >= 1"):
        TrainerConfig(pipeline="async", max_staleness=0)
    assert rolled_ahead("async", 3, 10) == 4


def test_overlong_filtering_leaves_the_runs_out_of_turns_out_of_the_loss_but_not_out_of_their_groups():
    from libra.rl.schedule import loss_bearing
    from libra.trainer.samples import to_samples

    def finished(tid: str, prompt: str, reward: float, answer: str | None, length: int) -> SimpleNamespace:
        return SimpleNamespace(trajectory_id=tid, prompt_id=prompt, reward=reward, answer=answer,
                               ids=list(range(length)), mask=[0] + [1] * (length - 1),
                               logprobs=[0.0] + [-1.0] * (length - 1), versions=[], model_version=0)

    # a0 solved, a1 wrong, a2 ran out of turns (8 times as long); group b ran out of turns whole
    runs = [finished("a0", "a", 1.0, "7", 80), finished("a1", "a", 0.0, "8", 80), finished("a2", "a", 0.0, None, 640),
            finished("b0", "b", 0.0, None, 640), finished("b1", "b", 0.0, None, 640)]
    samples = to_samples(runs)
    assert [round(s.advantage, 5) for s in samples] == [1.1547, -0.57735, -0.57735, 0.0, 0.0]
    assert loss_bearing(samples, runs, overlong_filter=False) == samples
    kept = loss_bearing(samples, runs, overlong_filter=True)
    # a2 is left out, and a0 and a1 keep the advantages its reward of 0 gave their group
    assert kept == samples[:2]
    # a step of nothing but runs out of turns is trained as it is: every advantage is 0
    assert loss_bearing(samples[3:], runs[3:], overlong_filter=True) == samples[3:]
    with pytest.raises(ValueError, match="2 samples for 5 trajectories"):
        loss_bearing(samples[:2], runs, overlong_filter=True)
    assert TrainerConfig().overlong_filter is False
