"""Old names users can still reach: a renamed config key, command-line flag or flow parameter keeps
working, and each use prints one line on stderr naming the new one."""

from __future__ import annotations

import sys
from typing import TypeVar

from libra.errors import LibraError

T = TypeVar("T")


def deprecated(old: str, new: str) -> None:
    """The one line a use of the old name `old` prints: it is deprecated, use `new`."""
    print(f"libra: {old} is deprecated; use {new}", file=sys.stderr, flush=True)


def renamed_parameter(old: str, new: str, old_value: T | None, new_value: T, default: T) -> T:
    """A flow parameter's value: the one given under its new name `new`, or the one given under its
    old name `old` (with the deprecation line); a LibraError when both are given."""
    if old_value is None:
        return new_value
    deprecated(old, new)
    if new_value != default:
        raise LibraError(f"{old} and {new} are one parameter; give only {new}")
    return old_value
