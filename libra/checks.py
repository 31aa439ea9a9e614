"""Range checks for the numbers a flow is given (a command-line flag or a deployment's parameter).

argparse and Prefect check that a number is a number; these check that it is a sensible one, with
the same one-line error for every parameter: below the least value, above the largest (sizes that
would not fit in memory or would run for days), or not finite (a float accepts `nan` and `inf`).
The upper bounds follow the config's own (`libra/config.py`) where a parameter overrides a config
value. A parameter is named as its caller names it (`Names`): `--steps` on the command line, `steps`
in a deployment run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from libra.errors import LibraError

Names = Callable[[str], str]  # a parameter's name -> how the caller spells it


def as_parameter(name: str) -> str:
    """A flow parameter's own name (a deployment run's `--param steps=...`)."""
    return name


def as_flag(name: str) -> str:
    """`group_size` -> `--group-size`, the command line's spelling."""
    return "--" + name.replace("_", "-")


def field_range(model: type[BaseModel], field: str) -> tuple[float, float]:
    """The least and largest value a config field takes (its `ge` and `le`), for a parameter that
    overrides it: one range, kept where the config declares it."""
    low, high = -math.inf, math.inf
    for bound in model.model_fields[field].metadata:
        low, high = getattr(bound, "ge", low), getattr(bound, "le", high)
    return low, high


def count_of(text: str, most: int) -> int | None:
    """`text` as a count from 0 to `most` when it is one in ASCII digits (leading zeros allowed), else
    None. A long text is never handed to `int`, which refuses more than 4,300 digits with an error of
    its own and takes quadratic time below that."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(most)):
        return None
    value = int(digits)
    return value if value <= most else None


def missing_policy(path: str | Path, name: str) -> str | None:
    """Why `path` (given as `name`: a flag or a config key) holds no policy to load, with what to do;
    None where it holds one (an HF-format checkpoint, whose config.json is read first)."""
    path = Path(path)
    if (path / "config.json").is_file():
        return None
    if path.exists() and not path.is_dir():
        return (f"{name} {path} is a file, not a policy directory; give a directory with an HF-format checkpoint "
                "(config.json and its weights), such as `libra policy init --out DIR` makes")
    return (f"{name}: no policy in {path}; build one with `libra policy init --out {path}`, or give a directory "
            "with an HF-format checkpoint")


def context_beyond_policy(path: str | Path, max_context: int) -> str | None:
    """Why a context of `max_context` tokens cannot run on the policy in `path` (more than its
    positions), with what to do; None where it can."""
    import json

    positions = json.loads((Path(path) / "config.json").read_text()).get("max_position_embeddings")
    if positions and max_context > positions:
        return (f"rollout.max_context {max_context} is more than the policy's {positions} positions; set it to at "
                f"most {positions}")
    return None


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


MAX_BOUNDS = 16  # bucket bounds at most (17 buckets; a router's work per decision grows with them)
MAX_BOUND_TOKENS = 10_000_000  # a bound past any context a model holds


def token_bounds(name: str, text: str) -> list[int]:
    """`4000,12000` -> [4000, 12000]: bucket bounds, increasing positive token counts."""
    shown = repr(text) if len(text) <= 60 else repr(text[:60]) + "..."
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if len(parts) > MAX_BOUNDS:
        raise LibraError(f"{name} {shown}: {len(parts):,} bounds; give at most {MAX_BOUNDS} (e.g. 4000,12000)")
    bounds = []
    for part in parts:
        bound = count_of(part, MAX_BOUND_TOKENS)
        if bound is None:
            raise LibraError(f"{name} {shown}: give 'auto' or increasing token counts of at most "
                             f"{MAX_BOUND_TOKENS:,} like 4000,12000")
        bounds.append(bound)
    if not bounds or bounds != sorted(set(bounds)) or bounds[0] < 1:
        raise LibraError(f"{name} {shown}: bounds must be increasing positive token counts, e.g. 4000,12000")
    return bounds
