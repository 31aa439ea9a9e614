"""Progress of long commands: one bar on stderr, redrawn in place, only on a terminal.

`libra simulate`, `libra plan`, `libra policy init` and `tune`, `libra eval-router` and the commands that read large traces
report through a `Progress`. It draws `label [#####-----] 45% 90/200 detail 12 s` on stderr,
redrawn at most ten times a second, only when stderr is a terminal and the command was not asked
for `--json`; otherwise it draws nothing, so pipes, logs and JSON output stay clean. Work that ends
within half a second draws no bar at all. The bar is erased if the command fails (the error is the
one line left) and kept when it finishes.

The computing code never sees this module: it takes an optional callback, and the command adapts
the callback's arguments to `Progress.update(done, total, detail)`.
"""

from __future__ import annotations

import math
import shutil
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import TextIO

from libra.clock import Clock, WallClock

CLEAR = "\r\x1b[K"  # to the start of the line, then erase it
DELAY_S = 0.5  # bars of `progress()` draw nothing before this much time has passed


@dataclass
class Progress:
    """A progress bar for one long step of a command; silent when `stream` is None."""

    label: str
    stream: TextIO | None
    clock: Clock = field(default_factory=WallClock)
    min_interval_s: float = 0.1
    delay_s: float = 0.5  # nothing is drawn before this much time has passed
    columns: int = 0  # width to fit the line in; 0: the terminal's
    started: float = field(init=False)
    _last_draw: float = field(default=-math.inf, init=False)
    _line: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.started = self.clock.now()

    @property
    def active(self) -> bool:
        return self.stream is not None

    def update(self, done: float, total: float, detail: str = "") -> None:
        """`done` of `total` units finished; drawn unless the last drawing is under min_interval_s old
        (the last unit is always drawn)."""
        if self.stream is None:
            return
        now = self.clock.now()
        if now - self.started < self.delay_s or (now - self._last_draw < self.min_interval_s and done < total):
            return
        self._last_draw = now
        self._line = render(self.label, done, total, detail, now - self.started,
                            self.columns or shutil.get_terminal_size((100, 24)).columns)
        self.stream.write(CLEAR + self._line)
        self.stream.flush()

    def echo(self, text: str, file: TextIO | None = None) -> None:
        """Print a line of text (to stdout by default) without tearing the bar: the bar is erased
        first and drawn again below it."""
        if self.stream is not None and self._line:
            self.stream.write(CLEAR)
            self.stream.flush()
        print(text, file=file if file is not None else sys.stdout, flush=True)
        if self.stream is not None and self._line:
            self.stream.write(self._line)
            self.stream.flush()

    def close(self, keep: bool = True) -> None:
        """End the bar: keep its last drawing on its own line, or erase it."""
        if self.stream is None or not self._line:
            return
        self.stream.write("\n" if keep else CLEAR)
        self.stream.flush()
        self._line = ""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close(keep=kind is None)


def render(label: str, done: float, total: float, detail: str, elapsed_s: float, columns: int) -> str:
    """One line: label, bar, percent, done/total, detail and elapsed time, cut to `columns` - 1."""
    share = min(1.0, max(0.0, done / total)) if total > 0 else 0.0
    width = 20
    filled = round(share * width)
    text = (f"{label} [{'#' * filled}{'-' * (width - filled)}] {share:4.0%} {_count(done)}/{_count(total)}"
            + (f" {detail}" if detail else "") + f" {elapsed_s:.0f} s")
    return text[: max(10, columns - 1)]


def _count(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def progress(label: str, *, quiet: bool = False, stream: TextIO | None = None) -> Progress:
    """A Progress drawing on `stream` (default stderr) when that is a terminal and not `quiet`
    (a --json command passes quiet=True)."""
    target = stream if stream is not None else sys.stderr
    try:
        tty = target.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Progress(label, target if tty and not quiet else None, delay_s=DELAY_S)
