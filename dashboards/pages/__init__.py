"""The dashboard's pages: each module's `build(view) -> Page` reads the store (and MLflow) and draws."""

from __future__ import annotations

from collections.abc import Callable

from dashboards.figures import Page
from dashboards.pages import compare, overview, pools, scheduling, trajectories
from dashboards.view import View

RUN_PAGES: dict[str, tuple[str, Callable[[View], Page]]] = {
    "overview": ("Overview", overview.build),
    "trajectories": ("Trajectories", trajectories.build),
    "scheduling": ("Scheduling", scheduling.build),
    "pools": ("Pools", pools.build),
}
COMPARE = compare.build
