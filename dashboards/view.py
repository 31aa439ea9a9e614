"""What a page is built from: the run, the request's parameters, and timed reads of the store and MLflow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dashboards.sources import Reads, RunInfo, Store, Tracking
from libra.config import DashboardConfig
from libra.errors import LibraError
from storage.queries import to_jsonable


class BadParameter(LibraError):
    """A query parameter the page cannot take (an unknown policy, a step that is not a number)."""


@dataclass
class View:
    store: Store
    tracking: Tracking
    settings: DashboardConfig
    run: str
    params: Mapping[str, Sequence[str]] = field(default_factory=dict)
    reads: Reads = field(default_factory=Reads)

    @property
    def info(self) -> RunInfo:
        return self.store.info(self.run)

    def rows(self, name: str, sql: str, **params: Any) -> list[dict[str, Any]]:
        """A query's rows as dicts of plain values (DuckDB's decimals as numbers, NaN as None), timed under `name`."""
        return plain(self.store.query(self.run, name, sql, params or None, self.reads))

    def param(self, key: str, default: str = "") -> str:
        values = self.params.get(key) or ()
        return values[-1] if values else default

    def int_param(self, key: str, default: int | None, low: int, high: int) -> int | None:
        text = self.param(key)
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            raise BadParameter(f"{key} must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise BadParameter(f"{key} must be between {low} and {high}, got {value}")
        return value

    def history(self) -> dict[str, list[tuple[int, float]]]:
        return self.tracking.history(self.run, self.reads)


def plain(table) -> list[dict[str, Any]]:
    return [to_jsonable(row) for row in table.to_pylist()]


def policies(view: View) -> list[str]:
    """The resource-management policies the run's steps were taken under (a simulation runs several)."""
    rows = view.rows("policies", "SELECT DISTINCT coalesce(policy, '') AS policy FROM steps ORDER BY policy")
    return [r["policy"] for r in rows]


def chosen_policy(view: View, names: Sequence[str]) -> str:
    """The `policy` parameter, else libra when the run has it, else the first; '' for a run without steps."""
    wanted = view.param("policy")
    if wanted:
        if wanted not in names:
            raise BadParameter(f"run {view.run!r} has no policy {wanted!r}; its policies: {', '.join(names) or 'none'}")
        return wanted
    return "libra" if "libra" in names else (names[0] if names else "")


def owner_prefix(policy: str, names: Sequence[str]) -> str:
    """In a run of several policies (a simulation), plans and pool events belong to a policy by the
    prefix of their plan and worker ids (`<policy>/...`); '' when the run has one policy."""
    return f"{policy}/" if len(names) > 1 and policy else ""


def stride(count: int, max_points: int) -> int:
    """Steps per point so that `count` steps make at most `max_points` points."""
    return max(1, -(-count // max_points))
