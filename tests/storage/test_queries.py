from pathlib import Path

import pytest

from libra.config import StoreConfig
from libra.errors import LibraError
from storage.catalog import Catalog, list_runs
from storage.ingest import import_trace
from storage.queries import NAMED_QUERIES, run_named
from tests.builders import small_trace


@pytest.fixture()
def catalog(tmp_path: Path):
    store = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    summary = import_trace(small_trace(tmp_path / "t.csv"), "small", store, prompts_per_step=1)
    assert (summary.trajectories, summary.turns, summary.steps) == (3, 6, 2)
    with Catalog(store.root, "small") as cat:
        yield cat


def test_replacing_an_import_with_the_same_file_leaves_the_same_rows(tmp_path: Path, catalog: Catalog) -> None:
    store = StoreConfig(root=str(catalog.root), fsync=False)
    import_trace(small_trace(tmp_path / "t2.csv"), "small", store, prompts_per_step=1, replace=True)
    with Catalog(store.root, "small") as again:
        assert again.query("select count(*) as n from turns").to_pylist() == [{"n": 6}]
        assert again.query("select count(*) as n from trajectories").to_pylist() == [{"n": 3}]
    assert list_runs(store.root) == ["small"]


def test_remaining_length_paths(catalog: Catalog) -> None:
    rows = sorted(run_named(catalog, "remaining_length_paths").to_pylist(), key=lambda r: (r["trajectory_id"], r["turn_idx"]))
    assert [(r["trajectory_id"], r["turn_idx"], r["tool_name"], r["tool_status"], r["position_tokens"], r["remaining_tokens"])
            for r in rows] == [
        ("p1/a", 0, "search", "ok", 35, 3011),
        ("p1/a", 1, "search", "error", 3042, 4),
        ("p2/a", 0, "python", "ok", 628, 2),
    ]
    assert [r["step"] for r in rows] == [0, 0, 1]
    recent = run_named(catalog, "remaining_length_paths", last_steps=1).to_pylist()
    assert [r["trajectory_id"] for r in recent] == ["p2/a"]


def test_length_histogram(catalog: Catalog) -> None:
    rows = run_named(catalog, "length_histogram", bin_tokens=1000).to_pylist()
    assert [(r["lo_tokens"], r["hi_tokens"], r["trajectories"]) for r in rows] == [(0, 1000, 2), (3000, 4000, 1)]
    assert rows[0]["gen_tokens_mean"] == 8.0  # (6 + 10) / 2
    auto = run_named(catalog, "length_histogram", bins=2).to_pylist()  # width ceil(3047 / 2) = 1524
    assert [(r["lo_tokens"], r["trajectories"]) for r in auto] == [(0, 2), (1524, 1)]
    recent = run_named(catalog, "length_histogram", last_steps=1, bin_tokens=100).to_pylist()
    assert [(r["lo_tokens"], r["trajectories"]) for r in recent] == [(600, 1)]


def test_tool_statistics(catalog: Catalog) -> None:
    rows = {r["tool_name"]: r for r in run_named(catalog, "tool_statistics").to_pylist()}
    assert set(rows) == {"search", "python"}
    search = rows["search"]
    assert (search["calls"], search["trajectories"], search["error_rate"], search["timeout_rate"]) == (2, 1, 0.5, 0.0)
    assert (search["payload_tokens_mean"], search["payload_tokens_max"], search["gen_tokens_mean"]) == (1510.0, 3000, 6.0)
    assert rows["python"]["payload_tokens_p50"] == 600.0


def test_per_step_drift_and_summary(catalog: Catalog) -> None:
    rows = run_named(catalog, "per_step_drift").to_pylist()
    assert [(r["step"], r["trajectories"], r["total_tokens_mean"], r["turns_mean"]) for r in rows] == [
        (0, 2, 1531.0, 2.0),
        (1, 1, 630.0, 2.0),
    ]
    assert rows[0]["length_vs_previous"] is None
    assert rows[1]["length_vs_previous"] == pytest.approx(630 / 1531)
    assert rows[1]["reward_mean"] == 0.0
    summary = run_named(catalog, "run_summary").to_pylist()[0]
    assert (summary["steps"], summary["trajectories"], summary["turns"]) == (2, 3, 6)
    assert summary["tool_calls_mean"] == 1.0
    assert summary["tool_error_rate"] == pytest.approx(1 / 3)


def test_empty_tables_are_queryable(catalog: Catalog) -> None:
    for table in ("steps", "plans", "pool_events"):
        assert catalog.query(f"select count(*) as n from {table}").to_pylist() == [{"n": 0}]
    assert "plan_id" in catalog.query("select * from plans").column_names


def test_named_query_errors(catalog: Catalog) -> None:
    with pytest.raises(LibraError, match="no named query 'nope'; named queries: length_histogram"):
        run_named(catalog, "nope")
    with pytest.raises(LibraError, match="unknown parameter"):
        run_named(catalog, "tool_statistics", bins=3)
    with pytest.raises(LibraError, match="non-negative integer"):
        run_named(catalog, "tool_statistics", last_steps=-1)
    with pytest.raises(LibraError, match="query failed: "):
        catalog.query("select * from nowhere")
    assert set(NAMED_QUERIES) >= {"length_histogram", "remaining_length_paths", "tool_statistics", "per_step_drift"}


def test_unknown_run(tmp_path: Path) -> None:
    with pytest.raises(LibraError, match="the store is empty"):
        Catalog(tmp_path, "ghost")


def test_learning_by_step_breaks_a_training_run_down_by_category(tmp_path: Path) -> None:
    """Per step and category: reward, solved / wrong / unanswered shares and the step's groups; a
    trajectories file written before `category` and `outcome` existed reads them as null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from libra.types import Trajectory
    from storage.records import trajectories_table
    from storage.schemas import STEPS
    from storage.writer import StoreWriter

    def trajectory(tid: str, category: str | None, outcome: str | None, reward: float) -> Trajectory:
        return Trajectory(tid, tid.split("/")[0], tid.split("/")[1], "math", 10, (), reward, 0, 1.0, category, outcome)

    writer = StoreWriter(tmp_path)
    old = [trajectory("p0/0", None, None, 1.0)]
    [shard] = writer.write_step("trajectories", "r", 0, trajectories_table("r", old, {"p0": 0}))
    pq.write_table(pq.read_table(shard).drop_columns(["category", "outcome"]), shard)  # as written before
    new = [trajectory("p1/0", "tank", "solved", 1.0), trajectory("p1/1", "tank", "wrong", 0.0),
           trajectory("p2/0", "pens", "unanswered", 0.0), trajectory("p2/1", "pens", "unanswered", 0.0)]
    writer.write_step("trajectories", "r", 1, trajectories_table("r", new, {"p1": 1, "p2": 1}))
    writer.write_step("steps", "r", 1, pa.Table.from_pylist(
        [{"run": "r", "step": 1, "uniform_groups": 1, "trained_groups": 1}], schema=STEPS.arrow))
    with Catalog(tmp_path, "r") as catalog:
        rows = run_named(catalog, "learning_by_step").to_pylist()
    assert [(r["step"], r["category"], r["trajectories"], r["reward_mean"], r["solved"], r["wrong"], r["unanswered"],
             r["step_uniform_groups"], r["step_trained_groups"]) for r in rows] == [
        (0, "", 1, 1.0, 0.0, 0.0, 0.0, None, None),
        (1, "pens", 2, 0.0, 0.0, 0.0, 1.0, 1, 1),
        (1, "tank", 2, 0.5, 0.5, 0.5, 0.0, 1, 1),
    ]
