import io
import json
import re
from pathlib import Path

import pytest

import cli.progress
from cli.main import main
from cli.progress import CLEAR, Progress, progress, render
from libra.clock import SimClock

ROOT = Path(__file__).resolve().parents[2]
TAU = ROOT / "data" / "traces" / "taubench_airline.csv"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True



def test_render_is_one_line_cut_to_the_terminal() -> None:
    assert render("simulating", 90, 200, "libra step 3/5", 12.4, 100) == (
        "simulating [#########-----------]  45% 90/200 libra step 3/5 12 s")
    assert render("reading t.csv", 0.25, 45.3, "MiB", 0.0, 100) == "reading t.csv [--------------------]   1% 0.2/45.3 MiB 0 s"
    assert render("x", 5, 0, "", 1.0, 100) == "x [--------------------]   0% 5/0 1 s"
    assert render("a long label", 1, 2, "d" * 200, 0.0, 30) == "a long label [##########-----"


def test_progress_draws_in_place_throttled_and_keeps_the_last_line() -> None:
    stream, clock = Terminal(), SimClock()
    bar = Progress("run", stream, clock=clock, delay_s=0.5, columns=80)
    bar.update(1, 4)  # within the delay: nothing
    clock.advance_to(0.6)
    bar.update(2, 4, "b")
    clock.advance_to(0.65)
    bar.update(3, 4, "c")  # within min_interval_s of the last drawing: skipped
    bar.update(4, 4, "d")  # the last unit is always drawn
    bar.close()
    assert stream.getvalue() == (CLEAR + "run [##########----------]  50% 2/4 b 1 s"
                                 + CLEAR + "run [####################] 100% 4/4 d 1 s\n")


def test_progress_is_erased_on_failure_and_lets_lines_through() -> None:
    stream, clock = Terminal(), SimClock()
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress("run", stream, clock=clock, delay_s=0.0, columns=80) as bar:
        bar.update(1, 2)
        bar.echo("step 1 loss 0.5", file=out)
        raise RuntimeError
    line = "run [##########----------]  50% 1/2 0 s"
    assert stream.getvalue() == CLEAR + line + CLEAR + line + CLEAR
    assert out.getvalue() == "step 1 loss 0.5\n"


def test_progress_draws_only_on_a_terminal_and_not_for_json() -> None:
    assert progress("x", stream=Terminal()).active
    assert not progress("x", stream=Terminal(), quiet=True).active
    assert not progress("x", stream=io.StringIO()).active
    silent = progress("x", stream=io.StringIO())
    silent.update(1, 1)
    silent.echo("still printed", file=(out := io.StringIO()))
    silent.close()
    assert out.getvalue() == "still printed\n"


def on_terminal(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, str]:
    """Run libra with stderr a terminal (bars draw at once); returns the status, stdout and stderr."""
    out, err = io.StringIO(), Terminal()
    with monkeypatch.context() as patch:
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", err)
        patch.setattr(cli.progress, "DELAY_S", 0.0)
        patch.setenv("COLUMNS", "1000")  # wide enough for a whole line wherever the checkout lies (paths are in it)
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_eval_router_shows_progress_on_a_terminal_only_without_json(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["eval-router", "--trace", str(TAU), "--routers", "libra,cmlfq", "--buckets", "2000,4000"]
    code, out, drawn = on_terminal(monkeypatch, *argv)
    assert code == 0 and "cmlfq" in out
    assert "reading " in drawn and " MiB " in drawn
    assert "replaying [" in drawn and "] 100% 14/14 cmlfq step 7/7" in drawn and drawn.endswith("\n")
    code, out, drawn = on_terminal(monkeypatch, *argv, "--json")
    assert (code, drawn) == (0, "")
    assert list(json.loads(out)["policies"]) == ["libra", "cmlfq"]


def test_simulate_shows_progress_per_system_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out, drawn = on_terminal(
        monkeypatch, "simulate", "--workload", "search-r1", "--cluster", "2x8:a800", "--model", "qwen3-8b", "--steps", "3",
        "--systems", "static-uniform,libra", "--group-size", "4", "--prompts-per-step", "8", "--no-track",
        "--store", str(tmp_path / "store"))
    assert code == 0 and "static-uniform" in out
    assert "simulating [" in drawn and "] 100% 6/6 libra step 3/3" in drawn


def test_policy_init_shows_training_progress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out, drawn = on_terminal(monkeypatch, "policy", "init", "--out", str(tmp_path / "p"), "--steps", "3",
                                   "--demos", "16")
    assert code == 0
    assert "training the policy [" in drawn and "] 100% 3/3 loss " in drawn
    assert "step     0  loss" in out and "demonstrations" in out  # the log lines go on, above the bar


def test_traces_import_shows_reading_progress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    swe = ROOT / "data" / "traces" / "swe_gemini3_mini_A.csv"
    code, out, drawn = on_terminal(monkeypatch, "traces", "import", str(swe), "--run", "swe", "--store", str(tmp_path))
    assert code == 0 and out.startswith("imported 10222 turns")
    size = swe.stat().st_size / 2**20
    assert drawn.startswith(CLEAR + f"reading {swe} [")
    assert re.search(rf"\] 100% {size:,.1f}/{size:,.1f} MiB \d+ s\n$", drawn)
    code, out, drawn = on_terminal(monkeypatch, "traces", "import", str(swe), "--run", "swe2", "--store", str(tmp_path),
                                   "--json")
    assert (code, drawn) == (0, "") and json.loads(out)["turns"] == 10222


def test_plan_shows_the_search_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """`libra plan` of a large cluster searched for minutes without a word."""
    code, out, drawn = on_terminal(monkeypatch, "plan", "--cluster", "2x8:a800", "--model", "qwen3-8b", "--trace", str(TAU))
    assert code == 0 and out.startswith("plan for 2x8:A800-SXM4-80GB (16 GPUs)")
    assert "planning 2x8:a800 [" in drawn and "] 100% 13/13 pools of hybrids searched" in drawn
    code, out, drawn = on_terminal(monkeypatch, "plan", "--cluster", "2x8:a800", "--model", "qwen3-8b", "--trace", str(TAU),
                                   "--json")
    assert (code, drawn) == (0, "") and json.loads(out)["gpus"] == 16
