from pathlib import Path

import mlflow
import pytest

from flows.trace_analysis import bundled_traces, run_name_for, trace_analysis_flow
from libra.config_loading import load_config
from storage.catalog import Catalog
from tests.builders import small_trace


@pytest.fixture()
def tracking(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)


def test_flow_imports_queries_and_tracks(tmp_path: Path, tracking: str) -> None:
    config = load_config(overrides={
        "store.root": str(tmp_path / "store"),
        "store.fsync": False,
        "tracking.artifact_root": str(tmp_path / "artifacts"),
        "traces.prompts_per_step": 1,
    })
    trace = small_trace(tmp_path / "small.csv")
    result = trace_analysis_flow(traces=[str(trace)], config=config)
    assert len(result) == 1
    row = result[0]
    assert (row["run"], row["trajectories"], row["turns"], row["steps"]) == ("small", 3, 6, 2)
    assert row["total_tokens_p50"] == 630.0

    with Catalog(config.store.root, "small") as catalog:
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 6}]

    run = mlflow.get_run(row["mlflow_run_id"])
    assert run.data.params["trace_file"] == "small.csv"
    assert run.data.metrics["trajectories"] == 3.0
    client = mlflow.MlflowClient()
    history = client.get_metric_history(run.info.run_id, "step_total_tokens_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 1531.0), (1, 630.0)]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"length_histogram.csv", "length_histogram.png", "per_step_drift.csv",
                         "per_step_drift.png", "tool_statistics.csv"}

    again = trace_analysis_flow(traces=[str(trace)], config=config)
    assert again[0]["turns"] == 6
    with Catalog(config.store.root, "small") as catalog:
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 6}]


def test_bundled_traces_are_present() -> None:
    names = [run_name_for(p) for p in bundled_traces()]
    assert names == ["fireact_hotpotqa", "swe_gemini3_mini_A", "taubench_airline", "tora_gsm8k"]
