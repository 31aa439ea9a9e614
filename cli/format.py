"""Rendering query results for people (aligned tables) and machines (JSON)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cli.text import printable
from storage.queries import to_jsonable


def rows_json(table: pa.Table) -> str:
    """A JSON list with one object per row."""
    return json.dumps([to_jsonable(row) for row in _rows(table)])


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as Python values; a column Python cannot hold (DuckDB's infinite timestamps and
    dates, years past 9999) as Arrow's text of each value."""
    columns = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        try:
            columns[name] = column.to_pylist()
        except (OverflowError, ValueError):
            columns[name] = pc.cast(column, pa.string()).to_pylist()
    return [{name: values[i] for name, values in columns.items()} for i in range(table.num_rows)]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = printable(str(to_jsonable(value)))
    return text if len(text) <= 60 else text[:57] + "..."


def render_table(table: pa.Table, max_rows: int = 100) -> str:
    """Columns aligned under their names; numbers right-aligned; at most `max_rows` rows shown."""
    names = table.column_names
    if not names:
        return "(no result)"
    shown = _rows(table.slice(0, max_rows))
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type) for f in table.schema]
    cells = [[_cell(row[n]) for n in names] for row in shown]
    header = [printable(n) for n in names]  # a column may be named by stored text (a PIVOT over a trace's tool names)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(header), line(["-" * w for w in widths])] + [line(r) for r in cells]
    if table.num_rows > max_rows:
        out.append(f"... {table.num_rows - max_rows} more row(s); use --json or LIMIT to see them")
    out.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(out)
