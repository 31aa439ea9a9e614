"""Synthetic, schema-valid store rows for benchmarks and crash tests (vectorised with numpy).

Trajectories have `turns_per_trajectory` turns; generated and payload tokens are drawn from
log-normal distributions with a fixed seed, so the same arguments always give the same table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.schemas import TRAJECTORIES, TURNS

TOOLS = pa.array(["search", "python", "bash:cat", "bash:grep", "bash:python"])
STATUSES = pa.array(["ok"] * 8 + ["error", "timeout"])
PROMPT_TOKENS = 256
SAMPLES_PER_PROMPT = 16


def _labels(prefix: str, numbers: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pa.array(numbers).cast(pa.string()), "")


def synthetic_turns(run: str, step: int, rows: int, turns_per_trajectory: int = 20, seed: int = 0) -> pa.Table:
    """`rows` turn rows of step `step` (the last trajectory may be cut short)."""
    rng = np.random.default_rng([seed, step])
    index = np.arange(rows)
    turn_idx = (index % turns_per_trajectory).astype(np.int32)
    trajectory = index // turns_per_trajectory
    gen = np.rint(rng.lognormal(5.0, 1.0, rows)).astype(np.int64)
    payload = np.rint(rng.lognormal(4.5, 1.5, rows)).astype(np.int64)
    is_final = (turn_idx == turns_per_trajectory - 1) | (index == rows - 1)
    payload[is_final] = 0
    before = np.cumsum(gen + payload) - (gen + payload)  # tokens before each turn, whole table
    context = PROMPT_TOKENS + before - before[trajectory * turns_per_trajectory]
    final = pa.array(is_final)
    columns = {
        "run": pa.array(np.full(rows, run)),
        "step": pa.array(np.full(rows, step, dtype=np.int64)),
        "trajectory_id": _labels(f"s{step}-t", trajectory),
        "prompt_id": _labels(f"s{step}-p", trajectory // SAMPLES_PER_PROMPT),
        "sample_id": pa.array(trajectory % SAMPLES_PER_PROMPT).cast(pa.string()),
        "turn_idx": pa.array(turn_idx),
        "context_tokens": pa.array(context),
        "gen_tokens": pa.array(gen),
        "tool_name": pc.if_else(final, "none", TOOLS.take(rng.integers(0, len(TOOLS), rows))),
        "tool_payload_tokens": pa.array(payload),
        "tool_status": pc.if_else(final, "none", STATUSES.take(rng.integers(0, len(STATUSES), rows))),
        "is_final": final,
    }
    return pa.Table.from_arrays(
        [columns[f.name] if f.name in columns else pa.nulls(rows, f.type) for f in TURNS.arrow], schema=TURNS.arrow
    )


def trajectories_of(turns: pa.Table) -> pa.Table:
    """The `trajectories` rows that summarise a turns table (one run, one step or many)."""
    grouped = turns.group_by(["run", "step", "trajectory_id", "prompt_id", "sample_id"], use_threads=False).aggregate(
        [
            ("gen_tokens", "sum"),
            ("tool_payload_tokens", "sum"),
            ("turn_idx", "count"),
            ("context_tokens", "min"),
        ]
    )
    n = grouped.num_rows
    turns_count = grouped.column("turn_idx_count").cast(pa.int32())
    gen = grouped.column("gen_tokens_sum")
    payload = grouped.column("tool_payload_tokens_sum")
    prompt = grouped.column("context_tokens_min")
    columns = {
        "run": grouped.column("run"),
        "step": grouped.column("step"),
        "trajectory_id": grouped.column("trajectory_id"),
        "prompt_id": grouped.column("prompt_id"),
        "sample_id": grouped.column("sample_id"),
        "source": pa.array(["synthetic"] * n),
        "prompt_tokens": prompt,
        "gen_tokens": gen,
        "tool_payload_tokens": payload,
        "total_tokens": pc.add(pc.add(prompt, gen), payload),
        "num_turns": turns_count,
        "num_tool_calls": pc.subtract(turns_count, pa.scalar(1, pa.int32())),
    }
    return pa.Table.from_arrays(
        [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in TRAJECTORIES.arrow],
        schema=TRAJECTORIES.arrow,
    )
