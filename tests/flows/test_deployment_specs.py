"""The deployments `libra deploy` registers name real flows, by their Prefect names, with default
parameters those flows take; without a Prefect server, `libra deploy` is one line saying so."""

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

from flows.deployments import DEPLOYMENTS

ROOT = Path(__file__).resolve().parents[2]


def test_every_deployment_names_its_flow_and_parameters_it_takes() -> None:
    assert {spec.flow_name for spec in DEPLOYMENTS} >= {"libra-train", "libra-plan", "libra-simulate",
                                                          "libra-trace-analysis"}
    for spec in DEPLOYMENTS:
        path, function = spec.entrypoint.split(":")
        assert (ROOT / path).is_file(), spec
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), function)
        assert flow.name == spec.flow_name
        assert set(spec.parameters) <= set(inspect.signature(flow.fn).parameters), spec
        for value in spec.parameters.values():  # files named are the checkout's own
            if isinstance(value, str) and value.endswith((".yaml", ".csv")):
                assert (ROOT / value).is_file(), value


def test_deploy_without_a_server_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "cli.main", "deploy"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("libra: error: deployments live on a Prefect server: start one (`prefect server start --host "
                          "127.0.0.1`) and set PREFECT_API_URL=http://127.0.0.1:4200/api\n")
