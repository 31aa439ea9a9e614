"""Where a partial rollout closes, as the planner sees it: the quantile of trajectory lengths at which
the fresh groups a steady step needs are complete, and a workload whose rollout waits for no longer one."""

import math

import pytest

from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.planner.workload import TrajectoryLength, build_workload, close_of, close_quantile

COST = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-14b"])


def test_the_close_is_where_the_fresh_groups_a_steady_step_needs_have_their_slowest_sample_done() -> None:
    # 1.5x in flight: the carried half-batch completes first, then half of the fresh groups
    assert close_quantile(16, 1.5, 32) == pytest.approx(0.957603, abs=1e-6)  # (1/2)^(1/16)
    assert close_quantile(1, 1.5, 32) == 0.5  # one sample per group: the median
    assert close_quantile(8, 1.0, 32) == 1.0  # no over-provision: the last trajectory
    # the slowest of G independent samples is below the quantile with probability 2 - overprovision
    assert close_quantile(4, 1.25, 32) ** 4 == pytest.approx(0.75)
    # from 2x on the carried groups could fill the batch alone: at least one fresh group is waited for
    assert close_quantile(4, 3.0, 10) == pytest.approx(0.1 ** 0.25)
    assert close_quantile(4, 2.0, 10) == close_quantile(4, 5.0, 10)
    for bad in ((16, 0.9, 32), (0, 1.5, 32), (16, 1.5, 0)):
        with pytest.raises(ValueError, match="got"):
            close_quantile(*bad)


def test_close_of_picks_the_quantile_trajectory() -> None:
    lengths = [TrajectoryLength(100, gen, 0, 1) for gen in range(100, 1100, 100)]  # 10 trajectories
    assert close_of(lengths, 0.5).gen_tokens == 500
    assert close_of(lengths, 0.95).gen_tokens == 1000
    assert close_of(lengths, 1.0).gen_tokens == 1000 and close_of(lengths, 0.0).gen_tokens == 100


def test_a_closing_workload_waits_for_no_longer_trajectory_and_still_fits_the_longest() -> None:
    lengths = [TrajectoryLength(200, 2_000, 300, 3, 2.0)] * 63 + [TrajectoryLength(200, 60_000, 300, 3, 2.0)]
    workload = build_workload(lengths)
    close = close_of(lengths, close_quantile(16, 1.5, 4))
    assert close.gen_tokens == 2_000
    closing = workload.closing_at(close)
    assert closing.max_tokens == workload.max_tokens == 60_500  # which instances may serve it: unchanged
    assert closing.tokens == workload.tokens  # the step's work: unchanged
    whole = COST.group_time(8, 1, workload.buckets)
    cut = COST.group_time(8, 1, closing.buckets)
    # the long one decoding at batch 1 decides the whole rollout; the closing one is the share's time
    assert whole > 2 * cut
    short_only = build_workload(lengths[:63])
    assert cut >= COST.group_time(8, 1, short_only.buckets)  # and no sooner than the others' work
    assert not math.isinf(cut)
    assert workload.closing_at(close_of(lengths, 1.0)) == workload  # closing at the longest changes nothing
