"""The `libra` command line: one entry point fronting every package."""
