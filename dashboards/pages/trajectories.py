"""Trajectories: how long they are per step and how that drifts, turns and tool calls per
trajectory, tool error rates, and the longest trajectories with a turn-by-turn timeline.

Everything here is from the store's `trajectories` and `turns` tables. A turn's place on the
timeline is its trajectory's earlier turns' generation and tool seconds added up (the agent loop
submits a trajectory's next turn as soon as its tool returns), so the timeline is exact up to the
router's own time between turns; imported traces record no times, and their timeline is in tokens.
"""

from __future__ import annotations

from urllib.parse import urlencode

from dashboards.figures import Page, Series, Span, Table, bars, heatmap, lines, timeline
from dashboards.view import BadParameter, View, plain, stride
from libra.checks import count_of
from storage.queries import PER_STEP_DRIFT

BINS = 40

HEAT_SQL = """
WITH w AS (SELECT greatest(1, ceil((max(total_tokens) + 1) / $bins))::BIGINT AS width FROM trajectories)
SELECT (step // $stride) * $stride AS step, (total_tokens // width) * width AS lo_tokens, count(*) AS trajectories
FROM trajectories, w
GROUP BY ALL
ORDER BY step, lo_tokens
"""

COUNTS_SQL = """
SELECT 'turns' AS what, num_turns AS n, count(*) AS trajectories FROM trajectories GROUP BY ALL
UNION ALL
SELECT 'tool calls' AS what, num_tool_calls AS n, count(*) AS trajectories FROM trajectories GROUP BY ALL
ORDER BY what, n
"""

TOOLS_SQL = """
SELECT step // $stride * $stride AS step, tool_name, count(*) AS calls,
       count(*) FILTER (WHERE tool_status = 'error') AS errors,
       count(*) FILTER (WHERE tool_status = 'timeout') AS timeouts
FROM turns WHERE tool_name <> 'none'
GROUP BY ALL
"""

LONGEST_SQL = """
SELECT step, trajectory_id, total_tokens, num_turns, num_tool_calls, reward, rollout_s
FROM trajectories ORDER BY total_tokens DESC, step, trajectory_id LIMIT $limit
"""

TURNS_OF_SQL = """
SELECT turn_idx, context_tokens, gen_tokens, tool_name, tool_payload_tokens, tool_status, instance, bucket, migrated,
       gen_latency_s, tool_latency_s
FROM turns WHERE step = $step AND trajectory_id = $trajectory ORDER BY turn_idx
"""

STEPS_SQL = "SELECT count(DISTINCT step) AS n FROM trajectories"


def build(view: View) -> Page:
    info = view.info
    if info.trajectories == 0:
        return Page(f"{view.run}: trajectories", notice=f"run {view.run!r} has no trajectories ({info.kind} run): "
                    "a simulated run records steps, plans and pool events only; training and imported traces have them")
    k = stride(view.rows("steps with trajectories", STEPS_SQL)[0]["n"], view.settings.max_points // 4)
    cells = view.rows("length histogram per step", HEAT_SQL, bins=BINS, stride=k)
    steps = sorted({c["step"] for c in cells})
    los = sorted({c["lo_tokens"] for c in cells})
    grid = {(c["step"], c["lo_tokens"]): c["trajectories"] for c in cells}
    binned = f" (steps in bins of {k})" if k > 1 else ""
    heat = heatmap("lengths", "Trajectory length per step", "step", "total tokens (bin start)", "trajectories",
                   steps, los, [[grid.get((s, lo)) for s in steps] for lo in los], empty="no trajectories",
                   note=f"trajectories per length bin ({BINS} bins), per step{binned}")
    drift_rows = plain(view.store.query(view.run, "per_step_drift", PER_STEP_DRIFT.sql, None, view.reads))
    last = drift_rows[-1]["length_vs_first"] if drift_rows else None
    drift_rows = drift_rows[::k] if k > 1 else drift_rows  # every k-th step (the note says so)
    x = [r["step"] for r in drift_rows]
    drift = lines("drift", "Length drift", "step", "total tokens per trajectory", [
        Series("mean", x, [r["total_tokens_mean"] for r in drift_rows]),
        Series("p50", x, [r["total_tokens_p50"] for r in drift_rows], dash="dot"),
        Series("p90", x, [r["total_tokens_p90"] for r in drift_rows], dash="dash"),
    ], empty="no trajectories", note=("" if last is None else f"the last step's mean is {last:.2f}x the first step's")
        + (f"; every {k}th step drawn" if k > 1 else ""))
    counts = view.rows("turns and tool calls per trajectory", COUNTS_SQL)
    per = bars("counts", "Turns and tool calls per trajectory", "count per trajectory", "trajectories", [
        Series("turns", [c["n"] for c in counts if c["what"] == "turns"], [c["trajectories"] for c in counts if c["what"] == "turns"]),
        Series("tool calls", [c["n"] for c in counts if c["what"] == "tool calls"],
               [c["trajectories"] for c in counts if c["what"] == "tool calls"]),
    ], empty="no trajectories")
    by_tool: dict[str, list[int]] = {}
    by_step: dict[int, list[int]] = {}
    for r in view.rows("tool calls by step and tool", TOOLS_SQL, stride=k):  # one scan of the turns for both charts
        for key, acc in ((r["tool_name"], by_tool), (r["step"], by_step)):
            total = acc.setdefault(key, [0, 0, 0])
            total[0] += r["calls"]
            total[1] += r["errors"]
            total[2] += r["timeouts"]
    tools = sorted(by_tool.items(), key=lambda t: (-t[1][0], t[0]))[:12]
    tool_chart = bars("tools", "Tool errors by tool", "tool", "% of calls", [
        Series("error", [t for t, _ in tools], [100 * e / n for _, (n, e, _) in tools],
               hover=[f"{n:,} calls" for _, (n, _, _) in tools]),
        Series("timeout", [t for t, _ in tools], [100 * o / n for _, (n, _, o) in tools]),
    ], empty="no tool calls in this run", note="the 12 most called tools")
    steps_seen = sorted(by_step)
    err_chart = lines("errors", "Tool errors per step", "step", "% of tool calls", [
        Series("error", steps_seen, [100 * by_step[s][1] / by_step[s][0] for s in steps_seen]),
        Series("timeout", steps_seen, [100 * by_step[s][2] / by_step[s][0] for s in steps_seen]),
    ], empty="no tool calls in this run")
    longest = view.rows("longest trajectories", LONGEST_SQL, limit=10)
    chosen = _chosen(view, longest)
    turns = view.rows("turns of the chosen trajectory", TURNS_OF_SQL, step=chosen[0], trajectory=chosen[1]) if chosen else []
    table = Table("longest", "Longest trajectories (choose one for its timeline)",
                  ("step", "trajectory", "total tokens", "turns", "tool calls", "reward", "rollout s"),
                  tuple((t["step"], t["trajectory_id"], t["total_tokens"], t["num_turns"], t["num_tool_calls"],
                         None if t["reward"] is None else round(t["reward"], 3),
                         None if t["rollout_s"] is None else round(t["rollout_s"], 2)) for t in longest),
                  tuple(urlencode({"trajectory": f"{t['step']}:{t['trajectory_id']}"}) for t in longest))
    return Page(f"{view.run}: trajectories", (("trajectories", f"{info.trajectories:,}"), ("turns", f"{info.turns:,}")),
                (heat, drift, per, tool_chart, err_chart, _timeline(chosen, turns)), (table,))


def _chosen(view: View, longest: list[dict]) -> tuple[int, str] | None:
    """The `trajectory` parameter (`<step>:<trajectory id>`), else the longest trajectory."""
    text = view.param("trajectory")
    if not text:
        return (longest[0]["step"], longest[0]["trajectory_id"]) if longest else None
    step_text, sep, tid = text.partition(":")
    step = count_of(step_text, 2**63 - 1)  # (the store's steps are int64)
    if not sep or step is None or not tid:
        raise BadParameter(f"trajectory must be <step>:<trajectory id>, got {text[:80]!r}")
    return step, tid


def _timeline(chosen: tuple[int, str] | None, turns: list[dict]):
    title = "Timeline of a trajectory" if chosen is None else f"Timeline of {chosen[1]} (step {chosen[0]})"
    if not turns:
        return timeline("timeline", title, "seconds", [], empty="no such trajectory in this run" if chosen else "no trajectories")
    timed = all(t["gen_latency_s"] is not None for t in turns)
    spans, marks, at = [], [], 0.0
    for t in turns:
        row = f"turn {t['turn_idx']}"
        gen = t["gen_latency_s"] if timed else float(t["gen_tokens"])
        tool = (t["tool_latency_s"] or 0.0) if timed else float(t["tool_payload_tokens"])
        where = "" if t["instance"] is None else f"instance {t['instance']}, bucket {t['bucket']}"
        spans.append(Span(row, at, gen, f"generate on instance {t['instance']}" if t["instance"] is not None else "generate",
                          f"{row}: {t['gen_tokens']} tokens generated from {t['context_tokens']} of context\n{where}"))
        if t["migrated"]:
            marks.append(Span(row, at, 0.0, "migrated", f"{row}: migrated (re-prefilled {t['context_tokens']} tokens)"))
        if t["tool_name"] != "none":
            spans.append(Span(row, at + gen, tool, f"tool {t['tool_name']}",
                              f"{row}: {t['tool_name']} -> {t['tool_status']}, {t['tool_payload_tokens']} tokens back"))
        at += gen + tool
    unit = "seconds since the trajectory started" if timed else "tokens (imported traces record no times)"
    return timeline("timeline", title, unit, spans, markers=marks, empty="",
                    note="generation bars are coloured by instance; x marks a migration (the turn re-prefilled on a new "
                         "instance); a turn starts when the previous turn's tool returned")
