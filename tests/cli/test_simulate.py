import json
from pathlib import Path

import mlflow

from cli.main import main
from storage.catalog import Catalog
from tests.builders import local_config


def test_simulate_json_store_and_mlflow(tmp_path: Path, capsys, monkeypatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = local_config(tmp_path)
    code = main(["simulate", "--workload", "search-r1", "--cluster", "2x8:a800", "--model", "qwen3-8b", "--steps", "3",
                 "--systems", "static-uniform,libra,oracle", "--group-size", "4", "--prompts-per-step", "8",
                 "--config", str(config), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(out)
    assert (result["workload"], result["gpus"]) == ("search-r1", 16)
    assert list(result["policies"]) == ["static-uniform", "libra", "oracle"]
    for m in result["policies"].values():
        assert {"tokens_per_s", "step_time_mean_s", "step_time_p99_s", "idle_gpu_s", "total_time_s"} <= set(m)
        assert set(m["idle_gpu_s"]) == {"rollout", "train"}
    assert result["policies"]["libra"]["vs_libra"] == 1.0 and result["policies"]["oracle"]["vs_oracle"] == 1.0
    assert result["bound_tokens_per_s"] > 0 and all(0 < m["vs_bound"] <= 1 for m in result["policies"].values())
    with Catalog(tmp_path / "store", result["store_run"]) as catalog:
        rows = catalog.query("select policy, count(*) as n from steps group by policy order by policy").to_pylist()
        assert rows == [{"policy": p, "n": 3} for p in ("libra", "oracle", "static-uniform")]
        assert catalog.query("select count(*) as n from plans").to_pylist()[0]["n"] >= 3
    mlflow.set_tracking_uri(uri)
    parent = mlflow.get_run(result["mlflow_parent_run_id"])
    children = mlflow.search_runs(experiment_ids=[parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(children["tags.mlflow.runName"]) == ["libra", "oracle", "static-uniform"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(parent.info.run_id)}
    assert {"throughput.png", "gpu_split.png", "summary.json"} <= artifacts
    mlflow.set_tracking_uri(None)


def test_simulate_errors(capsys) -> None:
    assert main(["simulate", "--workload", "nope", "--steps", "1", "--no-track"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
    assert main(["simulate", "--workload", "search-r1", "--systems", "libra,magic", "--no-track"]) == 2
    assert "unknown systems magic" in capsys.readouterr().err
    assert main(["simulate", "--workload", "search-r1", "--steps", "0", "--no-track"]) == 2


def test_a_simulation_into_a_run_that_exists_is_refused_before_it_starts_and_replace_replaces_it_whole(
        tmp_path: Path, capsys) -> None:
    """Two simulations under one run name once left a mix: the second replaced only the steps it
    wrote, so the first's other steps and systems stayed beside its own."""
    config = local_config(tmp_path)
    first = ["simulate", "--workload", "dapo-math", "--cluster", "1x8:h100", "--model", "qwen3-8b", "--steps", "2",
             "--systems", "libra,verl-colocated", "--run", "mix", "--no-track", "--config", str(config)]
    second = ["simulate", "--workload", "search-r1", "--cluster", "1x8:h100", "--model", "qwen3-8b", "--steps", "1",
              "--systems", "libra", "--run", "mix", "--no-track", "--config", str(config)]

    def rows() -> list[dict]:
        with Catalog(tmp_path / "store", "mix") as catalog:
            return catalog.query("select step, policy from steps order by step, policy").to_pylist()

    assert main(first) == 0
    before = rows()
    assert before == [{"step": s, "policy": p} for s in (0, 1) for p in ("libra", "verl-colocated")]
    capsys.readouterr()
    assert main(second) == 2
    err = capsys.readouterr().err
    assert "run 'mix' already exists in store" in err and "(simulation of dapo-math, 1x8:h100, qwen3-8b, 2 steps" in err
    assert err.strip().endswith("pass --replace to replace it whole") and "Traceback" not in err
    assert rows() == before
    assert main([*second, "--replace"]) == 0
    assert rows() == [{"step": 0, "policy": "libra"}]
