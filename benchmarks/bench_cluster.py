"""Orchestration beyond one machine, measured: a training run on one host against the same run on
three hosts, and Prefect's cost per iteration with a server against without one.

    python -m benchmarks.bench_cluster [--steps 4] [--iterations 30]    # needs root and iproute2

**One host against three.** The same short training (the shipped policy on the math tasks, 2 prompts
x 4 samples, the transformers engine, `placement.strategy: static`) on a Ray cluster of one host (the
head, with 4 CPUs for workers) and on a Ray cluster of three (a head without workers and two worker
hosts of 2 CPUs), each host its own network namespace on this machine (`tests/hosts.py`). Both runs
have 4 workers of one core, split 2 rollout + 2 train: on one host every engine, trainer rank and
all-reduce stays on the host; on three, the two trainer ranks all-reduce over gloo between hosts
and the engines answer across the bridge. The machine is the same, so the ratio is the cost of
spreading the run over hosts (the network hops, Ray's cross-node placement), not a speed-up.
Figures: seconds per iteration (the store's `step_s`, from the second iteration on: the first
includes the engines' start), three hosts / one host; and the runs' whole wall times.

**Prefect per iteration.** The training flow's orchestration with no work in it: per iteration the
three tasks `libra-train` runs before an iteration (follow-hosts, planning-due, iteration-setup), the
`rl-iteration` subflow with the next batch's rollout and reward submitted beside the update, then
sync, checkpoint and record; every task returns at once. Timed three ways, each in a fresh process:
the same calls without Prefect, the flow on Prefect's temporary server (what `libra train` uses when
no server is named) and the flow on a Prefect server (`prefect server start`, SQLite), as a
deployment run's flow reports to. Figures: milliseconds of Prefect per iteration (flow time less the
plain calls'), with a server and without, and their ratio; and Prefect's share of an iteration's
wall time on three hosts (the store's step_s is timed inside the iteration's flow, so the iteration
lasts step_s plus Prefect's time around it).

The figures go to benchmarks/out/cluster.json and the README's performance section.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import run_locations, save

ROOT = Path(__file__).resolve().parents[1]


# -- one host against three -------------------------------------------------------------------------

def training_config(base: Path, policy: Path, address: str, steps: int) -> Path:
    import yaml

    config = {**run_locations(base),
              "rollout": {"engine": "hf", "max_turns": 3, "max_tokens_per_turn": 40, "max_context": 512},
              "trainer": {"policy": str(policy), "run": "bench", "steps": steps, "prompts_per_step": 2,
                          "samples_per_prompt": 4, "eval_prompts": 2, "eval_every": 1000,
                          "checkpoint_dir": str(base / "checkpoints"), "lr": 1e-4},
              "placement": {"strategy": "static"},
              "cluster": {"ray_address": address, "start_timeout_s": 120}}
    path = base / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train_on(hosts: Any, base: Path, policy: Path, steps: int) -> dict[str, Any]:
    """A training run on `hosts` (started on the head's host); its per-iteration seconds."""
    from storage.catalog import Catalog

    config = training_config(base, policy, hosts.ray_address, steps)
    began = time.perf_counter()
    proc = hosts.run_on(hosts.head, [sys.executable, "-m", "cli.main", "train", "--config", str(config), "--json"],
                        cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
    out, err = proc.communicate(timeout=1800)
    wall_s = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"the run on {len(hosts.hosts)} host(s) failed: {err[-3000:]}")
    with Catalog(base / "store", "bench") as catalog:
        rows = catalog.query("SELECT step, step_s, rollout_s, train_s, train_gpus, rollout_gpus FROM steps "
                             "ORDER BY step").to_pylist()
    if [r["step"] for r in rows] != list(range(steps)):
        raise RuntimeError(f"the run recorded steps {[r['step'] for r in rows]}, not 0..{steps - 1}")
    split = {(r["train_gpus"], r["rollout_gpus"]) for r in rows}
    return {"wall_s": wall_s, "step_s": [r["step_s"] for r in rows], "rollout_s": [r["rollout_s"] for r in rows],
            "train_s": [r["train_s"] for r in rows], "split": sorted(split),
            "iteration_s": statistics.fmean(r["step_s"] for r in rows[1:])}


def hosts_comparison(steps: int) -> dict[str, Any]:
    from tests.hosts import NetnsHosts, available

    why = available()
    if why:
        raise SystemExit(f"bench_cluster needs test hosts: {why}")
    policy = ROOT / "data" / "policy"  # the shipped policy (a path every host's processes can read)
    layouts = {"one_host": {"workers": 0, "cpus": 0, "head_cpus": 4}, "three_hosts": {"workers": 2, "cpus": 2}}
    runs = {}
    for name, layout in layouts.items():
        with tempfile.TemporaryDirectory(prefix=f"libra-bench-{name}-") as tmp, NetnsHosts(**layout) as hosts:
            runs[name] = {"hosts": len(hosts.hosts), **train_on(hosts, Path(tmp), policy, steps)}
        r = runs[name]
        print(f"{name}: {steps} steps in {r['wall_s']:.0f} s, {r['iteration_s']:.1f} s an iteration "
              f"(split train/rollout {r['split']})", flush=True)
    one, three = runs["one_host"], runs["three_hosts"]
    if one["split"] != three["split"]:
        raise RuntimeError(f"the runs were split differently ({one['split']} against {three['split']}): not the same run")
    return {"runs": runs, "iteration_ratio": three["iteration_s"] / one["iteration_s"],
            "wall_ratio": three["wall_s"] / one["wall_s"]}


# -- Prefect per iteration --------------------------------------------------------------------------

def _noop(*args: Any, **kwargs: Any) -> int:
    return 0


BEFORE = ("follow-hosts", "planning-due", "iteration-setup")  # libra-train's tasks before each iteration
AFTER = ("sync-weights", "checkpoint", "record")  # rl-iteration's after its update


def plain_iterations(iterations: int) -> float:
    """The calls of `iterations` iterations without Prefect; seconds."""
    began = time.perf_counter()
    for step in range(iterations):
        for _ in BEFORE:
            _noop(step)
        for _ in ("rollout", "reward", "update", *AFTER):
            _noop(step)
    return time.perf_counter() - began


def flow_iterations(iterations: int) -> float:
    """The same calls as Prefect tasks in the training flow's shape; seconds of the flow run."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    tasks = {name: task(_noop, name=name, cache_policy=NO_CACHE)
             for name in (*BEFORE, "rollout", "reward", "update", *AFTER)}

    @flow(name="rl-iteration")
    def iteration(step: int) -> int:
        rolling = tasks["rollout"].submit(step + 1)
        scored = tasks["reward"].submit(step + 1, wait_for=[rolling])
        tasks["update"](step)
        rolling.result()
        scored.result()
        for name in AFTER:
            tasks[name](step)
        return step

    @flow(name="libra-train")
    def train(steps: int) -> int:
        for step in range(steps):
            for name in BEFORE:
                tasks[name](step)
            iteration(step)
        return steps

    train(1)  # not measured: the first flow run's set-up (the server's first answers, imports)
    began = time.perf_counter()
    train(iterations)
    return time.perf_counter() - began


def measure_child(kind: str, iterations: int) -> None:
    """In a fresh process: `kind` is plain, temporary or server; prints seconds."""
    if kind == "plain":
        print(json.dumps({"seconds": plain_iterations(iterations)}))
        return
    from flows.runtime import start_prefect

    start_prefect()  # the temporary server, unless PREFECT_API_URL names one
    print(json.dumps({"seconds": flow_iterations(iterations)}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_child(kind: str, iterations: int, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_cluster", "--child", kind,
                          "--iterations", str(iterations)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the {kind} measurement failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def prefect_overhead(iterations: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="libra-bench-prefect-") as tmp:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        base |= {"PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
        temporary = base | {"PREFECT_HOME": str(Path(tmp) / "temporary")}
        served = base | {"PREFECT_HOME": str(Path(tmp) / "server")}
        port = free_port()
        server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=served, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}/api"
            wait_for_server(url, server)
            seconds = {"plain": run_child("plain", iterations, base),
                       "temporary": run_child("temporary", iterations, temporary),
                       "server": run_child("server", iterations, served | {"PREFECT_API_URL": url})}
        finally:
            server.terminate()
            server.wait(30)
    per = {k: (v - seconds["plain"]) / iterations * 1000 for k, v in seconds.items() if k != "plain"}
    print(f"Prefect per iteration: {per['temporary']:.0f} ms on the temporary server, {per['server']:.0f} ms on a "
          f"server ({iterations} iterations)", flush=True)
    return {"iterations": iterations, "seconds": seconds, "temporary_ms": per["temporary"], "server_ms": per["server"],
            "server_ratio": per["server"] / per["temporary"]}


def wait_for_server(url: str, server: subprocess.Popen, timeout_s: float = 180) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"prefect server start exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the Prefect server at {url} did not answer within {timeout_s:.0f} s")


def prefect_share(prefect: dict[str, Any], iteration_s: float) -> dict[str, float]:
    """Prefect's share of an iteration's wall time: the store's step_s is the iteration's work, timed
    inside its flow, so the iteration lasts step_s plus what Prefect costs around it."""
    return {k: prefect[f"{k}_ms"] / 1000 / (iteration_s + prefect[f"{k}_ms"] / 1000) for k in ("temporary", "server")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="training iterations per run (default 4)")
    parser.add_argument("--iterations", type=int, default=30, help="iterations of the Prefect measurement (default 30)")
    parser.add_argument("--child", choices=("plain", "temporary", "server"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        measure_child(args.child, args.iterations)
        return 0
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first iteration includes the engines' start)")
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    began = time.perf_counter()
    prefect = prefect_overhead(args.iterations)
    hosts = hosts_comparison(args.steps)
    share = prefect_share(prefect, hosts["runs"]["three_hosts"]["iteration_s"])
    result = {"steps": args.steps, "hosts": hosts, "prefect": prefect, "prefect_share": share,
              "bench_s": time.perf_counter() - began}
    print(f"three hosts / one host: {hosts['iteration_ratio']:.2f} per iteration, {hosts['wall_ratio']:.2f} whole run; "
          f"Prefect with a server / without: {prefect['server_ratio']:.2f} ({share['server']:.0%} of an iteration's "
          f"wall time on three hosts)", flush=True)
    print(f"saved {save('cluster', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
