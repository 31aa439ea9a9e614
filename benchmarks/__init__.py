"""Benchmarks: each prints its figure as a ratio against a baseline measured in the same run and
writes it to benchmarks/out/<name>.json; `python -m benchmarks.report` puts them in the README."""
