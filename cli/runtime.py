"""Process environment for Prefect and MLflow on embedded defaults: local files, no server, no telemetry.

Called once by CLI commands that run flows, before Prefect or MLflow is imported. Values already set
in the environment win, so a user pointing at a Prefect server or MLflow server keeps them.
"""

from __future__ import annotations

import os
from pathlib import Path

from libra.config import LibraConfig


def prepare_runtime(config: LibraConfig) -> None:
    prefect_home = Path(config.orchestration.prefect_home).resolve()
    prefect_home.mkdir(parents=True, exist_ok=True)
    defaults = {
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_TRACKING_URI": absolute_tracking_uri(config.tracking.tracking_uri),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def absolute_tracking_uri(uri: str) -> str:
    """`sqlite:///relative.db` -> `sqlite:////abs/relative.db` (MLflow needs an absolute path); the
    database's directory is created."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix):]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri
