"""Prefect tasks: each is one call into `libra/` or `storage/`, plus retries and logging.
Arguments are ids, paths and small frozen records, never engines or models."""
