"""Importing per-turn trace files into the store.

The whole file is parsed and validated before anything is written (see `libra.traces`), so a
malformed file writes nothing. Steps follow RL order (`prompts_per_step` prompts per step, each
with all its samples); each step's shards replace that step's earlier ones, so importing the same
file into the same run twice leaves the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libra.config import StoreConfig
from libra.traces import read_trace, steps_by_prompt
from storage.records import trajectories_table, turns_table
from storage.writer import StoreWriter, check_run_name


@dataclass(frozen=True)
class ImportSummary:
    run: str
    path: str
    trajectories: int
    turns: int
    steps: int
    shards: int


def writer_for(store: StoreConfig, root: str | Path | None = None) -> StoreWriter:
    return StoreWriter(
        root or store.root, compression=store.compression, row_group_rows=store.row_group_rows, fsync=store.fsync
    )


def import_trace(
    path: str | Path, run: str, store: StoreConfig, prompts_per_step: int, root: str | Path | None = None
) -> ImportSummary:
    check_run_name(run)
    trace = read_trace(path)
    step_of = steps_by_prompt(trace.trajectories, prompts_per_step)
    trajectories = trajectories_table(run, trace.trajectories, step_of)
    turns = turns_table(run, trace.trajectories, step_of)
    writer = writer_for(store, root)
    shards = writer.write_run("turns", run, turns)
    shards += writer.write_run("trajectories", run, trajectories)
    return ImportSummary(
        run=run,
        path=str(path),
        trajectories=len(trace.trajectories),
        turns=trace.rows,
        steps=len(set(step_of.values())),
        shards=len(shards),
    )
