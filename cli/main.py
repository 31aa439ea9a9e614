"""`libra`: one command, a subcommand per capability, `--help` everywhere.

Every bad input ends the same way: one line on stderr, `libra: error: <what is wrong>`, exit status
2, no traceback, nothing written. That covers argparse's own complaints (this parser prints one line
instead of the usage block), `LibraError`s raised anywhere (bad configs, input files, SQL, arguments
out of range) and the operating system's refusals (`OSError`: a store on a read-only disk, a path
that is a directory). The message is printed on one line whatever it quotes (control characters are
escaped). Ctrl-C prints `libra: interrupted` and exits with 130, also while heavy modules are still
being imported: this module imports nothing heavy at the top, the subcommands are imported inside
`main`. A Ctrl-C that lands while a module is being imported waits until that import is done: raised
inside a native extension's initialisation (DuckDB's nanobind enums, for one) it aborts the whole
process. Python drops a KeyboardInterrupt that lands in a weakref callback or a finalizer (it can,
during imports) and prints "Exception ignored"; `main` delivers such a one again, in the main thread.
A second Ctrl-C ends the process at once, with the same line. Anything else is a bug and keeps
its traceback; `LIBRA_DEBUG=1` shows tracebacks for the mapped errors too.
"""

from __future__ import annotations

import _thread
import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from cli.once import forget, register
from cli.text import printable

if TYPE_CHECKING:
    from libra.config import LibraConfig

MAX_MESSAGE_CHARS = 2_000


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the subcommand's --help, and an option given
    twice is one (`cli.once`)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - argparse's own
        super().__init__(*args, **kwargs)
        register(self)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        return forget(parsed), extras

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"libra: error: {one_line(message)} (see `{self.prog} --help`)\n")


def one_line(text: str) -> str:
    """`text` with control characters escaped (a newline in a quoted file name stays on the line), cut
    to MAX_MESSAGE_CHARS."""
    text = printable(text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes."""
    parent = Parser(add_help=False)
    parent.add_argument("--config", metavar="FILE", help="YAML config (default: the embedded defaults, as in configs/default.yaml)")
    parent.add_argument("--store", metavar="DIR", help="store root directory (overrides store.root)")
    return parent


def build_parser() -> argparse.ArgumentParser:
    from cli import (
        compare_command,
        dashboard_command,
        deploy_command,
        plan_command,
        pool_command,
        rollout_command,
        router_command,
        run_command,
        simulate_command,
        store_commands,
        train_command,
        tree_command,
    )
    from libra import __version__

    parser = Parser(
        prog="libra",
        description="Libra manages GPUs for agentic RL post-training: a resource planner, causal routing "
        "of trajectories at tool returns, and an elastic hybrid pool. Trajectory statistics live in a "
        "Parquet store queried with DuckDB.",
    )
    parser.add_argument("--version", action="version", version=f"libra {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parent = common_options()
    store_commands.register(sub, parent)
    plan_command.register(sub, parent)
    router_command.register(sub, parent)
    simulate_command.register(sub, parent)
    tree_command.register(sub, parent)
    pool_command.register(sub, parent)
    rollout_command.register(sub, parent)
    run_command.register(sub, parent)
    train_command.register(sub, parent)
    dashboard_command.register(sub, parent)
    compare_command.register(sub, parent)
    deploy_command.register(sub, parent)
    return parser


def config_from_args(args: argparse.Namespace) -> LibraConfig:
    from libra.config_loading import load_config

    overrides = {"store.root": args.store} if getattr(args, "store", None) is not None else {}
    return load_config(getattr(args, "config", None), overrides)


def fail(message: str, code: int = 2) -> int:
    print(f"libra: {one_line(message)}", file=sys.stderr, flush=True)
    return code


class _Interrupts:
    """SIGINT handler: the first raises KeyboardInterrupt, as Python's does, once no import is under
    way; the next exits at once. Also the unraisable hook: a KeyboardInterrupt Python had to drop is
    delivered again."""

    def __init__(self) -> None:
        self.seen = 0
        self.redelivered = False  # the next call is this handler's own delivery, not a new Ctrl-C
        self.hook = sys.unraisablehook

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        redelivered, self.redelivered = self.redelivered, False
        if not redelivered:
            self.seen += 1
            if self.seen > 1:
                os.write(2, b"libra: interrupted\n")
                os._exit(130)
        if _importing(frame):
            self.deliver_later()
            return
        raise KeyboardInterrupt

    def unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.deliver_later()  # raised from here, it would be dropped again
            return
        self.hook(unraisable)

    def deliver_later(self) -> None:
        """The same interrupt again in a moment, from another thread, so that it lands once the main
        thread is back in ordinary code."""
        _thread.start_new_thread(self._deliver, ())

    def _deliver(self) -> None:
        time.sleep(0.01)  # (the clock rule's one exception: libra is not imported yet, and must not be from here)
        self.redelivered = True
        _thread.interrupt_main(signal.SIGINT)


def _importing(frame: FrameType | None) -> bool:
    """Whether the interrupted code runs inside an import (the import machinery is on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def main(argv: Sequence[str] | None = None) -> int:
    interrupts = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        interrupts = _Interrupts()
        signal.signal(signal.SIGINT, interrupts)
        sys.unraisablehook = interrupts.unraisable
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except BrokenPipeError:
        # the reader of stdout went away (`libra query ... | head`): stop quietly, and keep Python from
        # complaining when it flushes stdout at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    finally:
        if interrupts is not None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = interrupts.hook


def _main(argv: Sequence[str] | None) -> int:
    from libra.errors import LibraError
    from libra.switches import switch

    args = build_parser().parse_args(argv)
    try:
        debug = switch("LIBRA_DEBUG", False)
    except LibraError as exc:
        return fail(f"error: {exc}")
    try:
        named = getattr(args, "run", None)
        if any(not name.strip() for name in (named if isinstance(named, list) else [named]) if name is not None):
            raise LibraError("--run '' names no run: give a run name, or leave --run out for the default")
        config = config_from_args(args)
        from flows.runtime import quiet_environment

        quiet_environment()  # before a command imports its flow (and with it Prefect and MLflow)
        return args.handler(args, config)
    except LibraError as exc:
        if debug:
            raise
        return fail(f"error: {exc}")
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except OSError as exc:
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        return fail(f"error: {exc.strerror or exc}{where}")
    except MemoryError:
        if debug:
            raise
        return fail("error: out of memory; the input is too large for this machine")


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """The `libra` program: one command, then exit; nothing printed after the command's result (by
    atexit handlers, threads) reaches stdout."""
    from cli import streams

    streams.own_process()
    code = main(argv)
    streams.seal()
    sys.exit(code)


if __name__ == "__main__":
    entry()
