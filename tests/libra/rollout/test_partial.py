"""Partial rollouts in the agent loop: a batch that closes at k complete groups suspends the others
whole (tokens, behaviour log-probs, each token's weights version, working files), and a later
rollout continues them where they stopped, under newer weights, each token generated once."""

import os
import threading
import time
from pathlib import Path

import pytest

from libra.rl.schedule import whole_groups
from libra.rollout.agent import rollout
from libra.rollout.engines import HFEngine, VLLMEngine
from libra.rollout.envs import make_env
from libra.rollout.suspend import WorkdirTooLarge, restore_files, snapshot_files
from libra.scheduler.routers import Buckets, LeastLoad


@pytest.fixture(scope="module")
def vllm_engine(policy_dir):
    engine = VLLMEngine(policy_dir, size=1)
    yield engine
    engine.close()


def generated(run) -> int:
    return run.generated_tokens + len(run.partial_ids)


class Finishing(LeastLoad):
    """Least-load routing that also counts the groups every sample of which has ended."""

    def __init__(self, buckets: Buckets, samples: int) -> None:
        super().__init__(buckets)
        self.samples, self.group_of, self.ended = samples, {}, {}

    def start(self, trajectory_id, prompt_id, prompt_tokens):
        self.group_of[trajectory_id] = prompt_id
        return super().start(trajectory_id, prompt_id, prompt_tokens)

    def finish(self, trajectory_id, position):
        prompt = self.group_of.get(trajectory_id)  # (a resumed trajectory was started by an earlier rollout)
        self.ended[prompt] = self.ended.get(prompt, 0) + 1
        super().finish(trajectory_id, position)

    def complete_groups(self) -> int:
        return sum(n == self.samples for n in self.ended.values())


class MidTurn:
    """A real engine that stops stepping, and lets the batch close (`hold`), at the first step
    after which `groups` groups have ended and some turn is part-generated: the batch then closes
    while that turn is in flight, whatever the timing of the machine (the trajectories of a batch
    move nearly in lockstep, so without it the close may fall where every turn is at its tool).
    It waits at most `patience_s` for the close, then steps again."""

    def __init__(self, engine, router: Finishing, groups: int, patience_s: float = 30.0) -> None:
        self.engine, self.router, self.groups, self.patience_s = engine, router, groups, patience_s
        self.hold, self.paused_at = threading.Event(), None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def poll(self):
        if self.paused_at is not None and time.monotonic() - self.paused_at < self.patience_s:
            time.sleep(0.005)
            return []
        done = self.engine.poll()
        if (not self.hold.is_set() and not done and self.router.complete_groups() >= self.groups
                and any(out.outputs[0].token_ids for out in self.engine.progress.values())):
            self.paused_at = time.monotonic()
            self.hold.set()
        return done

    def abort_all(self):
        self.paused_at = None
        return self.engine.abort_all()


def test_a_closed_batch_suspends_incomplete_groups_whole_and_a_later_rollout_continues_them(vllm_engine, policy_dir,
                                                                                              tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    env = make_env("math")
    router = Finishing(Buckets((10**6,)), samples=4)
    midturn = MidTurn(vllm_engine, router, groups=2)  # the batch closes while a turn is being generated
    limits = {"min_tokens_per_turn": 40, "max_tokens_per_turn": 96, "max_turns": 4}
    first = rollout(env, env.tasks(4, seed=3), 4, [midturn], router, tokenizer, close_after=2, model_version=0,
                    workroot=tmp_path / "first", hold=midturn.hold, **limits)
    ended = {r.prompt_id for r in first.trajectories}
    held = {s.prompt_id for s in first.suspended}
    assert len(ended) >= 2 and held and not ended & held  # a group is ended or suspended, never split
    assert all(sum(s.prompt_id == p for s in first.suspended) == 4 for p in held)  # whole, its ended samples too
    assert len(whole_groups(first.trajectories)) >= 8
    interrupted = [s for s in first.suspended if s.run.partial is not None and s.run.partial.token_ids]
    assert interrupted, "no turn was interrupted mid-generation"
    for s in first.suspended:
        run = s.run
        assert len(run.ids) == len(run.mask) == len(run.logprobs) == len(run.versions)
        assert s.oldest_version == 0 and s.files == () and run.episode is None
    assert first.generated_tokens == sum(r.generated_tokens for r in first.trajectories) + \
        sum(generated(s.run) for s in first.suspended)

    second = rollout(env, [], 4, [vllm_engine], router, tokenizer, resume=first.suspended, model_version=1,
                     workroot=tmp_path / "second", **limits)
    assert second.resumed == len(first.suspended) and not second.suspended
    assert {r.trajectory_id for r in second.trajectories} == {s.trajectory_id for s in first.suspended}
    for s in first.suspended:
        run = next(r for r in second.trajectories if r.trajectory_id == s.trajectory_id)
        before = s.run.ids + list(s.run.partial_ids)
        assert run.ids[:len(before)] == before and run.suspensions == 1 and not run.failed
        if s.run.done:  # it had ended: it waited for its group
            assert run.ids == s.run.ids and run.new_tokens == 0
        assert run.model_version == 0  # its oldest token's
        policy = [v for v in run.versions if v >= 0]
        assert policy[:len([v for v in s.run.versions if v >= 0])] == [0] * len([v for v in s.run.versions if v >= 0])
        if not s.run.done:
            assert policy[-1] == 1
    # every token generated once: what both rollouts generated is what the trajectories hold
    assert first.generated_tokens + second.generated_tokens == \
        sum(r.generated_tokens for r in first.trajectories + second.trajectories)
    # an interrupted turn was continued from its last token: the engine scores the whole sequence
    # (the weights did not change) as it generated it, past the interruption. (A token sampled while
    # the floor held the stop tokens back, a turn's first 40, is scored without that mask: only
    # the tokens past the floor are compared.)
    continued = 0
    for s in interrupted:
        run = next(r for r in second.trajectories if r.trajectory_id == s.trajectory_id)
        scored = vllm_engine.sequence_logprobs(run.ids)
        cut = len(s.run.ids) + len(s.run.partial.token_ids)  # the first continued token
        past_floor = [i for t in run.turns for i in range(t.context_tokens + 40, t.context_tokens + t.gen_tokens)]
        after = [i for i in past_floor if i >= cut]
        assert max((abs(scored[i - 1] - run.logprobs[i]) for i in past_floor), default=0.0) < 1e-2
        continued += len(after)
    assert continued, "no continued turn went past the floor"


def test_the_transformers_engine_gives_back_its_queued_requests_unstarted(policy_dir):
    engine = HFEngine(policy_dir, size=1)
    engine.submit("a", [5, 6, 7], 8, ["</tool>"], 1.0)
    engine.submit("b", [5, 6], 8, ["</tool>"], 1.0)
    aborted = engine.abort_all()
    assert [(rid, g.token_ids, g.finish) for rid, g in aborted] == [("a", [], "abort"), ("b", [], "abort")]
    assert not engine.has_work()


class Fragile:
    """An environment whose episodes cannot be opened again (its index gone while they waited)."""

    def __init__(self, env) -> None:
        self.env, self.broken = env, False

    def __getattr__(self, name):
        return getattr(self.env, name)

    def open(self, task, workdir):
        if self.broken:
            raise RuntimeError("the index is gone")
        return self.env.open(task, workdir)


def test_a_trajectory_whose_environment_fails_while_suspended_fails_with_its_group(vllm_engine, policy_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    env = Fragile(make_env("math"))
    router = LeastLoad(Buckets((10**6,)))
    limits = {"min_tokens_per_turn": 40, "max_tokens_per_turn": 96, "max_turns": 4}
    first = rollout(env, env.tasks(3, seed=4), 2, [vllm_engine], router, tokenizer, close_after=1,
                    workroot=tmp_path / "first", **limits)
    assert first.suspended
    env.broken = True
    second = rollout(env, [], 2, [vllm_engine], router, tokenizer, resume=first.suspended, model_version=1,
                     workroot=tmp_path / "second", **limits)
    assert len(second.failed) == len(first.suspended)
    assert all(r.failure == "its environment could not be opened again after a suspension: RuntimeError: the index "
               "is gone" and r.reward == 0.0 for r in second.failed)
    assert whole_groups(second.trajectories) == []  # never scored as if it had ended


def test_a_working_directory_is_kept_as_its_plain_files_and_folders(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b"
    (source / "data").mkdir(parents=True)
    (source / "code.py").write_text("x = 1\n")
    (source / "data" / "rows.csv").write_bytes(b"1,2\n")
    os.chmod(source / "code.py", 0o600)
    files = snapshot_files(source, 1 << 20)
    assert [(f.path, f.mode, f.data) for f in files] == [("data", 0o755, None), ("code.py", 0o600, b"x = 1\n"),
                                                         ("data/rows.csv", 0o644, b"1,2\n")]
    target.mkdir()
    (target / "code.py").write_text("the environment's own\n")
    restore_files(target, files)
    assert (target / "code.py").read_text() == "x = 1\n" and (target / "data" / "rows.csv").read_bytes() == b"1,2\n"
    assert os.stat(target / "code.py").st_mode & 0o777 == 0o600
    # what the model's code made of the environment's files is what comes back: a folder where the
    # environment writes a file, a file where it makes a folder (a resume once failed on those)
    swapped, fresh = tmp_path / "swapped", tmp_path / "fresh"
    (swapped / "code.py").mkdir(parents=True)
    (swapped / "data").write_text("a file\n")
    fresh.mkdir()
    (fresh / "code.py").write_text("the environment's own\n")
    (fresh / "data" / "inner").mkdir(parents=True)
    restore_files(fresh, snapshot_files(swapped, 1 << 20))
    assert (fresh / "code.py").is_dir() and (fresh / "data").read_text() == "a file\n"


def test_a_working_directory_that_cannot_be_kept_is_refused_with_the_reason(tmp_path):
    big, linked = tmp_path / "big", tmp_path / "linked"
    big.mkdir()
    linked.mkdir()
    (big / "blob").write_bytes(b"x" * 2048)
    with pytest.raises(WorkdirTooLarge, match="more than 1,024 bytes of files"):
        snapshot_files(big, 1024)
    (linked / "secret").symlink_to("/etc/passwd")
    with pytest.raises(WorkdirTooLarge, match="'secret', which is neither a folder nor a plain file"):
        snapshot_files(linked, 1 << 20)
    from libra.rollout.suspend import WorkFile

    deep, long = tmp_path / "deep", tmp_path / "long"
    (deep / "/".join(["d"] * 65)).mkdir(parents=True)  # os.walk would recurse; 1,100 levels once stopped a rollout
    with pytest.raises(WorkdirTooLarge, match="folders more than 64 deep"):
        snapshot_files(deep, 1 << 20)
    (long / "/".join(["x" * 250] * 5)).mkdir(parents=True)  # 17 such levels once passed PATH_MAX
    with pytest.raises(WorkdirTooLarge, match="a path of more than 1,024 characters"):
        snapshot_files(long, 1 << 20)
    with pytest.raises(WorkdirTooLarge, match="could not be read: No such file or directory"):
        snapshot_files(tmp_path / "gone", 1 << 20)
    with pytest.raises(ValueError, match="is not a path inside its working directory"):
        restore_files(Path(tmp_path), (WorkFile("../escape", 0o644, 0, 0, b"x"),))


def test_a_held_batch_generates_until_released_and_takes_only_the_first_groups_to_complete(vllm_engine, policy_dir,
                                                                                            tmp_path):
    """The asynchronous pipeline's rollout: while `hold` is unset the batch does not close, however
    many groups are complete (never released here: every trajectory runs to its end); it takes
    exactly `close_after` groups, the first to complete, and carries the groups that completed
    after them whole, as ended samples for the next batch."""
    import threading

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    env = make_env("math")
    result = rollout(env, env.tasks(4, seed=6), 2, [vllm_engine], LeastLoad(Buckets((10**6,))), tokenizer,
                     close_after=1, hold=threading.Event(), max_turns=3, max_tokens_per_turn=64, workroot=tmp_path)
    assert len({r.prompt_id for r in result.trajectories}) == 1
    assert len(result.suspended) == 6 and all(s.run.done and s.run.partial is None for s in result.suspended)
    first = max(r.finished for r in result.trajectories)
    carried: dict[str, list] = {}
    for s in result.suspended:
        carried.setdefault(s.prompt_id, []).append(s.run)
    assert all(max(r.finished for r in runs) >= first for runs in carried.values())


def test_a_working_directory_shaped_to_break_the_suspension_ends_its_sample_with_no_answer(tmp_path):
    """A tool's code shapes its working directory so that it cannot be kept (1,100 folders deep,
    which a recursive walk cannot read; a link; more than the limit): suspending the batch ends that
    sample where it stands, without an answer (a reward of 0), and carries its group whole. It once
    failed the group, whose 0s were then left out of the update: a way for a policy to hide its worst
    samples."""
    from libra.clock import WallClock
    from libra.rollout.agent import start, suspend_groups

    env = make_env("math")
    tasks = env.tasks(3, seed=0)
    runs = start(env, tasks, [[1, 2, 3]] * len(tasks), 2, LeastLoad(Buckets((10**6,))), tmp_path, 1, 0, WallClock())
    victim, linked = runs[f"{tasks[0].task_id}/0"], runs[f"{tasks[2].task_id}/1"]
    deep = victim.workdir
    for _ in range(1_100):
        deep = deep / "d"
        deep.mkdir()
    (linked.workdir / "x").symlink_to("code")
    linked.done, linked.answer = True, "42"  # ended with an answer before the batch closed
    for run in runs.values():  # the batch closed with every group incomplete
        run.suspended = not run.done
    kept = suspend_groups(runs, 1 << 20, WallClock())
    assert runs == {} and len(kept) == 6
    ended = {s.trajectory_id: (s.run.done, s.run.suspended, s.run.answer, s.run.failure, s.files) for s in kept
             if s.run.done}
    assert ended == {victim.trajectory_id: (True, False, None, "", ()), linked.trajectory_id: (True, False, None, "", ())}
    assert all(s.run.suspended and not s.run.failed for s in kept if not s.run.done)
    from libra.files import remove_tree

    remove_tree(victim.workdir)  # (pytest's own clean-up recurses)


def test_files_that_do_not_fit_a_working_directory_again_end_their_sample_with_no_answer(tmp_path):
    """A tool's files kept at suspension (a sparse file comes back whole) that the new working
    directory cannot hold: the resume failed the sample as an environment failure, and its group
    with it, hiding its 0. Now the sample ends unanswered and its group goes on."""
    from libra.clock import WallClock
    from libra.config import SandboxConfig
    from libra.rollout.agent import resumed, start, suspend_groups

    env = make_env("math")
    tasks = env.tasks(1, seed=0)
    router = LeastLoad(Buckets((10**6,)))
    runs = start(env, tasks, [[1, 2, 3]] * len(tasks), 2, router, tmp_path / "a", 1, 0, WallClock())
    victim = runs[f"{tasks[0].task_id}/0"]
    with open(victim.workdir / "sparse", "wb") as handle:
        handle.truncate(3 << 20)  # no block on the disk; 3 MiB of zeros when read
    for run in runs.values():
        run.suspended = True
    kept = suspend_groups(runs, 4 << 20, WallClock())
    small = make_env("math", SandboxConfig(workdir_bytes=2 << 20))
    again = resumed(small, kept, router, tmp_path / "b", 1, WallClock())
    assert {tid: (r.done, r.answer, r.failure) for tid, r in again.items()} == {
        victim.trajectory_id: (True, None, ""), f"{tasks[0].task_id}/1": (False, None, "")}


def test_a_sample_that_had_ended_keeps_its_duration_when_its_group_resumes(tmp_path):
    """Its times are the suspending process's clock: the resume moved its start to the new clock and
    kept its old end, and its stored rollout time came out negative (-3.0 s after a 3 s wait)."""
    from libra.clock import SimClock
    from libra.rollout.agent import resumed, start, suspend_groups

    env = make_env("math")
    tasks = env.tasks(1, seed=0)
    router = LeastLoad(Buckets((10**6,)))
    runs = start(env, tasks, [[1, 2, 3]] * len(tasks), 2, router, tmp_path / "a", 1, 0, SimClock(100.0))
    ended = runs[f"{tasks[0].task_id}/0"]
    ended.done, ended.finished = True, 103.0
    runs[f"{tasks[0].task_id}/1"].suspended = True
    kept = suspend_groups(runs, 1 << 20, SimClock(110.0))
    again = resumed(env, kept, router, tmp_path / "b", 1, SimClock(5.0))  # a process resumed from a checkpoint
    back = again[ended.trajectory_id]
    assert (back.started, back.finished) == (-5.0, -2.0) and back.record().rollout_s == 3.0


def test_the_files_a_batch_suspends_are_capped_together_in_even_shares(tmp_path):
    """Each suspended sample may keep `rollout.suspend_bytes` of files, and all of a batch's together
    `rollout.suspend_total_bytes`, an even share each: past it a sample ends where it stands,
    unanswered, its group carried (a policy filling every directory to just under the first cap made
    every checkpoint hold that times the samples suspended). Names and entries count too: empty
    files of long names had pickled to 10 MB under a limit of 0."""
    from libra.clock import WallClock
    from libra.rollout.agent import start, suspend_groups
    from libra.rollout.suspend import ENTRY_BYTES

    env = make_env("math")
    tasks = env.tasks(3, seed=0)
    runs = start(env, tasks, [[1, 2, 3]] * len(tasks), 2, LeastLoad(Buckets((10**6,))), tmp_path, 1, 0, WallClock())
    order = list(runs)
    for i, run in enumerate(runs.values()):
        if i == 4:  # no data at all, but many entries
            for n in range(20):
                (run.workdir / f"{n:0100d}").touch()
        else:
            (run.workdir / "filler").write_bytes(b"x" * (3000 if i % 2 == 0 else 100))
        run.suspended = True
    kept = suspend_groups(runs, 4000, WallClock(), total=6 * 1000)  # an even share: 1,000 bytes each
    assert runs == {} and [s.trajectory_id for s in kept] == order
    held = [sum(len(f.data) for f in s.files if f.data is not None) for s in kept]
    assert held == [0, 100, 0, 100, 0, 100]  # the first sample's 3,000 bytes never took the others' share
    assert [s.run.answer is None and s.run.done for s in kept] == [True, False, True, False, True, False]
    assert len("filler") + 100 + ENTRY_BYTES <= 1000 < 20 * (100 + ENTRY_BYTES)
