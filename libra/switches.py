"""On/off switches in the environment (`LIBRA_DEBUG`, `LIBRA_NATIVE`, `LIBRA_FORK`): one reading for
all of them. Imported by `libra.native` as the package loads, so it imports nothing heavy."""

from __future__ import annotations

import os

from libra.errors import LibraError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def switch(name: str, default: bool) -> bool:
    """The variable `name` as on (1, true, yes, on) or off (0, false, no, off), in any case; `default`
    where it is unset or empty. Any other value is a LibraError that names the variable and what it
    takes (`LIBRA_DEBUG=false` had turned tracebacks on, `LIBRA_NATIVE=off` left the compiled core on)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise LibraError(f"{name}={os.environ[name][:40]!r}: give 1 (or true, yes, on) or 0 (or false, no, off)")
