"""Conversion of `libra.types` records into Arrow tables of the store's schemas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from libra.types import NO_TOOL, Trajectory
from storage.schemas import TRAJECTORIES, TURNS


def trajectories_table(run: str, trajectories: Sequence[Trajectory], step_of: Mapping[str, int]) -> pa.Table:
    """One row per trajectory; `step_of` maps a prompt id to its RL step."""
    columns = {
        "run": [run] * len(trajectories),
        "step": [step_of[t.prompt_id] for t in trajectories],
        "trajectory_id": [t.trajectory_id for t in trajectories],
        "prompt_id": [t.prompt_id for t in trajectories],
        "sample_id": [t.sample_id for t in trajectories],
        "source": [t.source for t in trajectories],
        "prompt_tokens": [t.prompt_tokens for t in trajectories],
        "gen_tokens": [t.gen_tokens for t in trajectories],
        "tool_payload_tokens": [t.tool_payload_tokens for t in trajectories],
        "total_tokens": [t.total_tokens for t in trajectories],
        "num_turns": [len(t.turns) for t in trajectories],
        "num_tool_calls": [t.num_tool_calls for t in trajectories],
        "reward": [t.reward for t in trajectories],
    }
    return _table(TRAJECTORIES.arrow, columns)


def turns_table(run: str, trajectories: Sequence[Trajectory], step_of: Mapping[str, int]) -> pa.Table:
    """One row per turn of every trajectory, in trajectory then turn order."""
    turns = [(step_of[t.prompt_id], turn, i == len(t.turns) - 1) for t in trajectories for i, turn in enumerate(t.turns)]
    columns = {
        "run": [run] * len(turns),
        "step": [s for s, _, _ in turns],
        "trajectory_id": [u.trajectory_id for _, u, _ in turns],
        "prompt_id": [u.prompt_id for _, u, _ in turns],
        "sample_id": [u.sample_id for _, u, _ in turns],
        "turn_idx": [u.turn_idx for _, u, _ in turns],
        "context_tokens": [u.context_tokens for _, u, _ in turns],
        "gen_tokens": [u.gen_tokens for _, u, _ in turns],
        "tool_name": [u.tool_name for _, u, _ in turns],
        "tool_payload_tokens": [u.tool_payload_tokens for _, u, _ in turns],
        "tool_status": [u.tool_status.value for _, u, _ in turns],
        "is_final": [final for _, _, final in turns],
    }
    assert all(u.tool_name == NO_TOOL or u.tool_status.value != "none" for _, u, _ in turns)
    return _table(TURNS.arrow, columns)


def _table(schema: pa.Schema, columns: dict[str, list]) -> pa.Table:
    arrays = [
        pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(len(columns["run"]), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def rollout_tables(run: str, step: int, result, model_version: int) -> tuple[pa.Table, pa.Table]:
    """(trajectories, turns) tables of a live rollout (`libra.rollout.agent.RolloutResult`), with
    the instance, bucket, migration, latencies and model version of every turn."""
    runs = result.trajectories
    trajectories = {
        "run": [run] * len(runs), "step": [step] * len(runs),
        "trajectory_id": [r.trajectory_id for r in runs], "prompt_id": [r.prompt_id for r in runs],
        "sample_id": [r.sample_id for r in runs], "source": [r.task.env for r in runs],
        "prompt_tokens": [r.prompt_tokens for r in runs], "gen_tokens": [r.generated_tokens for r in runs],
        "tool_payload_tokens": [sum(t.tool_payload_tokens for t in r.turns) for r in runs],
        "total_tokens": [len(r.ids) for r in runs], "num_turns": [len(r.turns) for r in runs],
        "num_tool_calls": [sum(t.tool_name != NO_TOOL for t in r.turns) for r in runs],
        "reward": [r.reward for r in runs], "model_version": [model_version] * len(runs),
        "rollout_s": [r.finished - r.started for r in runs],
    }
    turns = [(r, t, i == len(r.turns) - 1) for r in runs for i, t in enumerate(r.turns)]
    columns = {
        "run": [run] * len(turns), "step": [step] * len(turns),
        "trajectory_id": [r.trajectory_id for r, _, _ in turns], "prompt_id": [r.prompt_id for r, _, _ in turns],
        "sample_id": [r.sample_id for r, _, _ in turns], "turn_idx": [t.turn_idx for _, t, _ in turns],
        "context_tokens": [t.context_tokens for _, t, _ in turns], "gen_tokens": [t.gen_tokens for _, t, _ in turns],
        "tool_name": [t.tool_name for _, t, _ in turns], "tool_payload_tokens": [t.tool_payload_tokens for _, t, _ in turns],
        "tool_status": [t.tool_status for _, t, _ in turns], "is_final": [final for _, _, final in turns],
        "instance": [str(t.instance) for _, t, _ in turns], "bucket": [t.bucket for _, t, _ in turns],
        "migrated": [t.migrated for _, t, _ in turns], "gen_latency_s": [t.gen_latency_s for _, t, _ in turns],
        "tool_latency_s": [t.tool_latency_s for _, t, _ in turns], "model_version": [model_version] * len(turns),
    }
    return _table(TRAJECTORIES.arrow, trajectories), _table(TURNS.arrow, columns)
