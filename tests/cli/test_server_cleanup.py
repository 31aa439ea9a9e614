"""A process killed with SIGKILL after starting Prefect's temporary server leaves no server behind:
the server's watcher stops it once its starter is gone."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STARTER = """
import os, sys, time
from flows.runtime import prepare_runtime, start_prefect
from libra.config import LibraConfig
prepare_runtime(LibraConfig(), tracking=False)
start_prefect()
from prefect.server.api.server import SubprocessASGIServer
print(SubprocessASGIServer().server_process.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_killed_starter_leaves_no_prefect_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    starter = subprocess.Popen([sys.executable, "-c", STARTER], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    server = None
    try:
        server = int(starter.stdout.readline())
        assert alive(server)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 30
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server)
    finally:
        starter.kill()
        if server is not None and alive(server):
            os.kill(server, signal.SIGKILL)
