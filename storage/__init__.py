"""Trajectory store: versioned Arrow schemas, an atomic append-only Parquet writer partitioned by
run and step, a DuckDB catalog over a run's files, and the named queries other packages use."""
