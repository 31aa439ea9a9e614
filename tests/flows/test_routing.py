"""The routing flows run for real (Prefect, the test session's server): the router evaluation gives
exactly the replay's figures, the tree flow saves exactly the tree the store's rows make, and bad
parameters are refused before anything starts, named as a deployment spells them."""

from pathlib import Path

import pytest

from flows.routing import eval_router_flow, router_request, tree_flow, tree_request
from libra.clock import WallClock
from libra.config import LibraConfig
from libra.errors import LibraError

ROOT = Path(__file__).resolve().parents[2]
TAU = ROOT / "data" / "traces" / "taubench_airline.csv"
SWE = ROOT / "data" / "traces" / "swe_gemini3_mini_A.csv"


def test_the_evaluation_flow_reports_the_replays_figures():
    from libra.scheduler.replay import replay
    from libra.traces import read_trace

    report = eval_router_flow(str(TAU), buckets="2000,4000", routers="libra,cmlfq", prompts_per_step=4)
    direct = replay(read_trace(TAU).trajectories, prompts_per_step=4, order="group", bounds=[2000, 4000],
                    routers=["libra", "cmlfq"], settings=LibraConfig().scheduler, clock=WallClock())
    assert list(report["policies"]) == ["libra", "cmlfq"] and report["buckets"] == list(direct.buckets)
    assert (report["steps"], report["warmup_steps"]) == (direct.steps, direct.warmup_steps)
    for name, got in report["policies"].items():
        want = direct.routers[name]
        for metric in ("accuracy", "balanced_accuracy", "migrated_token_ratio", "decisions"):
            assert got[metric] == getattr(want, metric), (name, metric)


def test_the_tree_flow_saves_the_stores_tree(tmp_path: Path):
    from libra.scheduler.causal_tree import CausalTree
    from storage.ingest import import_trace

    store = tmp_path / "store"
    config = LibraConfig.model_validate({"store": {"root": str(store), "fsync": False}})
    import_trace(SWE, "swe", config.store, config.traces.prompts_per_step)
    out = tmp_path / "tree.json"
    summary = tree_flow("swe", str(out), last_steps=5, config=config)
    assert (summary["run"], summary["trajectories"]) == ("swe", 38)
    tree = CausalTree.load(out)
    assert (tree.nodes, len(tree.roots)) == (summary["nodes"], summary["roots"])


@pytest.mark.parametrize("call, message", [
    (lambda: router_request(str(TAU), LibraConfig(), routers=","), "routers ',': name at least one router"),
    (lambda: router_request(str(TAU), LibraConfig(), routers="libra,nope"), "routers: unknown router 'nope'"),
    (lambda: router_request(str(TAU), LibraConfig(), prompts_per_step=0), "prompts_per_step must be >= 1"),
    (lambda: router_request(str(TAU), LibraConfig(), buckets="x"), "buckets"),
    (lambda: tree_request("swe", "/no/such/folder/t.json"), "cannot write /no/such/folder/t.json"),
    (lambda: tree_request("swe", "t.json", last_steps=-1), "last_steps must be >= 0"),
    (lambda: tree_request("swe", "t.json", granularity="medium"), "granularity 'medium'"),
])
def test_bad_parameters_are_refused_by_name(call, message):
    with pytest.raises(LibraError) as caught:
        call()
    assert message in str(caught.value)
