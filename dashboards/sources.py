"""What the dashboard reads, and nothing it could write with.

    Store(root, runs)        the store's committed runs; one read-only DuckDB catalog per run
    Tracking(uri)            a training run's metric histories from MLflow, read-only
    Reads                    the queries one page ran, with their times (shown on the page)

The store is read through `storage.catalog.Catalog`, whose connection can only read the files a
run's manifest lists: the dashboard cannot change the store whatever it asks. MLflow's SQLite
file is read with `sqlite3`, read-only, and not opened while it does not exist (opening it would
create it); a tracking server is read through MLflow's client. A run's *version* changes whenever a commit changes its manifest or MLflow's database file
changes: an open page redraws when it does.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from libra.clock import Stopwatch
from libra.errors import LibraError
from storage.catalog import Catalog
from storage.manifest import committed_runs, manifests_signature, read_manifest
from storage.schemas import POOL_EVENTS, STEPS, TRAJECTORIES, TURNS


class MissingRun(LibraError):
    """A run the store does not have (or that the dashboard was not asked to show)."""


@dataclass(frozen=True)
class RunInfo:
    """One committed run, from its manifest alone (no query)."""

    name: str
    origin: str  # what wrote it: train, a trace import, a simulation, ...
    committed_at: float  # Unix time of its last commit
    steps: int  # steps with a `steps` row (0 for imported traces)
    trajectories: int
    turns: int
    pool_events: int

    @property
    def kind(self) -> str:
        if self.origin == "train":
            return "training"
        if self.trajectories == 0 and self.steps > 0:
            return "simulation"
        return "traces" if self.steps == 0 else "run"


@dataclass(frozen=True)
class QueryTime:
    name: str
    ms: float
    rows: int


@dataclass
class Reads:
    """The queries a page ran: name, milliseconds, rows out."""

    times: list[QueryTime] = field(default_factory=list)

    def add(self, name: str, seconds: float, rows: int) -> None:
        self.times.append(QueryTime(name, round(seconds * 1000, 1), rows))


OPEN_CATALOGS = 16  # runs whose DuckDB connection stays open between page views


class Store:
    """The store's committed runs (only `runs` when given), each read through a locked catalog."""

    def __init__(self, root: str | Path, runs: Sequence[str] = (), threads: int = 2) -> None:
        self.root = Path(root)
        self.pinned = tuple(runs)
        self.threads = threads
        self._catalogs: OrderedDict[str, tuple[Catalog, threading.Lock]] = OrderedDict()
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        found = committed_runs(self.root)
        return [r for r in found if r in self.pinned] if self.pinned else found

    def info(self, run: str) -> RunInfo:
        if self.pinned and run not in self.pinned:
            raise MissingRun(f"run {run!r} is not one of the runs this dashboard shows ({', '.join(self.pinned)})")
        manifest = read_manifest(self.root, run) if _plain_name(run) else None
        if manifest is None:
            known = self.names()
            hint = f"runs in the store: {', '.join(known)}" if known else \
                "the store has no runs yet: train (`libra train`), simulate (`libra simulate`) or import traces first"
            raise MissingRun(f"no run named {run!r} in the store {self.root}; {hint}")
        return RunInfo(run, manifest.origin, manifest.committed_at, len(manifest.steps(STEPS)),
                       manifest.rows(TRAJECTORIES), manifest.rows(TURNS), manifest.rows(POOL_EVENTS))

    def runs(self) -> list[RunInfo]:
        out = []
        for name in self.names():
            try:
                out.append(self.info(name))
            except LibraError:  # removed since it was listed, or its manifest unreadable (the run's page says why)
                continue
        return out

    def version(self, run: str) -> tuple:
        """What a commit to `run` changes; () for a name no run can have."""
        return manifests_signature(self.root, run) if _plain_name(run) else ()

    def query(self, run: str, name: str, sql: str, params: dict[str, Any] | None, reads: Reads) -> pa.Table:
        """One SELECT over `run`'s tables, timed into `reads`."""
        while True:
            catalog, lock = self._catalog(run)
            with lock:  # a DuckDB connection serves one query at a time
                if self._catalogs.get(run, (None,))[0] is not catalog:  # closed to make room since: open it again
                    continue
                watch = Stopwatch()
                table = catalog.query(sql, params)
            reads.add(name, watch.seconds(), table.num_rows)
            return table

    def _catalog(self, run: str) -> tuple[Catalog, threading.Lock]:
        self.info(run)  # a clear error for a run that is not there
        with self._lock:
            if run not in self._catalogs:
                self._catalogs[run] = (Catalog(self.root, run, threads=self.threads), threading.Lock())
                while len(self._catalogs) > OPEN_CATALOGS:  # the least recently read run's connection closes
                    _, (old, old_lock) = self._catalogs.popitem(last=False)
                    with old_lock:
                        old.close()
            self._catalogs.move_to_end(run)
            return self._catalogs[run]

    def close(self) -> None:
        with self._lock:
            for catalog, _ in self._catalogs.values():
                catalog.close()
            self._catalogs.clear()


def _plain_name(run: str) -> bool:
    from storage.manifest import RUN_NAME

    return bool(RUN_NAME.match(run))


HISTORY_METRICS = ("heldout_reward", "sync_s", "reward", "generated_tokens", "iteration_s")


class Tracking:
    """Metric histories of training runs, from MLflow (read-only). A run is found by its `libra.run`
    tag; of several (a run trained again from the start) the one not superseded is read.

    A SQLite database is read with `sqlite3` itself, read-only (SQLite's `mode=ro`), and only once
    MLflow's tables exist: MLflow's own client creates tables, or a default experiment, in a database
    a training is still setting up, and creates folders for the file's path wherever it runs. What
    is read is MLflow's tables of runs, tags and metrics, as `MlflowClient.search_runs` and
    `get_metric_history` would give them (active runs of active experiments; a NaN is stored as
    `is_nan`). A tracking server (http, https) is read through its API. Other URIs (a file store)
    are not read: the file store's client creates folders as it opens."""

    def __init__(self, uri: str | None) -> None:
        from libra.files import absolute_tracking_uri

        self.uri = absolute_tracking_uri(uri, create=False) if uri else None
        self._path = Path(self.uri.removeprefix("sqlite:///")) if self.uri and self.uri.startswith("sqlite:///") else None
        self._client = None
        self._cache: dict[str, tuple[float, dict[str, list[tuple[int, float]]]]] = {}
        self._lock = threading.Lock()

    def version(self) -> float:
        """Changes when MLflow's SQLite file does (0 when there is none, or MLflow is a server)."""
        if self._path is None:
            return 0.0
        try:
            return os.stat(self._path).st_mtime
        except FileNotFoundError:
            return 0.0

    def available(self) -> bool:
        if self.uri is None:
            return False
        if self._path is not None:
            return _has_mlflow_tables(self._path)
        return self.uri.startswith(("http://", "https://"))

    def history(self, run: str, reads: Reads) -> dict[str, list[tuple[int, float]]]:
        """metric -> [(step, value)] of the MLflow run tagged `libra.run` = `run`; {} when there is
        none, or MLflow cannot be read now (it is only ever a part of a page)."""
        version = self.version()
        with self._lock:
            cached = self._cache.get(run)
            if cached is not None and cached[0] == version and self._path is not None:
                return cached[1]
            if not self.available():
                return {}
            watch = Stopwatch()
            try:
                metrics = self._read(run)
            except Exception:  # noqa: BLE001 - a locked or migrating database, a server away: no metrics this time
                return {}
            reads.add("mlflow metric histories", watch.seconds(), sum(len(v) for v in metrics.values()))
            self._cache[run] = (version, metrics)
            return metrics

    def _read(self, run: str) -> dict[str, list[tuple[int, float]]]:
        if self._path is not None:
            return _sqlite_history(self._path, run)
        import mlflow

        if self._client is None:
            self._client = mlflow.MlflowClient(tracking_uri=self.uri)
        quoted = run.replace("'", "\\'")
        found = self._client.search_runs(experiment_ids=[e.experiment_id for e in self._client.search_experiments()],
                                         filter_string=f"tags.`libra.run` = '{quoted}'", max_results=50)
        live = [r for r in found if r.data.tags.get("libra.superseded") != "true"]
        if not live:
            return {}
        latest = max(live, key=lambda r: r.info.start_time or 0)
        return {key: sorted((m.step, m.value) for m in self._client.get_metric_history(latest.info.run_id, key))
                for key in HISTORY_METRICS if key in latest.data.metrics}


_LATEST_RUN = """
SELECT r.run_uuid FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id
JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'libra.run' AND t.value = ?
WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'
  AND NOT EXISTS (SELECT 1 FROM tags s WHERE s.run_uuid = r.run_uuid AND s.key = 'libra.superseded' AND s.value = 'true')
ORDER BY COALESCE(r.start_time, 0) DESC LIMIT 1
"""


def _sqlite_history(path: Path, run: str) -> dict[str, list[tuple[int, float]]]:
    """`Tracking.history` from MLflow's SQLite file, opened read-only: the latest active run tagged
    `libra.run` = `run` and not superseded, each of `HISTORY_METRICS` it logged as sorted (step, value)."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        found = con.execute(_LATEST_RUN, (run,)).fetchone()
        if found is None:
            return {}
        marks = ", ".join("?" * len(HISTORY_METRICS))
        rows = con.execute(f"SELECT key, step, value, is_nan FROM metrics WHERE run_uuid = ? AND key IN ({marks})",
                           (found[0], *HISTORY_METRICS)).fetchall()
    finally:
        con.close()
    history: dict[str, list[tuple[int, float]]] = {}
    for key, step, value, is_nan in rows:
        history.setdefault(key, []).append((int(step), math.nan if is_nan else float(value)))
    return {key: sorted(history[key]) for key in HISTORY_METRICS if key in history}


def _has_mlflow_tables(path: Path) -> bool:
    """Whether the SQLite file holds MLflow's tables (read-only; a missing file is not created)."""
    import sqlite3

    if not path.is_file():
        return False
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return {"alembic_version", "experiments", "runs", "metrics", "tags"} <= names
