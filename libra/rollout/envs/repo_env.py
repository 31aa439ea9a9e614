"""`repo`: a tiny Python repository with one injected bug and a failing test. Tools read a file,
replace one line, and run the tests in the sandbox; the reward is 1 when the tests pass."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from libra.config import SandboxConfig
from libra.rollout.envs.base import Task, WorkFileError, read_work_file, rng_for, write_work_file
from libra.rollout.sandbox import Sandbox, SandboxLimits, sandbox_for

# name -> (correct body line, buggy body lines, (args, expected) cases)
FUNCTIONS = {
    "add": ("return a + b", ["return a - b", "return a + b + 1"], [((2, 3), 5), ((10, 4), 14)]),
    "sub": ("return a - b", ["return a + b", "return b - a"], [((7, 3), 4), ((10, 4), 6)]),
    "mul": ("return a * b", ["return a + b", "return a * a"], [((3, 4), 12), ((5, 6), 30)]),
    "biggest": ("return max(a, b)", ["return min(a, b)"], [((3, 9), 9), ((8, 2), 8)]),
    "half": ("return a // 2", ["return a // 3", "return a * 2"], [((10,), 5), ((7,), 3)]),
    "square": ("return a * a", ["return a + a", "return a * 2"], [((3,), 9), ((5,), 25)]),
}
RUN_TESTS = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location('test_module', 'test_code.py')
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
names = sorted(n for n in dir(tests) if n.startswith('test_'))
failed = []
for n in names:
    try:
        getattr(tests, n)()
    except Exception as e:
        failed.append(f"FAIL {n}: {e}")
print("\\n".join(failed) if failed else f"all {len(names)} tests passed")
sys.exit(1 if failed else 0)
"""


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
        for args, want in FUNCTIONS[name][2]:
            call = f"m.{name}({', '.join(map(str, args))})"
            lines.append(f"    got = {call}")
            lines.append(f"    assert got == {want}, f'{call} returned {{got}}, expected {want}'")
        lines.append("")
    return "\n".join(lines)


class RepoEnv:
    name = "repo"
    tools = ("test", "read", "edit")
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
                            {"code": _source(bodies), "tests": _tests(names), "line": line,
                             "fix": f"    {FUNCTIONS[buggy][0]}"}))
        return out

    def open(self, task: Task, workdir: Path) -> _Episode:
        write_work_file(workdir, "code.py", task.data["code"])
        return _Episode(workdir, task.data["tests"], self.sandbox, self.limits)

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

    def __init__(self, workdir: Path, tests: str, sandbox: Sandbox, limits: SandboxLimits) -> None:
        self.workdir, self.tests, self.sandbox, self.limits = workdir, tests, sandbox, limits

    def _tests(self) -> tuple[str, str]:
        # the tests are the task's, never the model's: written afresh before every run, since code
        # the model put in code.py runs in the sandbox and could have changed them
        write_work_file(self.workdir, "test_code.py", self.tests)
        result = self.sandbox.run(RUN_TESTS, self.workdir, self.limits)
        return result.output, "ok" if result.status in ("ok", "error") and result.exit_code in (0, 1) else result.status

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
        if len(parts) != 2 or parts[0] != "code.py" or not parts[1].isdigit() or not _:
            return "edit expects: code.py N: NEW LINE (only code.py may change)", "error"
        lines = read_work_file(self.workdir, "code.py").splitlines()
        n = int(parts[1])
        if not 1 <= n <= len(lines):
            return f"line {n} is out of range 1..{len(lines)}", "error"
        lines[n - 1] = new[1:] if new.startswith(" ") else new
        write_work_file(self.workdir, "code.py", "\n".join(lines) + "\n")
        return f"line {n} is now: {lines[n - 1]}", "ok"

    def reward(self, answer: str) -> float:
        output, _ = self._tests()
        return 1.0 if output.startswith("all ") else 0.0
