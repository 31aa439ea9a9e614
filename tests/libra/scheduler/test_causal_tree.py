from pathlib import Path

import pytest

from libra.scheduler.causal_tree import GLOBAL, CausalTree, path_of, paths_from_rows
from libra.scheduler.keys import KeyScheme, ToolReturn

SEARCH_OK = ToolReturn("search", 100, "ok")
SEARCH_BIG = ToolReturn("search", 800, "ok")
BASH_ERR = ToolReturn("bash:cat", 20, "error")


def test_keys_reduce_returns() -> None:
    fine, coarse = KeyScheme("fine"), KeyScheme("coarse")
    assert fine.key(BASH_ERR) == ("bash:cat", 0, "error")
    assert coarse.key(BASH_ERR) == ("bash", 0, "error")
    assert [fine.payload_class(t) for t in (0, 500, 501, 5000, 5001)] == [0, 0, 1, 1, 2]


def test_insert_builds_prompt_and_global_paths() -> None:
    tree = CausalTree(KeyScheme("fine"))
    tree.insert("p", 1000, [(SEARCH_OK, 700), (SEARCH_BIG, 100)])
    tree.insert("q", 400, [(SEARCH_OK, 200)])
    root = tree.roots[GLOBAL]
    assert (root.count, sorted(root.samples)) == (2, [400, 1000])
    child = root.children[("search", 0, "ok")]
    assert (child.count, sorted(child.samples)) == (2, [200, 700])
    assert list(child.children[("search", 1, "ok")].samples) == [100]
    assert set(tree.roots) == {GLOBAL, "p", "q"}
    assert tree.nodes == 3 + 3 + 2  # three roots, global path 2 deep + p's 2 + q's 1


def test_estimates_and_survival_conditioning() -> None:
    tree = CausalTree(KeyScheme("fine"))
    for remaining in (100, 200, 300, 400, 1000):
        tree.insert("p", remaining + 50, [(SEARCH_OK, remaining)])
    node = tree.roots[GLOBAL].children[("search", 0, "ok")]
    mean, p90, support = node.estimate()
    assert (mean, p90, support) == (400.0, 1000.0, 5)
    # already 250 tokens past this node: only 300, 400 and 1000 outlived that
    assert node.estimate(250) == pytest.approx(((300 + 400 + 1000) / 3 - 250, 750.0, 3))
    assert node.estimate(1000) is None
    # bucket shares among the survivors: <= 100, <= 500, above
    assert node.distribution(0, [100, 500]) == ([0.2, 0.6, 0.2], 400.0, 5)
    assert node.distribution(250, [100, 500]) == ([1 / 3, 1 / 3, 1 / 3], pytest.approx(1700 / 3 - 250), 3)
    assert node.distribution(0, [-10, 150]) == ([0.0, 0.2, 0.8], 400.0, 5)  # bounds below zero hold nothing
    assert node.distribution(1000, [100]) is None


def test_cursor_is_one_lookup_per_return_and_stays_when_lost() -> None:
    tree = CausalTree(KeyScheme("fine"))
    tree.insert("p", 900, [(SEARCH_OK, 500), (SEARCH_BIG, 100)])
    cursor = tree.cursor("p")
    assert len(cursor.matches) == 2  # the prompt's root, then the global root
    cursor.advance(("search", 0, "ok"), position=300)
    assert all(m.on_path and m.position == 300 for m in cursor.matches)
    deep = cursor.matches[0].node
    cursor.advance(("bash", 0, "error"), position=600)  # unseen: stay at the deepest match
    assert cursor.matches[0].node is deep and not cursor.matches[0].on_path
    cursor.advance(("search", 1, "ok"), position=900)  # off the path for good
    assert cursor.matches[0].node is deep
    assert len(tree.cursor("unseen").matches) == 1


def test_prune_keeps_the_bound() -> None:
    tree = CausalTree(KeyScheme("fine"), max_nodes=50)
    for i in range(40):
        tree.insert(f"p{i}", 100, [(ToolReturn(f"t{i}", 10, "ok"), 50)])
    assert tree.nodes <= 50
    assert GLOBAL in tree.roots


def test_prune_removes_the_least_visited_leaves_ties_in_depth_first_order() -> None:
    tree = CausalTree(KeyScheme("fine"), max_nodes=1_000)
    a, b, c = (ToolReturn(name, 10, "ok") for name in ("a", "b", "c"))
    tree.insert("p", 100, [(a, 50), (b, 20)])
    tree.insert("p", 100, [(a, 50)])
    tree.insert("p", 100, [(c, 50)])
    tree.insert("q", 100, [])  # a prompt root without children
    assert tree.nodes == 9  # global, p, q and the six nodes below global and p

    def shape() -> dict:
        def below(node) -> dict:
            return {key[0]: (child.count, below(child)) for key, child in node.children.items()}
        return {name: below(root) for name, root in tree.roots.items()}

    # leaves, depth first with children taken from the end: p/c, p/a/b, global/c, global/a/b (count 1
    # each), then the childless prompt root q (count 1); the first three go
    assert tree.prune(6) == 3
    assert shape() == {GLOBAL: {"a": (2, {"b": (1, {})})}, "p": {"a": (2, {})}, "q": {}}
    assert tree.prune(3) == 3  # global/a/b, q, then p/a: p is a leaf only in the next pass
    assert shape() == {GLOBAL: {"a": (2, {})}, "p": {}}
    assert tree.nodes == 3


def test_save_load_roundtrip(tmp_path: Path) -> None:
    tree = CausalTree(KeyScheme("coarse", (100, 1000)), window=8, size_roots=True)
    tree.insert("p", 900, [(SEARCH_OK, 500), (BASH_ERR, 100)], prompt_tokens=300)
    tree.save(tmp_path / "tree.json")
    loaded = CausalTree.load(tmp_path / "tree.json")
    assert loaded.to_dict() == tree.to_dict()
    assert loaded.nodes == tree.nodes
    assert loaded.cursor("p", 300).matches[1].node is loaded.roots[loaded.size_root(300)]


def test_rebuild_from_store_rows_equals_paths_from_trajectories(tmp_path: Path) -> None:
    from libra.config import StoreConfig
    from libra.traces import read_trace
    from storage.catalog import Catalog
    from storage.ingest import import_trace
    from storage.queries import run_named
    from tests.builders import small_trace

    trace_file = small_trace(tmp_path / "t.csv")
    import_trace(trace_file, "r", StoreConfig(root=str(tmp_path / "s"), fsync=False), prompts_per_step=1)
    with Catalog(tmp_path / "s", "r") as catalog:
        trajectories = catalog.query("select * from trajectories order by trajectory_id").to_pylist()
        returns = run_named(catalog, "remaining_length_paths").to_pylist()
    from_store = paths_from_rows(trajectories, returns)
    expected = [path_of(t) for t in sorted(read_trace(trace_file).trajectories, key=lambda t: t.trajectory_id)]
    assert from_store == expected
