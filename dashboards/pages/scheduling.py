"""Scheduling: where the router put turns (bucket occupancy per step), the engines' queues, the
migrations it paid for, and its decisions against what then happened (the tokens a trajectory
still had to go when it was placed).

All from the store's `turns` table. An instance's queue is the number of turns generating on it at
once (its continuous batch plus anything waiting), rebuilt from the recorded latencies: a turn
starts when its trajectory's previous tool call returned (the agent loop submits it at once) and
generates for its recorded generation seconds.
"""

from __future__ import annotations

from dashboards.figures import Control, Page, Series, bars, lines
from dashboards.view import View, stride

BUCKETS_SQL = """
SELECT step // $stride * $stride AS step, bucket, count(*) AS turns,
       count(*) FILTER (WHERE migrated) AS migrated, sum(context_tokens) FILTER (WHERE migrated) AS migrated_tokens,
       sum(gen_tokens) AS gen_tokens
FROM turns WHERE bucket IS NOT NULL
GROUP BY ALL ORDER BY step, bucket
"""

STEPS_SQL = "SELECT max(step) AS last, count(DISTINCT step) AS n FROM turns WHERE bucket IS NOT NULL"

OUTCOMES_SQL = """
WITH recent AS (
    SELECT *, context_tokens + gen_tokens + tool_payload_tokens AS after_tokens,
           max(context_tokens + gen_tokens + tool_payload_tokens) OVER (PARTITION BY step, trajectory_id) AS total_tokens
    FROM turns WHERE bucket IS NOT NULL AND step > $last - $recent
)
SELECT bucket, count(*) AS turns,
       quantile_cont(total_tokens - context_tokens, 0.5) AS remaining_p50,
       quantile_cont(total_tokens - context_tokens, 0.9) AS remaining_p90,
       avg(CASE WHEN migrated THEN 100.0 ELSE 0.0 END) AS migrated_pct
FROM recent GROUP BY bucket ORDER BY bucket
"""

QUEUE_SQL = """
WITH t AS (
    SELECT instance, gen_latency_s,
           coalesce(sum(gen_latency_s + coalesce(tool_latency_s, 0)) OVER (
               PARTITION BY trajectory_id ORDER BY turn_idx ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS start_s
    FROM turns WHERE step = $step AND instance IS NOT NULL AND gen_latency_s IS NOT NULL
),
e AS (
    SELECT instance, start_s AS t_s, 1 AS delta FROM t
    UNION ALL SELECT instance, start_s + gen_latency_s AS t_s, -1 AS delta FROM t
),
running AS (
    SELECT instance, t_s, sum(delta) OVER (PARTITION BY instance ORDER BY t_s, delta ROWS UNBOUNDED PRECEDING) AS in_flight
    FROM e
),
span AS (SELECT greatest(max(t_s), 1e-9) / $points AS width FROM e)
SELECT instance, floor(t_s / width) * width AS t_s, max(in_flight) AS in_flight
FROM running, span GROUP BY ALL ORDER BY instance, t_s
"""


def build(view: View) -> Page:
    info = view.info
    meta = view.rows("routed steps", STEPS_SQL)[0] if info.turns else {"last": None, "n": 0}
    if not meta["n"]:
        why = ("a simulated run records steps, plans and pool events only" if info.kind == "simulation" else
               "its turns carry no router decisions (imported traces)" if info.turns else "it has no turns yet")
        return Page(f"{view.run}: scheduling", notice=f"run {view.run!r} has no routed turns: {why}")
    k = stride(meta["n"], view.settings.max_points // 4)
    rows = view.rows("turns per bucket per step", BUCKETS_SQL, stride=k)
    buckets = sorted({r["bucket"] for r in rows})
    binned = f" (steps in bins of {k})" if k > 1 else ""
    occupancy = bars("occupancy", "Turns per bucket", "step", "turns", [
        Series(f"bucket {b}", [r["step"] for r in rows if r["bucket"] == b], [r["turns"] for r in rows if r["bucket"] == b])
        for b in buckets[:8]], stacked=True, empty="no routed turns",
        note="turns the router placed in each instance bucket" + binned + (
            f"; buckets above {buckets[7]} are left out" if len(buckets) > 8 else ""))
    per_step: dict[int, dict[str, float]] = {}
    for r in rows:
        acc = per_step.setdefault(r["step"], {"turns": 0, "migrated": 0, "tokens": 0, "migrated_tokens": 0})
        acc["turns"] += r["turns"]
        acc["migrated"] += r["migrated"]
        acc["tokens"] += r["gen_tokens"] or 0
        acc["migrated_tokens"] += r["migrated_tokens"] or 0
    xs = sorted(per_step)
    migrations = lines("migrations", "Migrations", "step", "% of turns", [
        Series("turns migrated", xs, [100 * per_step[s]["migrated"] / per_step[s]["turns"] for s in xs]),
        Series("re-prefilled tokens per generated token", xs,
               [per_step[s]["migrated_tokens"] / per_step[s]["tokens"] if per_step[s]["tokens"] else None for s in xs],
               dash="dot", yaxis="y2"),
    ], y2_title="re-prefilled / generated tokens", empty="no routed turns",
        note="a migration re-prefills the trajectory's whole context on its new instance" + binned)
    recent = view.int_param("recent", 10, 1, 1_000_000)
    outcome = view.rows("remaining tokens by bucket", OUTCOMES_SQL, last=meta["last"], recent=recent)
    decisions = bars("decisions", "Router decisions against outcomes", "bucket chosen for the turn",
                     "tokens still to come in the trajectory", [
        Series("p50", [f"bucket {o['bucket']}" for o in outcome], [o["remaining_p50"] for o in outcome],
               hover=[f"{o['turns']:,} turns, {o['migrated_pct']:.1f}% migrated" for o in outcome]),
        Series("p90", [f"bucket {o['bucket']}" for o in outcome], [o["remaining_p90"] for o in outcome]),
    ], empty="no routed turns", note=f"last {recent} steps: tokens the trajectory added from the turn's start to its "
                                     "end; a router that tells long from short puts the long ones in higher buckets")
    step = view.int_param("step", meta["last"], 0, 10**12)
    queue = view.rows("turns in flight per instance", QUEUE_SQL, step=step, points=400)
    instances = sorted({q["instance"] for q in queue}, key=lambda s: (len(s), s))
    queues = lines("queues", f"Turns in flight per instance, step {step}", "seconds since the rollout started",
                   "turns generating or waiting", [
        Series(f"instance {i}", [q["t_s"] for q in queue if q["instance"] == i],
               [q["in_flight"] for q in queue if q["instance"] == i], mode="lines", extra={"line": {"shape": "hv"}})
        for i in instances[:8]], empty=f"step {step} has no timed turns",
        note="rebuilt from the recorded generation and tool seconds; the peak in each of 400 time bins")
    choices = tuple((str(s), f"step {s}") for s in range(meta["last"], max(-1, meta["last"] - 200), -1))
    controls = (Control("step", "queues of step", choices, str(step)),
                Control("recent", "decisions over the last", tuple((str(n), f"{n} steps") for n in (1, 5, 10, 50, 1000)),
                        str(recent)))
    migrated = sum(a["migrated"] for a in per_step.values())
    turns = sum(a["turns"] for a in per_step.values())
    return Page(f"{view.run}: scheduling", (("routed turns", f"{turns:,}"), ("buckets", str(len(buckets))),
                                            ("migrated turns", f"{migrated:,} ({100 * migrated / turns:.1f}%)")),
                (occupancy, queues, migrations, decisions), (), controls)
