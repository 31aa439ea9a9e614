import json
from pathlib import Path

import mlflow
import pytest

from cli.main import main
from storage.catalog import Catalog
from tests.builders import local_config


def config_file(tmp_path: Path) -> Path:
    return local_config(tmp_path, f"pool: {{core_ranks: 1, hybrids: 1, snapshot_dir: {tmp_path / 'pool'}, group_timeout_s: 5}}\n")


def test_pool_kill_verify_store_and_mlflow(tmp_path: Path, capsys, monkeypatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    code = main(["pool", "--steps", "40", "--schedule", "3:1", "--kill", "hybrid-0@15", "--verify", "--run", "drill",
                 "--config", str(config_file(tmp_path)), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["run"], result["steps"], result["core_ranks"], result["hybrids"]) == ("drill", 40, 1, 1)
    assert result["events"]["died"] >= 1 and result["events"]["activated"] >= 1
    assert result["retried_steps"] <= 1
    assert result["max_abs_diff_vs_core_only"] < 1e-6  # nothing lost or counted twice
    with Catalog(tmp_path / "store", "drill") as catalog:
        died = catalog.query("select worker_id, to_state, detail from pool_events where event = 'died'").to_pylist()
    assert died[0]["worker_id"] == "hybrid-0" and died[0]["to_state"] == "failed" and "SIGKILL" in died[0]["detail"]
    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(result["mlflow_run_id"])
    assert run.data.params["hybrids"] == "1" and "pool_events.json" in {
        a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    mlflow.set_tracking_uri(None)


@pytest.mark.parametrize("args, message", [
    (["--schedule", "ten:1"], "is not STEP:COUNT"),
    (["--schedule", "5:3"], "0 <= COUNT <= 1"),
    (["--kill", "hybrid-7@3"], "expected HYBRID@STEP with HYBRID one of hybrid-0"),
    (["--batch", "1"], "--batch >= core + hybrids (2)"),
    (["--schedule", ""], "--schedule '' gives no STEP:COUNT; give at least one (e.g. 10:2,40:0)"),
    (["--schedule", "0:all,0:0"], "--schedule gives step 0 twice; give each step once (e.g. 10:2,40:0)"),
    (["--schedule", "9" * 5000 + ":0"], "need STEP <= 1,000,000 (the most --steps allows)"),  # int() raised past 4,300 digits
    (["--schedule=-1:0"], "is not STEP:COUNT"),
    (["--kill", "hybrid-0@" + "9" * 5000], "--kill 'hybrid-0@99999"),
    (["--kill", "hybrid-0@60"], "--kill 'hybrid-0@60': step 60 is past the run's 60 steps (--steps); give a STEP "
                                "below 60"),  # the kill never happened, silently
])
def test_bad_arguments_are_one_line_errors(tmp_path: Path, capsys, args, message) -> None:
    code = main(["pool", "--config", str(config_file(tmp_path)), "--no-track", *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "store").exists()


def test_a_schedule_that_moves_no_hybrid_within_the_run_records_no_events(tmp_path: Path, capsys) -> None:
    # 10:all never fires in one step: the recording once failed on an empty events table, after the training
    code = main(["pool", "--steps", "1", "--run", "quiet", "--config", str(config_file(tmp_path)), "--no-track", "--json"])
    assert code == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert (result["run"], result["steps"]) == ("quiet", 1) and not any(result["events"].values())
