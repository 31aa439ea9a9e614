"""A training session on the transformers engine and the shipped policy: what it may train on,
its lock, and what a resume must share with the run it continues."""

from pathlib import Path

import pytest

from libra.config import LibraConfig
from libra.errors import LibraError
from libra.planner.workload import build_workload, lengths_from_trajectories
from libra.rl.runs import config_digest, hold_run, open_session
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture


def small(tmp_path, policy, **trainer) -> LibraConfig:
    return LibraConfig.model_validate({
        "rollout": {"engine": "hf", "max_turns": 2, "max_tokens_per_turn": 32, "max_context": 512},
        "trainer": {"policy": str(policy), "run": "s", "prompts_per_step": 2, "samples_per_prompt": 2,
                    "checkpoint_dir": str(tmp_path / "checkpoints"), **trainer}})


def test_a_batch_rolled_out_beyond_the_staleness_bound_is_never_trained_on(policy_dir, tmp_path):  # noqa: F811
    session = open_session(small(tmp_path, policy_dir, pipeline="sync", max_staleness=1))
    try:
        for step in (0, 1, 2):  # the rollout runs three batches ahead of the trainer, all from version 0
            session.rollout(step)
            session.score(step)
        assert {b.stats.model_version for b in session.pending.values()} == {0}
        batch = session.pending[0]
        first = session.update(0)
        # the update's timing sample counts tokens as the planner's workload of the batch does (the
        # calibration fits on one basis and predicts on the other): no padding
        workload = build_workload(lengths_from_trajectories(batch.trajectories))
        assert first.timing.tokens == sum(t.total_tokens for t in batch.trajectories) == pytest.approx(workload.tokens)
        assert first.timing.tokens <= first.stats.padded_tokens
        session.sync()
        second = session.update(1)
        assert (first.staleness_max, first.dropped, second.staleness_max, second.dropped) == (0, 0, 1, 0)
        assert first.admitted == second.admitted == 4 and session.trainer.updates == 2
        with pytest.raises(LibraError, match="all 4 trajectories are more than 1 updates old; nothing to train on"):
            session.update(2)  # 2 updates old
        assert session.trainer.updates == 2
    finally:
        session.close()


def test_one_process_trains_a_run_at_a_time(tmp_path):
    held = hold_run(tmp_path / "run")
    try:
        with pytest.raises(LibraError, match=r"run 'run' is being trained by another process \(pid \d+\)"):
            hold_run(tmp_path / "run")
    finally:
        held.close()
    hold_run(tmp_path / "run").close()  # free again


def test_a_resume_must_share_what_the_run_trains_on_not_where_its_files_go(tmp_path):
    base = small(tmp_path, "policy-dir")
    same = [base.model_copy(update={"trainer": replace_trainer(base, steps=99, eval_every=3, run="s", keep_checkpoints=5,
                                                               checkpoint_dir="elsewhere")}),
            base.model_copy(update={"store": base.store.model_copy(update={"root": "other-store"})}),
            base.model_copy(update={"rollout": base.rollout.model_copy(update={"tool_threads": 3})})]
    different = [base.model_copy(update={"trainer": replace_trainer(base, lr=1e-3)}),
                 base.model_copy(update={"rollout": base.rollout.model_copy(update={"temperature": 0.7})}),
                 base.model_copy(update={"trainer": replace_trainer(base, schedule="cosine")})]
    assert all(config_digest(c) == config_digest(base) for c in same)
    assert all(config_digest(c) != config_digest(base) for c in different)
    cosine = base.model_copy(update={"trainer": replace_trainer(base, schedule="cosine")})
    longer = cosine.model_copy(update={"trainer": replace_trainer(cosine, steps=99)})
    assert config_digest(longer) != config_digest(cosine)  # the step count shapes a cosine schedule


def replace_trainer(config: LibraConfig, **values):
    return config.trainer.model_copy(update=values)


def test_an_unnamed_run_resumes_under_its_derived_name(tmp_path):
    base = small(tmp_path, "policy-dir", run="")
    named = base.model_copy(update={"trainer": replace_trainer(base, run="train-math-seed0")})
    assert base.trainer.run_name() == "train-math-seed0" and config_digest(base) == config_digest(named)


def test_runs_checkpointed_before_layouts_were_planned_resume_and_a_planned_one_is_another_run():
    """A fixed layout (the default) leaves the digest as it was before `trainer.layout` existed (the
    value below is what that version computed for this config); `planned` trains otherwise."""
    config = LibraConfig.model_validate({"trainer": {"policy": "/nonexistent/policy", "run": "digest",
                                                     "backend": "megatron", "tp": 2}})
    assert config_digest(config) == "9a728cc89c556b27"
    planned = LibraConfig.model_validate({"trainer": {"policy": "/nonexistent/policy", "run": "digest",
                                                      "backend": "megatron", "layout": "planned"},
                                          "placement": {"strategy": "colocated"}, "rollout": {"engine": "vllm"}})
    assert config_digest(planned) != config_digest(planned.model_copy(update={"trainer": replace_trainer(planned, layout="fixed")}))


def test_no_failed_trajectory_and_no_group_that_lost_one_reaches_an_update(policy_dir, tmp_path):  # noqa: F811
    from libra.rl.schedule import train_task_seed
    from tests.libra.rollout.test_failures import Flaky

    config = small(tmp_path, policy_dir, pipeline="sync", prompts_per_step=3, samples_per_prompt=2)
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={"max_tokens_per_turn": 96,
                                                                                    "max_context": 1024})})
    session = open_session(config)
    try:
        tasks = session.env.tasks(3, seed=train_task_seed(0, 0))
        session.env = Flaky(session.env, {tasks[0].task_id}, set())
        session.rollout(0)
        rolled = session.batches.rolled_batch(0).result
        failed = {r.prompt_id for r in rolled.failed}
        batch = session.score(0)
        assert batch.stats.failed == len(rolled.failed) and batch.stats.dropped_groups == len(failed)
        trained = {s.trajectory_id.rsplit("/", 1)[0] for s in batch.samples}
        assert not trained & failed and {t.prompt_id for t in batch.trajectories} == trained
        assert failed == {tasks[0].task_id}  # the policy calls its python tool on these tasks
        assert batch.stats.trajectories == 4 and len(batch.samples) == 4
        update = session.update(0)
        assert update.admitted == len(batch.samples)
    finally:
        session.close()


def test_an_engine_that_died_in_a_rollout_is_started_again_at_the_next_sync(policy_dir, tmp_path):  # noqa: F811
    from tests.libra.rollout.test_failures import Dying

    config = small(tmp_path, policy_dir, pipeline="sync")
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={"instances": 2, "router": "least-load"})})
    session = open_session(config)
    try:
        dying = session.engines[0] = Dying(session.engines[0], after=2)
        session.rollout(0)
        assert session.dead_engines == (0,)
        session.score(0)
        session.update(0)
        session.sync()
        assert dying.closed and session.engines[0] is not dying and session.dead_engines == ()
        assert session.engine_starts[-1].workers == 1
        session.rollout(1)  # both engines serve again
        assert session.dead_engines == ()
    finally:
        session.close()


def test_tools_that_fail_or_hang_and_an_engine_killed_mid_batch_never_stall_a_step_or_reach_an_update(policy_dir, tmp_path):  # noqa: F811
    """One task in ten has a tool that raises (step 0) or hangs (step 1), and one of two engines dies
    in step 0's batch: both steps complete, the failures are counted in the record's row, and no
    sample of a group that lost a trajectory is trained on."""
    from libra.rl.schedule import train_task_seed
    from tests.libra.rollout.test_failures import Dying, Flaky

    config = small(tmp_path, policy_dir, pipeline="sync", prompts_per_step=10, samples_per_prompt=2)
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={
        "instances": 2, "router": "least-load", "max_tokens_per_turn": 96, "max_context": 1024, "tool_timeout_s": 2.0})})
    session = open_session(config)
    flaky = None
    try:
        step_tasks = [session.env.tasks(10, seed=train_task_seed(0, step)) for step in (0, 1)]
        flaky = session.env = Flaky(session.env, {step_tasks[0][0].task_id}, {step_tasks[1][3].task_id})
        dying = session.engines[0] = Dying(session.engines[0], after=3)
        for step, task in ((0, step_tasks[0][0]), (1, step_tasks[1][3])):
            session.rollout(step)
            rolled = session.batches.rolled_batch(step).result
            batch = session.score(step)
            update = session.update(step)
            session.sync()
            failed = {r.prompt_id for r in rolled.failed}
            assert failed == {task.task_id}  # the policy calls its python tool on this task
            trained = {s.trajectory_id.rsplit("/", 1)[0] for s in batch.samples}
            assert not trained & failed and len(trained) == 9 and update.admitted == len(batch.samples) == 18
            assert (batch.stats.failed, batch.stats.dropped_groups) == (len(rolled.failed), 1)
        assert dying.closed and session.dead_engines == ()  # started again at step 0's sync
    finally:
        if flaky is not None:
            flaky.release.set()
        session.close()


def test_partial_credit_is_refused_for_an_environment_that_grades_no_partial_work(policy_dir, tmp_path):  # noqa: F811
    config = small(tmp_path, policy_dir, partial_credit=0.5)
    config = config.model_copy(update={"trainer": config.trainer.model_copy(update={"env": "search"})})
    with pytest.raises(LibraError, match="trainer.partial_credit 0.5: the search environment grades no partial work"):
        open_session(config)
    assert not (tmp_path / "checkpoints").exists()  # refused before anything is written


def test_an_environment_without_problems_apart_from_the_held_out_ones_is_refused_before_any_work(
        policy_dir, tmp_path):  # noqa: F811
    config = small(tmp_path, policy_dir)
    config = config.model_copy(update={"trainer": config.trainer.model_copy(update={"env": "search",
                                                                                     "eval_prompts": 1024})})
    with pytest.raises(LibraError, match="are problems outside the first 1024 held-out tasks, short of "):
        open_session(config)
    assert not (tmp_path / "checkpoints").exists()


def test_workers_this_machine_cannot_make_are_refused_before_any_work(policy_dir, tmp_path):  # noqa: F811
    config = small(tmp_path, policy_dir)
    config = config.model_copy(update={"placement": config.placement.model_copy(update={"strategy": "static",
                                                                                         "cores_per_worker": 1024})})
    with pytest.raises(LibraError, match=r"core\(s\) make no worker of 1024 cores; lower placement.cores_per_worker$"):
        open_session(config)
    assert not (tmp_path / "checkpoints").exists()


def test_dynamic_sampling_trains_only_groups_whose_rewards_differ_and_the_policy_moves(policy_dir, tmp_path):  # noqa: F811
    """A few updates with dynamic sampling over twice the groups on the HF engine: finite losses,
    weights that changed, and no group whose rewards were all equal in an update."""


    from libra.rl.schedule import rolled_prompts

    config = small(tmp_path, policy_dir, pipeline="sync", prompts_per_step=4, samples_per_prompt=4, lr=2e-4,
                   dynamic_sampling=True, oversample=2.0)
    # turns long enough for the policy's reasoning and its python call, so some samples solve their task
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={"max_turns": 3,
                                                                                    "max_tokens_per_turn": 96})})
    informative = 0

    def check(batch, groups: dict[str, list]) -> None:
        nonlocal informative
        assert batch.stats.groups == rolled_prompts(config.trainer) - batch.stats.dropped_groups
        assert len(groups) == batch.stats.trained_groups <= config.trainer.prompts_per_step
        if batch.stats.uniform_groups < batch.stats.groups:  # some group's rewards differed
            informative += 1
            assert all(len({s.reward for s in members}) > 1 for members in groups.values())
            assert all(any(s.advantage != 0 for s in members) for members in groups.values())

    train_checked(config, 3, check)
    assert informative > 0


def train_checked(config: LibraConfig, steps: int, check, after=None) -> None:
    """`steps` iterations of `config`, each scored batch handed to `check` with its samples by group;
    every update's loss finite, and every weight moved by the end (`after`: then handed the session)."""
    import math

    import torch

    session = open_session(config)
    try:
        before = [p.detach().clone() for p in session.trainer.model.parameters()]
        for step in range(steps):
            session.rollout(step)
            batch = session.score(step)
            groups: dict[str, list] = {}
            for sample in batch.samples:
                groups.setdefault(sample.prompt_id, []).append(sample)
            check(batch, groups)
            update = session.update(step)
            assert math.isfinite(update.stats.loss) and update.stats.tokens > 0
            session.sync()
        changed = sum(not torch.equal(a, b.detach()) for a, b in zip(before, session.trainer.model.parameters(), strict=True))
        assert changed == len(before)
        if after is not None:
            after(session)
    finally:
        session.close()


def test_updates_of_the_main_jobs_recipe_learn_from_the_groups_whose_rewards_differ(tmp_path, monkeypatch):
    """configs/demo.yaml's trainer settings from the policy it trains (the shipped tuning on math),
    on the HF engine with 4 prompts x 4 samples: every step has groups whose rewards differ (the
    policy solves some tasks and fails others), only those carry advantages, the trajectories that
    ran out of turns are left out of the loss when the recipe filters them (and only those, and
    never in the evaluation's batch, which trains nothing), the losses are finite and every weight
    moves."""
    from pathlib import Path

    import yaml

    from libra.rollout.policy import SHIPPED_TUNED

    recipe = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "demo.yaml").read_text())["trainer"]
    assert recipe["policy"] == ".libra/policy-math"
    trainer = {k: v for k, v in recipe.items() if k not in ("policy", "run", "steps", "eval_every", "eval_prompts")}
    config = LibraConfig.model_validate({
        "rollout": {"engine": "hf", "max_turns": 3, "max_tokens_per_turn": 96},
        "trainer": {**trainer, "policy": str(SHIPPED_TUNED["math"]), "run": "recipe", "pipeline": "sync",
                    "prompts_per_step": 4, "samples_per_prompt": 4, "eval_prompts": 4,
                    "checkpoint_dir": str(tmp_path / "checkpoints")}})

    def check(batch, groups: dict[str, list]) -> None:
        rewards: dict[str, set[float]] = {}  # each whole group's, its samples trained on or not
        for trajectory in batch.trajectories:
            rewards.setdefault(trajectory.prompt_id, set()).add(trajectory.reward)
        differ = {prompt for prompt, seen in rewards.items() if len(seen) > 1}
        assert differ and len(rewards) - len(differ) == batch.stats.uniform_groups
        assert all(s.advantage == 0 for prompt, g in groups.items() if prompt not in differ for s in g)
        assert all(any(s.advantage != 0 for s in groups[prompt]) for prompt in differ)
        # overlong filtering: the trajectories that ran out of turns are in the store, not in the loss
        out_of_turns = {t.trajectory_id for t in batch.trajectories if t.outcome == "unanswered"}
        assert {s.trajectory_id for s in batch.samples} == \
            {t.trajectory_id for t in batch.trajectories} - (out_of_turns if recipe.get("overlong_filter") else set())

    def evaluated(session) -> None:
        import libra.rl.session as module
        from libra.rl.batches import EVALUATION
        from libra.rl.schedule import loss_bearing

        filtered = []  # the evaluation's batch trains nothing: it never filters (greedy runs rarely run out)
        monkeypatch.setattr(module, "loss_bearing", lambda samples, runs, overlong: filtered.append(overlong)
                            or loss_bearing(samples, runs, overlong), raising=True)
        session.rollout(EVALUATION, evaluation=True)
        batch = session.score(EVALUATION)
        assert len(batch.trajectories) == 4 and filtered == [False]
        assert {s.trajectory_id for s in batch.samples} == {t.trajectory_id for t in batch.trajectories}

    train_checked(config, 2, check, evaluated)


def test_partial_rollouts_carry_incomplete_groups_and_drop_stale_ones_counted_and_checkpointed(policy_dir, tmp_path):  # noqa: F811
    """Synchronous partial rollouts on vLLM over three iterations with max_staleness 1: each batch
    closes at 2 complete groups of the 4 in flight, the others are carried whole (into the
    checkpoint too, which a reopened session continues from), a group older than the bound is
    dropped and counted, and the updates report how off-policy their tokens were."""
    from libra.rl.records import IterationRecord

    config = small(tmp_path, policy_dir, pipeline="sync", max_staleness=1, samples_per_prompt=3)
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={
        "engine": "vllm", "partial": True, "overprovision": 2.0, "max_turns": 3, "max_tokens_per_turn": 64,
        "min_tokens_per_turn": 32})})
    session = open_session(config)
    carried = []
    try:
        for step in range(3):
            before = {s.trajectory_id: s.oldest_version for s in session.suspended}
            session.rollout(step)
            batch = session.score(step)
            stats = batch.stats
            assert stats.groups >= 2 and stats.trajectories == 3 * stats.groups
            assert stats.resumed + stats.stale_dropped == len(before)
            assert stats.stale_dropped == sum(1 for v in before.values() if step - v > 1)
            assert stats.suspended == len(session.suspended) and stats.suspended % 3 == 0
            update = session.update(step)
            gaps = [step - v for s in batch.samples for v in s.policy_token_versions()]
            assert update.token_gap_max == max(gaps) and update.offpolicy_share == pytest.approx(
                sum(g > 0 for g in gaps) / len(gaps))
            session.sync()
            carried.append(stats.resumed)
            session.checkpoint(IterationRecord(step, session.batches.recorded(step), update, {"iteration": 1.0, "train": 1.0}))
        assert sum(carried) > 0, "no suspended group was continued"
        held = {s.trajectory_id for s in session.suspended}
    finally:
        session.close()
    again = open_session(config)
    try:
        assert {s.trajectory_id for s in again.suspended} == held
    finally:
        again.close()


def test_a_checkpoints_planning_state_is_typed_and_an_older_dict_reads_the_same() -> None:
    from libra.errors import LibraError
    from libra.rl.session import PlanningState

    placement, cluster = object(), object()
    state = PlanningState.of({"placement": placement, "controller": None, "plan_events": {3: [{"event": "x"}]},
                              "cluster": cluster})
    assert state == PlanningState(placement, None, {3: [{"event": "x"}]}, cluster)  # type: ignore[arg-type]
    assert PlanningState.of(state) is state and PlanningState.of(None) is None
    with pytest.raises(LibraError, match="a checkpoint's planning state is a list, not one Libra wrote"):
        PlanningState.of([1])


def test_evaluating_past_the_tasks_a_policy_was_tuned_apart_from_is_refused() -> None:
    """Past the first 1,024 held-out tasks, the held-out problems include ones the shipped tuned policy
    was tuned on (190 of the first 2,000)."""
    from libra.config import LibraConfig
    from libra.errors import LibraError
    from libra.rl.runs import check_policy

    tuned = str(Path(__file__).resolve().parents[3] / "data" / "policy-math")
    config = LibraConfig.model_validate({"trainer": {"policy": tuned, "env": "math", "eval_prompts": 1024}})
    assert check_policy(config) == Path(tuned)
    with pytest.raises(LibraError, match=r"^trainer.eval_prompts 1025 is more than the 1024 held-out tasks the policy "
                                         r"was tuned apart from"):
        check_policy(config.model_copy(update={"trainer": config.trainer.model_copy(update={"eval_prompts": 1025})}))


def test_a_policy_whose_record_is_not_one_is_refused_in_one_line(tmp_path) -> None:
    import shutil

    from libra.config import LibraConfig
    from libra.errors import LibraError
    from libra.rl.runs import check_policy

    tuned = Path(__file__).resolve().parents[3] / "data" / "policy-math"
    policy = tmp_path / "policy"
    policy.mkdir()
    shutil.copyfile(tuned / "config.json", policy / "config.json")
    config = LibraConfig.model_validate({"trainer": {"policy": str(policy), "env": "math", "eval_prompts": 2000}})
    assert check_policy(config) == policy  # no record: nothing to hold the evaluation to
    (policy / "libra_policy.json").write_text('{"tuned": {"settings": {"env": "math", "held_out": 1024}')
    with pytest.raises(LibraError, match=r"libra_policy.json is not a policy's record \(Expecting ',' delimiter: "
                                         r"line 1 column 57 \(char 56\)\); build the policy again"):
        check_policy(config)
    (policy / "libra_policy.json").write_text('["tuned"]')
    with pytest.raises(LibraError, match=r"libra_policy.json is not a policy's record \(not a JSON object\)"):
        check_policy(config)
    (policy / "libra_policy.json").write_text('{"tuned": {"settings": {"env": "search", "held_out": 8}}}')
    assert check_policy(config) == policy  # tuned on another environment
