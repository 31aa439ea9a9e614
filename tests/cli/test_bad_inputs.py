"""Every bad input is one line on stderr, `libra: error: ...`, exit status 2, no traceback, and
nothing written: no store, no MLflow database, no Prefect home."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.main import main, one_line
from tests.builders import HEADER
from tests.cli.inputs import ROOT, TAU, libra, nothing_written

BAD = [
    # trace files, through every command that reads one
    (["traces", "import", "binary.csv", "--run", "r", "--store", "store"],
     "binary.csv:1: not UTF-8 text (byte 0xff at column 1); a trace is a UTF-8 CSV file"),
    (["traces", "import", "huge_int.csv", "--run", "r", "--store", "store"],
     "huge_int.csv:2: gen_tokens = '18446744073709551616' is more than 2,147,483,647, the largest count a trace may hold"),
    (["traces", "import", "wide.csv", "--run", "r", "--store", "store"],
     "wide.csv:2: a field is longer than 131,072 characters (an unclosed quote?); a trace's fields are ids, names and numbers"),
    (["traces", "import", "empty.csv", "--run", "r", "--store", "store"],
     "empty.csv:1: empty file: expected a header row " + ",".join(HEADER[:10])),
    (["traces", "import", "dir.csv", "--run", "r", "--store", "store"],
     "dir.csv: is a directory; pass a CSV file in the per-turn trace format"),
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", "zero.csv"],
     "zero.csv:2: trajectory p/s has no tokens (prompt_tokens, gen_tokens and tool_payload_tokens are all 0); "
     "a trajectory holds at least one token"),
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", "binary.csv", "--json"],
     "binary.csv:1: not UTF-8 text"),
    (["eval-router", "--trace", "huge_int.csv"], "huge_int.csv:2: gen_tokens = '18446744073709551616' is more than"),
    (["simulate", "--workload", "trace:zero.csv", "--steps", "2", "--no-track", "--store", "store"],
     "zero.csv:2: trajectory p/s has no tokens"),
    (["simulate", "--workload", "trace:", "--steps", "2", "--no-track", "--store", "store"],
     "workload 'trace:' names no file: give trace:FILE.csv"),  # it said ".: is a directory"
    (["run", "--traces", "small.csv", "binary.csv"], "binary.csv:1: not UTF-8 text"),
    (["run", "--traces", "missing.csv", "--json"], "missing.csv: no such trace file"),
    # config files
    (["config", "--config", "binary.yaml"], "binary.yaml: not UTF-8 text (byte 0xff at offset 15); a config is a YAML file"),
    (["config", "--config", "list.yaml"], "list.yaml: the top level must be a mapping of sections, got list"),
    (["config", "--config", "scalar.yaml"], "scalar.yaml: the top level must be a mapping of sections, got int"),
    (["config", "--config", "dup.yaml"], "dup.yaml: not valid YAML (duplicate key 'store' at line 2, column 1)"),
    (["config", "--config", "big.yaml"], "big.yaml: larger than 1,048,576 bytes; a config is a short YAML file"),
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", "small.csv", "--config", "bomb.yaml"],
     "bomb.yaml: the document expands to more than 100,000 values (aliases repeating aliases?); a config is a short YAML file"),
    (["config", "--config", "dir.csv"], "dir.csv: not a regular file; pass a YAML file"),
    # training layouts the machine cannot run
    (["train", "--config", "ranks.yaml", "--steps", "1"],
     "trainer.tp x pp x dp = 4 ranks (tp=1 pp=1 dp=4), but placement.strategy static gives the trainer 1 worker(s)"),
    (["train", "--config", "unplaced.yaml", "--steps", "1"],
     "unplaced.yaml: trainer.layout planned takes the layout the planner chooses for the trainer's workers; set "
     "placement.strategy"),
    # numbers out of range
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", "small.csv", "--batch", "1000000000000"],
     "--batch must be <= 1,000,000, got 1,000,000,000,000"),
    (["eval-router", "--trace", str(TAU), "--order", "epochs:1000000000"],
     "--order epochs:1000000000: 1,000,000,000 epochs of 2,454 turns make up to 2,454,000,000,000 routing decisions per "
     "router, more than the 20,000,000 a replay may hold; use fewer epochs"),
    (["eval-router", "--trace", str(TAU), "--prompts-per-step", "-4"], "--prompts-per-step must be >= 1, got -4"),
    (["eval-router", "--trace", str(TAU), "--routers", ","], "--routers ',': name at least one router"),
    (["eval-router", "--trace", str(TAU), "--buckets", ",".join(map(str, range(1, 100_001)))],  # ran 100,001 buckets
     "--buckets '1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,'...: 100,000 bounds; give at "
     "most 16 (e.g. 4000,12000)"),
    (["eval-router", "--trace", str(TAU), "--buckets", "4000,99999999999"],
     "--buckets '4000,99999999999': give 'auto' or increasing token counts of at most 10,000,000 like 4000,12000"),
    (["simulate", "--workload", "search-r1", "--group-size", "99999999", "--no-track"],
     "--group-size must be <= 4,096, got 99,999,999"),
    (["simulate", "--workload", "search-r1", "--steps", "1000", "--group-size", "1000", "--no-track"],
     "1,000 steps of 32 prompts x 1,000 samples are 32,000,000 trajectories, more than the 5,000,000 a simulation may hold"),
    (["simulate", "--workload", "search-r1", "--steps", "1", "--cluster", "1x1:cpu", "--no-track", "--store", "store"],
     "Qwen3-14B cannot run on 1x1:cpu with workload search-r1: no training configuration fits 1 GPUs; use more or "
     "larger GPUs, a smaller model or shorter trajectories"),
    (["simulate", "--workload", "chess", "--no-track"], "unknown workload 'chess'"),
    (["simulate", "--workload", f"trace:{TAU}", "--group-size", "4", "--no-track"],  # it was ignored
     "--group-size 4: a trace workload replays the samples its file holds for each prompt; leave it out, or simulate "
     "a preset workload"),
    (["simulate", "--workload", "search-r1", "--overprovision", "2", "--no-track"],  # it was ignored in sync mode
     "--overprovision and --max-staleness apply to partial and async rollouts; add --rollout-mode partial (or async), "
     "or leave them out"),
    (["simulate", "--workload", "search-r1", "--rollout-mode", "partial", "--max-staleness", "0", "--no-track"],
     "--max-staleness 0: a partial rollout trains groups at least one update old; give 1 or more, or use the sync "
     "mode for on-policy training"),
    (["pool", "--pace", "nan", "--no-track"], "--pace must be a finite number, got nan"),
    (["pool", "--hidden", "1000000000", "--no-track"], "--hidden must be <= 65,536, got 1,000,000,000"),
    (["rollout", "--env", "math", "--temperature", "inf", "--no-track"], "--temperature must be a finite number, got inf"),
    (["rollout", "--env", "math", "--prompts", "-1", "--no-track"], "--prompts must be >= 1, got -1"),
    (["rollout", "--env", "chess", "--no-track"], "unknown environment 'chess'; environments: search, math, repo"),
    (["policy", "init", "--demos", "1000000000"], "--demos must be <= 1,000,000, got 1,000,000,000"),
    (["tree", "--run", "r", "--out", "t.json", "--last-steps", "-1"], "--last-steps must be >= 0, got -1"),
    (["compare"], "no MLflow database at sqlite:///.libra/mlflow.db; train runs with `libra train` first"),
    (["compare", "--target", "nan"], "--target must be a finite number, got nan"),
    (["compare", "--config", "notdb.yaml"], "MLflow's tracking store sqlite:///"),  # a traceback of 81 lines before
    (["simulate", "--workload", "trace:small.csv", "--steps", "100000", "--prompts-per-step", "100000", "--no-track",
      "--store", "store"], "100,000 steps of 100,000 prompts x 2 samples are 20,000,000,000 trajectories, more than the "
                          "5,000,000 a simulation may hold"),  # a trace's ran until memory ran out
    (["config", "--config", ""], "the config file's name is empty: give a YAML file (--config FILE.yaml), or none for "
                                 "the embedded defaults"),  # it said ".: not a regular file"
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", ""],
     "--trace '' names no file: give a per-turn trace, FILE.csv"),  # "no trajectories to plan for", a Prefect home made
    # an empty --run once meant the default run (resuming or extending someone's)
    (["train", "--run", "", "--steps", "1"], "--run '' names no run: give a run name, or leave --run out for the default"),
    (["simulate", "--workload", "search-r1", "--run", " ", "--no-track", "--store", "store"], "--run '' names no run"),
    (["rollout", "--env", "math", "--run", "", "--no-track"], "--run '' names no run"),
    (["pool", "--run", "", "--no-track"], "--run '' names no run"),
    # a run or deployment that does not exist is refused before a Prefect home or a store is made
    (["tree", "--run", "nope", "--out", "t.json"], "no run named 'nope' in store .libra/store; the store is empty"),
    (["deploy", "--only", "nope"], "--only: unknown deployments nope; known: libra-train/demo"),
    # command-line values get the config's caps, and booleans are no numbers
    (["traces", "import", "small.csv", "--run", "x", "--prompts-per-step", "99999999999999999999"],
     "--prompts-per-step must be <= 100,000, got 99,999,999,999,999,999,999"),
    (["config", "--config", "steps.yaml"], "steps.yaml: trainer.steps = True: Value error, a number is needed here, not true"),
    # a store that is a file, or no path at all (it once listed no runs, or wrote into the working directory)
    (["runs", "--store", "small.csv"], "store small.csv is not a directory; give a store directory (--store DIR or store.root)"),
    (["query", "--store", "small.csv", "select 1"], "store small.csv is not a directory; give a store directory"),
    (["query", "--store", "stroe", "select count(*) from turns"],  # a typo: it answered 0, a table of nothing
     "no store at stroe (no such directory), so nothing to query; pass the store a run was written to (--store DIR, or "
     "store.root in --config)"),
    (["traces", "import", "small.csv", "--run", "x", "--store", "small.csv"], "store small.csv is not a directory"),
    (["traces", "import", "small.csv", "--run", "x", "--store", ""], "embedded defaults: store.root = '': String should "
                                                                     "have at least 1 character"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_is_one_line_and_writes_nothing(files: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                                   message: str) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith("libra: error: " + message) and err.count("\n") == 1, err
    nothing_written(files)


@pytest.mark.parametrize("argv, message", [  # the last one had silently won
    (["simulate", "--steps", "2", "--steps=50", "--store", "store"],
     "argument --steps: given twice; give it once (see `libra simulate --help`)"),
    (["eval-router", "--trace", "small.csv", "--policies", "mlfq", "--routers", "libra"],
     "argument --routers: given twice (--policies and --routers); give it once (see `libra eval-router --help`)"),
    (["query", "--store", "store", "--json", "--json", "select 1"],
     "argument --json: given twice; give it once (see `libra query --help`)"),
])
def test_an_option_given_twice_is_a_usage_error(files: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                                message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert (info.value.code, out, err.splitlines()[-1]) == (2, "", f"libra: error: {message}")  # after a renamed
    assert err.count("libra: error:") == 1  # flag's notice
    nothing_written(files)
    from cli.main import build_parser

    args = build_parser().parse_args(["eval-router", "--trace", "t.csv", "--routers", "libra", "--json"])
    assert (args.routers, args.json, hasattr(args, "_libra_given")) == ("libra", True, False)  # nothing left behind


def test_a_trace_with_a_byte_order_mark_is_imported(files: Path, capsys: pytest.CaptureFixture) -> None:
    bom = files / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (files / "small.csv").read_bytes())
    assert main(["traces", "import", str(bom), "--run", "bom", "--store", "store", "--json"]) == 0
    assert '"trajectories": 3, "turns": 6' in capsys.readouterr().out


def test_messages_stay_on_one_line(files: Path, capsys: pytest.CaptureFixture) -> None:
    odd = files / "two\nlines.csv"
    odd.write_bytes(b"\xff")
    assert main(["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", str(odd)]) == 2
    assert capsys.readouterr().err == f"libra: error: {files}/two\\nlines.csv:1: not UTF-8 text (byte 0xff at column 1); a trace is a UTF-8 CSV file\n"
    escaped = "a\\r\\nb\\x00c\\u2028d" + "e" * 3000
    assert one_line("a\r\nb\x00c\u2028d" + "e" * 3000) == escaped[:2000] + "..."


def test_a_store_under_a_file_is_one_line_before_anything_runs(files: Path, capsys: pytest.CaptureFixture) -> None:
    (files / "a_file").write_text("")
    assert main(["simulate", "--workload", "search-r1", "--steps", "1", "--cluster", "2x8:a800", "--model", "qwen3-8b",
                 "--systems", "libra", "--group-size", "2", "--prompts-per-step", "2", "--no-track",
                 "--store", "a_file/store"]) == 2
    err = capsys.readouterr().err
    assert err == ("libra: error: store a_file/store is not a directory (a_file is a file); give a store directory "
                   "(--store DIR or store.root)\n")



def test_training_under_the_name_of_an_imported_trace_is_refused_and_the_import_kept(
        files: Path, capsys: pytest.CaptureFixture) -> None:
    """A training run's first step replaces its run in the store whole: named as another kind of run
    (here an imported trace), it would have deleted the import."""
    assert main(["traces", "import", "small.csv", "--run", "agents", "--store", "store", "--json"]) == 0
    capsys.readouterr()
    before = sorted((p.relative_to(files), p.read_bytes()) for p in (files / "store").rglob("*") if p.is_file())
    assert main(["train", "--run", "agents", "--store", "store", "--steps", "1"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "libra: error: run 'agents' already exists in store store (import of small.csv, "
                          "prompts_per_step=8) and is not a training run, which would replace it; name the new run "
                          "another way (--run NAME)\n")
    assert sorted((p.relative_to(files), p.read_bytes()) for p in (files / "store").rglob("*") if p.is_file()) == before
    assert not (files / ".libra").exists()

@pytest.mark.parametrize("argv", [["rollout", "--env", "math", "--prompts", "1", "--samples", "1", "--no-track",
                                   "--policy", str(ROOT / "data" / "policy")],
                                  ["pool", "--steps", "20", "--no-track"]], ids=["rollout", "pool"])
def test_a_rollout_or_pool_named_as_an_existing_run_is_refused_before_it_starts(
        files: Path, capsys: pytest.CaptureFixture, argv: list[str]) -> None:
    """A rollout's batches replaced that run's steps (an imported trace's step 0 became one math
    trajectory), and a pool's events joined its tables, the run still saying it was the import."""
    assert main(["traces", "import", "small.csv", "--run", "agents", "--store", "store", "--json"]) == 0
    capsys.readouterr()
    before = sorted((p.relative_to(files), p.read_bytes()) for p in (files / "store").rglob("*") if p.is_file())
    assert main([*argv, "--run", "agents", "--store", "store"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("libra: error: run 'agents' already exists in store store (import of small.csv")
    assert err.endswith("; name another run with --run NAME (this command adds to no run it did not start)\n")
    assert sorted((p.relative_to(files), p.read_bytes()) for p in (files / "store").rglob("*") if p.is_file()) == before
    assert not (files / ".libra").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="working directories are tmpfs mounts only where Libra runs as root")
def test_a_rollout_whose_working_directories_would_pin_more_than_their_budget_is_refused(
        files: Path, capsys: pytest.CaptureFixture) -> None:
    """256 MiB a working directory, with nothing adding them up: the README's `--prompts 32 --samples
    8` could pin 64 GiB of a 24 GiB machine in tmpfs pages."""
    (files / "wd.yaml").write_text("sandbox:\n  workdir_bytes: 4194304\n  workdirs_bytes: 10485760\n")
    assert main(["rollout", "--env", "math", "--prompts", "2", "--samples", "2", "--no-track", "--config", "wd.yaml",
                 "--policy", str(ROOT / "data" / "policy"), "--store", "store"]) == 2
    assert capsys.readouterr().err == (
        "libra: error: 4 trajectories at once, each with a working directory of sandbox.workdir_bytes 4 MiB, may hold "
        "16 MiB of files in memory, past sandbox.workdirs_bytes 10 MiB; lower sandbox.workdir_bytes (a task's files "
        "need a few KiB) or the trajectories in flight, or raise sandbox.workdirs_bytes\n")
    nothing_written(files)


def test_a_tree_of_a_run_without_trajectories_is_refused_and_nothing_saved(files: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """A simulation's run holds steps and plans, no trajectories: the tree saved was one empty root."""
    from tests.builders import write_simulated_run

    write_simulated_run(files / "store", "sim", steps=2)
    assert main(["tree", "--run", "sim", "--out", "t.json", "--store", "store"]) == 2
    assert capsys.readouterr().err == ("libra: error: run 'sim' holds no trajectories to build a tree from (a pool's or "
                                       "a simulation's run); name an imported trace's or a training run (libra runs)\n")
    assert not (files / "t.json").exists()


def test_runs_lists_a_run_whose_manifest_is_torn_and_says_why_it_cannot_be_read(
        files: Path, capsys: pytest.CaptureFixture) -> None:
    for run in ("a", "b"):
        assert main(["traces", "import", "small.csv", "--run", run, "--store", "store", "--json"]) == 0
    (files / "store" / "_runs" / "a.manifest").write_bytes(b"\0" * 8192)
    capsys.readouterr()
    assert main(["runs", "--store", "store"]) == 0
    assert capsys.readouterr() == ("a\nb\n", "libra: note: listed but cannot be read: run 'a': manifest "
                                   "store/_runs/a.manifest has no valid slot; write it again whole with the command "
                                   "that wrote it (libra traces import FILE --run a --replace; libra train --run a "
                                   "--restart; libra simulate ... --run a --replace)\n")
    # training under its name is refused too (its origin cannot be read), unless it is to be replaced whole
    assert main(["train", "--run", "a", "--store", "store", "--steps", "1"]) == 2
    assert capsys.readouterr().err.startswith("libra: error: run 'a': manifest store/_runs/a.manifest has no valid slot")


@pytest.mark.parametrize("argv, message", [
    (["traces", "import", "binary.csv", "--run", "r"], "libra: error: binary.csv:1: not UTF-8 text"),
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", "zero.csv", "--json"],
     "libra: error: zero.csv:2: trajectory p/s has no tokens"),
    (["config", "--config", "bomb.yaml"], "libra: error: bomb.yaml: the document expands to more than 100,000 values"),
    (["plan", "--cluster", "1x8:a800", "--model", "qwen3-8b", "--trace", "small.csv", "--batch", "x"],
     "libra: error: argument --batch: invalid int value: 'x' (see `libra plan --help`)"),
    (["simulate"], "libra: error: the following arguments are required: --workload (see `libra simulate --help`)"),
])
def test_the_console_command_prints_one_line_and_no_traceback(files: Path, argv: list[str], message: str) -> None:
    started = time.perf_counter()
    proc = libra(*argv, cwd=files)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert time.perf_counter() - started < 60
    nothing_written(files)


# --- Ctrl-C -------------------------------------------------------------------------------------

INTERRUPT_IMPORT = """
import sys
class Interrupt:  # Ctrl-C while Prefect, the heaviest module, is being imported
    def find_spec(self, name, path=None, target=None):
        if name == "prefect":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
from cli.main import main
sys.exit(main(sys.argv[1:]))
"""

INTERRUPT_DROPPED = """
import sys, time, weakref
import cli.main
load = cli.main.config_from_args
def dropped(args):  # Ctrl-C inside a weakref callback, where Python drops it ("Exception ignored")
    class Thing:
        pass
    thing = Thing()
    ref = weakref.ref(thing, lambda _: (_ for _ in ()).throw(KeyboardInterrupt()))
    del thing
    time.sleep(1)
    print("not interrupted", file=sys.stderr)
    return load(args)
cli.main.config_from_args = dropped
sys.exit(cli.main.main(sys.argv[1:]))
"""

INTERRUPT_IN_AN_IMPORT = """
import sys, cli.main
load = cli.main.config_from_args
def importing(args):  # Ctrl-C while a module runs its top level, as a native extension's init does
    sys.path.insert(0, ".")
    import interrupts_itself
    return load(args)
cli.main.config_from_args = importing
sys.exit(cli.main.main(sys.argv[1:]))
"""

INTERRUPTS_ITSELF = """
import os, pathlib, signal, time
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.3)
pathlib.Path("imported").write_text("the import ran to its end")
"""


def interruptible() -> None:
    """In the child before it execs: Ctrl-C's default action, as in a terminal. A test runner started
    in the background (`cmd &` in a non-interactive shell) ignores SIGINT, and children inherit that;
    Python then installs no KeyboardInterrupt handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("script", [INTERRUPT_IMPORT, INTERRUPT_DROPPED], ids=["during-import", "dropped-by-python"])
def test_ctrl_c_is_one_line_and_exit_130(files: Path, script: str) -> None:
    proc = subprocess.run([sys.executable, "-c", script, "run", "--traces", "small.csv", "--json"], cwd=files,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          preexec_fn=interruptible)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "libra: interrupted\n")
    assert not (files / ".libra" / "store").exists()


def test_ctrl_c_during_an_import_waits_for_the_import(files: Path) -> None:
    """Raised inside a native extension's initialisation (DuckDB's nanobind), a KeyboardInterrupt
    aborts the process; so it is held until the module has finished importing."""
    (files / "interrupts_itself.py").write_text(INTERRUPTS_ITSELF)
    proc = subprocess.run([sys.executable, "-c", INTERRUPT_IN_AN_IMPORT, "run", "--traces", "small.csv", "--json"],
                          cwd=files, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=interruptible)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "libra: interrupted\n")
    assert (files / "imported").read_text() == "the import ran to its end"
    assert not (files / ".libra" / "store").exists()


@pytest.mark.parametrize("delay_s", [0.4, 2.0])
def test_sigint_early_in_a_real_run(files: Path, delay_s: float) -> None:
    """SIGINT to the installed `libra` command while it imports (0.4 s) and reads its trace or starts
    Prefect (2 s)."""
    command = Path(sys.executable).parent / "libra"
    proc = subprocess.Popen([str(command), "run", "--traces", "small.csv", "--json"], cwd=files,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=interruptible)
    time.sleep(delay_s)
    proc.send_signal(2)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (130, "", "libra: interrupted\n")


# --- two runs at once -----------------------------------------------------------------------------

@pytest.mark.slow
def test_two_runs_at_once_in_a_fresh_directory(files: Path) -> None:
    """Both create Prefect's and MLflow's databases in the same .libra at the same moment (each its own
    store, so the store's run locks do not meet); both succeed, with JSON only on stdout and nothing
    on stderr."""
    # MLflow's default database, in the working directory (an earlier test may have named another)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--traces", "small.csv", "--json", "--store",
                              f"store{i}"], cwd=files, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for i in range(2)]
    results = [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in runs]
    for code, out, err in results:
        assert (code, err) == (0, "")
        summary = json.loads(out)
        assert [(s["run"], s["trajectories"], s["turns"]) for s in summary] == [("small", 3, 6)]
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{files / '.libra' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("libra-traces")
    assert len(client.search_runs([experiment.experiment_id])) == 2



def test_an_error_inside_the_flow_is_one_line_without_prefects_logs(files: Path) -> None:
    """The store is a file: the flow's import task fails, and Prefect would log the failure, with
    its traceback, twice; the held log lines are dropped and the error is the one line."""
    (files / "a_file").write_text("")
    proc = libra("run", "--traces", "small.csv", "--store", "a_file/store", cwd=files)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("libra: error: store a_file/store is not a directory (a_file is a file); give a store "
                           "directory (--store DIR or store.root)\n")


def test_replace_never_replaces_a_run_of_another_kind(files: Path, capsys: pytest.CaptureFixture) -> None:
    """An import or a simulation with --replace over a training run had replaced it whole: the run's
    checkpoints were left without it, and `libra train` refused to resume them (a run of another kind)."""
    from tests.builders import write_placed_run
    from tests.storage.test_import import snapshot

    write_placed_run(files / "store", "t1", steps=2, turns_per_step=8)
    before = snapshot(files / "store")
    for argv in (["traces", "import", "small.csv", "--run", "t1", "--store", "store"],
                 ["traces", "import", "small.csv", "--run", "t1", "--store", "store", "--replace"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "already exists in store store (train) and is not an import of a trace" in err, err
        assert err.endswith("--replace replaces only an import; import small.csv under another run name (--run NAME)\n")
    assert main(["simulate", "--workload", "search-r1", "--steps", "1", "--systems", "libra", "--no-track",
                 "--store", "store", "--run", "t1", "--replace"]) == 2
    assert capsys.readouterr().err.endswith("--replace replaces only a simulation; name this one another way (--run NAME)\n")
    assert snapshot(files / "store") == before
    assert main(["traces", "import", "small.csv", "--run", "i", "--store", "store"]) == 0  # an import replaces an import
    assert main(["traces", "import", "small.csv", "--run", "i", "--store", "store", "--replace"]) == 0


@pytest.mark.parametrize("value, last", [("false", "libra: error: no store at store (no such directory), so nothing to "
                                                  "query; pass the store a run was written to (--store DIR, or "
                                                  "store.root in --config)"),
                                         ("maybe", "libra: error: LIBRA_DEBUG='maybe': give 1 (or true, yes, on) or 0 "
                                                   "(or false, no, off)")])
def test_libra_debug_takes_the_usual_spellings_of_off(files: Path, value: str, last: str) -> None:
    """LIBRA_DEBUG=false (or no, or off) had turned tracebacks on: only 0 meant off."""
    done = libra("query", "--store", "store", "--run", "zz", "select 1", cwd=files, timeout=120, LIBRA_DEBUG=value)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", last + "\n")


def test_an_empty_prefect_variable_is_unset_and_a_prefect_home_that_is_a_file_is_one_line(files: Path) -> None:
    """PREFECT_API_URL='' (the usual way to unset it) had flooded stderr with Prefect's tracebacks, and
    PREFECT_HOME naming a file failed with 'File exists' after seconds."""
    plan = ("plan", "--cluster", "1x8:h100", "--model", "qwen3-8b", "--trace", "small.csv")
    done = libra(*plan, cwd=files, timeout=300, PREFECT_API_URL="", PREFECT_HOME="")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (files / "afile").write_text("mine")
    done = libra(*plan, cwd=files, timeout=300, PREFECT_HOME=str(files / "afile"))
    assert (done.returncode, done.stderr) == (2, f"libra: error: PREFECT_HOME={files / 'afile'} is not a directory; "
                                                 "point it at a directory for Prefect's database, or unset it for "
                                                 "orchestration.prefect_home\n")
    assert (files / "afile").read_text() == "mine"


def test_an_artifact_root_that_cannot_be_a_directory_is_refused_before_any_work(files: Path,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    """It was found only when the first run was logged: after a whole training, and again at every rerun."""
    (files / "art.yaml").write_text("tracking:\n  artifact_root: small.csv/art\n")
    assert main(["simulate", "--workload", "search-r1", "--steps", "1", "--systems", "libra", "--config", "art.yaml",
                 "--store", "store"]) == 2
    assert capsys.readouterr().err == ("libra: error: tracking.artifact_root small.csv/art: Not a directory; point it at "
                                       "a directory MLflow can write its artifacts in\n")
    assert not (files / "store").exists()
