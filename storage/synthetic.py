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


def synthetic_turns(run: str, step: int, rows: int, turns_per_trajectory: int = 20, seed: int = 0,
                    routed: int = 0) -> pa.Table:
    """`rows` turn rows of step `step` (the last trajectory may be cut short). With `routed` > 0 the
    turns also carry what a routed rollout records: an instance and a bucket out of `routed` (a
    trajectory moves up a bucket with probability 0.1 at each turn; a move is a migration), the
    generation seconds (20 ms a token) and the tool seconds (log-normal), and the model version
    (the step)."""
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
    if routed:
        up = (rng.random(rows) < 0.1) & (turn_idx > 0)
        climbed = np.cumsum(up) - np.cumsum(up)[trajectory * turns_per_trajectory]
        bucket = np.minimum(trajectory % routed + climbed, routed - 1).astype(np.int32)
        moved = np.zeros(rows, dtype=bool)
        moved[1:] = (bucket[1:] != bucket[:-1]) & (turn_idx[1:] > 0)
        columns |= {"instance": pa.array(bucket).cast(pa.string()), "bucket": pa.array(bucket), "migrated": pa.array(moved),
                    "gen_latency_s": pa.array(gen * 0.02), "tool_latency_s": pa.array(np.where(is_final, 0.0, rng.lognormal(-1.0, 1.0, rows))),
                    "model_version": pa.array(np.full(rows, step, dtype=np.int64))}
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
