"""`libra tree`: parses its flags and calls the tree flow (`flows/routing.py`), which rebuilds the causal
prefix tree from a run's store and saves it."""

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
    from cli.flow_call import run_flow
    from cli.streams import json_stdout
    from flows.routing import tree_flow, tree_request
    from flows.store import require_run
    from libra.checks import as_flag

    request = tree_request(args.run, args.out, args.last_steps, args.granularity, names=as_flag)
    require_run(config.store, request.run)  # before the flow's runtime creates anything
    with json_stdout(args.json) as out:
        summary = run_flow(tree_flow, config, tracking=False, run=request.run, out=request.out,
                           last_steps=request.last_steps, granularity=request.granularity)
        print(json.dumps(summary) if args.json else
              f"saved a {summary['nodes']:,}-node tree ({summary['roots']:,} roots) from {summary['trajectories']:,} "
              f"trajectories and {summary['tool_returns']:,} tool returns of run {summary['run']!r} to {summary['out']}",
              file=out)
    return 0
