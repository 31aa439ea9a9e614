"""Plotly figures in one house style, and the records a page is made of.

A page (`Page`) is charts, tables and controls; a chart (`Chart`) is a Plotly figure as JSON, or
the reason it has nothing to draw. Figures are built with `plotly.graph_objects` (validated), every
axis names its unit, every chart with more than one series has a legend, and a chart holds a few
series: pages pick what to draw and bin long runs before anything reaches here.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

HEIGHT = 330
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Chart:
    key: str  # the element's id on the page
    title: str
    figure: dict[str, Any] | None  # Plotly JSON (data, layout); None when there is nothing to draw
    empty: str = ""  # why there is nothing to draw
    note: str = ""  # one line under the chart: what it shows and how it was derived


@dataclass(frozen=True)
class Table:
    key: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    links: tuple[str | None, ...] = ()  # per row: a query string that selects the row on this page
    note: str = ""


@dataclass(frozen=True)
class Control:
    """A selector on the page: choosing an option changes the query parameter `name`."""

    name: str
    label: str
    options: tuple[tuple[str, str], ...]  # (value, label)
    value: str | tuple[str, ...]
    multiple: bool = False


@dataclass(frozen=True)
class Page:
    title: str
    summary: tuple[tuple[str, str], ...] = ()  # (label, value) figures at the top
    charts: tuple[Chart, ...] = ()
    tables: tuple[Table, ...] = ()
    controls: tuple[Control, ...] = ()
    notice: str = ""  # a whole-page message (an empty run, a table the run does not have)


@dataclass(frozen=True)
class Series:
    name: str
    x: Sequence[Any]
    y: Sequence[Any]
    mode: str = "lines+markers"
    stackgroup: str | None = None
    hover: Sequence[str] | None = None
    dash: str | None = None
    yaxis: str = "y"
    extra: dict[str, Any] = field(default_factory=dict)


def text(value: Any) -> Any:
    """A string drawn by Plotly, escaped: Plotly renders some markup (links, styles) in names, hover
    text and category labels, and these come from the store. A newline becomes a line break."""
    if not isinstance(value, str):
        return value
    return html.escape(value, quote=False).replace("\n", "<br>")


def texts(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else [text(v) for v in values]


def base_layout(x_title: str, y_title: str, **more: Any) -> dict[str, Any]:
    return {"height": HEIGHT, "margin": {"l": 64, "r": 24, "t": 16, "b": 52}, "hovermode": "x unified",
            "xaxis": {"title": {"text": x_title}, "zeroline": False}, "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
            "legend": {"orientation": "h", "y": -0.22}, "template": "plotly_white", **more}


def as_json(fig: go.Figure) -> dict[str, Any]:
    return json.loads(fig.to_json())


def lines(key: str, title: str, x_title: str, y_title: str, series: Sequence[Series], *, empty: str,
          note: str = "", shapes: Sequence[dict] = (), y2_title: str = "", whole: Sequence[str] = ()) -> Chart:
    """A line (or stacked area) chart; `empty` is shown when no series has a point. `whole` names the
    axes ("y", "y2") whose values are counts: their ticks fall on whole numbers."""
    drawn = [s for s in series if any(v is not None for v in s.y)]
    if not drawn:
        return Chart(key, title, None, empty, note)
    fig = go.Figure()
    for i, s in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        extra = dict(s.extra)
        fig.add_trace(go.Scatter(name=text(s.name), x=texts(s.x), y=list(s.y), mode=s.mode, stackgroup=s.stackgroup,
                                 hovertext=texts(s.hover), yaxis=s.yaxis,
                                 line={"color": color, "dash": s.dash, "width": 2, **extra.pop("line", {})},
                                 marker={"size": 4, **extra.pop("marker", {})}, connectgaps=False, **extra))
    layout = base_layout(x_title, y_title, shapes=list(shapes), showlegend=True)
    if y2_title:
        layout["yaxis2"] = {"title": {"text": y2_title}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                            "showgrid": False}
    for axis in whole:
        top = max((v for s in drawn if (s.yaxis or "y") == axis for v in s.y if v is not None), default=0)
        layout["yaxis" if axis == "y" else "yaxis2"]["dtick"] = max(1, math.ceil(top / 5))
    fig.update_layout(**layout)
    return Chart(key, title, as_json(fig), note=note)


def bars(key: str, title: str, x_title: str, y_title: str, series: Sequence[Series], *, empty: str, note: str = "",
         stacked: bool = False, horizontal: bool = False) -> Chart:
    drawn = [s for s in series if any(v is not None for v in s.y)]
    if not drawn:
        return Chart(key, title, None, empty, note)
    fig = go.Figure()
    for i, s in enumerate(drawn):
        fig.add_trace(go.Bar(name=text(s.name), x=texts(s.y if horizontal else s.x), y=texts(s.x if horizontal else s.y),
                             orientation="h" if horizontal else "v", marker={"color": COLORS[i % len(COLORS)]},
                             hovertext=texts(s.hover), **s.extra))
    fig.update_layout(**base_layout(x_title, y_title, barmode="stack" if stacked else "group", showlegend=len(drawn) > 1,
                                    hovermode="closest"))
    return Chart(key, title, as_json(fig), note=note)


def heatmap(key: str, title: str, x_title: str, y_title: str, z_title: str, x: Sequence, y: Sequence,
            z: Sequence[Sequence], *, empty: str, note: str = "") -> Chart:
    if not x or not y:
        return Chart(key, title, None, empty, note)
    fig = go.Figure(go.Heatmap(x=texts(x), y=texts(y), z=[list(row) for row in z], colorscale="Viridis",
                               colorbar={"title": {"text": z_title}}, hoverongaps=False))
    fig.update_layout(**base_layout(x_title, y_title, hovermode="closest"))
    return Chart(key, title, as_json(fig), note=note)


@dataclass(frozen=True)
class Span:
    """One bar of a timeline: `row` from `start` for `length`, coloured by `group`."""

    row: str
    start: float
    length: float
    group: str
    hover: str


def timeline(key: str, title: str, x_title: str, spans: Sequence[Span], *, empty: str, note: str = "",
             row_title: str = "", markers: Sequence[Span] = (), colors: dict[str, str] | None = None) -> Chart:
    """Horizontal bars, one trace per group (a legend entry each, coloured by `colors` where it names
    the group); `markers` are points (length 0)."""
    if not spans:
        return Chart(key, title, None, empty, note)
    groups: dict[str, list[Span]] = {}
    for s in spans:
        groups.setdefault(s.group, []).append(s)
    rows = [text(r) for r in dict.fromkeys(s.row for s in spans)]
    fig = go.Figure()
    for i, (group, members) in enumerate(groups.items()):
        fig.add_trace(go.Bar(name=text(group), orientation="h", y=[text(m.row) for m in members], x=[m.length for m in members],
                             base=[m.start for m in members], hovertext=[text(m.hover) for m in members], hoverinfo="text",
                             marker={"color": (colors or {}).get(group, COLORS[i % len(COLORS)])}))
    if markers:
        fig.add_trace(go.Scatter(name="events", mode="markers", y=[text(m.row) for m in markers], x=[m.start for m in markers],
                                 hovertext=[text(m.hover) for m in markers], hoverinfo="text",
                                 marker={"symbol": "x", "size": 8, "color": "black"}))
    height = max(HEIGHT, 60 + 22 * len(rows))
    fig.update_layout(**base_layout(x_title, row_title, barmode="overlay", hovermode="closest", height=height))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=rows, rangemode=None)
    return Chart(key, title, as_json(fig), note=note)


def vertical_marks(xs: Sequence[float]) -> list[dict]:
    """Dashed vertical lines across the plot at `xs` (plan changes)."""
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
             "line": {"color": "rgba(80,80,80,0.55)", "dash": "dot", "width": 1}} for x in xs]
