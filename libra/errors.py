"""Errors a user can act on.

A `LibraError` carries one line that says what is wrong and what to do. The CLI prints it as
`libra: error: <message>` and exits with status 2; everything else is a bug and keeps its traceback
(`cli/main.py` also turns the operating system's refusals, `OSError`, into one line).

The readers of user files promise to raise nothing else on any input: `libra.traces.read_trace`
raises `LibraError` (a `TraceFormatError` naming file, line and reason when the content is at fault)
and `libra.config_loading.load_config` raises `ConfigError`. A fuzz test holds them to it.
"""


def first_line(exc: BaseException, *, typed: bool = False) -> str:
    """`exc` in one line: its message's first non-empty line, or its type's name when it says
    nothing; with `typed`, the type's name before the line (`ValueError: ...`)."""
    name = type(exc).__name__
    line = next((text.strip() for text in str(exc).splitlines() if text.strip()), "")
    if not line:
        return name
    return f"{name}: {line}" if typed else line


class LibraError(Exception):
    """A user mistake (bad config, bad input file, unknown run) with a one-line explanation."""


class ConfigError(LibraError):
    """A configuration value or key that the config models refuse."""


class InfeasibleError(LibraError, ValueError):
    """A cluster, model and workload that cannot run together: no configuration fits. (A ValueError
    too, for callers that caught the ValueError the simulator raised before.)"""


class TraceFormatError(LibraError):
    """A per-turn trace file that does not follow the documented format."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")


class HostLostError(LibraError):
    """A host of a Ray cluster stopped answering (its actors died with it): the run re-plans on the
    hosts that are left and continues from its last completed step."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(message)


class RankLostError(LibraError):
    """A rank of the trainer's core died (its process, or its host) before the update it was in."""

    def __init__(self, rank: int, message: str) -> None:
        self.rank = rank
        super().__init__(message)
