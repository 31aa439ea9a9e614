import math
from statistics import NormalDist

import pytest

from libra.scheduler.causal_tree import TrajectoryPath
from libra.scheduler.lengths import LogLogFit, PromptLengths
from libra.scheduler.libra_router import LibraRouter
from libra.scheduler.routers import Buckets

# two prompts of the same size, one four times shorter than the other, each with a 4x spread
HISTORY = [TrajectoryPath(p, n, (), 10) for p, n in (("p", 100), ("p", 400), ("q", 1000), ("q", 4000))]
WITHIN = math.log(4) / math.sqrt(2)  # pooled within-prompt spread of the log lengths
LEVEL = math.log(math.sqrt(200 * 2000))  # the regression: mean log length (the sizes do not vary)
BETWEEN = math.sqrt(4 * (math.log(10) / 2) ** 2 / 2 + 2 * WITHIN**2 / 2 - WITHIN**2)  # residual variance - within


def _model() -> PromptLengths:
    model = PromptLengths()
    model.observe_step(HISTORY, {"p": 10, "q": 10})
    return model


def _reference(spent: int, cuts: list[float], exact: list[float], censored: list[float]) -> tuple[list[float], float]:
    """The same quantities by brute-force integration over the prompt level on a fine grid."""
    unit = NormalDist()
    shares, alive, mean = [0.0] * (len(cuts) + 1), 0.0, 0.0
    points = 20_001
    for i in range(points):
        mu = LEVEL - 10 * BETWEEN + 20 * BETWEEN * i / (points - 1)
        weight = unit.pdf((mu - LEVEL) / BETWEEN)
        for x in exact:
            weight *= unit.pdf((math.log(x) - mu) / WITHIN)
        for c in censored:
            weight *= 1 - unit.cdf((math.log(c) - mu) / WITHIN)
        above = [1 - unit.cdf((math.log(t) - mu) / WITHIN) for t in (spent, *(spent + c for c in cuts))]
        alive += weight * above[0]
        for b in range(len(cuts)):
            shares[b] += weight * (above[b] - above[b + 1])
        shares[-1] += weight * above[-1]
        mean += weight * math.exp(mu + WITHIN**2 / 2) * unit.cdf((mu + WITHIN**2 - math.log(spent)) / WITHIN)
    return [s / alive for s in shares], mean / alive - spent


def test_loglog_fit_exact() -> None:
    fit = LogLogFit()
    assert fit.fit() is None
    for tokens, length in ((10, 50), (100, 500), (1000, 5000)):
        fit.add(tokens, length)
    a, b, residual = fit.fit()
    assert (a, b, residual) == pytest.approx((math.log(5), 1.0, 0.0), abs=1e-9)


def test_fit_spreads_and_prior_prediction() -> None:
    model = _model()
    a, b, within, between = model.fit
    assert (a, b, within, between) == pytest.approx((LEVEL, 0.0, WITHIN, BETWEEN), rel=1e-9)
    model.started("r/0", "r", 10)
    shares, mean = model.distribution("r/0", 10, [100, 1000])
    spread = math.hypot(WITHIN, BETWEEN)  # nothing known of prompt r: the prior predictive
    low, high = (NormalDist(LEVEL, spread).cdf(math.log(t)) for t in (100, 1000))
    # 10-point quadrature over a prompt level less certain (1.63) than a sample's spread (0.98): within 0.001
    assert shares == pytest.approx([low, high - low, 1 - high], abs=1e-3)
    assert mean == pytest.approx(math.exp(LEVEL + spread**2 / 2), rel=1e-3)
    assert model.distribution("unknown", 10, [100, 1000]) is None


def test_siblings_finished_and_running_are_evidence() -> None:
    model = _model()
    for t in ("r/0", "r/1", "r/2"):
        model.started(t, "r", 10)
    model.finished("r/1", 4010)  # a sibling ran 4,000 tokens: prompt r is a long one
    shares, mean = model.distribution("r/0", 10, [100, 1000])
    precision = 1 / BETWEEN**2 + 1 / WITHIN**2
    centre = (LEVEL / BETWEEN**2 + math.log(4000) / WITHIN**2) / precision
    spread = math.hypot(WITHIN, 1 / math.sqrt(precision))
    low, high = (NormalDist(centre, spread).cdf(math.log(t)) for t in (100, 1000))
    assert shares == pytest.approx([low, high - low, 1 - high], abs=1e-6)  # 10-point quadrature
    assert shares[0] < 0.06 and shares[2] > 0.75  # was 0.21 short, 0.44 long with no sibling known
    # r/2 is still running at 2,000 tokens, r/0 has run 500: quadrature against brute force
    model.advanced("r/2", 2010)
    shares, mean = model.distribution("r/0", 510, [100, 1000])
    expected, expected_mean = _reference(500, [100, 1000], [4000], [2000])
    assert shares == pytest.approx(expected, abs=2e-4)
    assert mean == pytest.approx(expected_mean, rel=2e-3)
    # the step ends: the finished sibling moves to history (counted once), the others are gone
    model.finished("r/0", 1210)
    model.finished("r/2", 3010)
    model.observe_step([TrajectoryPath("r", n, (), 10) for n in (1200, 4000, 3000)], {"r": 10})
    assert model.same_step == {} and model.running == {} and model.siblings == {}
    assert model.prompts["r"][0] == 3


def test_router_uses_a_finished_sibling() -> None:
    router = LibraRouter(Buckets((100, 1000)), size_roots=False)
    router.observe_step(HISTORY, {"p": 10, "q": 10})
    # an unseen prompt: the global root (a quarter short, half medium, a quarter long) times the
    # prompt-length prior (0.17 short, 0.40 medium, 0.43 long: lengths spread 60x) -> long
    first = router.start("r/0", "r", 10)
    assert first.bucket == 2 and first.estimate == pytest.approx(2300.48, abs=0.01)
    router.start("r/1", "r", 10)
    router.finish("r/1", 110)  # its sibling was done after 100 tokens: prompt r is a short one
    after = router.start("r/2", "r", 10)
    assert after.bucket == 1 and after.estimate == pytest.approx(718.80, abs=0.01)
    assert router.lengths.distribution("r/2", 10, [100, 1000])[0] == pytest.approx([0.352, 0.568, 0.080], abs=1e-3)
    tree_only = LibraRouter(Buckets((100, 1000)), size_roots=False, prompt_lengths=False)
    tree_only.observe_step(HISTORY, {"p": 10, "q": 10})
    tree_only.start("r/1", "r", 10)
    tree_only.finish("r/1", 110)
    assert tree_only.start("r/2", "r", 10) == tree_only.start("r/3", "r", 10)  # the tree alone learns nothing in a step


def test_lengths_from_logs_are_capped_instead_of_overflowing():
    from libra.scheduler.lengths import from_log

    assert from_log(math.log(250.0)) == pytest.approx(250.0, rel=1e-12)
    assert from_log(1e6) == math.exp(700.0)  # a fit extrapolated past exp's range
