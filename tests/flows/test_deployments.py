"""Libra's flows as Prefect deployments: a real Prefect server (SQLite) and a process worker, the
training deployment registered by `libra deploy` and run with `prefect deployment run`, its flow run
killed mid-run (Prefect marks it crashed) and resumed by running the deployment again with the same
run name. Every step lands once in the store and in MLflow, as with `libra train`."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.test_train import mlflow_runs, store_steps, write_config
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    """`prefect server start` and `prefect worker start` in process groups of their own, with a home
    and an API address of the test's (the session's test harness is not theirs)."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        self.env |= {"PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{self.port}/api",
                     "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
        self.procs: list[subprocess.Popen] = []
        self.logs = home / "logs"
        self.logs.mkdir(parents=True)

    def spawn(self, name: str, *argv: str) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        import urllib.request

        self.spawn("server", str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError("the Prefect server did not answer: " + (self.logs / "server.log").read_text()[-2000:])

    def run(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the worker ignores SIGTERM once its server is gone: SIGKILL
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path):
    server = PrefectServer(tmp_path / "prefect-server")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def flow_run_pids(flow_run_id: str) -> list[int]:
    """The processes running flow run `flow_run_id` (a worker's flow-run process carries its id)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode() in environ:
            found.append(int(entry.name))
    return found


def flow_run_state(server: PrefectServer, flow_run_id: str) -> str:
    out = server.run(str(BIN / "prefect"), "flow-run", "inspect", flow_run_id, "--output", "json", timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)["state"]["type"]


@pytest.mark.slow
def test_training_deployment_runs_crashes_and_resumes(server: PrefectServer, policy_dir, tmp_path: Path):  # noqa: F811
    config = write_config(tmp_path, policy_dir, "deployed")
    deployed = server.run(sys.executable, "-m", "cli.main", "deploy", "--only", "libra-train/demo", "--pool", "test-pool",
                          "--json")
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    assert json.loads(deployed.stdout)["deployments"] == ["libra-train/demo"]
    server.spawn("worker", str(BIN / "prefect"), "worker", "start", "--pool", "test-pool")

    params = ["--param", f"config={config}", "--param", f"steps={STEPS}", "--param", "run=deployed"]
    started = server.run(str(BIN / "prefect"), "deployment", "run", "libra-train/demo", *params)
    assert started.returncode == 0, started.stderr[-2000:]
    first = next(line.split()[-1] for line in started.stdout.splitlines() if "UUID" in line)
    latest = tmp_path / "checkpoints" / "deployed" / "LATEST"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (latest.exists() and latest.read_text().strip() == "step-000001"):
        time.sleep(0.05)
    pids = flow_run_pids(first)
    assert pids, "the flow run's process is not running"
    for pid in pids:  # the host's view of a crash: the flow run's process is gone, mid-run
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while (state := flow_run_state(server, first)) not in ("CRASHED", "FAILED") and time.monotonic() < deadline:
        time.sleep(1)
    assert state == "CRASHED"

    resumed = server.run(str(BIN / "prefect"), "deployment", "run", "libra-train/demo", *params, "--watch",
                         "--watch-timeout", "600", timeout=700)
    assert resumed.returncode == 0 and "Completed" in resumed.stdout, resumed.stdout[-3000:] + resumed.stderr[-2000:]

    assert store_steps(tmp_path, "deployed") == [{"step": s, "n": 8, "ids": 8, "v": max(0, s - 1)} for s in range(STEPS)]
    runs, client = mlflow_runs(tmp_path, "deployed")
    assert len(runs) == 1  # the resumed flow run continued the crashed one's MLflow run
    run_id = runs[0].info.run_id
    for metric in ("reward", "loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, metric)) == list(range(STEPS))
    assert client.get_run(run_id).data.tags["libra.checkpoint"].endswith(f"step-{STEPS:06d}")
    assert runs[0].info.status == "FINISHED"
