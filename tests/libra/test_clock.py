"""Time is read only through `libra/clock.py`, in every package of the project: its clocks, and
sleeping, deadlines and measurements on them."""

import ast
from pathlib import Path

import pytest

from libra.clock import Deadline, SimClock, Stopwatch, sleep

ROOT = Path(__file__).resolve().parents[2]
LIBRA = ROOT / "libra"
PACKAGES = ("libra", "flows", "tasks", "storage", "dashboards", "cli")
# the one exception: Ctrl-C's redelivery in the command line's first lines, which must not import libra
EXCEPTIONS = {"cli/main.py": ["time.sleep"]}
READS = {"time", "monotonic", "perf_counter", "sleep"}


def _time_reads(path: Path) -> list[str]:
    """`time.time()`-style calls and `from time import ...` of those names in one file, as 'line: name'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Attribute) and node.attr in READS and isinstance(node.value, ast.Name)
                and node.value.id == "time"):
            found.append((node.lineno, f"time.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [(node.lineno, f"from time import {a.name}") for a in node.names if a.name in READS]
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_nothing_but_the_clocks_reads_time():
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if p != LIBRA / "clock.py"]
    assert len(files) > 150
    reads = {str(p.relative_to(ROOT)): r for p in files if (r := _time_reads(p))}
    assert {path: [read.split(": ", 1)[1] for read in found] for path, found in reads.items()} == EXCEPTIONS, f"read time through a `libra.clock` clock instead: {reads}"


def test_the_check_sees_each_kind_of_read(tmp_path):
    source = tmp_path / "reads.py"
    source.write_text("import time\nfrom time import perf_counter\n"
                      "t = time.time()\nm = time.monotonic\ntime.sleep(0)\nelapsed = perf_counter()\n")
    assert _time_reads(source) == ["2: from time import perf_counter", "3: time.time", "4: time.monotonic",
                                   "5: time.sleep"]


def test_sleeping_on_a_simulated_clock_moves_it_forward():
    clock = SimClock(3.0)
    watch = Stopwatch(clock)
    deadline = Deadline(clock, 1.0)
    sleep(clock, 0.25)
    assert clock.now() == 3.25 and watch.seconds() == 0.25 and deadline.left() == 0.75
    sleep(clock, 1.0)
    assert deadline.left() == -0.25
    with pytest.raises(ValueError):
        sleep(clock, -1.0)


def test_a_stopwatch_on_the_wall_clock_counts_up():
    watch = Stopwatch()
    assert watch.seconds() >= 0.0
