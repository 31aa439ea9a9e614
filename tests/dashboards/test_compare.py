"""Training runs side by side (pure)."""

import pytest

from dashboards.compare import RunHistory, compare, default_target, time_to


def history(name: str, strategy: str, iteration: list[float], tokens: list[float], heldout: dict[int, float],
            evaluate: dict[int, float] | None = None, planning: dict[int, float] | None = None,
            applied: dict[int, float] | None = None, moved: dict[int, float] | None = None) -> RunHistory:
    metrics = {"iteration_s": tuple(enumerate(iteration)), "generated_tokens": tuple(enumerate(tokens)),
               "heldout_reward": tuple(sorted(heldout.items())), "evaluate_s": tuple(sorted((evaluate or {}).items())),
               "planning_s": tuple(sorted((planning or {}).items())), "plan_applied": tuple(sorted((applied or {}).items())),
               "workers_moved": tuple(sorted((moved or {}).items())),
               "rollout_workers": tuple((s, 1.0 if s < 2 else 2.0) for s in range(len(iteration)))}
    return RunHistory(name, f"id-{name}", strategy, metrics)


STATIC = history("s", "static", [10, 10, 10, 10], [100, 100, 100, 100], {0: 0.1, 2: 0.3, 4: 0.4}, evaluate={1: 4.0})
LIBRA = history("l", "libra", [10, 10, 6, 6], [100, 100, 100, 100], {0: 0.1, 2: 0.2, 4: 0.5},
                planning={2: 20.0, 3: 1.0}, applied={2: 1.0, 3: 0.0}, moved={2: 2.0, 3: 0.0})


def test_training_time_leaves_out_evaluation_and_counts_planning_and_moves():
    static, libra = compare([STATIC, LIBRA], target=0.4).rows  # fastest first
    assert static.strategy == "static" and static.train_time_s == 36.0 and static.tokens_per_s == pytest.approx(400 / 36)
    assert libra.train_time_s == 53.0 and libra.tokens_per_s == pytest.approx(400 / 53)
    assert (libra.plans_applied, libra.workers_moved, libra.rollout_workers_mean) == (1, 2, 1.5)
    assert (static.heldout_final, libra.heldout_final) == (0.4, 0.5)


def test_time_to_a_reward_is_the_training_before_the_update_that_reached_it():
    assert time_to(STATIC, 0.3) == 16.0  # after updates 0 and 1 (iteration 1 evaluated for 4 s)
    assert time_to(LIBRA, 0.5) == 53.0
    assert time_to(LIBRA, 0.1) == 0.0  # the initial policy already does
    assert time_to(STATIC, 0.9) is None


def test_the_default_target_is_the_best_every_run_reached():
    assert default_target([STATIC, LIBRA]) == 0.4
    assert compare([STATIC, LIBRA]).target == 0.4
    assert default_target([STATIC, history("x", "none", [1.0], [1.0], {})]) is None
    assert compare([history("x", "none", [1.0], [1.0], {})]).rows[0].time_to_target_s is None


def test_only_training_runs_are_read_from_an_experiment(tmp_path, monkeypatch):
    """A simulation's runs (one per system, written by `log_run`) had been listed as training runs
    of no steps."""
    import mlflow

    from dashboards.compare import read_runs
    from tasks.tracking_tasks import create_run, ensure_experiment, log_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for system in ("libra", "static"):
        log_run("libra-sim", str(tmp_path / "artifacts"), system, {"system": system}, {"throughput": 1.0})
    with pytest.raises(LookupError, match=r"^experiment 'libra-sim' has no training runs \(2 runs that are not training "
                                          r"runs: simulations, trace imports, rollouts or pools\)$"):
        read_runs(uri, "libra-sim")
    trained = create_run(ensure_experiment("libra-sim", str(tmp_path / "artifacts")), "train-math-seed0")
    mlflow.MlflowClient(tracking_uri=uri).log_metric(trained, "iteration_s", 12.5, step=0)
    [run] = read_runs(uri, "libra-sim")
    assert (run.name, run.run_id, run.metrics) == ("train-math-seed0", trained, {"iteration_s": ((0, 12.5),)})
