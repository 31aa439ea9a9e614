"""What the CLI's bad-input tests share (their working directory of inputs is the `files` fixture,
in conftest.py): the check that nothing was written, and the real command in a fresh process."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TAU = ROOT / "data" / "traces" / "taubench_airline.csv"


def nothing_written(where: Path) -> None:
    assert not (where / ".libra").exists()
    assert not (where / "store").exists()
    assert sorted(p.name for p in where.iterdir() if p.name.endswith(".db")) == []


def libra(*argv: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """The real command in a fresh process."""
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
