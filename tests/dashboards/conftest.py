"""A store with one run of each kind the dashboard shows, and an MLflow database beside it:

- `fixture-train`: a placed, routed training's rows (`tests.builders.write_placed_run`), with its
  held-out reward and weight-sync seconds in MLflow;
- `fixture-sim`: a simulation of two policies, by the simulator itself;
- `fixture-traces`: imported traces (turns without routing or times, no steps).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import trace_rows, write_placed_run, write_simulated_run, write_trace

HELDOUT = {0: 0.125, 6: 0.25, 12: 0.3125}
SYNC_S = 0.25


def write_mlflow(uri: str, run: str) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("libra-train-math")
    client.create_run(experiment, run_name=run, tags={"libra.run": run, "libra.superseded": "true"})  # an older try
    run_id = client.create_run(experiment, run_name=run, tags={"libra.run": run}).info.run_id
    for version, reward in HELDOUT.items():
        client.log_metric(run_id, "heldout_reward", reward, step=version)
    for step in range(12):
        client.log_metric(run_id, "sync_s", SYNC_S, step=step)


@pytest.fixture(scope="session")
def dash_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from libra.config import StoreConfig
    from storage.ingest import import_trace

    root = tmp_path_factory.mktemp("dashboard")
    store = root / "store"
    write_placed_run(store, "fixture-train")
    write_simulated_run(store, "fixture-sim", steps=8)
    rows = trace_rows("p0", "0", 100, [(50, "search", 300, "ok"), (40, "search", 200, "error"), (30, "none", 0, "")])
    rows += trace_rows("p1", "0", 120, [(60, "python", 100, "ok"), (20, "none", 0, "")], reward=0.0)
    import_trace(write_trace(root / "t.csv", rows), "fixture-traces", StoreConfig(root=str(store), fsync=False), 1)
    write_mlflow(f"sqlite:///{root / 'mlflow.db'}", "fixture-train")
    return root


@pytest.fixture(scope="session")
def client(dash_root: Path):
    from fastapi.testclient import TestClient

    from dashboards.app import create_app
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig

    store = Store(dash_root / "store")
    app = create_app(store, Tracking(f"sqlite:///{dash_root / 'mlflow.db'}"), DashboardConfig())
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c
    store.close()


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def browser():
    """Debian's chromium, headless, driven by Playwright (the set-up installs it; without it, skipped)."""
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: install Debian's chromium (apt-get install chromium), as `make setup` does")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                           "--no-first-run", "--disable-background-networking", "--disable-sync"])
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def served(dash_root: Path):
    """The fixture store's dashboard, served over HTTP from a thread."""
    from dashboards.server import Background
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig

    running = Background(Store(dash_root / "store"), Tracking(f"sqlite:///{dash_root / 'mlflow.db'}"),
                         DashboardConfig(port=0, refresh_s=0.5))
    yield running.url
    running.stop()


class Tab:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, url: str, renders: int = 1) -> None:
        self.page.goto(url)
        self.wait_renders(renders)

    def wait_renders(self, renders: int, timeout_s: float = 30) -> None:
        self.page.wait_for_function(f"window.libraDashboard && window.libraDashboard.renders >= {renders}",
                                    timeout=timeout_s * 1000)

    def close(self) -> None:
        self.page.close()
