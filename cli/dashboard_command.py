"""`libra dashboard`: parses its flags and serves the read-only dashboard (`dashboards.server`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from libra.config import LibraConfig


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "dashboard", parents=[parent], help="watch runs and compare them in a browser (read-only)",
        description="A read-only web dashboard over the store and MLflow: each run's overview (reward, throughput, "
        "stage seconds, the GPU split and the plans that changed it), trajectories, scheduling and pools, and runs "
        "side by side. Pages of a running training redraw as its steps commit. It listens on 127.0.0.1 unless told "
        "otherwise, and never writes.")
    cmd.add_argument("--run", action="append", default=[], metavar="NAME",
                     help="show only this run (repeatable; default: every run in the store)")
    cmd.add_argument("--host", help="address to listen on (default dashboard.host, 127.0.0.1: this machine only)")
    cmd.add_argument("--port", type=int, help="port (default dashboard.port, 8050; 0: any free port)")
    cmd.set_defaults(handler=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace, config: LibraConfig) -> int:
    from dashboards.server import serve

    def announce(url: str) -> None:
        first = f"{url}runs/{args.run[0]}/overview" if args.run else url
        print(f"Libra dashboard on {first}  (store {config.store.root}; Ctrl-C stops it)", flush=True)
        if not Path(config.store.root).exists():  # (a typo in --store served an empty dashboard without a word)
            print(f"libra: note: no store at {config.store.root} yet (no such directory); the dashboard shows runs "
                  "as they are written there, or pass the store your runs are in (--store DIR)", file=sys.stderr, flush=True)

    serve(config, args.run, args.host, args.port, announce)
    sys.stdout.flush()
    return 0
