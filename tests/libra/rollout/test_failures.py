"""Rollout failures are bounded and visible: a tool whose environment raises, a tool call that
hangs, and a trajectory that runs past its limit each fail that trajectory with the reason; the
others finish, the batch never waits on what hangs, and no failure is scored."""

import threading
import time

import pytest

from libra.rollout.agent import rollout
from libra.rollout.engines import HFEngine
from libra.rollout.envs import make_env
from libra.scheduler.routers import Buckets, LeastLoad


class Flaky:
    """An environment whose episodes of some tasks fail: `broken` raise from their tool, `hung` block
    in it until released."""

    def __init__(self, env, broken: set[str], hung: set[str]) -> None:
        self.env, self.broken, self.hung = env, broken, hung
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self.env, name)

    def open(self, task, workdir):
        episode = self.env.open(task, workdir)
        flaky = self

        class Episode:
            def call(self, name, argument):
                if task.task_id in flaky.broken:
                    raise RuntimeError("the index is gone")
                if task.task_id in flaky.hung:
                    flaky.release.wait(60)
                return episode.call(name, argument)

            def reward(self, answer):
                return episode.reward(answer)

        return Episode()


@pytest.fixture(scope="module")
def engine(policy_dir):
    return HFEngine(policy_dir, size=1)


def test_a_failing_and_a_hanging_tool_fail_their_trajectories_and_the_batch_goes_on(engine, tmp_path):
    env = make_env("search")
    tasks = env.tasks(4, seed=5)
    flaky = Flaky(env, {tasks[0].task_id}, {tasks[1].task_id})
    began = time.monotonic()
    try:
        result = rollout(flaky, tasks, 2, [engine], LeastLoad(Buckets((10**6,))), engine.tokenizer, temperature=0.0,
                         workroot=tmp_path, tool_timeout_s=2.0, max_turns=3)
    finally:
        flaky.release.set()
    assert time.monotonic() - began < 50  # the hung calls were given up on, not waited for (60 s)
    by_task = {t.task_id: [r for r in result.trajectories if r.prompt_id == t.task_id] for t in tasks}
    called = [r for r in result.trajectories if r.turns and r.turns[0].tool_name == "search"]
    assert called, "the policy called no tool; choose other seeds"
    for run in by_task[tasks[0].task_id]:
        if run in called or run.failed:
            assert run.failure == "the search tool's environment failed: RuntimeError: the index is gone"
            assert run.reward == 0.0 and run.done
    for run in by_task[tasks[1].task_id]:
        if run.failed:
            assert run.failure == "a search call did not return within 2 s (rollout.tool_timeout_s)"
    assert {r.prompt_id for r in result.failed} == {tasks[0].task_id, tasks[1].task_id}
    assert not any(r.failed for t in tasks[2:] for r in by_task[t.task_id])


def test_a_trajectory_past_its_time_limit_fails(engine, tmp_path):
    env = make_env("search")
    tasks = env.tasks(2, seed=5)
    flaky = Flaky(env, set(), {t.task_id for t in tasks})
    try:
        result = rollout(flaky, tasks, 1, [engine], LeastLoad(Buckets((10**6,))), engine.tokenizer, temperature=0.0,
                         workroot=tmp_path, tool_timeout_s=600.0, trajectory_timeout_s=2.0, max_turns=3)
    finally:
        flaky.release.set()
    called = [r for r in result.trajectories if r.failed]
    assert called and all(r.failure == "still running after 2 s (rollout.trajectory_timeout_s)" for r in called)


def test_only_whole_groups_are_kept_and_the_statistics_count_the_rest():
    from types import SimpleNamespace

    from libra.rl.records import RolloutStats
    from libra.rl.schedule import select_groups, whole_groups

    def run(prompt, reward, failure=""):
        return SimpleNamespace(prompt_id=prompt, reward=reward, failure=failure, failed=bool(failure), turns=[1],
                               ids=[0] * 12, prompt_tokens=2, answer="7", category=None)

    runs = [run("a", 1.0), run("a", 0.0), run("b", 0.0, "tool failed"), run("b", 1.0), run("c", 1.0), run("c", 1.0)]
    kept = whole_groups(runs)
    assert kept == [runs[0], runs[1], runs[4], runs[5]]
    result = SimpleNamespace(trajectories=runs, failed=[runs[2]], generated_tokens=60, wall_s=3.0, migrations=0,
                             suspended=(), resumed=0)
    stats = RolloutStats.of(result, kept, 4, select_groups(kept, dynamic=False, wanted=2))
    assert (stats.trajectories, stats.failed, stats.dropped_groups, stats.reward_mean) == (4, 1, 1, 0.75)
    assert (stats.groups, stats.uniform_groups, stats.trained_groups, stats.unanswered) == (2, 1, 2, 0)


class Dying:
    """An engine that fails at its `after`-th step (an engine process killed mid-batch)."""

    def __init__(self, engine, after: int) -> None:
        self.engine, self.after, self.steps, self.closed = engine, after, 0, False

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def poll(self):
        self.steps += 1
        if self.steps >= self.after:
            raise RuntimeError("engine process died")
        return self.engine.poll()

    def close(self):
        self.closed = True


def test_an_engine_that_dies_mid_batch_hands_its_turns_to_another_once(policy_dir, engine, tmp_path):
    env = make_env("search")
    spare = HFEngine(policy_dir, size=1)
    try:
        router = LeastLoad(Buckets((60, 10**6)))  # two buckets, one an instance
        result = rollout(env, env.tasks(4, seed=5), 2, [Dying(spare, after=2), engine], router, engine.tokenizer,
                         temperature=0.0, workroot=tmp_path, max_turns=3)
    finally:
        spare.close()
    assert result.dead_engines == (0,)
    assert not result.failed and all(r.done for r in result.trajectories)
    moved = [r for r in result.trajectories if r.retried]
    assert moved and all(t.instance == 1 for r in moved for t in r.turns[-1:])


def test_when_every_engine_dies_the_batch_fails_with_the_engines_error(policy_dir, tmp_path):
    env = make_env("search")
    only = HFEngine(policy_dir, size=1)
    try:
        with pytest.raises(RuntimeError, match="engine process died"):
            rollout(env, env.tasks(2, seed=5), 1, [Dying(only, after=1)], LeastLoad(Buckets((10**6,))), only.tokenizer,
                    temperature=0.0, workroot=tmp_path)
    finally:
        only.close()


def test_rewards_are_computed_side_by_side_and_one_that_raises_fails_only_its_trajectory():
    """A repo reward runs the tests in the sandbox, up to its time limit: a batch's rewards run
    `threads` at a time. Four episodes whose rewards each wait for the other three complete only if
    they are computed together; a reward that raises fails its own trajectory."""
    from types import SimpleNamespace

    from libra.rollout.agent import score_rewards

    together = threading.Barrier(4, timeout=30)

    class Waits:
        def reward(self, answer):
            together.wait()
            return 1.0

    class Broken:
        def reward(self, answer):
            raise RuntimeError("the index is gone")

    runs = [SimpleNamespace(failed=False, answer="x", episode=Waits(), reward=None, failure=None) for _ in range(4)]
    runs += [SimpleNamespace(failed=False, answer="x", episode=Broken(), reward=None, failure=None),
             SimpleNamespace(failed=True, answer="x", episode=Broken(), reward=None, failure="hung"),
             SimpleNamespace(failed=False, answer=None, episode=Broken(), reward=None, failure=None)]
    score_rewards(runs, threads=4)
    assert [(r.reward, r.failure) for r in runs] == [(1.0, None)] * 4 + [
        (None, "its reward could not be computed: RuntimeError: the index is gone"), (None, "hung"), (0.0, None)]
