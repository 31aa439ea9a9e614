"""How a command calls its flow: the runtime prepared from the config (Prefect's temporary server
started when no server is named), the flow's log lines held while it runs (an expected error is
then the CLI's one line, not Prefect's log of it with a traceback), the flow's result returned."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libra.config import LibraConfig
from libra.errors import LibraError

EXPECTED = (LibraError, OSError, MemoryError, KeyboardInterrupt)  # what cli.main turns into one line


def run_flow(flow: Callable[..., Any], config: LibraConfig, *, tracking: bool = True, **parameters: Any) -> Any:
    """`flow(config=config, **parameters)` in a prepared runtime."""
    from flows.runtime import held_logs, prepare_runtime, start_prefect

    prepare_runtime(config, tracking)
    start_prefect()
    with held_logs(EXPECTED):
        return flow(config=config, **parameters)
