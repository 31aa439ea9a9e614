"""Live: while `libra train` runs (the transformers engine, the shipped policy, 4 short iterations),
the open overview gains points as steps commit, without a reload."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.dashboards.conftest import Tab
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def points(tab: Tab) -> int:
    return tab.page.evaluate("(() => { const p = document.getElementById('plot-throughput');"
                             " return p && p.data ? p.data[0].x.length : 0; })()")


def test_overview_gains_points_while_a_training_runs(browser, policy_dir, tmp_path) -> None:  # noqa: F811
    from benchmarks.common import run_locations
    from dashboards.server import Background
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig

    config = run_locations(tmp_path) | {
        "rollout": {"engine": "hf", "max_turns": 2, "max_tokens_per_turn": 24, "max_context": 384},
        "trainer": {"policy": str(policy_dir), "run": "live", "steps": STEPS, "prompts_per_step": 2,
                    "samples_per_prompt": 2, "eval_prompts": 2, "eval_every": 100,
                    "checkpoint_dir": str(tmp_path / "checkpoints")},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    train = subprocess.Popen([sys.executable, "-m", "cli.main", "train", "--config", str(path), "--json"], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    running = Background(Store(tmp_path / "store"), Tracking(config["tracking"]["tracking_uri"]),
                         DashboardConfig(port=0, refresh_s=0.5))
    tab = Tab(browser)
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "store" / "_runs" / "live.manifest").exists():  # the first step committed
            assert train.poll() is None, train.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no step committed in 10 minutes"
            time.sleep(0.5)
        tab.open(running.url + "/runs/live/overview")
        tab.page.evaluate("window.sameDocument = true")
        seen = [points(tab)]
        while train.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if points(tab) != seen[-1]:
                seen.append(points(tab))
        out, err = train.communicate(timeout=60)
        assert train.returncode == 0, err[-3000:]
        end = time.monotonic() + 10
        while points(tab) < STEPS and time.monotonic() < end:  # the last step's notice
            time.sleep(0.2)
        seen.append(points(tab))
        assert seen[0] < STEPS and seen[-1] == STEPS, seen
        assert sorted(set(seen)) == list(dict.fromkeys(seen)), seen  # only ever more points
        assert tab.page.evaluate("window.sameDocument") is True  # redrawn in place, never reloaded
        assert tab.page.evaluate("window.libraDashboard.renders") >= 2
        assert tab.errors == []
    finally:
        if train.poll() is None:
            train.kill()
            train.communicate()
        tab.close()
        running.stop()
