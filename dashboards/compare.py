"""Training runs side by side (`libra compare`): throughput, time to a held-out reward, the plans
applied and the workers moved, read from MLflow (read-only).

    read_runs(tracking_uri, experiment)  -> [RunHistory]   the experiment's live runs and their metrics
    compare(histories, target)           -> Comparison     one row per run (pure)

Throughput is generated tokens over training time: each iteration's seconds without its held-out
evaluation, plus the planning flow's seconds (planning, moving workers, restarting engines), so a
placement strategy pays for its moves. The time to a held-out reward is the training time until the update
after which the held-out reward first reached the target (0 when the initial policy already does);
the default target is the best held-out reward every run reached, so each run has a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

METRICS = ("generated_tokens", "iteration_s", "evaluate_s", "planning_s", "heldout_reward", "plan_applied",
           "workers_moved", "rollout_workers", "reward")


@dataclass(frozen=True)
class RunHistory:
    """One training run's metric histories: metric -> ((step, value), ...) in step order."""

    name: str
    run_id: str
    strategy: str  # placement.strategy
    metrics: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)

    def values(self, metric: str) -> dict[int, float]:
        return dict(self.metrics.get(metric, ()))


@dataclass(frozen=True)
class RunRow:
    run: str
    strategy: str  # placement.strategy
    steps: int
    tokens_per_s: float  # generated tokens / training seconds (with planning)
    train_time_s: float
    heldout_final: float | None
    time_to_target_s: float | None  # None: the run never reached the target
    plans_applied: int
    workers_moved: int
    rollout_workers_mean: float | None
    run_id: str


@dataclass(frozen=True)
class Comparison:
    target: float | None
    rows: tuple[RunRow, ...]


def _training_seconds(h: RunHistory) -> dict[int, float]:
    """Each step's training seconds: the iteration without its evaluation, plus the planning before it."""
    iteration, evaluation, planning = h.values("iteration_s"), h.values("evaluate_s"), h.values("planning_s")
    return {s: max(0.0, t - evaluation.get(s, 0.0)) + planning.get(s, 0.0) for s, t in iteration.items()}


def time_to(h: RunHistory, target: float) -> float | None:
    """Training seconds until the held-out reward first reached `target`. The held-out reward at
    step v is measured after v updates, that is after iterations 0 .. v - 1."""
    seconds = _training_seconds(h)
    for version, reward in sorted(h.values("heldout_reward").items()):
        if reward >= target:
            return sum(t for s, t in seconds.items() if s < version)
    return None


def default_target(histories: Sequence[RunHistory]) -> float | None:
    """The best held-out reward every run reached (None when a run has none)."""
    bests = [max(h.values("heldout_reward").values(), default=None) for h in histories]
    return None if not bests or any(b is None for b in bests) else min(bests)


def compare(histories: Sequence[RunHistory], target: float | None = None) -> Comparison:
    """One row per run, fastest first (by tokens/s)."""
    if target is None:
        target = default_target(histories)
    rows = []
    for h in histories:
        seconds = _training_seconds(h)
        total = sum(seconds.values())
        tokens = sum(h.values("generated_tokens").values())
        heldout = h.values("heldout_reward")
        workers = list(h.values("rollout_workers").values())
        rows.append(RunRow(h.name, h.strategy, len(seconds), tokens / total if total > 0 else 0.0, total,
                           heldout[max(heldout)] if heldout else None, time_to(h, target) if target is not None else None,
                           int(sum(h.values("plan_applied").values())), int(sum(h.values("workers_moved").values())),
                           sum(workers) / len(workers) if workers else None, h.run_id))
    return Comparison(target, tuple(sorted(rows, key=lambda r: -r.tokens_per_s)))


def read_runs(tracking_uri: str, experiment: str, runs: Sequence[str] = ()) -> list[RunHistory]:
    """The experiment's training runs (the latest of each name: superseded runs are left out), or
    only those named in `runs`; raises LookupError naming what exists when nothing matches."""
    from pathlib import Path

    import mlflow

    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        # opening a missing SQLite file would create an empty tracking database: only read
        raise LookupError(f"no MLflow database at {tracking_uri}")
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise LookupError(f"no MLflow experiment {experiment!r} at {tracking_uri}; experiments: "
                          f"{', '.join(names) or 'none'}")
    out, others = [], 0
    for run in client.search_runs([found.experiment_id], max_results=5000):
        tags = run.data.tags
        if "libra.run" not in tags and "iteration_s" not in run.data.metrics:  # a simulation's, a trace import's, a rollout's or a pool's
            others += 1
            continue
        name = tags["libra.run"] if "libra.run" in tags else run.info.run_name
        if tags.get("libra.superseded") == "true" or (runs and name not in runs):
            continue
        params = run.data.params  # runs recorded before the key was renamed hold placement.policy
        strategy = params.get("placement.strategy", params.get("placement.policy", "none"))
        metrics = {key: tuple(sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)))
                   for key in METRICS if key in run.data.metrics}
        out.append(RunHistory(name, run.info.run_id, strategy, metrics))
    if not out:
        raise LookupError(f"experiment {experiment!r} has no training runs" + (f" named {', '.join(runs)}" if runs else "")
                          + (f" ({others} runs that are not training runs: simulations, trace imports, rollouts or pools)"
                             if others else ""))
    return out
