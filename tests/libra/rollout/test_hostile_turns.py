"""A hostile policy's turns through the real agent loop: a scripted engine stands for the model
(what it writes is the attack); the environments, the sandbox and the tokenizer are the real ones."""

import math
from collections.abc import Callable

import pytest
from transformers import AutoTokenizer

from libra.rollout.agent import rollout
from libra.rollout.engines import Generation
from libra.rollout.envs import make_env
from libra.scheduler.routers import Buckets, LeastLoad


class Scripted:
    """An engine whose every turn is `script(trajectory id, turn index)`, tokenized for real."""

    def __init__(self, tokenizer, script: Callable[[str, int], str], logprob: float = -1.0) -> None:
        self.tokenizer, self.script, self.logprob = tokenizer, script, logprob
        self.queue: list[tuple[str, int]] = []
        self.turns: dict[str, int] = {}

    def submit(self, request_id, prompt, max_tokens, stop, temperature=1.0, seed=None, min_tokens=0) -> None:
        self.queue.append((request_id, max_tokens))

    def has_work(self) -> bool:
        return bool(self.queue)

    def poll(self) -> list[tuple[str, Generation]]:
        out = []
        for tid, max_tokens in self.queue:
            turn = self.turns[tid] = self.turns.get(tid, -1) + 1
            ids = self.tokenizer(self.script(tid, turn), add_special_tokens=False)["input_ids"][:max_tokens]
            out.append((tid, Generation(ids, self.tokenizer.decode(ids), "stop", 0.0, 0, tuple([self.logprob] * len(ids)))))
        self.queue = []
        return out

    def abort_all(self) -> list[tuple[str, Generation]]:
        queued, self.queue = self.queue, []
        return [(tid, Generation([], "", "abort", 0.0, 0, ())) for tid, _ in queued]


@pytest.fixture(scope="module")
def tokenizer(policy_dir):
    return AutoTokenizer.from_pretrained(policy_dir)


def run(env_name: str, tokenizer, script, tmp_path, logprob: float = -1.0, **limits):
    env = make_env(env_name)
    return rollout(env, env.tasks(1, seed=1), 2, [Scripted(tokenizer, script, logprob)], LeastLoad(Buckets((10**6,))),
                   tokenizer, workroot=tmp_path, **limits)


def test_an_observation_of_many_tokens_a_character_stops_at_the_context_limit(tokenizer, tmp_path):
    """2,000 characters of output (what an observation keeps) of four tokens each: the trajectory's
    context once grew to 8,086 tokens against a limit of 1,536."""
    result = run("math", tokenizer, lambda tid, turn: "<tool>python: print(chr(0x1F600) * 2000)</tool>", tmp_path,
                 max_turns=8, max_tokens_per_turn=96, max_context=1536)
    for t in result.trajectories:
        assert not t.failure and len(t.ids) == 1536 and len(t.turns) == 1
        assert t.turns[0].tool_payload_tokens == 1536 - t.prompt_tokens - t.turns[0].gen_tokens


def test_a_malformed_call_is_recorded_as_malformed_whatever_name_the_model_wrote(tokenizer, tmp_path):
    """`none` names a final turn in the store (the trace format's rule): a call to an unknown tool
    named so was recorded as one, mid-trajectory."""
    names = {0: "none", 1: "shell", 2: "python"}
    result = run("math", tokenizer, lambda tid, turn: f"<tool>{names.get(turn, 'x')}: print(1)</tool>"
                 if turn < 3 else "<answer>1</answer>", tmp_path, max_turns=8, max_tokens_per_turn=96)
    for t in result.trajectories:
        assert [(u.tool_name, u.tool_status) for u in t.turns] == [("malformed", "error"), ("malformed", "error"),
                                                                   ("python", "ok"), ("none", "none")]


def test_an_edit_of_a_line_numbered_past_python_s_integer_limit_is_the_tools_error(tokenizer, tmp_path):
    """4,301 digits (int() refuses more than 4,300): the environment raised, which failed the
    trajectory and left its whole group out of the update."""
    lines = {0: "1" + "0" * 4300, 1: "0" * 4300 + "2"}  # out of range; line 2, as int() reads it
    result = run("repo", tokenizer, lambda tid, turn: f"<tool>edit: code.py {lines[turn]}: return a</tool>" if turn < 2
                 else "<answer>done</answer>", tmp_path, max_turns=4, max_tokens_per_turn=5000, max_context=20_000)
    for t in result.trajectories:
        assert not t.failure and [(u.tool_name, u.tool_status) for u in t.turns] == [
            ("edit", "error"), ("edit", "ok"), ("none", "none")]


def test_a_value_that_is_a_lone_surrogate_is_an_observation_like_any_other(tokenizer, tmp_path):
    """The code under test returns "\\udc80", which the test runner's JSON carries and the host reads
    back as a lone surrogate: the tokenizer raised on the observation, out of the whole rollout."""
    line = make_env("repo").tasks(1, seed=1)[0].data["line"]
    turns = {0: f'<tool>edit: code.py {line}:     return "\\udc80"</tool>', 1: "<tool>test: all</tool>"}
    result = run("repo", tokenizer, lambda tid, turn: turns.get(turn, "<answer>done</answer>"), tmp_path,
                 max_turns=4, max_tokens_per_turn=500, max_context=8_000)
    for t in result.trajectories:
        assert not t.failure and [(u.tool_name, u.tool_status) for u in t.turns] == [
            ("edit", "ok"), ("test", "ok"), ("none", "none")]
        shown = tokenizer.decode(t.ids[t.prompt_tokens:])
        assert "returned ?, expected" in shown and "\udc80" not in shown


@pytest.mark.parametrize("logprob", [-math.inf, math.nan])
def test_a_turn_whose_log_probs_are_not_numbers_fails_its_trajectory(tokenizer, tmp_path, logprob):
    """The trainer's importance ratio divides by the engine's log-probs: an -inf (reported from a
    vLLM backend) made one update write NaN into every weight."""
    result = run("math", tokenizer, lambda tid, turn: "<answer>1</answer>", tmp_path, logprob=logprob)
    assert [t.failure for t in result.trajectories] == [
        f"the engine returned a log-prob of {logprob} for a generated token"] * 2


def test_a_context_that_a_prompt_fills_is_refused_before_any_trajectory_opens(tokenizer, tmp_path):
    """vLLM had refused the request with a traceback, after the engines had started."""
    from libra.errors import LibraError
    from libra.rollout.envs import prompt

    env = make_env("math")
    tokens = len(tokenizer(prompt(env, env.tasks(1, seed=1)[0]), add_special_tokens=False)["input_ids"])
    with pytest.raises(LibraError, match=rf"^the math task math-1-0's prompt is {tokens} tokens, which leaves no room to "
                                         rf"generate in rollout.max_context {tokens + 1}; set rollout.max_context to at "
                                         rf"least {tokens + 97} \(the prompt and a turn\)$"):
        run("math", tokenizer, lambda tid, turn: "<answer>1</answer>", tmp_path, max_context=tokens + 1)
    assert list(tmp_path.iterdir()) == []
    result = run("math", tokenizer, lambda tid, turn: "<answer>1</answer>", tmp_path, max_context=tokens + 2)
    assert [len(t.turns) for t in result.trajectories] == [1, 1]  # one token of room: a turn
