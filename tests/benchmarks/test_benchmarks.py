"""Benchmarks stay runnable, and the README's performance section is what they last measured."""

import pytest

from benchmarks import bench_cost_model, bench_planner, bench_router, bench_sim, bench_store, report


def test_store_benchmark_smoke(capsys) -> None:
    assert bench_store.main(["--rows", "4000", "--steps", "4", "--repeats", "1", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "ingest 4,000 turn rows in 4 steps" in out and "ratio bare/libra" in out
    assert out.count("query ") == len(bench_store.QUERY_CASES)


def test_planner_benchmark_smoke(capsys) -> None:
    assert bench_planner.main(["--nodes", "1", "--repeats", "1", "--no-save"]) == 0
    assert "8 GPUs: plan in" in capsys.readouterr().out


def test_router_benchmark_smoke(capsys) -> None:
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "data" / "traces" / "taubench_airline.csv"
    assert bench_router.main(["--traces", str(trace), "--orders", "group", "--nodes", "2000", "--decisions", "500",
                              "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "taubench_airline (group" in out and "latency libra" in out
    assert "libra allowed 60.9% like cmlfq" in out  # Libra's router given C-MLFQ's migration allowance


def test_headroom_lanes_are_each_tried_once_on_the_rollout_gpus() -> None:
    from benchmarks.bench_headroom import lane_configs

    assert list(lane_configs(16, (4, 8))) == [
        ((1, 4), (3, 4)), ((2, 4), (2, 4)), ((3, 4), (1, 4)),  # TP4 lanes of 4, 8 and 12 GPUs
        ((1, 4), (1, 8)), ((2, 4), (1, 8)),  # beside one TP8 instance (4 GPUs idle, then none)
        ((1, 8), (2, 4)), ((1, 8), (1, 4)), ((1, 8), (1, 8))]
    assert list(lane_configs(8, (8,))) == []  # one instance: nothing to set apart


def test_sim_benchmark_smoke(capsys) -> None:
    assert bench_sim.main(["--steps", "2", "--workloads", "search-r1", "--scale-nodes", "1", "--scale-steps", "1",
                           "--python-core-nodes", "1", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "search-r1 (2 steps" in out and "libra" in out and "scale: 8 GPUs" in out
    assert "Python core" in out  # the compiled core's runs, and the same on the Python sources (or those alone)


@pytest.mark.parametrize("name, parameters", [("qwen2.5-3b", 3_085_938_688), ("qwen2.5-7b", 7_615_616_512),
                                              ("qwen3-4b", 4_022_468_096), ("qwen3-8b", 8_190_735_360)])
def test_cost_model_benchmark_builds_each_dense_profile_as_a_transformers_model(name, parameters) -> None:
    import torch

    from libra.planner.profiles import MODELS

    model = bench_cost_model.hf_model(MODELS[name], "meta", torch.bfloat16)  # shapes only, no memory
    assert sum(p.numel() for p in model.parameters()) == MODELS[name].total_params == parameters


def test_cost_model_benchmark_smoke_on_cpu(capsys) -> None:
    assert bench_cost_model.main(["--models", "libra-tiny", "--hardware", "cpu", "--device", "cpu", "--small",
                                  "--repeats", "1", "--no-save"]) == 0
    out = capsys.readouterr().out
    kinds = [line.split()[0] for line in out.splitlines() if " tokens: measured " in line]
    assert kinds == ["prefill"] * 2 + ["train_step"] * 4
    assert "libra-tiny on cpu against the local-cpu-2core profile" in out


def test_readme_performance_section_is_current() -> None:
    assert report.main(["--check"]) == 0, "run `python -m benchmarks.report` to regenerate README.md"


def test_dashboard_benchmark_smoke(capsys) -> None:
    from pathlib import Path

    from benchmarks import bench_dashboard

    if not Path(bench_dashboard.CHROMIUM).exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium, as `make setup` does)")
    assert bench_dashboard.main(["--rows", "4000", "--steps", "4", "--sim-steps", "2", "--repeats", "1", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert out.count(" first ") == 8 and "slowest open" in out and "of the 3 s goal" in out


def test_the_learning_figures_compare_the_gain_with_a_spread_only_between_seeds() -> None:
    """One seed has no spread between seeds: the figures say so rather than divide by zero (a single
    seed's run once printed a ratio of 195312500), and the README's row names the gain alone."""
    from benchmarks.bench_train import spread_against_goal
    from benchmarks.report_training import train_section

    assert spread_against_goal(0.094, 0.039) == "spread between seeds 0.039: least gain / spread 2.4 (goal >= 3)"
    assert spread_against_goal(0.1, 0.0) == "spread between seeds 0.000: least gain / spread inf (goal >= 3)"
    assert spread_against_goal(0.195, None).startswith("one seed: no spread between seeds")
    one = {"seeds": {"0": {"heldout": {"0": 0.305, "60": 0.5}}}, "steps": 60, "gain_min": 0.195, "gain_spread": 0.0,
           "end_min": 0.5, "recipe": {"lr": 1e-4}, "machine": "2 cores",
           "pipeline": {"iterations": 4, "one_step_off_s": 10.0, "sync_s": 12.0, "ratio_sync_over_one_step_off": 1.2},
           "prefect": {"overhead_share": 0.01}, "trainer": {"libra_tokens_per_s": 90, "bare_tokens_per_s": 100, "ratio": 0.9}}
    row = train_section(one)[4]
    assert "| seed 0: 0.305 / 0.500 | one seed: no spread between seeds | gain +0.195; lowest final 0.500 |" in row
