"""Conversion of `libra.types` records (imported traces and live rollouts alike) into Arrow tables
of the store's schemas."""

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
        "model_version": [t.model_version for t in trajectories],
        "rollout_s": [t.rollout_s for t in trajectories],
        "category": [t.category for t in trajectories],
        "outcome": [t.outcome for t in trajectories],
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
        **{name: [getattr(u, name) for _, u, _ in turns]
           for name in ("instance", "bucket", "migrated", "gen_latency_s", "tool_latency_s", "model_version")},
    }
    assert all(u.tool_name == NO_TOOL or u.tool_status.value != "none" for _, u, _ in turns)
    return _table(TURNS.arrow, columns)


def _table(schema: pa.Schema, columns: dict[str, list]) -> pa.Table:
    arrays = [
        pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(len(columns["run"]), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)
