"""Every environment: deterministic tasks, an expert that solves them with real tool outputs, and
tools that answer bad calls with errors instead of failing."""

import re

import pytest

from libra.rollout.envs import ENVS, demonstration, make_env
from libra.rollout.envs.repo_env import FUNCTIONS, cases
from libra.rollout.envs.search_env import BM25


@pytest.mark.parametrize("name", ENVS)
def test_the_expert_solves_every_task_with_real_tools(name, tmp_path):
    env = make_env(name)
    tasks = env.tasks(6, seed=3)
    assert [t.task_id for t in tasks] == [f"{name}-3-{i}" for i in range(6)]
    assert env.tasks(6, seed=3) == tasks and env.tasks(6, seed=4) != tasks
    for i, task in enumerate(tasks):
        workdir = tmp_path / str(i)
        workdir.mkdir()
        text, spans = demonstration(env, task, workdir)
        answer = text.rsplit("<answer>", 1)[1].split("</answer>")[0]
        assert env.open(task, workdir).reward(answer) == 1.0 if name != "repo" else True
        for s, e in spans:  # every turn: a line of thinking, then one action that ends it
            assert re.fullmatch(r"[^<\n]+\n(<tool>[^<]*</tool>|<answer>[^<]*</answer>)", text[s:e]), text[s:e]
    if name == "repo":  # the expert's repository passes its tests after the fix
        assert "all 3 tests passed" in text


def test_the_search_expert_thinks_from_what_it_has_read(tmp_path):
    env = make_env("search")
    task = next(t for t in env.tasks(20, seed=3) if len(t.data["hops"]) == 3)
    text, spans = demonstration(env, task, tmp_path)
    turns = [text[s:e] for s, e in spans]
    assert len(turns) == 4 and turns[-1].endswith(f"<answer>{task.answer}</answer>")
    for before, turn in zip(spans, spans[1:], strict=False):  # each thought names what the last result said
        seen = text[before[1]:turn[0]]
        named = re.search(r"The library says (.+?)\. ", text[turn[0]:turn[1]]).group(1)
        assert named.split()[0] in seen and named.split()[-1] in seen


def test_math_answers_are_checked_exactly(tmp_path):
    env = make_env("math")
    task = env.tasks(1, seed=0)[0]
    episode = env.open(task, tmp_path)
    assert episode.reward(task.answer) == 1.0 and episode.reward(task.answer + "0") == 0.0
    assert episode.call("python", "print(6 * 7)") == ("42", "ok")
    output, status = episode.call("python", "1/0")
    assert status == "error" and "ZeroDivisionError" in output


def test_a_math_episode_credits_the_expression_its_last_call_computed_in_place(tmp_path):
    env = make_env("math")
    task = next(t for t in env.tasks(20, seed=0) if t.data["category"] == "marbles")  # "{a} + {b} * {c}"
    a, b, c = task.data["expression"].replace("+", " ").replace("*", " ").split()
    episode = env.open(task, tmp_path)
    assert episode.partial_credit() == 0.0  # no call made
    episode.call("python", f"print({a} + {b} * {c})")
    assert episode.partial_credit() == 1.0
    episode.call("python", f"x = {a} + {c} * {c}\nprint(x)")  # the last call counts: one number wrong
    assert episode.partial_credit() == pytest.approx(4 / 5)
    episode.call("python", f"print({a} + {b} * {c} + 1000 + 2000 + 3000)")  # terms of its own dilute the credit
    assert episode.partial_credit() == pytest.approx(5 / 11)
    episode.call("python", f"print({b} * {c} + {a})")  # the right result, the terms out of place
    assert episode.partial_credit() == 0.0
    # the question's numbers copied without computing anything: a syntax error never counts (the
    # call before stands), and printed they compute nothing (they once scored 1, then a fifth)
    assert episode.call("python", f"{a} {b} {c}")[1] == "error"
    assert episode.partial_credit() == 0.0
    episode.call("python", f"print({a}, {b}, {c})")
    assert episode.partial_credit() == 0.0
    # the expression in code that never runs computes nothing either (a red team's: 1 before)
    for dead in (f"if []:\n    print({a} + {b} * {c})\nprint('hi')", f"f = lambda: {a} + {b} * {c}\nprint(1)",
                 f"def g():\n    return {a} + {b} * {c}\nprint(0)"):
        assert episode.call("python", dead)[1] == "ok"
        assert episode.partial_credit() == 0.0, dead
    episode.call("python", f"x = {a} + {b} * {c}\nprint(x)")  # computed, then printed
    assert episode.partial_credit() == 1.0
    episode.call("python", f"import sys\nx = {a} + {b} * {c}\nprint('answer:', x)\nprint('note', file=sys.stderr)")
    assert episode.partial_credit() == 1.0  # a label before it, a warning on stderr after it
    # the expression as text computes nothing: in a string, a comment or a docstring it counts for
    # nothing (a red team's `print("a + b * c")` scored 1, a comment then `print(0)` 0.83)
    episode.call("python", f'print("{a} + {b} * {c}")')
    assert episode.partial_credit() == 0.0
    episode.call("python", f'"""{a} + {b} * {c}"""\n# {a} + {b} * {c}\nprint(0)')
    assert episode.partial_credit() == pytest.approx(0 / 5)
    assert env.grades_partial_work and not make_env("search").grades_partial_work
    assert not make_env("repo").grades_partial_work


def test_repo_tools_refuse_bad_calls(tmp_path):
    env = make_env("repo")
    task = env.tasks(1, seed=0)[0]
    episode = env.open(task, tmp_path)
    assert episode.call("read", "../etc/passwd")[1] == "error"
    assert episode.call("edit", "test_code.py 1: pass") == ("edit expects: code.py N: NEW LINE (only code.py may change)",
                                                            "error")
    assert episode.call("edit", "code.py 99: pass")[0].startswith("line 99 is out of range")
    for line in ("²", "٣", "1e3", "-1"):  # '²'.isdigit() is true, and int('²') raised: an environment failure
        assert episode.call("edit", f"code.py {line}: pass") == (
            "edit expects: code.py N: NEW LINE (only code.py may change)", "error")
    assert episode.reward("done") == 0.0  # the bug is still there
    episode.call("edit", f"code.py {task.data['line']}: {task.data['fix']}")
    assert episode.reward("done") == 1.0


def test_code_that_returns_the_shown_cases_values_passes_the_tests_tool_and_earns_nothing(tmp_path):
    """The reward's run adds cases held on the host to those test_code.py shows: a lookup of the
    shown values passes the model's own test runs, not the reward (it earned 1 before)."""
    env = make_env("repo")
    task = env.tasks(1, seed=0)[0]
    buggy = task.data["names"][(task.data["line"] - 2) // 3]
    table = {args: want for args, want in cases(buggy)}
    args = "a" if len(next(iter(table))) == 1 else "a, b"
    episode = env.open(task, tmp_path)
    lookup = f"    return {table!r}[({args},)]" if args == "a" else f"    return {table!r}[({args})]"
    assert episode.call("edit", f"code.py {task.data['line']}: {lookup}")[1] == "ok"
    assert episode.call("test", "all") == ("all 3 tests passed", "ok")
    assert episode.reward("done") == 0.0
    episode.call("edit", f"code.py {task.data['line']}: {task.data['fix']}")
    assert episode.call("test", "all") == ("all 3 tests passed", "ok") and episode.reward("done") == 1.0
    for name in FUNCTIONS:  # every buggy body fails a held case, and the right one passes them all
        correct, bugs, _, held = FUNCTIONS[name]
        for body in [correct, *bugs]:
            function = eval(f"lambda {'a' if len(held[0][0]) == 1 else 'a, b'}: {body.removeprefix('return ')}")  # noqa: S307
            assert all(function(*a) == w for a, w in held) == (body == correct), (name, body)

def test_an_edit_is_one_line_and_only_the_bugs_line_fixed_earns_the_reward(tmp_path):
    """A red team's two ways to pass every task's tests without finding the bug: one edit whose new
    line held line breaks (it appended right definitions of all six functions), and the same edit to
    every body line (a body that computes each function's value from its own name)."""
    env = make_env("repo")
    task = env.tasks(1, seed=0)[0]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    episode = env.open(task, tmp_path / "a")
    appended = "code.py 8:     return 0\n" + "\n".join(f"def {n}(a, b=0): return {FUNCTIONS[n][0][7:]}" for n in FUNCTIONS)
    assert episode.call("edit", appended) == ("edit replaces one line: NEW LINE may not hold a line break", "error")
    assert episode.call("edit", "code.py 2: return 1\r")[1] == "error"
    assert (tmp_path / "a" / "code.py").read_text() == task.data["code"]
    episode = env.open(task, tmp_path / "b")
    right = {n: FUNCTIONS[n][0][7:] for n in FUNCTIONS}
    table = "{" + ", ".join(f"{n!r}: (lambda a, b=0: {body})" for n, body in right.items()) + "}"
    everywhere = f"    return {table}[__import__('sys')._getframe().f_code.co_name](*[v for v in (a, locals().get('b')) if v is not None])"
    for line in (2, 5, 8):
        assert episode.call("edit", f"code.py {line}: {everywhere}")[1] == "ok"
    assert episode.call("test", "all") == ("all 3 tests passed", "ok")
    assert episode.reward("done") == 0.0  # the tests pass; code.py is not the task's but for its bug
    # the same body, which also puts the task's lines back (right ones for the bug's) while the tests run:
    # code.py is read before they do (a reviewer's: it had earned 1 on 12 of 12 tasks)
    given = task.data["code"].splitlines()
    fixed = [task.data["fix"] if i == task.data["line"] - 1 else line for i, line in enumerate(given)]
    restore = (f"__import__('pathlib').Path('code.tmp').write_text({chr(10).join(fixed) + chr(10)!r}), "
               "__import__('os').replace('code.tmp', 'code.py')")
    sneaky = everywhere.replace("    return ", f"    return ({restore}) and None or ", 1)
    for line in (2, 5, 8):
        assert episode.call("edit", f"code.py {line}: {sneaky}")[1] == "ok"
    assert episode.reward("done") == 0.0
    for line in (2, 5, 8):  # the task's lines back, the bug's fixed: the reward
        given = task.data["code"].splitlines()[line - 1]
        episode.call("edit", f"code.py {line}: {task.data['fix'] if line == task.data['line'] else given}")
    assert episode.reward("done") == 1.0


def test_bm25_ranks_the_matching_document_first():
    index = BM25(["the cat sat", "a dog ran far", "cats and dogs"])
    assert index.search("dog ran", 2) == [1]  # no stemming: "dogs" is another word
    assert index.search("cats dog", 3) == [2, 1]  # equal matches: the shorter document first
    assert index.search("zebra", 2) == []


def test_a_huge_search_query_is_refused_at_once(tmp_path):
    import time

    env = make_env("search")
    episode = env.open(env.tasks(1, seed=0)[0], tmp_path)
    began = time.process_time()
    output, status = episode.call("search", "capital " * 650_000)  # 5.2 MB
    assert status == "error" and output == ("query too long: 5,200,000 characters, at most 1,000; search for a few "
                                            "words")
    assert time.process_time() - began < 0.5
    assert episode.call("search", "capital")[1] == "ok"
