"""Comparison: several runs side by side on the same axes. A series is one run under one policy
(`<run>:<policy>`): a training run is one series, a simulation one per policy it simulated.

Throughput is trained tokens over the step's seconds, the measure both the simulator and training
record; reward and held-out reward exist for training runs only. The table sets each series
against the first one chosen.
"""

from __future__ import annotations

from dashboards.figures import Control, Page, Series, Table, lines
from dashboards.view import BadParameter, View, plain, stride

POLICIES_SQL = "SELECT coalesce(policy, '') AS policy, count(*) AS steps FROM steps GROUP BY ALL ORDER BY policy"

SERIES_SQL = """
WITH s AS (SELECT * FROM steps WHERE coalesce(policy, '') = $policy)
SELECT min(step) AS step, max(step) AS last_step, sum(trained_tokens) / nullif(sum(step_s), 0) AS trained_tokens_per_s,
       avg(step_s) AS step_s, sum(step_s) AS seconds, sum(trained_tokens) AS trained_tokens,
       avg(train_gpus) AS train_gpus, avg(reward_mean) AS reward_mean, quantile_cont(step_s, 0.99) AS step_p99_s
FROM s GROUP BY step // $stride ORDER BY step
"""

MAX_RUNS = 50
# which of a simulation's policies are shown first: Libra, then the baselines and the oracle; the
# ablations (+planner, ...) after them
FIRST = ("libra", "verl-colocated", "areal-static-optimal", "greedy-heuristic", "oracle", "static-uniform")


def available(view: View) -> list[tuple[str, str, int]]:
    """(run, policy, steps) of every run with steps, at most MAX_RUNS runs, newest first; a run's
    policies in the order of FIRST, then by name."""
    out = []
    for info in sorted(view.store.runs(), key=lambda i: -i.committed_at)[:MAX_RUNS]:
        if info.steps:
            rows = plain(view.store.query(info.name, f"policies of {info.name}", POLICIES_SQL, None, view.reads))
            rows.sort(key=lambda r: (FIRST.index(r["policy"]) if r["policy"] in FIRST else len(FIRST), r["policy"]))
            out += [(info.name, r["policy"], r["steps"]) for r in rows]
    return out


def build(view: View) -> Page:
    found = available(view)
    keys = [f"{run}:{policy}" for run, policy, _ in found]
    wanted = list(dict.fromkeys(view.params.get("series") or ()))
    unknown = [w for w in wanted if w not in keys]
    if unknown:
        raise BadParameter(f"no series {', '.join(map(repr, unknown))}; series are <run>:<policy>, one of: "
                           f"{', '.join(keys) or 'none (no run in the store has steps)'}")
    limit = view.settings.max_series
    chosen = (wanted or keys)[:limit]
    control = Control("series", "series", tuple((k, k) for k in keys), tuple(chosen), multiple=True)
    if not found:
        return Page("compare runs", notice="no run in the store has steps yet: train (`libra train`) or simulate "
                                          "(`libra simulate`) runs, then compare them here")
    data = {}
    for key in chosen:
        run, _, policy = key.partition(":")  # run names have no ':'; a policy may
        count = next(n for r, p, n in found if r == run and p == policy)
        rows = plain(view.store.query(run, f"steps of {key}", SERIES_SQL, {"policy": policy,
                                "stride": stride(count, view.settings.max_points)}, view.reads))
        heldout = view.tracking.history(run, view.reads).get("heldout_reward", [])
        data[key] = (rows, heldout)

    def chart(key: str, title: str, y: str, column: str, note: str = "", empty: str = "no steps") -> object:
        return lines(key, title, "step", y, [Series(k, [r["step"] for r in rows], [r[column] for r in rows], mode="lines")
                                              for k, (rows, _) in data.items()], empty=empty, note=note)

    elapsed = lines("elapsed", "Time to reach a step", "step", "seconds to the step's end", [
        Series(k, [r["last_step"] for r in rows], _cumulative([r["seconds"] for r in rows]), mode="lines")
        for k, (rows, _) in data.items()], empty="no steps", note="seconds from the run's start to the end of each "
                                                                  "step (simulated time for simulations); lower is faster")
    heldout = lines("heldout", "Held-out reward", "updates", "reward", [
        Series(k, [v for v, _ in h], [r for _, r in h]) for k, (_, h) in data.items()],
        empty="no held-out reward: only training runs evaluate one (MLflow)")
    charts = (chart("throughput", "Throughput", "trained tokens / s", "trained_tokens_per_s"), elapsed,
              chart("train_gpus", "Training GPUs", "GPUs (workers when on CPU)", "train_gpus",
                    empty="no GPU split recorded (unplaced runs)"),
              chart("reward", "Batch reward", "reward", "reward_mean", empty="no rewards: simulations have none"),
              heldout)
    base = _totals(data[chosen[0]][0]) if chosen else None
    rows = []
    for k, (series_rows, h) in data.items():
        tokens, seconds = _totals(series_rows)
        rate = tokens / seconds if seconds else None
        base_rate = base[0] / base[1] if base and base[1] else None
        rows.append((k, len(series_rows), None if rate is None else round(rate, 1),
                     None if rate is None or not base_rate else round(rate / base_rate, 3), round(seconds, 1),
                     round(h[-1][1], 3) if h else None))
    table = Table("summary", "Side by side", ("series", "points", "trained tokens / s", f"vs {chosen[0]}" if chosen else "vs first",
                                              "wall time s", "held-out reward, last"), tuple(rows))
    more = f"; showing {limit} of {len(wanted)} chosen (dashboard.max_series)" if len(wanted) > limit else ""
    return Page("compare runs", (("series", f"{len(chosen)} of {len(keys)}{more}"),), charts, (table,), (control,))


def _cumulative(values: list[float | None]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v or 0.0
        out.append(total)
    return out


def _totals(rows: list[dict]) -> tuple[float, float]:
    return sum(r["trained_tokens"] or 0 for r in rows), sum(r["seconds"] or 0.0 for r in rows)
