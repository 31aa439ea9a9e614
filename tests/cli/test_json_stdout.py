import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import local_config as config_file

ROOT = Path(__file__).resolve().parents[2]

NOISY = """
import json, os, subprocess, sys
from cli.streams import json_stdout
sys.__stdout__.write("before the block\\n")  # still in the buffer when the block starts
with json_stdout({enabled}) as out:
    print("python noise")
    os.write(1, b"fd noise\\n")
    subprocess.run([sys.executable, "-c", "print('child noise')"], check=True)
    sys.__stdout__.write("buffered noise\\n")  # into the original stdout's buffer
    print(json.dumps({{"ok": True}}), file=out)
print("after the block")
"""


def run_script(source: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_inside_json_stdout_only_the_json_reaches_stdout() -> None:
    proc = run_script(NOISY.format(enabled=True))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == 'before the block\n{"ok": true}\nafter the block\n'
    assert proc.stderr.splitlines() == ["python noise", "fd noise", "child noise", "buffered noise"]


def test_without_json_the_block_runs_unchanged() -> None:
    proc = run_script(NOISY.format(enabled=False))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(["before the block", "python noise", "fd noise", "child noise",
                                                       "buffered noise", '{"ok": true}', "after the block"])
    assert proc.stderr == ""


def test_json_stdout_under_a_capturing_test(capsys: pytest.CaptureFixture) -> None:
    from cli.streams import json_stdout

    with json_stdout() as out:
        print("noise")
        print("[1]", file=out)
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("[1]\n", "noise\n")


@pytest.mark.parametrize("argv", [
    ["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", str(ROOT / "data/traces/tora_gsm8k.csv")],
    ["eval-router", "--trace", str(ROOT / "data/traces/taubench_airline.csv"), "--routers", "libra"],
    ["simulate", "--workload", "search-r1", "--cluster", "2x8:a800", "--model", "qwen3-8b", "--steps", "2",
     "--systems", "libra", "--group-size", "2", "--prompts-per-step", "4", "--no-track"],
], ids=["plan", "eval-router", "simulate"])
def test_json_commands_print_one_json_document(tmp_path: Path, argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "cli.main", *argv, "--json", "--config", str(config_file(tmp_path))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and isinstance(json.loads(proc.stdout), dict)


# vLLM logs to stdout and starts engine processes that inherit it: that with --json none of it reaches
# stdout is asserted of every `libra train --json` on vLLM (tests/flows/test_train.py `finished`, run
# by tests/flows/test_replanning.py)


LATE = """
import atexit, os, sys, threading
from cli.main import entry
atexit.register(lambda: (print("printed at exit"), os.write(1, b"written to fd 1 at exit\\n")))
entry(["runs", "--store", {store!r}, "--json"])
"""


def test_what_prints_after_the_result_while_the_program_exits_goes_to_stderr(tmp_path: Path) -> None:
    # Ray's driver prints the cluster's deduplicated warnings to sys.stdout from its atexit handler
    proc = run_script(LATE.format(store=str(tmp_path / "store")))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [] and proc.stdout.count("\n") == 1
    assert proc.stderr.splitlines()[-2:] == ["printed at exit", "written to fd 1 at exit"]


def test_the_program_without_json_also_keeps_exit_noise_off_stdout(tmp_path: Path) -> None:
    proc = run_script(LATE.format(store=str(tmp_path / "store")).replace(', "--json"', ""))
    assert proc.returncode == 0, proc.stderr
    assert "at exit" not in proc.stdout
    assert proc.stderr.splitlines()[-2:] == ["printed at exit", "written to fd 1 at exit"]
