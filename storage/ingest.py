"""Importing per-turn trace files into the store: all or nothing, one run at a time.

The whole file is parsed and validated before anything is written (see `libra.traces`), so a
malformed file writes nothing. Steps follow RL order (`prompts_per_step` prompts per step, each
with all its samples). The turns and trajectories of every step are then staged and published by
one commit (`StoreWriter.transaction`): the run appears complete or not at all, and an import that
is killed leaves the run as it was (absent if new, the previous import otherwise).

An import creates a run: into a run that exists it is refused (`RunExistsError`, which says to
pass --replace) unless `replace` is given, and then it replaces the run whole, so re-importing
with another `prompts_per_step` or another file leaves exactly the new rows; or `refresh` is given,
and then it replaces only an earlier import of a file of the same name (the trace-analysis flow run
again), never a run something else wrote. An import does not
wait for another writer of the same run: it is refused at once (`RunLockedError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libra.config import StoreConfig
from libra.traces import ReadProgress, read_trace, steps_by_prompt
from storage.manifest import (
    IMPORT_ORIGIN,
    ManifestUnreadable,
    RunExistsError,
    RunManifest,
    check_store_root,
    import_origin,
    read_manifest,
)
from storage.records import trajectories_table, turns_table
from storage.writer import (
    StoreWriter,
    check_run_name,
    other_origin_error,
    run_exists_error,
    written_by,
)


@dataclass(frozen=True)
class ImportSummary:
    run: str
    path: str
    trajectories: int
    turns: int
    steps: int
    shards: int
    replaced: bool  # whether the import replaced an existing run


def writer_for(store: StoreConfig, root: str | Path | None = None) -> StoreWriter:
    return StoreWriter(
        root or store.root, compression=store.compression, row_group_rows=store.row_group_rows, fsync=store.fsync
    )


def import_trace(
    path: str | Path,
    run: str,
    store: StoreConfig,
    prompts_per_step: int,
    root: str | Path | None = None,
    *,
    replace: bool = False,
    refresh: bool = False,
    progress: ReadProgress | None = None,  # hears the bytes of the file read so far (libra.traces.read_trace)
) -> ImportSummary:
    """Import the trace at `path` as the store run `run`. A run of that name is refused, unless
    `replace` (an earlier import is replaced whole, whatever file it was of) or `refresh` (it is
    replaced only where it is an earlier import of a file of the same name, as a flow that imports
    its traces again leaves it). A run of another kind (a training run, a simulation) is never
    replaced: a training run's checkpoints would be left without their run, never to resume."""
    check_run_name(run)
    writer = writer_for(store, root)
    name = Path(path).name
    check_store_root(writer.root)
    try:  # fail before parsing; checked again under the lock
        existing = read_manifest(writer.root, run)
    except ManifestUnreadable:
        if not replace:  # its origin is unknown; replaced whole, it is not read
            raise
        existing = None
    if (refusal := _refusal(writer.root, existing, name, replace, refresh)) is not None:
        raise refusal
    trace = read_trace(path, progress=progress)
    step_of = steps_by_prompt(trace.trajectories, prompts_per_step)
    trajectories = trajectories_table(run, trace.trajectories, step_of)
    turns = turns_table(run, trace.trajectories, step_of)
    origin = f"{import_origin(name)}prompts_per_step={prompts_per_step}"
    mode = "replace" if replace or refresh else "create"
    with writer.transaction(run, mode=mode, origin=origin, wait_s=0) as tx:
        if (refusal := _refusal(writer.root, tx.base, name, replace, refresh)) is not None:
            raise refusal
        shards = tx.write_run("turns", turns)
        shards += tx.write_run("trajectories", trajectories)
        replaced = tx.base is not None
    return ImportSummary(
        run=run,
        path=str(path),
        trajectories=len(trace.trajectories),
        turns=trace.rows,
        steps=len(set(step_of.values())),
        shards=len(shards),
        replaced=replaced,
    )


def _refusal(root: Path, existing: RunManifest | None, name: str, replace: bool, refresh: bool) -> RunExistsError | None:
    """Why an import of the file `name` may not write over the run `existing` (None: it may): a run
    another writer made, ever; with `refresh`, an import of another file; without either, any run."""
    if existing is None:
        return None
    if not written_by(existing, IMPORT_ORIGIN):
        return other_origin_error(root, existing, "an import of a trace", _only_imports(name))
    if replace:
        return None
    if refresh:
        return None if written_by(existing, import_origin(name)) else \
            other_origin_error(root, existing, f"an import of {name}", _rename_hint(name))
    return run_exists_error(root, existing)


def _only_imports(name: str) -> str:
    return f"--replace replaces only an import; import {name} under another run name (--run NAME)"


def _rename_hint(name: str) -> str:
    return f"rename the trace file, or import it under another run name with `libra traces import {name} --run NAME`"
