"""`libra`: one command, a subcommand per capability, `--help` everywhere.

User mistakes (bad arguments, configs, input files, SQL) print one line, `libra: error: ...`, and
exit with status 2. Heavy imports (Prefect, MLflow) happen inside the subcommands that need them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from cli import (
    plan_command,
    pool_command,
    rollout_command,
    router_command,
    run_command,
    simulate_command,
    store_commands,
    tree_command,
)
from libra import __version__
from libra.config import LibraConfig, load_config
from libra.errors import LibraError

Handler = Callable[[argparse.Namespace, LibraConfig], int]


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--config", metavar="FILE", help="YAML config (default: the embedded defaults, as in configs/default.yaml)")
    parent.add_argument("--store", metavar="DIR", help="store root directory (overrides store.root)")
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    return parser


def config_from_args(args: argparse.Namespace) -> LibraConfig:
    overrides = {"store.root": args.store} if getattr(args, "store", None) else {}
    return load_config(getattr(args, "config", None), overrides)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        handler: Handler = args.handler
        return handler(args, config)
    except LibraError as exc:
        print(f"libra: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("libra: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
