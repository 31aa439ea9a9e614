"""DuckDB catalog: the store's tables as views over one run's (or every run's) Parquet shards.

A `Catalog` opens an in-memory DuckDB connection and defines one view per table, reading only
files named `part-*.parquet` under the schema version it knows, so temporaries of a writer that
is still running (or was killed) are never read. A table with no shards for the run is an empty
view with the right columns, so every query works on every run.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from libra.errors import LibraError
from storage.schemas import TABLES, TableSchema
from storage.writer import SHARD_GLOB, check_run_name, table_dir


def list_runs(root: str | Path) -> list[str]:
    """Runs that have at least one shard in any table."""
    runs: set[str] = set()
    for schema in TABLES.values():
        base = table_dir(root, schema)
        if base.is_dir():
            for run_dir in base.glob("run=*"):
                if any(run_dir.glob(f"step=*/{SHARD_GLOB}")):
                    runs.add(run_dir.name.removeprefix("run="))
    return sorted(runs)


class Catalog:
    """Read-only SQL over a store. `run=None` exposes every run (the `run` column tells them apart)."""

    def __init__(self, root: str | Path, run: str | None = None, *, threads: int = 2) -> None:
        self.root = Path(root)
        self.run = run
        if run is not None:
            check_run_name(run)
            if run not in list_runs(self.root):
                known = list_runs(self.root)
                hint = f"runs in the store: {', '.join(known)}" if known else "the store is empty; import or run something first"
                raise LibraError(f"no run named {run!r} in store {self.root}; {hint}")
        self.con = duckdb.connect(database=":memory:", config={"threads": threads})
        for schema in TABLES.values():
            self._define_view(schema)

    def _define_view(self, schema: TableSchema) -> None:
        run_part = f"run={self.run}" if self.run is not None else "run=*"
        pattern = table_dir(self.root, schema) / run_part / "step=*" / SHARD_GLOB
        if any(pattern.parent.parent.parent.glob(f"{run_part}/step=*/{SHARD_GLOB}")):
            literal = str(pattern).replace("'", "''")
            self.con.execute(
                f"CREATE VIEW {schema.name} AS SELECT * FROM read_parquet('{literal}', hive_partitioning=false)"
            )
        else:
            empty = pa.Table.from_batches([], schema=schema.arrow)
            self.con.register(f"_empty_{schema.name}", empty)
            self.con.execute(f"CREATE VIEW {schema.name} AS SELECT * FROM _empty_{schema.name}")

    def query(self, sql: str, params: list | dict | None = None) -> pa.Table:
        """Run SQL; a SQL mistake becomes a one-line LibraError."""
        try:
            relation = self.con.sql(sql, params=params)
            if relation is None:  # a statement with no result set
                return pa.table({})
            return relation.to_arrow_table()
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LibraError(f"query failed: {first}") from None

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
