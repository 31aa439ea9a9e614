"""Old command-line flags that still work under their new names (`libra.renames` says each use once)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cli.once import once


class RenamedFlag(argparse.Action):
    """An old flag that still works: its value goes where the new flag's goes, and each use prints
    one line naming the new flag (`libra.renames.deprecated`)."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **{"default": argparse.SUPPRESS, "help": argparse.SUPPRESS, **kwargs})
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from libra.renames import deprecated

        once(self, namespace, option_string)
        deprecated(option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, values)
