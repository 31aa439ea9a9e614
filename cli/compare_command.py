"""`libra compare`: training runs of one MLflow experiment side by side (`dashboards.compare`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from libra.config import LibraConfig
from libra.errors import LibraError


def register(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "compare", parents=[parent], help="compare training runs side by side",
        description="Training runs of one MLflow experiment side by side: generated tokens per second of training "
        "time (planning and moves included, held-out evaluation left out), the time to a held-out reward, the plans "
        "applied and the workers moved. Run the same steps and seeds under each placement "
        "strategy (`libra train --placement libra|static|colocated --run NAME`), then compare them.")
    cmd.add_argument("--experiment", help="MLflow experiment (default: the training experiment of trainer.env, "
                     "e.g. libra-train-math)")
    cmd.add_argument("--run", action="append", default=[], metavar="NAME", help="only this run (repeatable)")
    cmd.add_argument("--target", type=float, help="held-out reward to time (default: the best every run reached)")
    cmd.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmd.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace, config: LibraConfig) -> int:
    from cli.streams import json_stdout
    from dashboards.compare import compare, read_runs
    from flows.runtime import allow_file_store, store_error
    from libra.checks import in_range
    from libra.config_loading import tracking_uri_in_use

    in_range("--target", args.target, 0.0, 1.0)  # a held-out reward
    if args.experiment is not None and not args.experiment.strip():
        raise LibraError("--experiment '' names no experiment: give one, or leave it out for this config's training runs")
    experiment = args.experiment or config.train_experiment
    uri = tracking_uri_in_use(config)  # where train and simulate log (MLFLOW_TRACKING_URI, if set)
    with json_stdout(args.json) as out:
        allow_file_store(uri)
        try:
            histories = read_runs(uri, experiment, args.run)
        except LookupError as exc:
            raise LibraError(f"{exc}; train runs with `libra train` first, or name another --experiment") from None
        except LibraError:
            raise
        except Exception as exc:  # not MLflow's store (a file that is not its database, a file as a directory)
            raise store_error(uri, exc) from None
        result = compare(histories, args.target)
        if args.json:
            print(json.dumps({"experiment": experiment, "target": result.target,
                              "runs": [json_row(r) for r in result.rows]}), file=out)
        else:
            print(render(experiment, result), file=out)
    return 0


def json_row(row) -> dict:
    """A row as the JSON output has it: the placement strategy under its key `policy`."""
    return {("policy" if k == "strategy" else k): v for k, v in asdict(row).items()}


def render(experiment: str, result) -> str:
    import pyarrow as pa

    from cli.format import render_table

    base = result.rows[0].tokens_per_s if result.rows else 0.0
    table = pa.Table.from_pylist([
        {"run": r.run, "policy": r.strategy, "steps": r.steps, "tokens/s": round(r.tokens_per_s, 1),
         "vs fastest": round(r.tokens_per_s / base, 3) if base else None, "train time s": round(r.train_time_s, 1),
         "held-out final": r.heldout_final,
         "time to target s": None if r.time_to_target_s is None else round(r.time_to_target_s, 1),
         "plans applied": r.plans_applied, "workers moved": r.workers_moved,
         "rollout workers": None if r.rollout_workers_mean is None else round(r.rollout_workers_mean, 2)}
        for r in result.rows])
    target = "none (a run has no held-out reward)" if result.target is None else f"{result.target:g}"
    return f"experiment {experiment}; held-out reward target {target}\n{render_table(table)}"
