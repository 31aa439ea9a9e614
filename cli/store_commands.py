"""Store subcommands: `traces import`, `query`, `runs`, `schema`, `config`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cli.format import render_table, rows_json
from cli.text import printable
from libra.config import LibraConfig
from libra.config_loading import default_config_yaml
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    traces = sub.add_parser("traces", help="per-turn trace files", description="Work with per-turn trace files.")
    traces_sub = traces.add_subparsers(dest="traces_command", metavar="ACTION", required=True)
    imp = traces_sub.add_parser(
        "import",
        parents=[parent],
        help="import a per-turn trace CSV into the store",
        description="Validate a per-turn trace CSV (format: data/traces/README.md) and write its turns and "
        "trajectories into the store as run NAME. The run appears complete or not at all: nothing is visible "
        "unless the whole file is valid and every shard is written, and an interrupted import leaves the store as "
        "it was. Importing into a run that exists is refused unless --replace is given; then the import "
        "replaces the run whole.",
    )
    imp.add_argument("file", metavar="FILE.csv", help="per-turn trace file")
    imp.add_argument("--run", required=True, help="run name to import into")
    imp.add_argument("--prompts-per-step", type=int, metavar="N", help="prompts per RL step (default: traces.prompts_per_step)")
    imp.add_argument("--replace", action="store_true", help="replace the run whole if it already exists")
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    imp.set_defaults(handler=cmd_traces_import)

    query = sub.add_parser(
        "query",
        parents=[parent],
        help="run read-only DuckDB SQL over a run's store",
        description="Run one DuckDB SELECT over a run's tables (trajectories, turns, steps, plans, pool_events, "
        "timings), or a named query with --named. Prints a table, or JSON rows with --json. Queries only read: "
        "statements that write or change state (COPY, ATTACH, CREATE, INSERT, INSTALL, SET, ...) are refused, "
        "and no file but the store's committed shards can be read.",
    )
    query.add_argument("sql", nargs="?", metavar="SQL", help="the query, e.g. \"select count(*) as n from turns\"")
    query.add_argument("--run", help="run whose tables to expose (default: every run; the run column tells them apart)")
    query.add_argument("--named", metavar="NAME", help="run a named query instead of SQL (see `libra query --list`)")
    query.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="parameter of a named query (repeatable)")
    query.add_argument("--list", action="store_true", help="list the named queries and their parameters")
    query.add_argument("--json", action="store_true", help="print rows as a JSON list of objects")
    query.add_argument("--max-rows", type=int, default=100, metavar="N", help="rows to show in table output (default 100)")
    query.set_defaults(handler=cmd_query)

    runs = sub.add_parser(
        "runs", parents=[parent], help="list the runs in the store",
        description="List the runs in the store whose data is committed (what queries see).",
    )
    runs.add_argument("--json", action="store_true", help="print a JSON list")
    runs.set_defaults(handler=cmd_runs)

    schema = sub.add_parser(
        "schema", parents=[parent], help="describe the store's tables", description="Columns of each table, with units and meaning."
    )
    schema.add_argument("table", nargs="?", help="one table (default: all)")
    schema.set_defaults(handler=cmd_schema)

    config = sub.add_parser(
        "config", parents=[parent], help="print the effective configuration", description="Print the validated configuration as YAML."
    )
    config.set_defaults(handler=cmd_config)


def cmd_traces_import(args: argparse.Namespace, config: LibraConfig) -> int:
    from flows.store import import_trace
    from libra.checks import field_range, in_range
    from libra.config import TracesConfig

    in_range("--prompts-per-step", args.prompts_per_step, *field_range(TracesConfig, "prompts_per_step"))
    prompts_per_step = args.prompts_per_step if args.prompts_per_step is not None else config.traces.prompts_per_step
    from cli.progress import progress

    with progress(f"reading {args.file}", quiet=args.json) as bar:  # a bar on a terminal, for large files
        summary = import_trace(args.file, args.run, config.store, prompts_per_step, replace=args.replace,
                               progress=lambda done, total: bar.update(done / 2**20, total / 2**20, "MiB"))
    if args.json:
        print(json.dumps(summary.__dict__))
    else:
        replaced = ", replacing the previous import" if summary.replaced else ""
        print(
            f"imported {summary.turns} turns of {summary.trajectories} trajectories from {summary.path} "
            f"into run {summary.run!r} ({summary.steps} steps, {summary.shards} shards, store {config.store.root}{replaced})"
        )
    return 0


def _parse_params(pairs: list[str]) -> dict[str, int]:
    params: dict[str, int] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LibraError(f"--param {pair!r}: write KEY=VALUE, e.g. --param last_steps=10")
        try:
            params[key] = int(value)
        except ValueError:
            raise LibraError(f"--param {pair!r}: the value must be an integer") from None
    return params


def cmd_query(args: argparse.Namespace, config: LibraConfig) -> int:
    from flows.store import named_queries, open_catalog, query

    if args.list:
        for named in named_queries():
            params = ", ".join(f"{k}={v}" for k, v in named.defaults.items()) or "no parameters"
            print(f"{named.name} ({params})\n    {named.doc}")
        return 0
    if (args.sql is None) == (args.named is None):
        raise LibraError("give either SQL or --named NAME (see `libra query --help`)")
    if args.param and args.named is None:
        raise LibraError("--param only applies to --named queries")
    if not 0 <= args.max_rows <= 10**9:
        raise LibraError(f"--max-rows must be 0 to 1,000,000,000 (rows shown in table output), got {args.max_rows}")
    if not Path(config.store.root).exists():  # (a typo in --store had answered every query with no rows)
        raise LibraError(f"no store at {config.store.root} (no such directory), so nothing to query; pass the store a "
                         "run was written to (--store DIR, or store.root in --config)")
    with open_catalog(config.store, args.run) as catalog:
        table = query(catalog, args.sql, args.named, _parse_params(args.param) if args.named is not None else None)
    print(rows_json(table) if args.json else render_table(table, max_rows=args.max_rows))
    return 0


def cmd_runs(args: argparse.Namespace, config: LibraConfig) -> int:
    from flows.store import runs as store_runs

    runs, hidden, unreadable = store_runs(config.store)
    if hidden:
        print(f"libra: note: not listed, no committed import: {', '.join(map(printable, hidden))} (an import still running or killed, "
              "or written before run manifests; import again to use)", file=sys.stderr)
    for why in unreadable.values():
        print(f"libra: note: listed but cannot be read: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(runs))
    elif runs:
        print("\n".join(map(printable, runs)))
    else:
        absent = "" if Path(config.store.root).exists() else ": no such directory"
        print(f"(no runs in store {config.store.root}{absent})")
    return 0


def cmd_schema(args: argparse.Namespace, config: LibraConfig) -> int:
    from flows.store import tables

    known = tables()
    if args.table is not None and args.table not in known:
        raise LibraError(f"no table {args.table!r}; tables: {', '.join(known)}")
    for schema in known.values():
        if args.table not in (None, schema.name):
            continue
        print(f"{schema.name} (v{schema.version}): {schema.doc}")
        for column in schema.columns:
            unit = f" [{column.unit}]" if column.unit else ""
            required = "" if column.nullable else " (required)"
            print(f"  {column.name:<22} {str(column.type):<8} {column.doc}{unit}{required}")
        print()
    return 0


def cmd_config(args: argparse.Namespace, config: LibraConfig) -> int:
    import yaml

    print(yaml.safe_dump(config.model_dump(), sort_keys=False), end="")
    return 0


__all__ = ["register", "default_config_yaml"]
