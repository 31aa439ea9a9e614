import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import build_parser, main
from storage.catalog import list_runs
from tests.builders import small_trace, trace_rows, write_trace

ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "data" / "traces" / "swe_gemini3_mini_A.csv"


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_swe_import_then_count(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = str(tmp_path / "store")
    code, out, _ = run_cli(capsys, "traces", "import", str(SWE), "--run", "swe", "--store", store, "--json")
    assert code == 0
    assert json.loads(out) == {"run": "swe", "path": str(SWE), "trajectories": 246, "turns": 10222, "steps": 31,
                               "shards": 62, "replaced": False}
    code, out, _ = run_cli(capsys, "query", "--run", "swe", "--store", store, "select count(*) as n from turns", "--json")
    assert (code, json.loads(out)) == (0, [{"n": 10222}])
    # importing again is refused unless --replace, which replaces the run whole
    code, out, err = run_cli(capsys, "traces", "import", str(SWE), "--run", "swe", "--store", store)
    assert (code, out) == (2, "")
    assert err.startswith(f"libra: error: run 'swe' already exists in store {store} (import of swe_gemini3_mini_A.csv, "
                          "prompts_per_step=8, committed ")
    assert err.endswith("); pass --replace to replace it whole\n") and err.count("\n") == 1
    code, out, _ = run_cli(capsys, "traces", "import", str(SWE), "--run", "swe", "--store", store, "--replace",
                           "--prompts-per-step", "2")
    assert code == 0 and out.endswith("(123 steps, 246 shards, store " + store + ", replacing the previous import)\n")
    code, out, _ = run_cli(capsys, "query", "--store", store, "--json",
                           "select count(*) as n, count(distinct trajectory_id) as ids, max(step) as last from trajectories")
    assert json.loads(out) == [{"n": 246, "ids": 246, "last": 122}]


def test_table_output_and_named_queries(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = str(tmp_path / "store")
    run_cli(capsys, "traces", "import", str(small_trace(tmp_path / "t.csv")), "--run", "s", "--store", store,
            "--prompts-per-step", "1")
    code, out, _ = run_cli(capsys, "query", "--run", "s", "--store", store,
                           "select trajectory_id, total_tokens from trajectories order by trajectory_id")
    assert code == 0
    assert out.splitlines() == [
        "trajectory_id  total_tokens",
        "-------------  ------------",
        "p1/a                   3046",
        "p1/b                     16",
        "p2/a                    630",
        "(3 rows)",
    ]
    code, out, _ = run_cli(capsys, "query", "--run", "s", "--store", store, "--named", "length_histogram",
                           "--param", "bin_tokens=1000", "--json")
    assert [(r["lo_tokens"], r["trajectories"]) for r in json.loads(out)] == [(0, 2), (3000, 1)]
    code, out, _ = run_cli(capsys, "query", "--list")
    assert code == 0 and "remaining_length_paths (last_steps=0)" in out
    code, out, _ = run_cli(capsys, "runs", "--store", store, "--json")
    assert json.loads(out) == ["s"]


def test_malformed_trace_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = trace_rows("p", "s", 5, [(1, "search", 3, "ok"), (2, "none", 0, "")])
    rows[1]["gen_tokens"] = "many"
    bad = write_trace(tmp_path / "bad.csv", rows)
    store = tmp_path / "store"
    code, out, err = run_cli(capsys, "traces", "import", str(bad), "--run", "bad", "--store", str(store))
    assert code == 2 and out == ""
    assert err == f"libra: error: {bad}:3: gen_tokens must be a non-negative integer, got 'many'\n"
    assert list_runs(store) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["query", "--run", "ghost", "select 1"], "libra: error: no run named 'ghost'"),
        (["query", "select nope"], "libra: error: query failed: Binder Error"),
        (["query"], "libra: error: give either SQL or --named NAME"),
        (["query", "--named", "tool_statistics", "--param", "last_steps"], "libra: error: --param 'last_steps': write KEY=VALUE"),
        (["traces", "import", "x.csv", "--run", "a b"], "libra: error: run name 'a b' is not allowed"),
        (["schema", "nope"], "libra: error: no table 'nope'"),
        (["config", "--config", "/no/such.yaml"], "libra: error: /no/such.yaml: cannot read config"),
    ],
)
def test_user_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    run_cli(capsys, "traces", "import", str(small_trace(tmp_path / "t.csv")), "--run", "s", "--store", str(tmp_path))
    code, _, err = run_cli(capsys, *argv, "--store", str(tmp_path)) if argv[0] != "traces" else run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1


def test_help_everywhere(capsys: pytest.CaptureFixture) -> None:
    for argv in (["--help"], ["traces", "--help"], ["traces", "import", "--help"], ["query", "--help"],
                 ["runs", "--help"], ["schema", "--help"], ["config", "--help"], ["run", "--help"]):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(argv)
        assert info.value.code == 0
        assert "usage: libra" in capsys.readouterr().out


def test_console_script_bad_argument_is_not_a_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "query", "--max-rows", "many"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "argument --max-rows: invalid int value: 'many'" in proc.stderr


def test_schema_and_config(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run_cli(capsys, "schema", "turns")
    assert code == 0 and "gen_tokens" in out and "[tokens]" in out
    code, out, _ = run_cli(capsys, "config")
    assert code == 0 and out == (ROOT / "configs" / "default.yaml").read_text().split("\n", 2)[2]
