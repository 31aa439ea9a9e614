"""`libra train` refuses bad input with one line and exit status 2, before it writes anything."""

from pathlib import Path

import pytest
import yaml

from cli.main import main


def config(tmp_path: Path, trainer: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "store": {"root": str(tmp_path / "store")},
        "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "artifact_root": str(tmp_path / "art")},
        "orchestration": {"prefect_home": str(tmp_path / "prefect")},
        "trainer": {"checkpoint_dir": str(tmp_path / "checkpoints"), **trainer}}))
    return path


@pytest.mark.parametrize("trainer, argv, message", [
    ({"stepz": 3}, [], "unknown key 'trainer.stepz'; allowed keys here: env, policy, run, steps"),
    ({"policy": "missing-policy-dir"}, [], "trainer.policy: no policy in missing-policy-dir; build one with "
     "`libra policy init --out missing-policy-dir`"),
    ({"env": "chess"}, [], "trainer.env = 'chess': Input should be 'search', 'math' or 'repo'"),
    ({}, ["--steps", "-1"], "--steps = -1: Input should be greater than or equal to 1"),
    ({"steps": 0}, [], "trainer.steps = 0: Input should be greater than or equal to 1"),
    ({}, ["--run", "../escape"], "run name"),
    ({"lr": -1}, [], "trainer.lr = -1: Input should be greater than 0"),
    ({"max_staleness": 0}, [], "pipeline one_step_off trains on batches 1 update old: max_staleness must be >= 1"),
])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, capsys, trainer, argv, message):
    path = config(tmp_path, trainer)
    assert main(["train", "--config", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("libra: error: ") and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
