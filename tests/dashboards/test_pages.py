"""Each page's figures against the rows the fixture wrote, and independent counts of the same rows."""

from __future__ import annotations

import html
from collections import defaultdict
from urllib.parse import urlencode

import pytest

from storage.catalog import Catalog
from tests.dashboards.conftest import HELDOUT, SYNC_S


def page(client, path: str) -> dict:
    response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def charts(body: dict) -> dict[str, dict]:
    return {c["key"]: c for c in body["charts"]}


def traces(chart: dict) -> dict[str, dict]:
    """A chart's traces by name as the page shows it (names reach Plotly escaped; it draws the entities)."""
    return {html.unescape(t["name"]): t for t in chart["figure"]["data"]}


def test_overview_of_a_placed_training(client) -> None:
    body = page(client, "/api/runs/fixture-train/overview")
    assert dict(body["summary"]) == {"steps": "12", "wall time": "201 s", "generated tokens / s": "6,876.9",
                                     "trajectories": "720", "last batch reward": "0.750", "held-out reward": "0.125 -> 0.312"}
    c = charts(body)
    reward = traces(c["reward"])
    assert reward["training batch (mean)"]["y"] == [0.25] * 4 + [0.5] * 4 + [0.75] * 4
    heldout = reward["held-out (after the step's update)"]  # version v follows step v - 1's update
    assert (heldout["x"], heldout["y"]) == ([v - 1 for v in HELDOUT], list(HELDOUT.values()))
    categories = traces(c["categories"])  # two groups a step have a category, and each group's rewards differ
    assert sorted(categories) == ["pages", "tank"]
    assert categories["tank"]["x"] == list(range(12)) and categories["tank"]["y"] == [1.0] * 12
    assert categories["pages"]["hovertext"] == ["1 group"] * 12
    stages = traces(c["stages"])
    assert stages["rollout"]["y"] == [12.0 + s for s in range(12)]
    assert stages["weight sync"]["y"] == [SYNC_S] * 12  # from MLflow, the run not superseded
    assert stages["whole step"]["y"] == [14.0 + s / 2 for s in range(12)]
    stale = traces(c["staleness"])
    assert stale["mean"]["y"] == [0.0] + [1.0 + 0.25 * (s % 2) for s in range(1, 12)]
    assert stale["oldest"]["y"] == [0] + [1 + s % 2 for s in range(1, 12)]
    assert stale["mean"]["hovertext"][:2] == ["0% of the tokens off-policy", "100% of the tokens off-policy"]
    carried = traces(c["partial"])
    assert carried["suspended when the batch closed"]["y"] == [4] * 12
    assert carried["continued from earlier batches"]["y"] == [0] + [4] * 11
    assert carried["dropped, too stale"]["y"] == [2 * (s % 3 == 2) for s in range(12)]
    split = traces(c["split"])
    assert split["training"]["y"] == [2] * 6 + [1] * 6 and split["hybrid"]["y"] == [0] * 6 + [1] * 6
    marks = split["plan applied"]
    assert marks["x"] == [0, 6] and "pressure: rollout 1.6x training" in marks["hovertext"][1]
    assert [s["x0"] for s in c["split"]["figure"]["layout"]["shapes"]] == [0, 6]
    plans = body["tables"][0]["rows"]
    assert [(p[0], p[1], p[2]) for p in plans] == [(6, "yes", "pressure: rollout 1.6x training"),
                                                  (3, "no", "gain 2% below threshold 5%"), (0, "yes", "initial plan")]
    assert [r["name"] for r in body["reads"]][:2] == ["policies", "steps in run"]


def test_overview_of_a_simulation_has_a_policy_selector_and_no_reward(client, dash_root) -> None:
    body = page(client, "/api/runs/fixture-sim/overview")
    assert body["controls"][0]["name"] == "policy" and body["controls"][0]["value"] == "libra"
    assert [o[0] for o in body["controls"][0]["options"]] == ["libra", "verl-colocated"]
    c = charts(body)
    assert c["reward"]["figure"] is None and "simulated run has none" in c["reward"]["empty"]
    other = page(client, "/api/runs/fixture-sim/overview?policy=verl-colocated")
    with Catalog(dash_root / "store", "fixture-sim") as catalog:
        expected = catalog.query("select sum(trained_tokens) / sum(step_s) as r from steps "
                                 "where policy = 'verl-colocated' group by step order by step").column("r").to_pylist()
    assert traces(charts(other)["throughput"])["trained tokens / s"]["y"] == pytest.approx(expected)


def test_long_runs_are_binned_to_max_points(dash_root) -> None:
    from fastapi.testclient import TestClient

    from dashboards.app import create_app
    from dashboards.sources import Store, Tracking
    from dashboards.view import stride
    from libra.config import DashboardConfig

    assert [stride(n, 2000) for n in (1, 2000, 2001, 100_000)] == [1, 1, 2, 50]
    app = create_app(Store(dash_root / "store"), Tracking(None), DashboardConfig(max_points=4))
    with TestClient(app, base_url="http://127.0.0.1") as small:
        c = charts(small.get("/api/runs/fixture-train/overview").json())
    rollout = traces(c["stages"])["rollout"]
    assert rollout["x"] == [0, 3, 6, 9] and rollout["y"] == [13.0, 16.0, 19.0, 22.0]  # the mean of 3 steps each
    steps = [range(0, 3), range(3, 6), range(6, 9), range(9, 12)]
    expected = [sum(4000 + 10 * s for s in r) / sum(14.0 + s / 2 for s in r) for r in steps]
    assert traces(c["throughput"])["trained tokens / s"]["y"] == pytest.approx(expected)
    assert "the mean of 3 steps" in c["stages"]["note"]


def test_trajectories_page(client, dash_root) -> None:
    body = page(client, "/api/runs/fixture-train/trajectories")
    c = charts(body)
    with Catalog(dash_root / "store", "fixture-train") as catalog:
        longest = catalog.query("select step, trajectory_id, total_tokens from trajectories "
                                "order by total_tokens desc, step, trajectory_id limit 10").to_pylist()
        heat_total = catalog.query("select count(*) as n from trajectories").column("n")[0].as_py()
        errors = catalog.query("select avg(case when tool_status = 'error' then 100.0 else 0 end) as e from turns "
                               "where tool_name <> 'none' group by step order by step").column("e").to_pylist()
        first = catalog.query(f"select turn_idx, gen_latency_s, tool_latency_s, tool_name from turns where step = "
                              f"{longest[0]['step']} and trajectory_id = '{longest[0]['trajectory_id']}' "
                              "order by turn_idx").to_pylist()
    table = body["tables"][0]
    assert [(r[0], r[1], r[2]) for r in table["rows"]] == [(t["step"], t["trajectory_id"], t["total_tokens"]) for t in longest]
    assert table["links"][0] == urlencode({"trajectory": f"{longest[0]['step']}:{longest[0]['trajectory_id']}"})
    heat = c["lengths"]["figure"]["data"][0]
    assert sum(v for row in heat["z"] for v in row if v) == heat_total
    assert traces(c["errors"])["error"]["y"] == pytest.approx(errors)
    # the timeline: each turn starts where the previous turn's generation and tool call ended
    spans = [(s, b, x) for t in c["timeline"]["figure"]["data"] if t["type"] == "bar"
             for s, b, x in zip(t["y"], t["base"], t["x"], strict=True)]
    starts = {s: b for s, b, _ in sorted(spans, key=lambda v: v[1], reverse=True)}
    at = 0.0
    for turn in first:
        assert starts[f"turn {turn['turn_idx']}"] == pytest.approx(at)
        at += turn["gen_latency_s"] + (turn["tool_latency_s"] if turn["tool_name"] != "none" else 0.0)
    chosen = page(client, f"/api/runs/fixture-train/trajectories?{table['links'][3]}")
    assert longest[3]["trajectory_id"] in charts(chosen)["timeline"]["title"]


def test_imported_traces_draw_their_timeline_in_tokens(client) -> None:
    c = charts(page(client, "/api/runs/fixture-traces/trajectories"))
    assert "tokens" in c["timeline"]["figure"]["layout"]["xaxis"]["title"]["text"]
    counts = traces(c["counts"])
    assert (counts["turns"]["x"], counts["turns"]["y"]) == ([2, 3], [1, 1])
    tools = traces(c["tools"])
    assert tools["error"]["x"] == ["search", "python"] and tools["error"]["y"] == [50.0, 0.0]


def test_scheduling_page_against_a_count_by_hand(client, dash_root) -> None:
    body = page(client, "/api/runs/fixture-train/scheduling")
    with Catalog(dash_root / "store", "fixture-train") as catalog:
        turns = catalog.query("select step, trajectory_id, turn_idx, instance, bucket, migrated, context_tokens, "
                              "gen_tokens, tool_payload_tokens, gen_latency_s, tool_latency_s from turns").to_pylist()
    migrated = sum(t["migrated"] for t in turns)
    assert dict(body["summary"])["migrated turns"] == f"{migrated:,} ({100 * migrated / len(turns):.1f}%)"
    c = charts(body)
    occupancy = traces(c["occupancy"])
    assert sum(occupancy["bucket 0"]["y"]) == sum(1 for t in turns if t["bucket"] == 0)
    # the peak of turns in flight on each instance in step 11, rebuilt here from the same rows
    last = [t for t in turns if t["step"] == 11]
    by_trajectory = defaultdict(list)
    for t in last:
        by_trajectory[t["trajectory_id"]].append(t)
    events = defaultdict(list)
    for rows in by_trajectory.values():
        at = 0.0
        for t in sorted(rows, key=lambda r: r["turn_idx"]):
            events[t["instance"]] += [(at, 1), (at + t["gen_latency_s"], -1)]
            at += t["gen_latency_s"] + t["tool_latency_s"]
    peaks = {}
    for instance, es in events.items():
        running = peak = 0
        for _, delta in sorted(es):
            running += delta
            peak = max(peak, running)
        peaks[f"instance {instance}"] = peak
    queues = traces(c["queues"])
    assert {name: max(t["y"]) for name, t in queues.items()} == peaks
    # decisions: the p50 of the tokens still to come, over the last 10 steps, per bucket
    import numpy as np

    totals = {(t["step"], t["trajectory_id"]): 0 for t in turns}
    for t in turns:
        key = (t["step"], t["trajectory_id"])
        totals[key] = max(totals[key], t["context_tokens"] + t["gen_tokens"] + t["tool_payload_tokens"])
    remaining = [totals[(t["step"], t["trajectory_id"])] - t["context_tokens"] for t in turns if t["step"] > 1 and t["bucket"] == 1]
    assert traces(c["decisions"])["p50"]["y"][1] == pytest.approx(float(np.quantile(remaining, 0.5)))


def test_pools_page(client) -> None:
    body = page(client, "/api/runs/fixture-train/pools")
    assert dict(body["summary"]) == {"workers": "2", "joins": "6", "rollbacks and failures": "1"}
    c = charts(body)
    durations = traces(c["durations"])
    assert durations["join (requested -> active)"]["x"] == [6, 7, 8, 10, 11]
    assert durations["join (requested -> active)"]["y"] == [1.5] * 5
    assert durations["join given up (cancelled, rolled back, timed out)"]["x"] == [9]
    assert durations["join given up (cancelled, rolled back, timed out)"]["y"] == [3.0]
    assert durations["leave (requested -> released)"]["y"] == [1.5] * 5
    states = {t["name"]: t for t in c["states"]["figure"]["data"]}
    assert set(states) == {"rollout", "joining", "training", "leaving", "events"}
    assert sum(states["training"]["x"]) == pytest.approx(1.5 * 5)  # activated -> leave requested, 1.5 s each
    assert body["tables"][0]["rows"][0][5:] == ["rolled_back", "snapshot stale"]


def test_compare_page(client) -> None:
    body = page(client, "/api/compare")
    rows = {r[0]: r for r in body["tables"][0]["rows"]}
    assert set(rows) == {"fixture-sim:libra", "fixture-sim:verl-colocated", "fixture-train:libra"}
    first = body["tables"][0]["rows"][0]
    assert first[3] == 1.0  # the first series against itself
    chosen = page(client, "/api/compare?series=fixture-train:libra&series=fixture-sim:verl-colocated")
    assert [r[0] for r in chosen["tables"][0]["rows"]] == ["fixture-train:libra", "fixture-sim:verl-colocated"]
    train = chosen["tables"][0]["rows"][0]
    assert (train[1], train[2], train[4], train[5]) == (12, round(sum(4000 + 10 * s for s in range(12)) / 201.0, 1), 201.0, 0.312)
    c = charts(chosen)
    assert traces(c["heldout"])["fixture-train:libra"]["y"] == list(HELDOUT.values())
    assert traces(c["elapsed"])["fixture-train:libra"]["y"][-1] == pytest.approx(201.0)
