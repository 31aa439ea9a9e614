"""Stdout belongs to the result: with `--json` it carries one JSON document and nothing else.

Third-party code prints to stdout: vLLM's logger writes to `sys.stdout`, C libraries and child
processes (vLLM's engine processes, Prefect's temporary server) write to file descriptor 1. So a
`--json` command runs inside `json_stdout`: while the block runs, file descriptor 1 points at stderr
and `sys.stdout` is `sys.stderr`, and the block writes its JSON to the stream it is given, which is
the real stdout saved at the start. Child processes started in the block keep stderr as their
stdout. Without `--json` the block runs unchanged and is given `sys.stdout`.

In a process that is one `libra` command (the console script, `python -m cli.main`: `own_process`),
stdout stays on stderr after the block, and `seal` points it there once the command returns: what
prints while the process exits is not the result. Ray's driver, for one, prints the cluster's
deduplicated warnings to `sys.stdout` when its atexit handler disconnects.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

_owned = False  # this process is one command: its stdout is the result and nothing after it


def own_process() -> None:
    """This process runs one `libra` command and then exits: from the end of a `json_stdout` block
    on, stdout is stderr."""
    global _owned
    _owned = True


def seal() -> None:
    """The command's result is written: whatever prints from now until the process exits (atexit
    handlers, threads still running) goes to stderr."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # closed, or its reader went away: nothing more reaches it anyway
        pass
    try:
        sys.stderr.flush()
        os.dup2(2, 1)
    except OSError:  # no stderr to point at
        pass
    sys.stdout = sys.stderr


@contextmanager
def json_stdout(enabled: bool = True) -> Iterator[TextIO]:
    """Everything written to stdout inside the block goes to stderr, except what is written to the
    stream the block is given (the real stdout)."""
    original = sys.stdout
    if not enabled:
        yield original
        return
    original.flush()
    try:
        saved = os.dup(1)
    except OSError:  # stdout is closed: nothing to protect
        yield original
        return
    try:
        on_fd1 = original.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a capture object (tests) that is not a file
        on_fd1 = False
    out: TextIO = (os.fdopen(os.dup(saved), "w", encoding=getattr(original, "encoding", None) or "utf-8",
                             errors=getattr(original, "errors", None) or "strict") if on_fd1 else original)
    sys.stderr.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield out
    finally:
        try:
            out.flush()
        finally:
            try:
                original.flush()  # what libraries left in the old stdout's buffer goes to stderr too
            except (OSError, ValueError):
                pass
            if not _owned:
                sys.stdout = original
                os.dup2(saved, 1)
            os.close(saved)
            if out is not original:
                try:
                    out.close()
                except OSError:  # the reader of stdout went away; out.flush() above raised it already
                    pass
