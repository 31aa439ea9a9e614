"""Trajectory store: versioned Arrow schemas; Parquet shards partitioned by run and step, published
by per-run manifests (`manifest`) so that a run's import or step appears whole or not at all, one
writer per run at a time (`writer`); a read-only DuckDB catalog over the committed shards
(`catalog`); and the named queries other packages use (`queries`)."""
