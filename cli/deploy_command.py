"""`libra deploy`: register Libra's flows as deployments on a Prefect server's process work pool
(`flows/deployments.py` says which, with what defaults, and how to run them)."""

from __future__ import annotations

import argparse
import json

from libra.config import LibraConfig
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "deploy", parents=[parent], help="register the flows as Prefect deployments on a process work pool",
        description="Register Libra's flows (training, planning, simulation, trace analysis, rollout, pool) as "
        "deployments on the Prefect server PREFECT_API_URL names, on a process work pool (created when missing). "
        "Then `prefect worker start --pool POOL` runs them and `prefect deployment run 'libra-train/demo' --param "
        "steps=3` starts a training run that lands in the same store and MLflow as `libra train`.")
    cmd.add_argument("--pool", default="libra", help="process work pool (default libra)")
    cmd.add_argument("--only", metavar="NAME,...", help="only these deployments (FLOW/NAME, e.g. libra-train/demo)")
    cmd.add_argument("--json", action="store_true", help="print the deployments' names as JSON")
    cmd.set_defaults(handler=cmd_deploy)


def cmd_deploy(args: argparse.Namespace, config: LibraConfig) -> int:
    import contextlib
    import io

    from cli.streams import json_stdout
    from flows.deployments import DEPLOYMENTS, deploy, server_url
    from flows.runtime import prepare_runtime

    specs = DEPLOYMENTS
    if args.only:  # refused before the runtime creates Prefect's folder
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        known = {f"{spec.flow_name}/{spec.name}": spec for spec in DEPLOYMENTS}
        unknown = sorted(wanted - set(known))
        if unknown or not wanted:
            raise LibraError(f"--only: unknown deployments {', '.join(unknown) or '(none given)'}; known: "
                             f"{', '.join(known)}")
        specs = tuple(spec for name, spec in known.items() if name in wanted)
    prepare_runtime(config, tracking=False)
    url = server_url()
    with json_stdout(args.json) as out:
        with contextlib.redirect_stdout(io.StringIO()):  # Prefect prints a table per deployment
            names = deploy(specs, args.pool)
        if args.json:
            print(json.dumps({"server": url, "work_pool": args.pool, "deployments": names}), file=out)
        else:
            print("\n".join([f"{len(names)} deployment(s) on {url}, work pool {args.pool!r}:", *names,
                             f"start a worker: prefect worker start --pool {args.pool}",
                             f"run one:        prefect deployment run '{names[0]}' --watch"]), file=out)
    return 0
