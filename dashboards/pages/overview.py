"""Run overview: reward and held-out reward, the groups that carry a gradient by task category, throughput, stage seconds, how stale the trained tokens
were and what partial rollouts carried over, and the GPU split over steps, with the plans that
changed it and their reasons.

Steps come from the store's `steps` table (binned to `max_points` points on long runs: a point is
the mean of its steps, throughput their tokens over their seconds), plans from `plans`, the
held-out reward and the weight-sync seconds from the run's MLflow metrics (training runs only).
"""

from __future__ import annotations

from dashboards.figures import Control, Page, Series, Table, lines, vertical_marks
from dashboards.view import View, chosen_policy, owner_prefix, policies, stride

STEPS_SQL = """
WITH s AS (SELECT * FROM steps WHERE coalesce(policy, '') = $policy)
SELECT min(step) AS step, count(*) AS steps,
       avg(rollout_s) AS rollout_s, avg(train_s) AS train_s, avg(step_s) AS step_s,
       sum(gen_tokens) / nullif(sum(step_s), 0) AS gen_tokens_per_s,
       sum(trained_tokens) / nullif(sum(step_s), 0) AS trained_tokens_per_s,
       avg(reward_mean) AS reward_mean, avg(reward_std) AS reward_std,
       avg(train_gpus) AS train_gpus, avg(rollout_gpus) AS rollout_gpus, avg(hybrid_gpus) AS hybrid_gpus,
       sum(trajectories) AS trajectories, sum(gen_tokens) AS gen_tokens, sum(step_s) AS seconds,
       avg(offpolicy_share) AS offpolicy_share, avg(version_gap_mean) AS version_gap_mean,
       max(version_gap_max) AS version_gap_max, sum(suspended) AS suspended, sum(resumed) AS resumed,
       sum(stale_dropped) AS stale_dropped
FROM s
GROUP BY step // $stride
ORDER BY step
"""

COUNT_SQL = "SELECT count(*) AS n FROM steps WHERE coalesce(policy, '') = $policy"

# a training's groups by task category: the share whose rewards differ (the rest carry no gradient)
CATEGORIES_SQL = """
WITH g AS (
    SELECT step, category, max(reward) > min(reward) AS differ
    FROM trajectories
    WHERE category IS NOT NULL AND step >= 0
    GROUP BY step, prompt_id, category)
SELECT min(step) AS step, category, count(*) AS groups, avg(CASE WHEN differ THEN 1.0 ELSE 0.0 END) AS informative
FROM g
GROUP BY step // $stride, category
ORDER BY category, step
"""

PLANS_SQL = """
SELECT step, plan_id, applied, reason, train_gpus, rollout_gpus, hybrid_gpus, train_tp, train_pp, train_dp,
       t_iter_s, switch_cost_s
FROM plans
WHERE $prefix = '' OR starts_with(plan_id, $prefix)
ORDER BY step DESC, plan_id DESC
LIMIT $limit
"""


def build(view: View) -> Page:
    names = policies(view)
    policy = chosen_policy(view, names)
    count = view.rows("steps in run", COUNT_SQL, policy=policy)[0]["n"]
    k = stride(count, view.settings.max_points)
    steps = view.rows("steps by step", STEPS_SQL, policy=policy, stride=k)
    plans = view.rows("plans", PLANS_SQL, prefix=owner_prefix(policy, names), limit=view.settings.max_points)
    history = view.history()
    controls = (Control("policy", "policy", tuple((n, n) for n in names), policy),) if len(names) > 1 else ()
    if not steps:
        return Page(f"{view.run}: overview", controls=controls,
                    notice=f"run {view.run!r} has no steps yet ({view.info.kind}: "
                           f"{view.info.trajectories} trajectories, {view.info.turns} turns); a training or a "
                           "simulation records one row per step, and this page fills in as they commit")
    x = [s["step"] for s in steps]
    binned = f" (each point: the mean of {k} steps)" if k > 1 else ""
    heldout = history.get("heldout_reward", [])
    reward = lines("reward", "Reward", "step", "reward", [
        Series("training batch (mean)", x, [s["reward_mean"] for s in steps]),
        Series("held-out (after the step's update)", [v - 1 for v, _ in heldout], [r for _, r in heldout], dash="dash",
               hover=[f"after {v} updates" for v, _ in heldout]),
    ], empty="no rewards: a simulated run has none, and this training has logged none yet",
        note="mean reward of the step's trajectories; held-out: greedy, on tasks no step trains on (MLflow), drawn "
             "at the step whose update it follows (-1: the initial policy)" + binned)
    by_category: dict[str, list[dict]] = {}
    for row in view.rows("groups by category", CATEGORIES_SQL, stride=k):
        by_category.setdefault(row["category"], []).append(row)
    gradient = lines("categories", "Groups with a gradient, by task category", "step", "share of the groups", [
        Series(category, [r["step"] for r in rows], [r["informative"] for r in rows],
               hover=[f"{r['groups']} group{'' if r['groups'] == 1 else 's'}" for r in rows]) for category, rows in by_category.items()
    ], empty="no task categories: a simulated run, or an environment whose tasks have none (math's have)",
        note="the share of each category's groups whose samples' rewards differed; a group whose rewards are all "
             "equal has advantage 0 and teaches nothing (trainer.curriculum draws more of the categories "
             "where this is high)" + binned)
    throughput = lines("throughput", "Throughput", "step", "tokens / s", [
        Series("generated tokens / s", x, [s["gen_tokens_per_s"] for s in steps]),
        Series("trained tokens / s", x, [s["trained_tokens_per_s"] for s in steps]),
    ], empty="no throughput: the steps have no seconds", note="tokens over the step's wall time" + binned)
    sync = dict(history.get("sync_s", []))
    stages = lines("stages", "Seconds per step by stage", "step", "seconds", [
        Series("rollout", x, [s["rollout_s"] for s in steps]),
        Series("train", x, [s["train_s"] for s in steps]),
        Series("weight sync", x, [sync.get(s["step"]) for s in steps]) if k == 1 else Series("weight sync", [], []),
        Series("whole step", x, [s["step_s"] for s in steps], dash="dot"),
    ], empty="no stage times", note="with one-step-off overlap the whole step is less than the sum of its stages" + binned)
    staleness = lines("staleness", "Staleness of the trained tokens", "step", "updates behind the trainer", [
        Series("mean", x, [s["version_gap_mean"] for s in steps],
               hover=[None if s["offpolicy_share"] is None else f"{s['offpolicy_share']:.0%} of the tokens off-policy"
                      for s in steps]),
        Series("oldest", x, [s["version_gap_max"] for s in steps], dash="dot"),
    ], empty="no staleness recorded: a simulated run, or a run from before it was counted",
        note="updates between the weights that generated each trained policy token and the weights the update "
             "started from (0: on-policy; one-step-off: 1; partial rollouts carry older tokens)" + binned)
    partial = any(s["suspended"] or s["resumed"] or s["stale_dropped"] for s in steps)  # else only zeros or nulls
    carried = lines("partial", "Partial rollouts", "step", "trajectories", [
        Series("suspended when the batch closed", x, [s["suspended"] for s in steps]),
        Series("continued from earlier batches", x, [s["resumed"] for s in steps]),
        Series("dropped, too stale", x, [s["stale_dropped"] for s in steps], dash="dot"),
    ] if partial else [], empty="no partial rollouts: rollout.partial is off (or the run is simulated)", whole=("y",),
        note="trajectories of the groups not complete when the batch closed, carried to the next step whole; those "
             "more than trainer.max_staleness updates old are dropped, counted here" + binned)
    applied = sorted((p for p in plans if p["applied"]), key=lambda p: p["step"])
    changes = [p for i, p in enumerate(applied)
               if i == 0 or _split(p) != _split(applied[i - 1])]
    top = max((sum(v or 0 for v in (s["train_gpus"], s["rollout_gpus"], s["hybrid_gpus"])) for s in steps), default=0)
    split = lines("split", "GPU split", "step", "GPUs (workers when on CPU)", [
        Series("training", x, [s["train_gpus"] for s in steps], mode="lines", stackgroup="gpus"),
        Series("rollout", x, [s["rollout_gpus"] for s in steps], mode="lines", stackgroup="gpus"),
        Series("hybrid", x, [s["hybrid_gpus"] for s in steps], mode="lines", stackgroup="gpus"),
        Series("plan applied", [p["step"] for p in changes], [top * 1.04 for _ in changes], mode="markers",
               hover=[_plan_text(p) for p in changes], extra={"marker": {"symbol": "triangle-down", "size": 10}}),
    ], empty="no GPU split recorded: the run was not placed (placement.strategy none)",
        shapes=vertical_marks([p["step"] for p in changes]),
        note="dotted lines: applied plans that changed the split (hover the triangles for the reason)" + binned)
    summary = _summary(steps, heldout, count)
    table = Table("plans", "Plans (newest first)", ("step", "applied", "reason", "train / rollout / hybrid GPUs",
                                                    "layout tp x pp x dp", "predicted step s", "switch cost s"),
                  tuple((p["step"], "yes" if p["applied"] else "no", p["reason"] or "",
                         f"{p['train_gpus']} / {p['rollout_gpus']} / {p['hybrid_gpus']}",
                         "" if p["train_tp"] is None else f"{p['train_tp']} x {p['train_pp']} x {p['train_dp']}",
                         _round(p["t_iter_s"]), _round(p["switch_cost_s"])) for p in plans[:50]),
                  note="" if plans else "no plans: the planner has not run in this run")
    charts = (reward, gradient, throughput, stages, staleness, carried, split) if reward.figure else \
        (throughput, stages, split, reward, gradient, staleness, carried)
    return Page(f"{view.run}: overview" + (f" ({policy})" if len(names) > 1 else ""), summary, charts, (table,), controls)


def _split(plan: dict) -> tuple:
    return plan["train_gpus"], plan["rollout_gpus"], plan["hybrid_gpus"], plan["train_tp"], plan["train_pp"], plan["train_dp"]


def _plan_text(plan: dict) -> str:
    return (f"step {plan['step']}: {plan['reason'] or 'applied'}\ntrain {plan['train_gpus']}, rollout "
            f"{plan['rollout_gpus']}, hybrid {plan['hybrid_gpus']} GPUs")


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _summary(steps: list[dict], heldout: list[tuple[int, float]], count: int) -> tuple[tuple[str, str], ...]:
    seconds = sum(s["seconds"] or 0.0 for s in steps)
    tokens = sum(s["gen_tokens"] or 0 for s in steps)
    out = [("steps", f"{count:,}"), ("wall time", f"{seconds:,.0f} s")]
    if tokens:
        out.append(("generated tokens / s", f"{tokens / seconds:,.1f}" if seconds else "-"))
    trajectories = sum(s["trajectories"] or 0 for s in steps)
    if trajectories:
        out.append(("trajectories", f"{trajectories:,}"))
    rewards = [s["reward_mean"] for s in steps if s["reward_mean"] is not None]
    if rewards:
        out.append(("last batch reward", f"{rewards[-1]:.3f}"))
    if heldout:
        out.append(("held-out reward", f"{heldout[0][1]:.3f} -> {heldout[-1][1]:.3f}"))
    return tuple(out)

