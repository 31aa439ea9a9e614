from libra.rollout.protocol import Action, observation, parse

TOOLS = ("python", "search")


def test_tool_calls_and_answers():
    assert parse("let me compute <tool>python: print(1 + 2)</tool>", TOOLS) == Action("tool", "python", "print(1 + 2)")
    assert parse("<answer> 42 </answer>", TOOLS) == Action("answer", argument="42")
    assert parse("<tool>search: a</tool> then <answer>b</answer>", TOOLS).kind == "answer"  # the later tag wins


def test_malformed_turns_become_errors_that_say_what_to_do():
    unknown = parse("<tool>shell: ls</tool>", TOOLS)
    assert (unknown.kind, unknown.name) == ("malformed", "shell")
    assert unknown.error == "unknown tool 'shell'; tools: python, search"
    assert "expected <tool>NAME: ARGUMENT</tool>" in parse("<tool>python print(1)</tool>", TOOLS).error
    assert "expected <tool>NAME: ARGUMENT</tool>" in parse("<tool>python: print(1)", TOOLS).error
    assert parse("I think the answer is 4", TOOLS).error.startswith("no tool call and no answer")


def test_observations():
    assert observation("7", "ok") == "<obs>7</obs>\n"
    assert observation("boom", "timeout") == "<obs status=error>boom</obs>\n"
    assert observation("x" * 10, "ok", max_chars=4) == "<obs>xxxx [...]</obs>\n"
