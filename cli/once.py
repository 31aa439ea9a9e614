"""Each option once: an option given twice (`--steps 5 ... --steps 50`, or an old flag beside its
new name) is a usage error, not the last one silently winning. Options meant to repeat
(`action="append"`) still do."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

GIVEN = "_libra_given"  # the options parsed so far, on the namespace while it is parsed (removed after)


def once(action: argparse.Action, namespace: argparse.Namespace, option_string: str | None) -> None:
    """An `ArgumentError` if `action`'s destination was already given in this parse."""
    given: dict[str, str] = namespace.__dict__.setdefault(GIVEN, {})
    name = option_string or "/".join(action.option_strings) or action.dest
    if action.dest in given:
        earlier = given[action.dest]
        both = "" if earlier == name else f" ({earlier} and {name})"
        raise argparse.ArgumentError(action, f"given twice{both}; give it once")
    given[action.dest] = name


def forget(namespace: argparse.Namespace) -> argparse.Namespace:
    namespace.__dict__.pop(GIVEN, None)
    return namespace


class _Once(argparse.Action):
    """A storing action that refuses a second use of its option (positionals are given once anyway)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: str | Sequence[str] | None,
                 option_string: str | None = None) -> None:
        if self.option_strings:
            once(self, namespace, option_string)
        super().__call__(parser, namespace, values, option_string)


class _Store(_Once, argparse._StoreAction):
    pass


class _StoreConst(_Once, argparse._StoreConstAction):
    pass


class _StoreTrue(_Once, argparse._StoreTrueAction):
    pass


class _StoreFalse(_Once, argparse._StoreFalseAction):
    pass


def register(parser: argparse.ArgumentParser) -> None:
    """`parser`'s storing actions refuse a second use."""
    for name, action in ((None, _Store), ("store", _Store), ("store_const", _StoreConst), ("store_true", _StoreTrue),
                         ("store_false", _StoreFalse)):
        parser.register("action", name, action)
