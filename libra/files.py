"""File-system helpers: durability shared by the store and the trainer's checkpoints, and where a
relative SQLite tracking database lies."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes its new entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def absolute_tracking_uri(uri: str, create: bool = True) -> str:
    """`sqlite:///relative.db` -> `sqlite:////abs/relative.db` (MLflow needs an absolute path); with
    `create`, the database's directory is created."""
    prefix = "sqlite:///"
    if uri.startswith(prefix):
        path = Path(uri[len(prefix):]).resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri
