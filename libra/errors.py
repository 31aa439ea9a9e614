"""Errors a user can act on.

A `LibraError` carries one line that says what is wrong and what to do. The CLI prints it as
`libra: error: <message>` and exits with status 2; everything else is a bug and keeps its traceback.
"""


class LibraError(Exception):
    """A user mistake (bad config, bad input file, unknown run) with a one-line explanation."""


class ConfigError(LibraError):
    """A configuration value or key that the config models refuse."""


class TraceFormatError(LibraError):
    """A per-turn trace file that does not follow the documented format."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")
