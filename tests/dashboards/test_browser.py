"""Every page in headless Chromium: its charts drawn, no console errors, a screenshot each.

Screenshots go to $LIBRA_SCREENSHOTS when it is set (the README's come from there), else to the
test's temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.dashboards.conftest import Tab

PAGES = [("fixture-train", "overview"), ("fixture-train", "trajectories"), ("fixture-train", "scheduling"),
         ("fixture-train", "pools"), ("fixture-sim", "overview"), ("fixture-traces", "trajectories"), (None, "compare")]


def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("LIBRA_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.parametrize("run, name", PAGES)
def test_page_draws_its_charts_without_console_errors(browser, served, client, tmp_path, run, name) -> None:
    path = "/compare" if run is None else f"/runs/{run}/{name}"
    expected = client.get(f"/api{path}").json()
    drawn = [c["key"] for c in expected["charts"] if c["figure"]]
    assert drawn, f"{path}: the fixture should give this page charts to draw"
    tab = Tab(browser)
    try:
        tab.open(served + path)
        for key in drawn:  # each chart is a Plotly plot with its traces in an SVG
            traces = tab.page.evaluate(f"document.getElementById('plot-{key}').data.length")
            assert traces == len(next(c for c in expected["charts"] if c["key"] == key)["figure"]["data"])
            assert tab.page.locator(f"#plot-{key} .main-svg").count() >= 1
        for c in expected["charts"]:
            if not c["figure"]:
                assert tab.page.inner_text(f"#plot-{c['key']}") == c["empty"]
        assert tab.page.inner_text("#title") == expected["title"]
        tab.page.screenshot(path=str(shots(tmp_path) / f"{run or 'compare'}-{name}.png"), full_page=True)
        assert tab.errors == []
    finally:
        tab.close()


def test_controls_change_the_page_in_place(browser, served) -> None:
    tab = Tab(browser)
    try:
        tab.open(served + "/runs/fixture-sim/overview")
        tab.page.evaluate("window.sameDocument = true")
        tab.page.select_option("select[name=policy]", "verl-colocated")
        tab.wait_renders(2)
        assert tab.page.inner_text("#title") == "fixture-sim: overview (verl-colocated)"
        assert tab.page.url.endswith("?policy=verl-colocated")
        tab.page.click("text=Trajectories")  # a link: a new document
        tab.wait_renders(1)
        tab.page.go_back()
        tab.wait_renders(1)
        tab.page.goto(served + "/runs/fixture-train/trajectories")
        tab.wait_renders(1)
        tab.page.evaluate("window.sameDocument = true")
        link = tab.page.locator("#table-longest a").nth(2)
        chosen = link.inner_text()
        link.click()
        tab.wait_renders(2)
        assert chosen in tab.page.inner_text("#chart-timeline h2")
        assert tab.page.evaluate("window.sameDocument") is True  # no reload
        assert tab.errors == []
    finally:
        tab.close()


def test_missing_run_page_in_the_browser(browser, served) -> None:
    tab = Tab(browser)
    try:
        response = tab.page.goto(served + "/runs/not-there/overview")
        assert response.status == 404
        assert "no run named 'not-there'" in tab.page.inner_text("#problem")
        assert [e for e in tab.errors if "404" not in e] == []  # the browser logs the 404 status itself
    finally:
        tab.close()
