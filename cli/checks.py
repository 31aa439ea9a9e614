"""Range checks for numeric command-line arguments.

argparse checks that a number is a number; these check that it is a sensible one, with the same
one-line error for every flag: below the least value, above the largest (sizes that would not fit
in memory or would run for days), or not finite (argparse's float accepts `nan` and `inf`). The
upper bounds follow the config's own (`libra/config.py`) where a flag overrides a config value.
"""

from __future__ import annotations

import math

from libra.errors import LibraError


def in_range(flag: str, value: int | float | None, low: int | float, high: int | float) -> None:
    """Nothing if `value` is None or within [low, high]; a LibraError naming the flag otherwise."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise LibraError(f"{flag} must be a finite number, got {value}")
    if value < low:
        raise LibraError(f"{flag} must be >= {low}, got {value}")
    if value > high:
        raise LibraError(f"{flag} must be <= {high:,}, got {value:,}")
