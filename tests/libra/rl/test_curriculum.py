"""The curriculum by task category (`trainer.curriculum`): counts, rates, the draw, and the run's
state that carries them."""

import random
from collections import Counter
from types import SimpleNamespace

import pytest

from libra.config import LibraConfig, TrainerConfig
from libra.errors import LibraError
from libra.rl.curriculum import POOL, curriculum_tasks, informative_rate, remembered
from libra.rl.schedule import iteration_tasks, select_groups, train_task_seed, training_tasks
from libra.rollout.envs import Task, make_env


def task(i: int, category: str) -> Task:
    return Task("math", f"t{i}", "?", "0", {"category": category})


def test_counts_decay_by_iteration_and_add_the_iterations_groups():
    counts = remembered({}, [("a", 4, 1), ("b", 2, 2)], 0.5)
    assert counts == {"a": [4.0, 1.0], "b": [2.0, 2.0]}
    counts = remembered(counts, [("a", 2, 2), ("c", 1, 0)], 0.5)
    assert counts == {"a": [4.0, 2.5], "b": [1.0, 1.0], "c": [1.0, 0.0]}


def test_an_unseen_category_is_tried_at_one_half_and_none_falls_to_zero():
    counts = {"never": [10.0, 0.0], "always": [10.0, 10.0]}
    assert informative_rate(counts, "unseen") == 0.5
    assert informative_rate(counts, "never") == 1 / 12
    assert informative_rate(counts, "always") == 11 / 12


def test_prompts_are_drawn_in_proportion_to_the_informative_rates():
    candidates = [task(i, "never" if i % 2 else "always") for i in range(4_000)]
    counts = {"never": [10.0, 0.0], "always": [10.0, 10.0]}
    drawn = curriculum_tasks(candidates, 1_000, counts, random.Random(0))
    shares = Counter(t.data["category"] for t in drawn)
    assert shares["always"] == pytest.approx(1_000 * 11 / 12, abs=20)  # 917 expected; binomial sd 8.7
    # each category's candidates are taken in their order, each at most once
    always = [t.task_id for t in drawn if t.data["category"] == "always"]
    assert always == [f"t{i}" for i in range(0, 2 * len(always), 2)]
    assert len({t.task_id for t in drawn}) == 1_000
    # the same counts and seed draw the same tasks (a resumed run draws what it would have)
    assert curriculum_tasks(candidates, 1_000, counts, random.Random(0)) == drawn


def test_a_category_that_runs_out_leaves_the_draw_to_the_others():
    candidates = [task(0, "a"), task(1, "b"), task(2, "b"), task(3, "b")]
    drawn = curriculum_tasks(candidates, 4, {"a": [0.0, 100.0]}, random.Random(1))
    assert sorted(t.task_id for t in drawn) == ["t0", "t1", "t2", "t3"]
    with pytest.raises(ValueError, match="5 tasks wanted from 4 candidates"):
        curriculum_tasks(candidates, 5, {}, random.Random(1))


def test_groups_are_counted_by_category_and_whether_their_rewards_differ():
    def run(prompt: str, reward: float, category: str | None) -> SimpleNamespace:
        return SimpleNamespace(prompt_id=prompt, reward=reward, category=category)

    runs = [run("p1", 0, "tank"), run("p1", 1, "tank"), run("p2", 1, "tank"), run("p2", 1, "tank"),
            run("p3", 0, "pages"), run("p3", 0, "pages"), run("p4", 1, None), run("p4", 0, None)]
    chosen = select_groups(runs, dynamic=False, wanted=4)
    assert chosen.by_category == (("pages", 1, 0), ("tank", 2, 1))  # a task without a category is not counted
    assert (chosen.groups, chosen.uniform) == (4, 2)


def test_iteration_tasks_follow_the_curriculum_only_when_asked_and_never_hold_a_held_out_problem():
    math = make_env("math")
    seed = train_task_seed(0, 14)  # an iteration whose stream holds a held-out problem
    plain = TrainerConfig(eval_prompts=128)
    assert iteration_tasks(math, 16, seed, plain, {"tank": [50.0, 50.0]}) == training_tasks(math, 16, seed, 128)
    taught = TrainerConfig(eval_prompts=128, curriculum=True)
    counts = {c: [30.0, 0.0] for c in ("marbles", "teams", "times-plus", "pages", "pens")} | {"tank": [30.0, 30.0]}
    drawn = iteration_tasks(math, 16, seed, taught, counts)
    held = {math.problem(t) for t in math.tasks(128, seed=0)}
    assert not [t for t in drawn if math.problem(t) in held]
    pool = {t.task_id for t in training_tasks(math, 16 * POOL, seed, 128)}
    assert {t.task_id for t in drawn} <= pool and len({t.task_id for t in drawn}) == 16
    # tank's rate is 31/32 against 1/32 for each other category: 31 of 36 of the draws
    assert Counter(t.data["category"] for t in drawn)["tank"] == 13
    assert iteration_tasks(math, 16, seed, taught, counts) == drawn
    # no counts yet (the first iterations): every category at one half, as good as a uniform draw
    first = Counter(t.data["category"] for t in iteration_tasks(math, 600, seed, taught, None))
    assert len(first) == 6 and min(first.values()) >= 75


def test_a_run_keeps_the_counts_in_its_checkpoint_state():
    from libra.rl.records import Batch, IterationRecord, RolloutStats, Update, advanced
    from libra.trainer.checkpoint import CheckpointState
    from libra.trainer.trainer import UpdateStats

    stats = RolloutStats(8, 100, 1.0, 0.5, 0.5, 0.5, 1.0, 10.0, 0, 0, groups_by_category=(("tank", 3, 2),))
    update = Update(UpdateStats(0.5, 1.0, 0.0, 2.0, 0.1, 0.01, 64, 4, 80, 1e-5, 0.2), 8, 0, 1, 1.0)
    record = IterationRecord(0, Batch(0, (), (), stats), update, {"iteration": 2.0})
    state = CheckpointState("r", 0, 0, "digest", summary={"curriculum": {"tank": [2.0, 0.0], "pens": [1.0, 1.0]}})
    after = advanced(state, record, 1, "", 0.5)
    assert after.summary["curriculum"] == {"tank": [4.0, 2.0], "pens": [0.5, 0.5]}
    assert record.metrics()["informative_tank"] == 2 / 3


def test_the_curriculum_is_refused_for_an_environment_without_task_categories(tmp_path):
    from libra.rl.runs import check_tasks

    config = LibraConfig.model_validate({"trainer": {"env": "search", "curriculum": True, "eval_prompts": 8,
                                                     "prompts_per_step": 2, "samples_per_prompt": 2}})
    with pytest.raises(LibraError, match=r"^trainer.curriculum draws prompts by task category, and the search "
                                         r"environment's tasks have none; set trainer.curriculum false, or train on math$"):
        check_tasks(config)
    with pytest.raises(ValueError, match="curriculum_decay"):
        TrainerConfig(curriculum_decay=1.0)
