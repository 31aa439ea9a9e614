"""Pools: each worker's state over the run (hybrids joining and leaving training, engines placed and
moved), how long joins and leaves took, and the rollbacks and failures.

From the store's `pool_events` (a worker is in the state its last transition entered until its
next one) and `steps` (hybrid GPUs per step). Events whose from and to states are equal (an
engine restarted, the routing tree rebuilt, a snapshot fetched) are progress notes, drawn as marks.
"""

from __future__ import annotations

from dashboards.figures import Control, Page, Series, Span, Table, lines, timeline
from dashboards.view import View, chosen_policy, owner_prefix, policies

MAX_WORKERS = 40
STATE_COLORS = {"rollout": "#1f77b4", "serving": "#1f77b4", "joining": "#ff7f0e", "training": "#2ca02c",
                "leaving": "#9467bd", "failed": "#d62728", "absent": "#7f7f7f"}
TROUBLE = ("rolled_back", "died", "join_timed_out", "cancelled", "failed", "host_lost")

WORKERS_SQL = """
WITH e AS (SELECT * FROM pool_events WHERE $prefix = '' OR starts_with(worker_id, $prefix)),
top AS (SELECT worker_id, count(*) AS n FROM e GROUP BY worker_id ORDER BY n DESC, worker_id LIMIT $workers)
SELECT worker_id, count(*) AS events FROM e JOIN top USING (worker_id) GROUP BY worker_id ORDER BY worker_id
"""

SPANS_SQL = """
WITH e AS (
    SELECT * FROM pool_events
    WHERE ($prefix = '' OR starts_with(worker_id, $prefix)) AND list_contains($workers, worker_id)
),
moves AS (
    SELECT worker_id, step, time_s, to_state, event,
           lead(time_s) OVER (PARTITION BY worker_id ORDER BY time_s, step) AS until_s
    FROM e WHERE from_state <> to_state
),
last AS (SELECT max(time_s) AS end_s FROM e)
SELECT worker_id, step, time_s, coalesce(until_s, end_s) - time_s AS seconds, to_state, event
FROM moves, last
ORDER BY time_s DESC LIMIT $limit
"""

NOTES_SQL = """
SELECT worker_id, step, time_s, event, detail FROM pool_events
WHERE ($prefix = '' OR starts_with(worker_id, $prefix)) AND from_state = to_state AND list_contains($workers, worker_id)
ORDER BY time_s DESC LIMIT $limit
"""

DURATIONS_SQL = """
WITH moves AS (
    SELECT worker_id, step, time_s, event,
           lead(time_s) OVER w AS next_s, lead(event) OVER w AS next_event
    FROM pool_events
    WHERE ($prefix = '' OR starts_with(worker_id, $prefix)) AND from_state <> to_state
    WINDOW w AS (PARTITION BY worker_id ORDER BY time_s, step)
)
SELECT step, time_s, event, next_event, next_s - time_s AS seconds
FROM moves WHERE event IN ('join_requested', 'leave_requested') AND next_s IS NOT NULL
ORDER BY time_s DESC LIMIT $limit
"""

COUNTS_SQL = """
SELECT count(*) FILTER (WHERE event = 'join_requested') AS joins,
       count(*) FILTER (WHERE list_contains($events, event)) AS trouble
FROM pool_events WHERE $prefix = '' OR starts_with(worker_id, $prefix)
"""

TROUBLE_SQL = """
SELECT step, time_s, worker_id, from_state, to_state, event, detail FROM pool_events
WHERE ($prefix = '' OR starts_with(worker_id, $prefix)) AND list_contains($events, event)
ORDER BY time_s DESC LIMIT 50
"""

HYBRIDS_SQL = """
SELECT step, hybrid_gpus FROM steps WHERE coalesce(policy, '') = $policy AND hybrid_gpus IS NOT NULL
ORDER BY step
"""


def build(view: View) -> Page:
    names = policies(view)
    policy = chosen_policy(view, names)
    prefix = owner_prefix(policy, names)
    controls = (Control("policy", "policy", tuple((n, n) for n in names), policy),) if len(names) > 1 else ()
    title = f"{view.run}: pools" + (f" ({policy})" if len(names) > 1 else "")
    workers = [w["worker_id"] for w in view.rows("workers", WORKERS_SQL, prefix=prefix, workers=MAX_WORKERS)]
    if not workers:
        return Page(title, controls=controls, notice=f"run {view.run!r} has no pool events" + (
            f" under policy {policy}" if prefix else "") + ": a run records them when it places workers, moves them, "
            "or runs hybrids")
    limit = view.settings.max_points
    spans = view.rows("worker states", SPANS_SQL, prefix=prefix, workers=workers, limit=limit)
    notes = view.rows("progress notes", NOTES_SQL, prefix=prefix, workers=workers, limit=limit)
    states = timeline("states", "Worker states over time", "seconds since the run started", [
        Span(s["worker_id"], s["time_s"], max(s["seconds"], 0.0), s["to_state"],
             f"{s['worker_id']}: {s['to_state']} from {s['time_s']:.1f} s for {s['seconds']:.1f} s "
             f"(step {s['step']}, {s['event']})") for s in reversed(spans)],
        markers=[Span(n["worker_id"], n["time_s"], 0.0, "note", f"{n['worker_id']}: {n['event']} at {n['time_s']:.1f} s"
                      + (f" ({n['detail']})" if n["detail"] else "")) for n in notes],
        row_title="worker", empty="no state transitions", colors=STATE_COLORS,
        note=(f"the {MAX_WORKERS} workers with the most events; " if len(workers) >= MAX_WORKERS else "")
        + (f"the last {limit} intervals; " if len(spans) >= limit else "") + "x: progress notes")
    durations = view.rows("join and leave durations", DURATIONS_SQL, prefix=prefix, limit=limit)[::-1]  # the newest, oldest first
    kinds = {"join (requested -> active)": lambda d: d["event"] == "join_requested" and d["next_event"] == "activated",
             "join given up (cancelled, rolled back, timed out)":
                 lambda d: d["event"] == "join_requested" and d["next_event"] != "activated",
             "leave (requested -> released)": lambda d: d["event"] == "leave_requested"}
    marks = {"leave (requested -> released)": {"marker": {"symbol": "circle-open", "size": 10}}}  # seen over a join of the same length
    joins = lines("durations", "Joins and leaves", "step", "seconds", [
        Series(name, [d["step"] for d in durations if keep(d)], [d["seconds"] for d in durations if keep(d)], mode="markers",
               extra=marks.get(name, {"marker": {"size": 6}}))
        for name, keep in kinds.items()], empty="no joins or leaves: the run has no hybrids")
    hybrids = view.rows("hybrid GPUs per step", HYBRIDS_SQL, policy=policy)
    trouble = view.rows("rollbacks and failures", TROUBLE_SQL, prefix=prefix, events=list(TROUBLE))
    per_step: dict[int, int] = {}
    for t in trouble:
        per_step[t["step"]] = per_step.get(t["step"], 0) + 1
    hybrid_chart = lines("hybrids", "Hybrid GPUs per step", "step", "GPUs training as hybrids", [
        Series("hybrid GPUs", [h["step"] for h in hybrids], [h["hybrid_gpus"] for h in hybrids],
               extra={"line": {"shape": "hv"}}),
        Series("rollbacks and failures", sorted(per_step), [per_step[s] for s in sorted(per_step)], mode="markers",
               yaxis="y2", extra={"marker": {"symbol": "x", "size": 9}}),
    ], y2_title="rollbacks and failures (count)", whole=("y", "y2"), empty="no hybrid GPUs recorded",
        note="rollbacks and failures: of the last 50, how many in each step")
    table = Table("trouble", "Rollbacks and failures (newest first)",
                  ("step", "time s", "worker", "from", "to", "event", "detail"),
                  tuple((t["step"], round(t["time_s"], 2), t["worker_id"], t["from_state"], t["to_state"], t["event"],
                         t["detail"] or "") for t in trouble),
                  note="" if trouble else "none: no join was rolled back or given up, and no worker or host failed")
    counts = view.rows("joins, rollbacks and failures", COUNTS_SQL, prefix=prefix, events=list(TROUBLE))[0]
    return Page(title, (("workers", str(len(workers))), ("joins", f"{counts['joins']:,}"),
                        ("rollbacks and failures", f"{counts['trouble']:,}")),
                (states, joins, hybrid_chart), (table,), controls)
