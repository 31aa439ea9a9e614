"""Dashboard benchmark: how long every page takes to open in a browser on two large stores.

- a 200-step simulation on a 48-GPU cluster (6x8 A800, search-r1, Qwen3-14B; `libra simulate`,
  five simulated systems): the overview, pools and comparison pages;
- a store of 10,000,000 routed turn rows (100 steps of synthetic turns with instances, buckets,
  migrations and latencies, their trajectories, a steps row per step and 8 hybrids' join and leave
  events each step): every run page.

The dashboard runs as `libra dashboard` serves it (uvicorn, one process) and headless Chromium opens
each page: the time is from the navigation to every chart drawn. Each page is opened `--repeats`
times; the first open after the server started (its catalogs cold) is reported beside the median.
The server's own query times for the page are printed beside it. Goal: every page under 3 s.

    python -m benchmarks.bench_dashboard [--rows 10000000] [--sim-steps 200] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import save

GOAL_S = 3.0
SIM_RUN, BIG_RUN = "sim-48gpu", "turns-10m"
SIM_SYSTEMS = "libra,verl-colocated,areal-static-optimal,greedy-heuristic,oracle"
CHROMIUM = "/usr/bin/chromium"


def build_sim(root: Path, steps: int) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.main", "simulate", "--workload", "search-r1", "--cluster", "6x8:a800",
                    "--steps", str(steps), "--systems", SIM_SYSTEMS, "--no-track", "--store", str(root),
                    "--run", SIM_RUN, "--json"], check=True, stdout=subprocess.DEVNULL,
                   cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - began


def build_big(root: Path, rows: int, steps: int) -> float:
    """`rows` routed turns over `steps` steps, committed a step at a time as a training commits them."""
    from storage.synthetic import synthetic_turns, trajectories_of
    from storage.writer import StoreWriter

    began = time.perf_counter()
    writer = StoreWriter(root, fsync=False)
    per_step = rows // steps
    for step in range(steps):
        turns = synthetic_turns(BIG_RUN, step, per_step, routed=8)
        trajectories = trajectories_of(turns)
        n = trajectories.num_rows
        gen = pc.sum(trajectories.column("gen_tokens")).as_py()
        row = {"run": BIG_RUN, "step": step, "policy": "libra", "start_s": 600.0 * step, "rollout_s": 420.0,
               "train_s": 300.0, "step_s": 600.0, "trajectories": n, "gen_tokens": gen, "trained_tokens": gen,
               "train_gpus": 16, "rollout_gpus": 24, "hybrid_gpus": 8}
        with writer.transaction(BIG_RUN, mode="replace" if step == 0 else "update", origin="train") as tx:
            tx.write_step("turns", step, turns)
            tx.write_step("trajectories", step, trajectories)
            tx.write_step("steps", step, pa.Table.from_pylist([row]))
            tx.write_step("pool_events", step, pa.Table.from_pylist(hybrid_events(step, 600.0 * step)))
    return time.perf_counter() - began


def hybrid_events(step: int, start_s: float, hybrids: int = 8) -> list[dict]:
    """Each hybrid's lifecycle in one step: it leaves the rollout's tail, joins, trains and is
    released; every seventh join is rolled back."""
    rows = []
    for h in range(hybrids):
        t = start_s + 300.0 + 10.0 * h
        moves = [("rollout", "joining", "join_requested"), ("joining", "rollout", "rolled_back")] if (step + h) % 7 == 0 else \
            [("rollout", "joining", "join_requested"), ("joining", "training", "activated"),
             ("training", "leaving", "leave_requested"), ("leaving", "rollout", "released")]
        for i, (a, b, event) in enumerate(moves):
            rows.append({"run": BIG_RUN, "step": step, "time_s": t + [0.0, 12.0, 250.0, 254.0][i], "worker_id": f"hybrid-{h}",
                         "gpus": 1, "from_state": a, "to_state": b, "event": event, "detail": ""})
    return rows


def open_page(page, url: str) -> float:
    """Seconds from navigating to `url` to every chart drawn (errors on the page raise)."""
    began = time.perf_counter()
    page.goto(url)
    page.wait_for_function("window.libraDashboard && window.libraDashboard.renders >= 1", timeout=60_000)
    seconds = time.perf_counter() - began
    errors = page.evaluate("window.libraDashboard.errors")
    if errors:
        raise RuntimeError(f"{url}: {errors}")
    return seconds


def api_reads(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}/api{path}") as response:
        body = json.loads(response.read())
    return {"built_ms": body["built_ms"], "reads": body["reads"], "charts": sum(1 for c in body["charts"] if c["figure"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="turn rows of the large store (default 10,000,000)")
    parser.add_argument("--steps", type=int, default=100, help="steps the rows are spread over (default 100)")
    parser.add_argument("--sim-steps", type=int, default=200, help="steps of the 48-GPU simulation (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="opens of each page (default 3)")
    parser.add_argument("--dir", help="scratch directory, kept and reused when it holds the stores already")
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/out/dashboard.json")
    args = parser.parse_args(argv)
    if args.rows < args.steps or args.steps < 1 or args.repeats < 1:
        parser.error("--rows must be >= --steps >= 1 and --repeats >= 1")
    if not Path(CHROMIUM).exists():
        parser.error(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    from dashboards.server import Background
    from dashboards.sources import Store, Tracking
    from libra.config import DashboardConfig
    from storage.manifest import read_manifest

    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="libra-bench-dash-"))
    root = scratch / "store"
    built = {}
    if read_manifest(root, SIM_RUN) is None:
        built["simulation_s"] = build_sim(root, args.sim_steps)
    if read_manifest(root, BIG_RUN) is None:
        built["large_store_s"] = build_big(root, args.rows, args.steps)
    for name, seconds in built.items():
        print(f"built {name.removesuffix('_s')} in {seconds:.1f} s")
    pages = [(SIM_RUN, f"/runs/{SIM_RUN}/overview"), (SIM_RUN, f"/runs/{SIM_RUN}/overview?policy=verl-colocated"),
             (SIM_RUN, f"/runs/{SIM_RUN}/pools"), (SIM_RUN, "/compare")]
    pages += [(BIG_RUN, f"/runs/{BIG_RUN}/{page}") for page in ("overview", "trajectories", "scheduling", "pools")]
    running = Background(Store(root), Tracking(None), DashboardConfig(port=0))
    base = running.url
    results = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            for store, path in pages:
                opens = [open_page(page, base + path) for _ in range(args.repeats)]
                reads = api_reads(base, path)
                median = statistics.median(opens)
                results.append({"store": store, "page": path, "first_s": opens[0], "median_s": median,
                                "max_s": max(opens), "charts": reads["charts"], "built_ms": reads["built_ms"],
                                "reads": reads["reads"]})
                slow = ", ".join(f"{r['name']} {r['ms']:.0f} ms" for r in sorted(reads["reads"], key=lambda r: -r["ms"])[:3])
                print(f"{path:<48} first {opens[0]:.2f} s, median {median:.2f} s ({reads['charts']} charts; "
                      f"server {reads['built_ms']:.0f} ms: {slow})")
            browser.close()
            if console:
                raise RuntimeError(f"console errors: {console}")
    finally:
        running.stop()
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    worst = max(r["max_s"] for r in results)
    print(f"slowest open {worst:.2f} s: {worst / GOAL_S:.2f} of the {GOAL_S:.0f} s goal "
          f"({'met' if worst < GOAL_S else 'missed'})")
    if not args.no_save:
        save("dashboard", {"rows": args.rows, "steps": args.steps, "sim_steps": args.sim_steps,
                           "sim_policies": SIM_SYSTEMS, "repeats": args.repeats, "goal_s": GOAL_S,
                           "pages": results, "slowest_s": worst, **built})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
