"""`repo`: a tiny Python repository with one injected bug and a failing test. Tools read a file,
replace one line, and run the tests in the sandbox; the reward is 1 when the tests pass with the
bug's line the only one changed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from libra.checks import count_of
from libra.config import SandboxConfig
from libra.rollout.envs.base import Task, WorkFileError, read_work_file, rng_for, write_work_file
from libra.rollout.sandbox import Sandbox, SandboxLimits, sandbox_for

# name -> (correct body line, buggy body lines, the (args, expected) cases test_code.py shows, cases
# held on the host: the reward's run adds them, so code that returns the shown values and nothing
# else fails; the sandboxed code may see their inputs when they run, never their expected values)
FUNCTIONS = {
    "add": ("return a + b", ["return a - b", "return a + b + 1"], [((2, 3), 5), ((10, 4), 14)], [((0, 7), 7), ((-3, 12), 9)]),
    "sub": ("return a - b", ["return a + b", "return b - a"], [((7, 3), 4), ((10, 4), 6)], [((5, 9), -4), ((0, 0), 0)]),
    "mul": ("return a * b", ["return a + b", "return a * a"], [((3, 4), 12), ((5, 6), 30)], [((7, 0), 0), ((-2, 8), -16)]),
    "biggest": ("return max(a, b)", ["return min(a, b)"], [((3, 9), 9), ((8, 2), 8)], [((-5, -9), -5), ((4, 4), 4)]),
    "half": ("return a // 2", ["return a // 3", "return a * 2"], [((10,), 5), ((7,), 3)], [((1,), 0), ((-7,), -4)]),
    "square": ("return a * a", ["return a + a", "return a * 2"], [((3,), 9), ((5,), 25)], [((-4,), 16), ((0,), 0)]),
}


def cases(name: str, held: bool = False) -> list[tuple[tuple[int, ...], int]]:
    """The test cases of function `name`: those test_code.py shows, and with `held` the host's too."""
    return list(FUNCTIONS[name][2]) + (list(FUNCTIONS[name][3]) if held else [])


# Runs in the sandbox: import code.py and call each tested function on the tests' inputs; one last
# line carries the values it returned. The verdict is the host's (`verdict`), from the expected
# values the task keeps: printing "all tests passed" earns nothing, and printing forged values
# needs the expected ones, which the host's held cases never show.
MARKER = "LIBRA-TEST-RESULTS "
RUNNER = """
import importlib.util, json
spec = importlib.util.spec_from_file_location('code_module', 'code.py')
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
results = []
for name, cases in %(cases)r:
    got = []
    for args in cases:
        try:
            value = getattr(m, name)(*args)
        except Exception as e:
            got.append(["error", str(e)])
            break
        got.append(["value", value] if type(value) in (int, float, bool, str) else ["repr", repr(value)])
    results.append(got)
print(%(marker)r + json.dumps(results))
"""


def runner(names: list[str], held: bool = False) -> str:
    """The sandboxed half of a test run over the functions `names` (in the tests' order); `held`:
    the host's cases too (the reward's run)."""
    return RUNNER % {"cases": [(n, [list(args) for args, _ in cases(n, held)]) for n in names], "marker": MARKER}


def verdict(names: list[str], output: str, held: bool = False) -> tuple[str, bool] | None:
    """(the test report, whether every test passed) from the runner's last line; None when the run
    did not get that far (its own output, a traceback, is then the report). `held`: the run had the
    host's cases too."""
    lines = output.splitlines()
    if not lines or not lines[-1].startswith(MARKER):
        return None
    try:
        results = json.loads(lines[-1][len(MARKER):])
    except (ValueError, RecursionError):  # a forged line may nest deeper than the parser goes
        return None
    if not isinstance(results, list) or len(results) != len(names):
        return None
    failed = []
    for name, got in sorted(zip(names, results, strict=True)):
        for (args, want), outcome in zip(cases(name, held), got if isinstance(got, list) else [], strict=False):
            kind, value = outcome if isinstance(outcome, list) and len(outcome) == 2 else ("error", "no result")
            call = f"m.{name}({', '.join(map(str, args))})"
            if kind == "error":
                failed.append(f"FAIL test_{name}: {value}")
                break
            if kind != "value" or value != want:
                failed.append(f"FAIL test_{name}: {call} returned {value}, expected {want}")
                break
        else:
            if not isinstance(got, list) or len(got) < len(cases(name, held)):
                failed.append(f"FAIL test_{name}: no result")
    return ("\n".join(failed) if failed else f"all {len(names)} tests passed"), not failed


def _source(functions: dict[str, str]) -> str:
    lines = []
    for name, body in functions.items():
        args = "a" if len(FUNCTIONS[name][2][0][0]) == 1 else "a, b"
        lines += [f"def {name}({args}):", f"    {body}", ""]
    return "\n".join(lines)


def _tests(names: list[str]) -> str:
    lines = ["import importlib.util",
             "spec = importlib.util.spec_from_file_location('code_module', 'code.py')",
             "m = importlib.util.module_from_spec(spec)", "spec.loader.exec_module(m)", ""]
    for name in names:
        lines.append(f"def test_{name}():")
        for args, want in cases(name):
            call = f"m.{name}({', '.join(map(str, args))})"
            lines.append(f"    got = {call}")
            lines.append(f"    assert got == {want}, f'{call} returned {{got}}, expected {want}'")
        lines.append("")
    return "\n".join(lines)


class RepoEnv:
    name = "repo"
    tools = ("test", "read", "edit")
    grades_partial_work = False
    instructions = ("Fix the bug so the tests pass. Run the tests with <tool>test: all</tool>, read a file with "
                    "<tool>read: FILE</tool>, replace line N with <tool>edit: FILE N: NEW LINE</tool>; when the "
                    "tests pass reply <answer>done</answer>.")

    def __init__(self, limits: SandboxLimits | None = None, sandbox: SandboxConfig | None = None) -> None:
        self.limits = limits or SandboxLimits(timeout_s=5.0, cpu_s=3)
        self.sandbox = sandbox_for(sandbox)

    def tasks(self, count: int, seed: int) -> list[Task]:
        out = []
        for i in range(count):
            r = rng_for(seed, i, "repo")
            names = r.sample(sorted(FUNCTIONS), 3)
            buggy = r.choice(names)
            bodies = {n: FUNCTIONS[n][0] for n in names}
            bodies[buggy] = r.choice(FUNCTIONS[buggy][1])
            line = 3 * names.index(buggy) + 2
            out.append(Task("repo", f"repo-{seed}-{i}", f"The test for {buggy} fails in code.py.", "done",
                            {"code": _source(bodies), "tests": _tests(names), "names": names, "line": line,
                             "fix": f"    {FUNCTIONS[buggy][0]}"}))
        return out

    def open(self, task: Task, workdir: Path) -> _Episode:
        self.sandbox.prepare(workdir)
        write_work_file(workdir, "code.py", task.data["code"])
        return _Episode(workdir, task.data["tests"], task.data["names"], self.sandbox, self.limits, task.data["code"],
                        task.data["line"])

    def problem(self, task: Task) -> str:
        return f"{task.question}\n{task.data['code']}"

    def expert(self, task: Task) -> Callable[[str], str]:
        line, fix = task.data["line"], task.data["fix"]
        wrong = task.data["code"].splitlines()[line - 1].strip()

        def next_turn(transcript: str) -> str:  # thinks from what the tools showed, then acts
            done = transcript.count("<obs")
            last = transcript.rsplit("<obs>", 1)[1].split("</obs>")[0].strip() if done else ""
            if done == 0:
                return "I will run the tests first to see which one fails and why.\n<tool>test: all</tool>"
            if done == 1:
                failure = last.splitlines()[0] if last else "a test fails"
                return f"The tests report: {failure}. I will read code.py to find the line that causes it.\n" \
                       "<tool>read: code.py</tool>"
            if done == 2:
                return f"Line {line} of code.py is `{wrong}`, which gives the wrong result; it should be " \
                       f"`{fix.strip()}`. I will replace that line.\n<tool>edit: code.py {line}: {fix}</tool>"
            if done == 3:
                return "The line is replaced. I will run the tests again to check that they pass now.\n" \
                       "<tool>test: all</tool>"
            return f"The tests report: {last.splitlines()[0] if last else 'nothing'}. So the bug is fixed.\n" \
                   "<answer>done</answer>"
        return next_turn


class _Episode:
    FILES = ("code.py", "test_code.py")

    def __init__(self, workdir: Path, tests: str, names: list[str], sandbox: Sandbox, limits: SandboxLimits,
                 code: str, line: int) -> None:
        self.workdir, self.tests, self.names, self.sandbox, self.limits = workdir, tests, names, sandbox, limits
        self.code, self.line = code, line  # the task's code.py and its buggy line (1-based), kept on the host
        self.passed = False

    def _tests(self) -> tuple[str, str]:
        # test_code.py is for the model to read (the task's, written afresh); the run itself only
        # computes values, and the host judges them (`_run`)
        write_work_file(self.workdir, "test_code.py", self.tests)
        return self._run()

    def _run(self, held: bool = False) -> tuple[str, str]:
        result = self.sandbox.run(runner(self.names, held), self.workdir, self.limits)
        judged = verdict(self.names, result.stdout, held) if result.status == "ok" else None
        self.passed = judged is not None and judged[1]
        if judged is None:
            return result.output, "ok" if result.status in ("ok", "error") and result.exit_code in (0, 1) else result.status
        return judged[0], "ok"

    def call(self, name: str, argument: str) -> tuple[str, str]:
        try:
            return self._call(name, argument)
        except WorkFileError as exc:
            return str(exc), "error"

    def _call(self, name: str, argument: str) -> tuple[str, str]:
        if name == "test":
            return self._tests()
        if name == "read":
            file = argument.strip()
            if file not in self.FILES:
                return f"no such file {file!r}; files: {', '.join(self.FILES)}", "error"
            if file == "test_code.py":
                write_work_file(self.workdir, file, self.tests)
            lines = read_work_file(self.workdir, file).splitlines()
            return "\n".join(f"{i + 1}: {line}" for i, line in enumerate(lines)), "ok"
        target, _, new = argument.partition(":")  # edit: FILE N: NEW LINE
        parts = target.split()
        if len(parts) != 2 or parts[0] != "code.py" or not (parts[1].isascii() and parts[1].isdigit()) or not _:
            return "edit expects: code.py N: NEW LINE (only code.py may change)", "error"
        if "\n" in new or "\r" in new:  # one line: several had appended whole new definitions
            return "edit replaces one line: NEW LINE may not hold a line break", "error"
        lines = read_work_file(self.workdir, "code.py").splitlines()
        n = count_of(parts[1], len(lines))
        if not n:
            digits = parts[1].lstrip("0") or "0"
            shown = digits if len(digits) <= 12 else digits[:12] + "..."
            return f"line {shown} is out of range 1..{len(lines)}", "error"
        lines[n - 1] = new[1:] if new.startswith(" ") else new
        write_work_file(self.workdir, "code.py", "\n".join(lines) + "\n")
        return f"line {n} is now: {lines[n - 1]}", "ok"

    def reward(self, answer: str) -> float:
        """1 when the tests pass, with the host's cases added, and code.py is the task's but for its
        buggy line: the bug fixed where it is. The same edit to every function's body (one that
        computes each function's right value from its own name) passed every task's tests without
        finding the bug. code.py is read before the tests run (code under test that put the task's
        lines back as it ran had passed the check after them). The tests run as at a call, without
        rewriting test_code.py: nothing the model did to its working directory can fail the reward,
        only fail the tests."""
        if not self._only_the_bug_changed():  # checked before the tests run: their code can rewrite code.py
            return 0.0
        self._run(held=True)
        return 1.0 if self.passed else 0.0

    def _only_the_bug_changed(self) -> bool:
        try:
            now = read_work_file(self.workdir, "code.py").splitlines()
        except WorkFileError:
            return False
        given = self.code.splitlines()
        return len(now) == len(given) and all(a == b for i, (a, b) in enumerate(zip(now, given, strict=True))
                                              if i != self.line - 1)

    def partial_credit(self) -> float:
        return 0.0  # the tests pass or they do not
