"""PNG plots of a run (matplotlib): drawn from the store's named queries, or from given series. The
recording tasks save them as MLflow artifacts."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from storage.catalog import Catalog  # noqa: E402
from storage.queries import run_named  # noqa: E402


def length_histogram_png(catalog: Catalog, out: str | Path, title: str = "") -> Path:
    """Bar chart of trajectory length (total tokens)."""
    table = run_named(catalog, "length_histogram", bins=30)
    lo = table.column("lo_tokens").to_pylist()
    hi = table.column("hi_tokens").to_pylist()
    count = table.column("trajectories").to_pylist()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(lo, count, width=[h - lo_ for lo_, h in zip(lo, hi, strict=True)], align="edge", edgecolor="black", linewidth=0.3)
    ax.set_xlabel("trajectory length (total tokens)")
    ax.set_ylabel("trajectories")
    ax.set_title(title or "trajectory length")
    return _save(fig, out)


def per_step_drift_png(catalog: Catalog, out: str | Path, title: str = "") -> Path:
    """Mean, p50 and p90 of trajectory length per step."""
    table = run_named(catalog, "per_step_drift")
    steps = table.column("step").to_pylist()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for column, label in (("total_tokens_mean", "mean"), ("total_tokens_p50", "p50"), ("total_tokens_p90", "p90")):
        ax.plot(steps, table.column(column).to_pylist(), label=label, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("total tokens per trajectory")
    ax.set_title(title or "length per step")
    ax.legend()
    return _save(fig, out)


def lines_png(series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str, out: str | Path) -> Path:
    """One line per named (xs, ys) series."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, label=label, linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return _save(fig, out)


def _save(fig: plt.Figure, out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
