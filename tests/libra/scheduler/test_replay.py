import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from libra.clock import WallClock
from libra.config import SchedulerConfig
from libra.errors import LibraError
from libra.scheduler.replay import (
    Bound,
    auto_buckets,
    clairvoyant_bound,
    parse_order,
    path_of,
    replay,
    rl_steps,
)
from libra.scheduler.routers import Buckets
from tests.libra.scheduler.builders import make_trajectory


def _tiny() -> list:
    """Four prompts, one sample each; prompts_per_step=1 gives four steps, the first is warm-up."""
    return [
        make_trajectory("a", "0", 10, [(100, "search", 50, "ok"), (50, "none", 0, "")]),  # 200 after prompt
        make_trajectory("b", "0", 10, [(20, "search", 10, "ok"), (10, "none", 0, "")]),  # 40
        make_trajectory("c", "0", 10, [(500, "search", 900, "error"), (600, "none", 0, "")]),  # 2000
        make_trajectory("d", "0", 10, [(30, "none", 0, "")]),  # 30
    ]


def test_path_of() -> None:
    path = path_of(_tiny()[0])
    assert (path.start_remaining, [r for _, r in path.returns], path.prompt_tokens) == (200, [50], 10)


def test_replay_exact_metrics_on_a_tiny_trace() -> None:
    result = replay(_tiny(), prompts_per_step=1, bounds=[100], routers=["always-shortest", "oracle", "mlfq"])
    assert (result.steps, result.warmup_steps, result.buckets) == (4, 2, (100,))
    # scored steps c and d: decisions c-start (2000, long), c-return (600, long), d-start (30, short)
    shortest = result.routers["always-shortest"]
    assert (shortest.decisions, shortest.accuracy, shortest.balanced_accuracy) == (3, 1 / 3, 0.5)
    assert shortest.migrated_token_ratio == 0.0 and shortest.rank_correlation is None
    oracle = result.routers["oracle"]
    assert (oracle.accuracy, oracle.balanced_accuracy, oracle.rank_correlation) == (1.0, 1.0, 1.0)
    assert oracle.migrated_token_ratio == 0.0  # c starts long and stays long
    mlfq = result.routers["mlfq"]  # c demoted after 1400 spent: re-prefills 1410 of 2010 + 40 tokens
    assert mlfq.accuracy == pytest.approx(2 / 3)
    assert mlfq.migrated_token_ratio == pytest.approx(1410 / 2050)
    assert math.isnan(mlfq.p99_us)
    # within 7% of 2050 tokens (143) no move can be paid: the bound starts each in its true bucket
    # and leaves c in long at its return (right anyway)
    assert result.bound == Bound(0.07, 1.0, 1.0, 0.0)


def test_clairvoyant_bound_prices_moves() -> None:
    # one trajectory: start 2000 left (long), then after 1410 tokens 600 left (long), then 10 (short)
    trace = [make_trajectory("c", "0", 10, [(500, "search", 900, "error"), (580, "search", 10, "ok"), (10, "none", 0, "")])]
    buckets = Buckets((100,))
    # weights: long decisions 1/(2x2) each, the short one 1/2; moving to short at the last return costs 2000 tokens
    cheap = clairvoyant_bound(trace, buckets, 1.0)
    assert (cheap.balanced_accuracy, cheap.achieved, cheap.migrated_token_ratio) == (1.0, 1.0, pytest.approx(2000 / 2010))
    tight = clairvoyant_bound(trace, buckets, 0.5)
    assert tight.achieved == 0.5 and tight.migrated_token_ratio == 0.0  # stay long: both long decisions right
    assert 0.5 <= tight.balanced_accuracy < 1.0  # the dual bound is above what any schedule within 50% reaches


def test_latency_is_measured_with_a_timer() -> None:
    result = replay(_tiny(), prompts_per_step=1, routers=["libra"], clock=WallClock())
    assert result.routers["libra"].p99_us >= result.routers["libra"].p50_us > 0
    assert result.bound is not None and replay(_tiny(), prompts_per_step=1, routers=["libra"], with_bound=False).bound is None


def test_orders_and_auto_buckets() -> None:
    assert parse_order("group") == 1 and parse_order("epochs:3") == 3
    for bad in ("epochs:0", "epochs:x", "random"):
        with pytest.raises(LibraError):
            parse_order(bad)
    steps = rl_steps(_tiny(), 2, 2)
    assert [[t.prompt_id for t in s] for s in steps] == [["a", "b"], ["c", "d"], ["a", "b"], ["c", "d"]]
    assert auto_buckets(_tiny()).bounds == (200, 2000)
    with pytest.raises(LibraError, match="none after warm-up"):
        replay(_tiny()[:1], prompts_per_step=1)
    with pytest.raises(LibraError, match="unknown router"):
        replay(_tiny(), prompts_per_step=1, routers=["nope"])
    cold = SchedulerConfig(warmup_fraction=0.0)
    with pytest.raises(LibraError, match=r"^scheduler.warmup_fraction 0 leaves no warm-up steps to set the buckets "
                                         r"from; give the bucket bounds \(--buckets\)"):
        replay(_tiny(), prompts_per_step=1, settings=cold)
    assert replay(_tiny(), prompts_per_step=1, bounds=[100], settings=cold).warmup_steps == 0


turns = st.lists(st.tuples(st.integers(1, 3000), st.sampled_from(["search", "bash:cat", "python"]),
                           st.integers(0, 6000), st.sampled_from(["ok", "error", "timeout"])), max_size=6)


@st.composite
def traces(draw):
    out = []
    for p in range(draw(st.integers(2, 8))):
        for s in range(draw(st.integers(1, 3))):
            body = draw(turns)
            out.append(make_trajectory(f"p{p}", str(s), draw(st.integers(1, 2000)), body + [(draw(st.integers(1, 3000)), "none", 0, "")]))
    return out


@settings(max_examples=40, deadline=None)
@given(traces(), st.sampled_from(["group", "epochs:2"]))
@example([make_trajectory("p0", "0", 1565, [(1, "none", 0, "")]),  # a length fit extrapolated past exp's range
          make_trajectory("p1", "0", 1560, [(1, "search", 0, "ok"), (1, "none", 0, "")]),
          make_trajectory("p2", "0", 1, [(1, "none", 0, "")])], "group")
def test_oracle_is_perfect_and_always_shortest_never_migrates(trace, order) -> None:
    result = replay(trace, prompts_per_step=1, order=order)
    oracle, shortest = result.routers["oracle"], result.routers["always-shortest"]
    assert oracle.accuracy == 1.0 and oracle.balanced_accuracy == 1.0
    assert shortest.migrated_token_ratio == 0.0
    for metrics in result.routers.values():
        assert metrics.decisions == oracle.decisions
        assert 0.0 <= metrics.migrated_token_ratio
    bound = result.bound
    assert bound.migrated_token_ratio <= bound.budget and bound.achieved <= bound.balanced_accuracy + 1e-12
    for name in ("always-shortest", "least-load", "predictor"):  # they never migrate: within any budget
        assert result.routers[name].balanced_accuracy <= bound.balanced_accuracy + 1e-9
