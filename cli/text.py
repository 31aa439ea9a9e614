"""Text that reaches the terminal: escaped so that it never drives it."""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every character that is not printable escaped as Python writes it (`\\x1b`,
    `\\n`): what reaches the terminal never drives it."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
