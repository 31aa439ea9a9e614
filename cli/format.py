"""Rendering query results for people (aligned tables) and machines (JSON)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from storage.queries import to_jsonable


def rows_json(table: pa.Table) -> str:
    """A JSON list with one object per row."""
    return json.dumps([to_jsonable(row) for row in table.to_pylist()])


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(to_jsonable(value))
    return text if len(text) <= 60 else text[:57] + "..."


def render_table(table: pa.Table, max_rows: int = 100) -> str:
    """Columns aligned under their names; numbers right-aligned; at most `max_rows` rows shown."""
    names = table.column_names
    if not names:
        return "(no result)"
    shown = table.slice(0, max_rows).to_pylist()
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type) for f in table.schema]
    cells = [[_cell(row[n]) for n in names] for row in shown]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(names), line(["-" * w for w in widths])] + [line(r) for r in cells]
    if table.num_rows > max_rows:
        out.append(f"... {table.num_rows - max_rows} more row(s); use --json or LIMIT to see them")
    out.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(out)
