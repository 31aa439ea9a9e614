import os
import sys
from collections.abc import Iterator

import pytest

# Prefect and MLflow must not phone home or write outside the test's folders.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_left_as_found() -> Iterator[None]:
    """A test that points MLflow's process-wide tracking URI somewhere (`mlflow.set_tracking_uri`)
    must not send a later test's runs there: a simulation's run once went to another test's
    database, and its own test found no such run."""
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(None)
