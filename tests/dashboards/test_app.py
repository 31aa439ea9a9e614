"""The web application: its routes, its refusals, that it only reads, and `libra dashboard`."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("overview", "trajectories", "scheduling", "pools")


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_page_of_every_run_answers(client) -> None:
    index = client.get("/")
    assert index.status_code == 200
    for run in ("fixture-train", "fixture-sim", "fixture-traces"):
        assert f"/runs/{run}/overview" in index.text
        for name in PAGES:
            html = client.get(f"/runs/{run}/{name}")
            assert html.status_code == 200 and f'data-api="/api/runs/{run}/{name}"' in html.text
            body = client.get(f"/api/runs/{run}/{name}").json()
            assert body["charts"] or body["notice"], (run, name)
    assert client.get("/compare").status_code == 200
    assert client.get("/plotly.min.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.get("/runs/fixture-train", follow_redirects=False).headers["location"] == "/runs/fixture-train/overview"


def test_missing_runs_pages_and_parameters_get_a_clear_answer(client) -> None:
    page = client.get("/runs/no-such-run/overview")
    assert page.status_code == 404
    assert "no run named &#39;no-such-run&#39; in the store" in page.text and "fixture-train" in page.text
    assert "Traceback" not in page.text
    assert client.get("/api/runs/no-such-run/pools").json()["error"].startswith("no run named 'no-such-run'")
    assert client.get("/runs/../../etc/overview").status_code == 404
    assert client.get("/api/runs/..%2Fetc/overview").status_code == 404
    bad_page = client.get("/runs/fixture-train/settings")
    assert bad_page.status_code == 404 and "no page &#39;settings&#39;" in bad_page.text
    for query, message in (("/api/runs/fixture-sim/overview?policy=nope", "run 'fixture-sim' has no policy 'nope'"),
                           ("/api/runs/fixture-train/scheduling?step=x", "step must be a whole number"),
                           ("/api/runs/fixture-train/scheduling?recent=0", "recent must be between 1 and"),
                           ("/api/runs/fixture-train/trajectories?trajectory=7", "trajectory must be <step>:<trajectory id>"),
                           ("/api/runs/fixture-train/trajectories?trajectory=" + "9" * 5000 + ":x",  # int() raised: a 500
                            "trajectory must be <step>:<trajectory id>"),
                           ("/api/compare?series=nope:libra", "no series 'nope:libra'")):
        response = client.get(query)
        assert response.status_code == 400 and message in response.json()["error"], query
    gone = client.get("/api/runs/fixture-train/trajectories?trajectory=3:nope").json()
    assert [c["empty"] for c in gone["charts"] if c["key"] == "timeline"] == ["no such trajectory in this run"]


def test_only_reads(client, dash_root) -> None:
    before = tree_digest(dash_root / "store"), tree_digest(dash_root).get("mlflow.db")
    for run in ("fixture-train", "fixture-sim", "fixture-traces"):
        for name in PAGES:
            client.get(f"/api/runs/{run}/{name}")
    client.get("/api/compare")
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/runs/fixture-train/overview").status_code == 405
    assert (tree_digest(dash_root / "store"), tree_digest(dash_root).get("mlflow.db")) == before


def test_a_missing_mlflow_database_is_not_created(dash_root, tmp_path) -> None:
    from dashboards.sources import Reads, Tracking

    tracking = Tracking(f"sqlite:///{tmp_path / 'none.db'}")
    assert tracking.history("fixture-train", Reads()) == {} and not (tmp_path / "none.db").exists()


def test_other_hosts_are_refused_on_loopback(client) -> None:
    assert client.get("/", headers={"host": "evil.example"}).status_code == 400
    assert client.get("/", headers={"host": "localhost:8050"}).status_code == 200


def versions_seen(client, url: str, count: int, timeout_s: float = 20.0) -> list[str]:
    """The first `count` `version` events of the change stream at `url` (bounded in time)."""
    import json

    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    with client.stream("GET", url) as stream:
        assert stream.status_code == 200
        event = None
        for line in stream.iter_lines():
            assert time.monotonic() < deadline, f"only {len(seen)} version events in {timeout_s} s"
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "version":
                seen.append(json.loads(line.removeprefix("data: ")))
                if len(seen) == count:
                    return seen
    return seen


def test_events_give_the_version_now_and_again_after_a_commit(tmp_path) -> None:
    """The change stream: the runs' version on connecting (so a commit between reading a page and
    listening is not lost), then a new one once a commit changes the run; a page's data carries the
    version it was read at."""
    import pyarrow as pa
    from fastapi.testclient import TestClient

    from dashboards.app import create_app
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig
    from storage.writer import StoreWriter

    writer = StoreWriter(tmp_path / "store", fsync=False)
    row = {"run": "live", "step": 0, "policy": "libra", "step_s": 1.0}
    writer.write_step("steps", "live", 0, pa.Table.from_pylist([row]))
    app = create_app(Store(tmp_path / "store"), Tracking(None), DashboardConfig(refresh_s=0.2))

    def commit_soon() -> None:
        time.sleep(1.0)
        writer.write_step("steps", "live", 1, pa.Table.from_pylist([row | {"step": 1}]))

    with TestClient(app, base_url="http://127.0.0.1") as client:
        read_at = client.get("/api/runs/live/overview").json()["version"]
        threading.Thread(target=commit_soon, daemon=True).start()
        first, second = versions_seen(client, "/events?run=live", 2)
        assert first == read_at and second != first
        assert client.get("/api/runs/live/overview").json()["version"] == second
        with client.stream("GET", "/events?run=live") as stream:
            assert next(stream.iter_lines()).startswith("retry: 200")


def test_events_refuse_runs_not_in_the_store_and_too_many_runs(client) -> None:
    missing = client.get("/events?run=fixture-train&run=nope")
    assert missing.status_code == 404 and missing.json()["error"].startswith("no run named 'nope'")
    many = client.get("/events?" + "&".join(f"run=r{i}" for i in range(101)))  # (a run named twice counts once)
    assert many.status_code == 400 and many.json()["error"] == "give at most 100 run parameters"


def test_a_bug_answers_one_line_not_a_traceback(dash_root) -> None:
    from fastapi.testclient import TestClient

    from dashboards.app import create_app
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig

    class Broken(Store):
        def query(self, *args, **kwargs):
            raise ZeroDivisionError("division by zero\nsecond line")

    app = create_app(Broken(dash_root / "store"), Tracking(None), DashboardConfig())
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        response = client.get("/api/runs/fixture-train/overview")
    assert response.status_code == 500
    assert response.json() == {"error": "the dashboard failed: ZeroDivisionError: division by zero"}


def test_an_mlflow_database_still_being_set_up_is_left_as_it_is(dash_root, tmp_path) -> None:
    """A training creates its SQLite file before MLflow's tables: the dashboard reads nothing from it
    and creates nothing in it (MLflow's client would create its tables and a default experiment)."""
    import sqlite3

    from dashboards.sources import Reads, Tracking

    path = tmp_path / "mlflow.db"
    sqlite3.connect(path).close()  # an empty database file
    before = path.read_bytes()
    tracking = Tracking(f"sqlite:///{path}")
    assert not tracking.available() and tracking.history("fixture-train", Reads()) == {}
    assert path.read_bytes() == before
    full = Tracking(f"sqlite:///{dash_root / 'mlflow.db'}")  # the fixture's: read, through a read-only connection
    assert full.available() and full.history("fixture-train", Reads())["sync_s"] == [(s, 0.25) for s in range(12)]


def test_at_most_so_many_runs_keep_a_connection_open(tmp_path) -> None:
    import pyarrow as pa

    from dashboards import sources
    from dashboards.sources import Reads, Store
    from storage.writer import StoreWriter

    writer = StoreWriter(tmp_path / "store", fsync=False)
    names = [f"run-{i:02d}" for i in range(sources.OPEN_CATALOGS + 2)]
    for name in names:
        writer.write_step("steps", name, 0, pa.Table.from_pylist([{"run": name, "step": 0, "step_s": 2.0}]))
    store = Store(tmp_path / "store")
    try:
        for name in names:
            assert store.query(name, "steps", "SELECT sum(step_s) AS s FROM steps", None, Reads()).to_pylist() == [{"s": 2.0}]
        assert list(store._catalogs) == names[-sources.OPEN_CATALOGS:]  # the least recently read closed
        assert store.query(names[0], "again", "SELECT count(*) AS n FROM steps", None, Reads()).to_pylist() == [{"n": 1}]
        assert list(store._catalogs)[-1] == names[0] and len(store._catalogs) == sources.OPEN_CATALOGS
    finally:
        store.close()


def test_cli_serves_on_the_address_it_prints_and_stops_on_ctrl_c(dash_root) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "dashboard", "--store", str(dash_root / "store"),
                             "--port", "0", "--run", "fixture-train"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert line.startswith("Libra dashboard on http://127.0.0.1:") and "/runs/fixture-train/overview" in line
        url = line.split()[3]
        with urllib.request.urlopen(url) as response:
            assert response.status == 200
        base = url.split("/runs/")[0]
        with urllib.request.urlopen(base + "/") as response:  # only the run asked for
            text = response.read().decode()
        assert "fixture-train" in text and "fixture-sim" not in text
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, 130), err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--run", "nope"], "--run nope: no such run in the store"),
    (["--port", "70000"], "dashboard.port: Input should be less than or equal to 65535"),
    (["--host", "no.such.host.invalid"], "cannot resolve host 'no.such.host.invalid'"),
])
def test_cli_refuses_bad_input_in_one_line(dash_root, args, message) -> None:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "dashboard", "--store", str(dash_root / "store"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("libra: error: ") and message in proc.stderr and proc.stderr.count("\n") == 1


def test_cli_refuses_a_port_in_use(dash_root) -> None:
    from dashboards.server import bind

    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "cli.main", "dashboard", "--store", str(dash_root / "store"),
                               "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_mlflow_histories_read_as_its_client_gives_them_and_nothing_created(dash_root, tmp_path, monkeypatch) -> None:
    """The SQLite file read directly gives what MLflow's client gives (the run not superseded, every
    logged value in step order, NaN kept), and reading leaves nothing in the working directory (MLflow's
    client makes folders for the file's path there)."""
    import math

    import mlflow

    from dashboards.sources import HISTORY_METRICS, Reads, Tracking

    path = tmp_path / "mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}")
    experiment = client.create_experiment("e")
    older = client.create_run(experiment, tags={"libra.run": "r"}).info.run_id
    client.log_metric(older, "reward", 9.0, step=0)
    newer = client.create_run(experiment, tags={"libra.run": "r"}).info.run_id
    for step, value in ((2, 0.5), (0, math.nan), (1, 0.25), (1, 0.125)):
        client.log_metric(newer, "reward", value, step=step)
    client.log_metric(newer, "heldout_reward", 0.3, step=4)
    client.log_metric(newer, "not_shown", 1.0, step=0)
    deleted = client.create_run(client.create_experiment("gone"), tags={"libra.run": "r"}).info.run_id
    client.log_metric(deleted, "reward", 7.0, step=0)
    client.delete_experiment(client.get_run(deleted).info.experiment_id)
    expected = {key: sorted((m.step, m.value) for m in client.get_metric_history(newer, key))
                for key in HISTORY_METRICS if client.get_metric_history(newer, key)}
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    got = Tracking(f"sqlite:///{path}").history("r", Reads())
    assert list(got) == ["heldout_reward", "reward"] and got["heldout_reward"] == [(4, 0.3)]
    assert [s for s, _ in got["reward"]] == [0, 1, 1, 2] and math.isnan(got["reward"][0][1])
    assert got["reward"][1:] == [(1, 0.125), (1, 0.25), (2, 0.5)] == expected["reward"][1:]
    assert Tracking(f"sqlite:///{path}").history("other", Reads()) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_change_streams_past_the_cap_are_answered_503_and_a_closed_one_frees_its_place(dash_root) -> None:
    """Each open page polls its runs every refresh_s on the server's loop: hundreds of streams (or
    a burst of requests, each checking its runs on the loop) stalled every page for seconds. Served
    for real (the test client does not keep a stream open as a browser does)."""
    from contextlib import ExitStack

    import httpx

    from dashboards.server import Background
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig

    running = Background(Store(dash_root / "store"), Tracking(None), DashboardConfig(port=0, refresh_s=0.2, max_streams=2))
    try:
        with httpx.Client(base_url=running.url, timeout=10) as client:
            with ExitStack() as open_pages:
                reading = []  # (a line iterator dropped closes its stream)
                for _ in range(2):
                    stream = open_pages.enter_context(client.stream("GET", "/events?run=fixture-train&run=fixture-train"))
                    reading.append(stream.iter_lines())
                    assert stream.status_code == 200 and next(reading[-1]).startswith("retry:")
                refused = client.get("/events?run=fixture-train")
                assert refused.status_code == 503 and refused.json()["error"] == (
                    "2 change streams are open, the most this dashboard serves (dashboard.max_streams); close a page "
                    "or try again later")
                assert client.get("/api/runs").status_code == 200  # the other pages are served
            deadline = time.monotonic() + 10
            while True:  # the server sees a page gone at its next poll
                with client.stream("GET", "/events?run=fixture-train") as stream:
                    if stream.status_code == 200:
                        break
                assert time.monotonic() < deadline, "a closed stream never freed its place"
                time.sleep(0.1)
    finally:
        running.stop()
