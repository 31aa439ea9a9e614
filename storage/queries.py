"""Named queries over a catalog: the questions the planner, the tree rebuild and dashboards ask.

Each is plain SQL with `$name` parameters, kept here so that `libra query --named NAME` and the
Python callers run exactly the same text. "Recent" means the last `last_steps` steps of the run
(all steps when `last_steps` is 0).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from libra.errors import LibraError
from storage.catalog import Catalog


@dataclass(frozen=True)
class NamedQuery:
    name: str
    doc: str
    sql: str
    defaults: dict[str, Any] = field(default_factory=dict)  # every parameter with its default


def _recent(table: str, condition: str = "TRUE") -> str:
    """CTEs `recent_steps` and `recent`: the rows of `table` in the last `$last_steps` steps (all when 0)
    that satisfy `condition`."""
    return f"""
    recent_steps AS (
        SELECT max(step) - $last_steps AS after FROM {table}
    ),
    recent AS (
        SELECT t.* FROM {table} t, recent_steps r
        WHERE ($last_steps = 0 OR t.step > r.after) AND ({condition})
    )"""

LENGTH_HISTOGRAM = NamedQuery(
    "length_histogram",
    "Histogram of trajectory length (total tokens) over the recent steps: one row per bin of "
    "`bin_tokens` tokens (0 = pick a width giving about `bins` bins), with the mean prompt, "
    "generated and tool-payload tokens of the trajectories in each bin.",
    f"""
    WITH {_recent("trajectories")},
    width AS (
        SELECT CASE WHEN $bin_tokens > 0 THEN $bin_tokens
                    ELSE greatest(1, ceil((max(total_tokens) + 1) / $bins))::BIGINT END AS w
        FROM recent
    )
    SELECT (total_tokens // w) * w AS lo_tokens,
           (total_tokens // w) * w + w AS hi_tokens,
           count(*) AS trajectories,
           avg(prompt_tokens) AS prompt_tokens_mean,
           avg(gen_tokens) AS gen_tokens_mean,
           avg(tool_payload_tokens) AS tool_payload_tokens_mean
    FROM recent, width
    GROUP BY ALL
    ORDER BY lo_tokens
    """,
    {"last_steps": 0, "bin_tokens": 0, "bins": 20},
)

REMAINING_LENGTH_PATHS = NamedQuery(
    "remaining_length_paths",
    "One row per tool return over the recent steps: the return (tool, payload tokens, status), the "
    "position in tokens after it, and the remaining tokens the trajectory then generated or received "
    "(output and tool feedback after this return). Rows come in no particular order; sort by "
    "(trajectory_id, turn_idx) to walk a path. The causal tree is rebuilt from these rows.",
    f"""
    WITH {_recent("turns")},
    final AS (
        SELECT step, trajectory_id, context_tokens + gen_tokens + tool_payload_tokens AS total_tokens
        FROM recent WHERE is_final
    )
    SELECT u.step, u.trajectory_id, u.prompt_id, u.turn_idx, u.tool_name, u.tool_status, u.tool_payload_tokens,
           u.context_tokens + u.gen_tokens + u.tool_payload_tokens AS position_tokens,
           f.total_tokens - (u.context_tokens + u.gen_tokens + u.tool_payload_tokens) AS remaining_tokens
    FROM recent u JOIN final f USING (step, trajectory_id)
    WHERE NOT u.is_final
    """,
    {"last_steps": 0},
)

TOOL_STATISTICS = NamedQuery(
    "tool_statistics",
    "Per tool over the recent steps: calls, trajectories using it, error and timeout rates, tool "
    "payload size (mean, p50, p90, max), tokens generated before the call and tool latency.",
    f"""
    WITH {_recent("turns", "t.tool_name <> 'none'")}
    SELECT tool_name,
           count(*) AS calls,
           count(DISTINCT trajectory_id) AS trajectories,
           avg(CASE WHEN tool_status = 'error' THEN 1.0 ELSE 0.0 END) AS error_rate,
           avg(CASE WHEN tool_status = 'timeout' THEN 1.0 ELSE 0.0 END) AS timeout_rate,
           avg(tool_payload_tokens) AS payload_tokens_mean,
           quantile_cont(tool_payload_tokens, 0.5) AS payload_tokens_p50,
           quantile_cont(tool_payload_tokens, 0.9) AS payload_tokens_p90,
           max(tool_payload_tokens) AS payload_tokens_max,
           avg(gen_tokens) AS gen_tokens_mean,
           avg(tool_latency_s) AS tool_latency_s_mean
    FROM recent
    GROUP BY tool_name
    ORDER BY calls DESC, tool_name
    """,
    {"last_steps": 0},
)

PER_STEP_DRIFT = NamedQuery(
    "per_step_drift",
    "Per step: trajectories, total-token mean/p50/p90/max, generated tokens, turns and tool calls "
    "per trajectory, mean reward, and the mean length relative to the previous and the first step.",
    """
    WITH per_step AS (
        SELECT step,
               count(*) AS trajectories,
               avg(total_tokens) AS total_tokens_mean,
               quantile_cont(total_tokens, 0.5) AS total_tokens_p50,
               quantile_cont(total_tokens, 0.9) AS total_tokens_p90,
               max(total_tokens) AS total_tokens_max,
               avg(gen_tokens) AS gen_tokens_mean,
               avg(num_turns) AS turns_mean,
               avg(num_tool_calls) AS tool_calls_mean,
               avg(reward) AS reward_mean
        FROM trajectories
        GROUP BY step
    )
    SELECT *,
           total_tokens_mean / lag(total_tokens_mean) OVER (ORDER BY step) AS length_vs_previous,
           total_tokens_mean / first_value(total_tokens_mean) OVER (ORDER BY step) AS length_vs_first
    FROM per_step
    ORDER BY step
    """,
    {},
)

RUN_SUMMARY = NamedQuery(
    "run_summary",
    "One row for the whole run: steps, trajectories, turns, total-token p50/p90/p99 and mean, turns "
    "per trajectory (p50), tool calls per trajectory, tool error rate and mean reward.",
    """
    WITH t AS (
        SELECT count(DISTINCT step) AS steps,
               count(*) AS trajectories,
               sum(num_turns) AS turns,
               avg(total_tokens) AS total_tokens_mean,
               quantile_cont(total_tokens, 0.5) AS total_tokens_p50,
               quantile_cont(total_tokens, 0.9) AS total_tokens_p90,
               quantile_cont(total_tokens, 0.99) AS total_tokens_p99,
               quantile_cont(num_turns, 0.5) AS turns_p50,
               avg(num_tool_calls) AS tool_calls_mean,
               avg(reward) AS reward_mean
        FROM trajectories
    ),
    u AS (
        SELECT avg(CASE WHEN tool_status = 'error' THEN 1.0 ELSE 0.0 END) AS tool_error_rate
        FROM turns WHERE tool_name <> 'none'
    )
    SELECT * FROM t, u
    """,
    {},
)

TRAJECTORY_LENGTHS = NamedQuery(
    "trajectory_lengths",
    "One row per trajectory over the recent steps with what the planner needs: prompt, generated "
    "and tool-payload tokens, turns, and the wall time its tool calls took (0 when not recorded).",
    f"""
    WITH {_recent("trajectories")},
    tool_time AS (
        SELECT step, trajectory_id, coalesce(sum(tool_latency_s), 0.0) AS tool_time_s
        FROM turns GROUP BY step, trajectory_id
    )
    SELECT r.step, r.trajectory_id, r.prompt_id, r.prompt_tokens, r.gen_tokens, r.tool_payload_tokens, r.num_turns,
           coalesce(tt.tool_time_s, 0.0) AS tool_time_s
    FROM recent r LEFT JOIN tool_time tt USING (step, trajectory_id)
    ORDER BY r.step, r.trajectory_id
    """,
    {"last_steps": 0},
)

TIMING_SAMPLES = NamedQuery(
    "timing_samples",
    "Measured timing samples (training steps, decode steps, prefills) over the recent steps, for "
    "calibrating the cost model.",
    f"""
    WITH {_recent("timings")}
    SELECT * FROM recent ORDER BY step
    """,
    {"last_steps": 0},
)

REWARD_BY_STEP = NamedQuery(
    "reward_by_step",
    "Per step of a training run: trajectories, mean reward, solved fraction (reward > 0), generated "
    "tokens per trajectory, the weights versions that generated them, and the step's rollout, train "
    "and whole-step seconds (null for runs that were not trained).",
    """
    WITH t AS (
        SELECT step,
               count(*) AS trajectories,
               avg(reward) AS reward_mean,
               avg(CASE WHEN reward > 0 THEN 1.0 ELSE 0.0 END) AS solved_fraction,
               avg(gen_tokens) AS gen_tokens_mean,
               min(model_version) AS model_version_min,
               max(model_version) AS model_version_max
        FROM trajectories
        GROUP BY step
    )
    SELECT t.*, s.rollout_s, s.train_s, s.step_s
    FROM t LEFT JOIN steps s USING (step)
    ORDER BY step
    """,
    {},
)

LEARNING_BY_STEP = NamedQuery(
    "learning_by_step",
    "Per step and task category of a training run (why it learns or not): trajectories, mean reward, "
    "the shares solved, answered wrong and left unanswered (no answer in the expected form), mean "
    "generated tokens, and the step's groups: scored, with all rewards equal (no gradient), trained on.",
    """
    SELECT t.step, coalesce(t.category, '') AS category,
           count(*) AS trajectories,
           avg(t.reward) AS reward_mean,
           avg(CASE WHEN t.outcome = 'solved' THEN 1.0 ELSE 0.0 END) AS solved,
           avg(CASE WHEN t.outcome = 'wrong' THEN 1.0 ELSE 0.0 END) AS wrong,
           avg(CASE WHEN t.outcome = 'unanswered' THEN 1.0 ELSE 0.0 END) AS unanswered,
           avg(t.gen_tokens) AS gen_tokens_mean,
           any_value(s.uniform_groups) AS step_uniform_groups,
           any_value(s.trained_groups) AS step_trained_groups
    FROM trajectories t LEFT JOIN steps s USING (step)
    GROUP BY t.step, t.category
    ORDER BY t.step, category
    """,
    {},
)

NAMED_QUERIES: dict[str, NamedQuery] = {
    q.name: q
    for q in (LENGTH_HISTOGRAM, REMAINING_LENGTH_PATHS, TOOL_STATISTICS, PER_STEP_DRIFT, RUN_SUMMARY,
              TRAJECTORY_LENGTHS, TIMING_SAMPLES, REWARD_BY_STEP, LEARNING_BY_STEP)
}


def run_named(catalog: Catalog, name: str, **params: Any) -> pa.Table:
    """Run a named query; unknown names or parameters are LibraErrors that list what exists."""
    if name not in NAMED_QUERIES:
        raise LibraError(f"no named query {name!r}; named queries: {', '.join(NAMED_QUERIES)}")
    query = NAMED_QUERIES[name]
    unknown = sorted(set(params) - set(query.defaults))
    if unknown:
        allowed = ", ".join(query.defaults) or "none"
        raise LibraError(f"{name}: unknown parameter(s) {', '.join(unknown)}; parameters: {allowed}")
    values = {**query.defaults, **params}
    for key, value in values.items():
        if not isinstance(value, int) or value < 0:
            raise LibraError(f"{name}: parameter {key} must be a non-negative integer, got {value!r}")
    if name == "length_histogram" and values["bins"] < 1:
        raise LibraError("length_histogram: bins must be >= 1")
    return catalog.query(query.sql, values or None)


def to_jsonable(value: Any) -> Any:
    """A value DuckDB returned as one JSON takes (decimals as numbers, times as ISO text, NaN as null)."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
