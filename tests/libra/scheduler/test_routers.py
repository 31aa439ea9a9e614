import pytest

from libra.scheduler.causal_tree import CausalTree, TrajectoryPath
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.libra_router import LibraRouter
from libra.scheduler.metrics import DecisionRecord, accuracy, balanced_accuracy, rank_correlation, spearman
from libra.scheduler.routers import (
    CMLFQ,
    MLFQ,
    Buckets,
    Budgeted,
    Lane,
    LeastLoad,
    LengthPredictor,
    MigrationBudget,
    RouteDecision,
)

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


def _libra(budget: float) -> LibraRouter:
    """Trained on one step: starts 120, 150 (medium), 2050, 2100 (long); after a search 90 (short),
    120 (medium), 2000, 2040 (long)."""
    router = LibraRouter(BUCKETS, migration_budget=budget, size_roots=False, prompt_lengths=False)
    paths = [TrajectoryPath("p", s, ((SEARCH, r),), 10) for s, r in ((120, 90), (150, 120), (2050, 2000), (2100, 2040))]
    router.observe_step(paths, {"p": 10})
    return router


def test_libra_router_balanced_rule_priced_moves_and_survival() -> None:
    router = _libra(0.08)
    # decisions per true bucket, plus one each: weights 11/6, 11/12, 11/15 for short, medium, long
    assert router.truth_counts == [2, 4, 5] and router.tokens == [4460, 4]
    assert router.budget.credit == pytest.approx(0.08 * 4250)  # credit earned on the tokens seen (prompts + final turns)
    start = router.start("x", "q", 10)  # unseen prompt, global root: half medium, half long -> medium
    assert (start.bucket, start.estimate) == (1, 1105.0)
    # after the search: a quarter short, a quarter medium, half long -> short wins once weighted and
    # the move (40 tokens of context, price 0.61 x 40 / 1115) is cheap
    assert router.on_return("x", SEARCH, 40) == RouteDecision(0, 1062.5)
    assert router.budget.credit == pytest.approx(0.08 * 4290 - 40)
    router.start("y", "q", 10)
    assert router.on_return("y", SEARCH, 40).bucket == 0
    # 500 tokens past the search only the two long ones were still running (1500 and 1540 left):
    # long, but re-prefilling 540 tokens is over the remaining credit (306) -> stay
    late = router.on_return("y", ToolReturn("browser", 10, "ok"), 540)
    assert late == RouteDecision(0, 1520.0) and router.budget.credit == pytest.approx(0.08 * 4830 - 80)
    free = _libra(1.0)
    free.start("y", "q", 10)
    free.on_return("y", SEARCH, 40)
    assert free.on_return("y", ToolReturn("browser", 10, "ok"), 540) == RouteDecision(2, 1520.0)
    # a first move at 540 tokens costs 0.61 x 540 / 1115 = 0.29 of a decision, more than the 0.23 it gains
    free.start("z", "q", 10)
    assert free.on_return("z", SEARCH, 540).bucket == 1


def test_migration_budget_and_budgeted_baselines() -> None:
    budget = MigrationBudget(0.1)
    budget.see(1000)
    assert budget.allows(100) and not budget.allows(101)
    budget.spend(60)
    assert budget.credit == 40.0
    budget.see(9000)
    budget.end_step()  # 940 left: within the step's earnings (1000 over both see() calls), kept
    assert budget.credit == 940.0
    budget.end_step()  # a step that earned nothing keeps nothing
    assert budget.credit == 0.0 and not budget.allows(1)
    router = Budgeted(MLFQ(BUCKETS), 0.1)
    assert router.name == "mlfq@budget"
    router.start("a", "p", 50)
    assert router.on_return("a", SEARCH, 170).bucket == 0  # 120 spent: MLFQ would demote, credit is 17
    router.start("b", "p", 2000)  # +200 credit
    assert router.on_return("a", SEARCH, 180).bucket == 1  # now the 180 can be paid
    assert router.budget.credit == pytest.approx(218 - 180)
    with pytest.raises(ValueError):
        MigrationBudget(1.5)


def test_mlfq_demotes_on_tokens_spent() -> None:
    router = MLFQ(BUCKETS)
    router.start("a", "p", 50)
    assert router.on_return("a", SEARCH, 120).bucket == 0  # 70 spent
    assert router.on_return("a", SEARCH, 400).bucket == 1  # 350 spent
    assert router.on_return("a", SEARCH, 2000).bucket == 2


def test_least_load_spreads_starts() -> None:
    router = LeastLoad(BUCKETS)
    assert [router.start(str(i), "p", 10).bucket for i in range(4)] == [0, 1, 2, 0]
    router.finish("1", 40)
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


def test_lane_prices_a_token_by_the_batch_each_instance_would_run() -> None:
    lane = Lane(2, (0.01, 0.012, 0.014))  # two instances, batches up to 3
    assert [lane.token_s(n) for n in (0, 1, 2, 3, 4, 6)] == [0.01, 0.01, 0.01, 0.012, 0.012, 0.014]
    assert lane.token_s(12) == pytest.approx(0.014 * 6 / 3)  # batches of 6 past the largest: they wait their turn
    with pytest.raises(ValueError):
        Lane(0, (0.01,))
    with pytest.raises(ValueError):
        LibraRouter(BUCKETS, lanes=(lane,))  # one lane per bucket


def test_libra_router_with_lanes_evens_out_per_token_latency_and_sends_likely_long_ones_long() -> None:
    """Lanes: 4 slow instances (30 ms a token, +1 ms per extra sequence), 1 medium, 1 fast (5 ms,
    +1 ms). Knowing nothing, each start goes where a token would decode fastest with it added; a
    prompt whose history says it runs long (all its samples > 1000 tokens) goes to the long bucket
    whatever the load, and a trajectory there keeps its place at returns."""
    slow = Lane(4, tuple(0.030 + 0.001 * b for b in range(256)))
    medium = Lane(1, tuple(0.012 + 0.001 * b for b in range(256)))
    fast = Lane(1, tuple(0.005 + 0.001 * b for b in range(256)))
    router = LibraRouter(BUCKETS, measure="total", lanes=(slow, medium, fast), prompt_lengths=False)
    placed = [router.start(f"n{i}", "new", 10).bucket for i in range(12)]
    # the fast lane takes sequences until a token there (5 ms + 1 ms per extra sequence) costs what it
    # costs on the medium one (12 ms), then they alternate (a tie goes to the smaller bucket)
    assert placed == [2, 2, 2, 2, 2, 2, 2, 1, 2, 1, 2, 1]
    assert router.active == [0, 3, 9]
    router.finish("n0", 20)
    assert router.active == [0, 3, 8]
    # a fast lane that slows steeply with load: unknown trajectories soon go to the medium one ...
    steep = Lane(1, tuple(0.005 + 0.010 * b for b in range(256)))
    router = LibraRouter(BUCKETS, measure="total", lanes=(slow, medium, steep), prompt_lengths=False)
    assert [router.start(f"u{i}", "new", 10).bucket for i in range(3)] == [2, 1, 1]
    for _ in range(4):
        router.trees["coarse/1"].insert("long", 6000, [(SEARCH, 5000)])
    # ... but one whose prompt always ran long is sent to the long bucket against the load
    assert router.start("l0", "long", 10).bucket == 2
    assert router.active == [0, 2, 2]
    assert router.on_return("l0", SEARCH, 1010).bucket == 2  # and keeps its place at a return


def test_least_latency_is_libras_placement_without_length_evidence() -> None:
    from libra.errors import LibraError
    from libra.scheduler.replay import make_router

    medium = Lane(1, tuple(0.012 + 0.001 * b for b in range(256)))
    fast = Lane(1, tuple(0.005 + 0.001 * b for b in range(256)))
    slow = Lane(4, tuple(0.030 + 0.001 * b for b in range(256)))
    lanes = (slow, medium, fast)
    router = make_router("least-latency", BUCKETS, {}, lanes=lanes)
    libra = LibraRouter(BUCKETS, lanes=lanes, prompt_lengths=False)
    placed = [router.start(f"n{i}", "new", 10).bucket for i in range(12)]
    assert placed == [libra.start(f"n{i}", "new", 10).bucket for i in range(12)] == [2] * 7 + [1, 2, 1, 2, 1]
    router.finish("n0", 30)
    assert router.active == [0, 3, 8] and router.on_return("n1", SEARCH, 500).bucket == 2  # never migrates
    with pytest.raises(LibraError, match="lanes"):
        make_router("least-latency", BUCKETS, {})
