"""`libra tree`: rebuild the causal prefix tree from a run's store and save it."""

from __future__ import annotations

import argparse
import json

from libra.config import LibraConfig


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "tree",
        parents=[parent],
        help="rebuild the causal prefix tree from a run's store and save it",
        description="Read the run's trajectories and tool returns (named query remaining_length_paths) from the "
        "store, insert them into a causal prefix tree (scheduler settings: payload classes, window, node bound) and "
        "save it atomically as JSON, ready for a router to load.",
    )
    cmd.add_argument("--run", required=True, help="run in the store")
    cmd.add_argument("--out", required=True, metavar="FILE.json", help="where to save the tree")
    cmd.add_argument("--last-steps", type=int, default=0, metavar="N", help="only the last N steps (default: all)")
    cmd.add_argument("--granularity", choices=["fine", "coarse"], default="coarse", help="tool names as recorded or by family")
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON")
    cmd.set_defaults(handler=cmd_tree)


def cmd_tree(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout
    from libra.checks import in_range
    from libra.errors import LibraError
    from libra.scheduler.causal_tree import GLOBAL, CausalTree, paths_from_rows
    from libra.scheduler.keys import KeyScheme
    from storage.catalog import Catalog
    from storage.queries import run_named

    in_range("--last-steps", args.last_steps, 0, 1_000_000_000)
    s = config.scheduler
    with json_stdout(args.json) as out:
        with Catalog(config.store.root, args.run, threads=config.store.duckdb_threads) as catalog:
            rows = run_named(catalog, "trajectory_lengths", last_steps=args.last_steps).to_pylist()
            returns = run_named(catalog, "remaining_length_paths", last_steps=args.last_steps).to_pylist()
        tree = CausalTree(KeyScheme(args.granularity, tuple(s.payload_bounds)), s.window, s.max_nodes, size_roots=True)
        tree.rebuild(paths_from_rows(rows, returns))
        try:
            tree.save(args.out)
        except OSError as exc:
            raise LibraError(f"cannot write {args.out}: {exc.strerror}") from None
        summary = {"run": args.run, "out": args.out, "trajectories": len(rows), "tool_returns": len(returns),
                   "nodes": tree.nodes, "roots": len(tree.roots), "global_root_samples": tree.roots[GLOBAL].count}
        print(json.dumps(summary) if args.json else
              f"saved a {tree.nodes:,}-node tree ({len(tree.roots):,} roots) from {len(rows):,} trajectories and "
              f"{len(returns):,} tool returns of run {args.run!r} to {args.out}", file=out)
    return 0
