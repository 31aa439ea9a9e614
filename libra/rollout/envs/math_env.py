"""`math`: word problems solved with a python tool; the reward is the exact integer answer."""

from __future__ import annotations

import ast
import io
import operator
import re
import tokenize
from collections.abc import Callable
from pathlib import Path

from libra.config import SandboxConfig
from libra.rollout.envs.base import Task, rng_for
from libra.rollout.sandbox import Sandbox, SandboxLimits, sandbox_for

# (problem, expression, the reasoning from the one to the other); CATEGORIES names each (a task's
# `category`, by which a run's rewards are broken down)
TEMPLATES = [
    ("{n} has {a} marbles and buys {b} bags of {c} marbles. How many marbles does {n} have now?", "{a} + {b} * {c}",
     "{n} starts with {a} marbles. The {b} bags of {c} marbles add {b} * {c} marbles, so the total is {a} + {b} * {c}."),
    ("A tank holds {a} liters. {b} liters leak out every hour for {c} hours. How many liters are left?", "{a} - {b} * {c}",
     "The tank starts with {a} liters. In {c} hours {b} * {c} liters leak out, so {a} - {b} * {c} liters are left."),
    ("{a} students are split into teams of {b}. How many full teams are there?", "{a} // {b}",
     "Each team has {b} students, so the number of full teams is {a} divided by {b}, rounded down: {a} // {b}."),
    ("What is {a} times {b} plus {c}?", "{a} * {b} + {c}",
     "The problem asks for {a} times {b}, which is {a} * {b}, and then {c} more: {a} * {b} + {c}."),
    ("{n} reads {b} pages a day for {c} days, then {a} more pages. How many pages did {n} read?", "{b} * {c} + {a}",
     "{n} reads {b} pages on each of {c} days, which is {b} * {c} pages, and then {a} more: {b} * {c} + {a}."),
    ("A box has {a} pens. {n} gives away {b} pens to each of {c} friends. How many pens are left?", "{a} - {b} * {c}",
     "{n} gives {b} pens to each of {c} friends, {b} * {c} pens in all, so {a} - {b} * {c} pens are left."),
]
CATEGORIES = ("marbles", "tank", "teams", "times-plus", "pages", "pens")
NAMES = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jon"]


class MathEnv:
    name = "math"
    tools = ("python",)
    grades_partial_work = True
    instructions = ("Solve the problem. Compute with <tool>python: CODE</tool> (print the result), then reply "
                    "<answer>NUMBER</answer>.")

    def __init__(self, limits: SandboxLimits | None = None, sandbox: SandboxConfig | None = None) -> None:
        self.limits = limits or SandboxLimits(timeout_s=3.0, cpu_s=2)
        self.sandbox = sandbox_for(sandbox)

    def tasks(self, count: int, seed: int) -> list[Task]:
        out = []
        for i in range(count):
            r = rng_for(seed, i, "math")
            which = r.randrange(len(TEMPLATES))
            template, expression, reasoning = TEMPLATES[which]
            b, c = r.randint(2, 9), r.randint(2, 9)
            a = r.randint(b * c + 1, b * c + 90)
            values = {"a": a, "b": b, "c": c, "n": r.choice(NAMES)}
            expr = expression.format(**values)
            out.append(Task("math", f"math-{seed}-{i}", template.format(**values), str(eval(expr)),  # noqa: S307 - our own template
                            {"expression": expr, "reasoning": reasoning.format(**values), "category": CATEGORIES[which]}))
        return out

    def open(self, task: Task, workdir: Path) -> _Episode:
        self.sandbox.prepare(workdir)
        return _Episode(task, workdir, self.sandbox, self.limits)

    def problem(self, task: Task) -> str:
        return f"{task.data['category']}: {task.data['expression']}"  # the name in the question aside

    def expert(self, task: Task) -> Callable[[str], str]:
        def next_turn(transcript: str) -> str:  # reasons, computes, then answers what python printed
            if "<obs>" not in transcript:
                return (f"{task.data['reasoning']} I will compute it with python.\n"
                        f"<tool>python: print({task.data['expression']})</tool>")
            result = transcript.rsplit("<obs>", 1)[1].split("</obs>")[0].strip()
            return f"Python printed {result}, so the answer is {result}.\n<answer>{result}</answer>"
        return next_turn


class _Episode:
    def __init__(self, task: Task, workdir: Path, sandbox: Sandbox, limits: SandboxLimits) -> None:
        self.task, self.workdir, self.sandbox, self.limits = task, workdir, sandbox, limits
        self.last_code = ""  # the code of the last python call that ran and printed (kept here, out of its reach)
        self.last_output = ""  # and what it printed to stdout

    def call(self, name: str, argument: str) -> tuple[str, str]:
        result = self.sandbox.run(argument, self.workdir, self.limits)
        if result.status == "ok" and result.output:  # only computed work earns partial credit
            self.last_code, self.last_output = argument, result.stdout
        return result.output or "(no output: print the result)", result.status

    def reward(self, answer: str) -> float:
        return 1.0 if answer.strip() == self.task.answer else 0.0

    def partial_credit(self) -> float:
        """The task's expression, its numbers and operators in order, that the last python call that
        ran and printed has in the same places, over the longer of the two: the expression copied
        right and nothing else scores 1; a call with extra terms scores less. Only terms the call
        computed and printed count: the last word it printed must be the value of its terms read as
        one expression (the numbers printed without operators, or the expression in code that
        never runs, `if []:` or a lambda never called, score 0; a red team's dead code had scored
        1), and a syntax error never counts."""
        want, got = _TERMS.findall(self.task.data["expression"]), computed_terms(self.last_code)
        if not got or printed_value(self.last_output) != term_value(got):  # terms it wrote but did not print
            return 0.0
        return sum(a == b for a, b in zip(want, got, strict=False)) / max(len(want), len(got), 1)


def term_value(terms: list[str]) -> str | None:
    """The value of `terms` (numbers and operators) read in order as one expression, as `print`
    writes it; None when they are not one, or it is out of bounds (a call's own numbers)."""
    if len(terms) > 64:
        return None
    try:
        tree = ast.parse(" ".join(terms), mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float) and abs(node.value) < 10**12:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = value(node.left), value(node.right)
            if abs(left) >= 10**12 or abs(right) >= 10**12:
                raise ArithmeticError
            return _ARITHMETIC[type(node.op)](left, right)
        raise ArithmeticError

    try:
        return str(value(tree.body))
    except (ArithmeticError, RecursionError):
        return None


def printed_value(output: str) -> str | None:
    """The last word of the last line a call printed (`print("answer:", x)` prints x last), None
    when it printed nothing."""
    words = output.strip().rsplit(None, 1)
    return words[-1] if words else None


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
               ast.Div: operator.truediv, ast.Mod: operator.mod}
_TERMS = re.compile(r"\d+|//|\*\*|[-+*/%]")  # an expression's numbers and operators (brackets aside)
_OPERATORS = frozenset(("//", "**", "-", "+", "*", "/", "%"))


def computed_terms(code: str) -> list[str]:
    """The numbers and arithmetic operators `code` computes with, in order, read as Python's own
    tokens: the expression in a string, a comment or a docstring counts nothing (`print("126 + 5 *
    8")` had scored full partial credit without computing anything)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [t.string for t in tokens
            if t.type == tokenize.NUMBER or (t.type == tokenize.OP and t.string in _OPERATORS)]
