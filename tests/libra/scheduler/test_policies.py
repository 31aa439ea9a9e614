import pytest

from libra.scheduler.causal_tree import CausalTree, TrajectoryPath
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.metrics import DecisionRecord, accuracy, balanced_accuracy, rank_correlation, spearman
from libra.scheduler.policies import CMLFQ, MLFQ, Buckets, LeastLoad, LengthPredictor, LibraRouter

BUCKETS = Buckets((100, 1000))  # short <= 100 < medium <= 1000 < long
SEARCH = ToolReturn("search", 50, "ok")
PYTHON_ERR = ToolReturn("python", 50, "error")


def _tree(paths: list[tuple[int, list[tuple[ToolReturn, int]]]]) -> CausalTree:
    tree = CausalTree(KeyScheme("fine"))
    for start, returns in paths:
        tree.insert("seen", start, returns)
    return tree


def test_buckets() -> None:
    assert [BUCKETS.of(t) for t in (0, 100, 101, 1000, 1001)] == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        Buckets((500, 100))


def test_cmlfq_migrates_only_when_mean_and_p90_agree() -> None:
    # after a search: remaining 400, 500, 600 (all medium) -> migrate; after a python error: 200..1000 and
    # 3000 -> mean 840 (medium) but P90 3000 (long) disagree -> stay
    errors = [200, 300, 400, 500, 600, 700, 800, 900, 1000, 3000]
    tree = _tree([(900, [(SEARCH, 400)]), (1000, [(SEARCH, 500)]), (1100, [(SEARCH, 600)])]
                 + [(r + 100, [(PYTHON_ERR, r)]) for r in errors])
    router = CMLFQ(BUCKETS, tree)
    assert router.start("a", "new", 10).bucket == 0
    decision = router.on_return("a", SEARCH, 300)
    assert (decision.bucket, decision.estimate) == (1, 500.0)
    assert router.start("b", "new", 10).bucket == 0
    decision = router.on_return("b", PYTHON_ERR, 300)
    assert (decision.bucket, decision.estimate) == (0, 840.0)
    unseen = router.on_return("a", ToolReturn("browser", 10, "ok"), 400)
    assert unseen.bucket == 1  # unseen return: stay


def test_libra_router_conditions_on_tokens_spent() -> None:
    router = LibraRouter(BUCKETS, min_support=2, payoff=0.0, size_roots=False)
    paths = [TrajectoryPath("p", s, ((SEARCH, r),), 10) for s, r in ((120, 90), (150, 120), (2050, 2000), (2100, 2040))]
    router.observe_step(paths, {"p": 10})
    start = router.start("x", "q", 10)  # unseen prompt: global root, starts 120..2100 -> mean 1105, P90 2100: agree long
    assert (start.bucket, start.estimate) == (2, 1105.0)
    # right after the search (position 40): remaining 90, 120, 2000, 2040 -> mean 1062.5 (long), P90 2040 (long): stay
    assert router.on_return("x", SEARCH, 40).bucket == 2
    router.finish("x")
    router.start("y", "q", 10)
    # 500 tokens after the search only the two long ones are still running: 1500 and 1540 remain -> long
    y = router.on_return("y", SEARCH, 40)
    assert y.bucket == 2


def test_libra_router_payoff_blocks_costly_moves() -> None:
    router = LibraRouter(BUCKETS, payoff=2.0, size_roots=False)
    paths = [TrajectoryPath("p", 5000 + i, ((SEARCH, 60 + i),), 10) for i in range(4)]
    router.observe_step(paths, {"p": 10})
    assert router.start("x", "new", 10).bucket == 2  # long at the start (no context to re-prefill)
    late = router.on_return("x", SEARCH, 4000)  # ~62 tokens left: short, but re-prefilling 4000 does not pay
    assert late.bucket == 2 and late.estimate == pytest.approx(61.5)


def test_mlfq_demotes_on_tokens_spent() -> None:
    router = MLFQ(BUCKETS)
    router.start("a", "p", 50)
    assert router.on_return("a", SEARCH, 120).bucket == 0  # 70 spent
    assert router.on_return("a", SEARCH, 400).bucket == 1  # 350 spent
    assert router.on_return("a", SEARCH, 2000).bucket == 2


def test_least_load_spreads_starts() -> None:
    router = LeastLoad(BUCKETS)
    assert [router.start(str(i), "p", 10).bucket for i in range(4)] == [0, 1, 2, 0]
    router.finish("1")
    assert router.start("4", "p", 10).bucket == 1


def test_length_predictor_history_then_regression() -> None:
    router = LengthPredictor(BUCKETS, repredict=True)
    assert router.start("a", "p", 100) == router.start("a", "p", 100)  # no history: shortest, no estimate
    router.observe_step([TrajectoryPath("p", 500, (), 100), TrajectoryPath("p", 700, (), 100),
                         TrajectoryPath("q", 50, (), 10)], {"p": 100, "q": 10})
    decision = router.start("b", "p", 100)
    assert (decision.bucket, decision.estimate) == (1, 600.0)
    assert router.on_return("b", SEARCH, 300).estimate == pytest.approx(400.0)  # 600 - 200 spent
    assert router.on_return("b", SEARCH, 1000).estimate == pytest.approx(900.0)  # outlived: the tokens spent
    unseen = router.start("c", "r", 100)  # log-log fit through (10, 50), (100, 500), (100, 700)
    assert unseen.estimate == pytest.approx((500 * 700) ** 0.5, rel=1e-9)


def test_metrics_exact() -> None:
    records = [DecisionRecord(0, 0, 10.0, 5, 0, 0), DecisionRecord(0, 1, 20.0, 500, 0, 0),
               DecisionRecord(1, 1, 30.0, 600, 0, 0), DecisionRecord(2, 2, None, 5000, 0, 0)]
    assert accuracy(records) == 0.75
    assert balanced_accuracy(records, 3) == pytest.approx((1 + 0.5 + 1) / 3)
    assert rank_correlation(records) == 1.0
    assert spearman([1, 2, 2, 3], [4, 3, 2, 1]) == pytest.approx(-0.9486832980505138)


def test_libra_router_places_unknown_trajectories_by_prior_shares() -> None:
    router = LibraRouter(BUCKETS, measure="total", prior_shares=(0.5, 0.25, 0.25))
    assert [router.start(str(i), "new", 10).bucket for i in range(8)] == [0, 1, 2, 0, 0, 1, 2, 0]
    assert LibraRouter(BUCKETS).start("x", "new", 10).bucket == 0  # no prior: the shortest bucket


def test_total_measure_adds_the_position() -> None:
    router = MLFQ(BUCKETS, measure="total")
    router.start("a", "p", 50)
    assert router.on_return("a", SEARCH, 120).bucket == 1  # 120 tokens in total so far > 100
    with pytest.raises(ValueError):
        MLFQ(BUCKETS, measure="tokens")
