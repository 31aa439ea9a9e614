"""The causal prefix tree: what past trajectories did after the same sequence of tool returns.

Roots: one per prompt (samples of a prompt seen in earlier steps), optionally one per prompt-size
class (prompts of 2^(k/c) to 2^((k+1)/c) tokens for `size_classes` c; the prompt's size is known
before its first token), and one global root pooling every prompt. An edge is a reduced tool return (`keys`); a node stands for "after these returns" and keeps
the remaining length that trajectories had from there (tokens generated or received after the
return): visit count, and the last `window` samples, sorted on demand, from which the mean, P90 and
their survival-conditioned versions ("given that it has already gone `elapsed` tokens past this
node") are read in O(log window).

A `Cursor` follows one live trajectory: each return costs one dict lookup per root, never a fresh
descent. When the path leaves the tree, the cursor stays at the deepest matched node and counts the
tokens since it, so estimates can be conditioned on them.

Memory is bounded by `max_nodes`: when an insert would pass it, the least-visited leaves go first
(`prune`). Each node holds at most `window` integers, so memory is O(max_nodes * window) plus
the dict overhead (about 1 KB per node at window 64; 100,000 nodes ~ 100 MB worst case).
"""

from __future__ import annotations

import bisect
import gc
import json
import math
import os
import stat
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.types import Trajectory

Key = tuple[str, int, str]
GLOBAL = "__global__"


class Node:
    # no link to the parent: a tree without cycles is freed as soon as it is dropped (the planning
    # flow and the simulator rebuild trees every step; cyclic ones waited for the collector)
    __slots__ = ("children", "count", "samples", "_sorted", "_prefix", "key")

    def __init__(self, key: Key | None = None, window: int = 64) -> None:
        self.children: dict[Key, Node] = {}
        self.count = 0  # samples ever inserted
        self.samples: deque[int] = deque(maxlen=window)  # most recent remaining lengths (tokens)
        self._sorted: list[int] | None = None
        self._prefix: list[int] | None = None
        self.key = key

    def add(self, remaining: int) -> None:
        self.count += 1
        self.samples.append(remaining)
        self._sorted = self._prefix = None

    def _ready(self) -> tuple[list[int], list[int]]:
        if self._sorted is None:
            ordered = sorted(self.samples)
            prefix = [0]
            for value in ordered:
                prefix.append(prefix[-1] + value)
            self._sorted, self._prefix = ordered, prefix
        return self._sorted, self._prefix  # type: ignore[return-value]

    def _survivors(self, elapsed: int) -> tuple[list[int], list[int], int, int] | None:
        """(sorted samples, their prefix sums, index of the first that went more than `elapsed`
        tokens past this node, how many did); None if none did."""
        if not self.samples:
            return None
        ordered, prefix = self._ready()
        start = bisect.bisect_right(ordered, elapsed) if elapsed > 0 else 0
        n = len(ordered) - start
        return (ordered, prefix, start, n) if n else None

    def estimate(self, elapsed: int = 0, quantile: float = 0.9) -> tuple[float, float, int] | None:
        """(mean, quantile, support) of the remaining length of trajectories that went more than
        `elapsed` tokens past this node, minus `elapsed`; None if none did."""
        found = self._survivors(elapsed)
        if found is None:
            return None
        ordered, prefix, start, n = found
        mean = (prefix[-1] - prefix[start]) / n - elapsed
        q = ordered[start + min(n - 1, int(quantile * n))] - elapsed
        return mean, float(q), n

    def distribution(self, elapsed: int, bounds: Sequence[float]) -> tuple[list[float], float, int] | None:
        """(share of each bucket, mean, support) of the remaining length of trajectories that went
        more than `elapsed` tokens past this node, minus `elapsed`; bucket i holds lengths <=
        bounds[i], one more bucket above. None if none went that far."""
        found = self._survivors(elapsed)
        if found is None:
            return None
        ordered, prefix, start, n = found
        shares, below = [], start
        for bound in bounds:
            upto = max(below, bisect.bisect_right(ordered, elapsed + bound))
            shares.append((upto - below) / n)
            below = upto
        shares.append((len(ordered) - below) / n)
        return shares, (prefix[-1] - prefix[start]) / n - elapsed, n


@dataclass(frozen=True)
class TrajectoryPath:
    """A finished trajectory as the tree stores it."""

    prompt_id: str
    start_remaining: int  # tokens generated or received after the prompt
    returns: tuple[tuple[ToolReturn, int], ...]  # each tool return and the remaining tokens after it
    prompt_tokens: int = 0  # initial prompt size (keys the prompt-size roots)

    @property
    def remaining_at_decisions(self) -> list[int]:
        """The true remaining tokens at the start and after each tool return (what an oracle knows)."""
        return [self.start_remaining] + [remaining for _, remaining in self.returns]


def path_from_turns(prompt_id: str, prompt_tokens: int,
                    turns: Sequence[tuple[int, str, int, str]]) -> TrajectoryPath:
    """A finished trajectory as the tree stores it, from its turns as (generated tokens, tool,
    payload tokens, status): the remaining tokens at its start and after each tool return that is
    followed by another turn."""
    start = sum(gen + payload for gen, _, payload, _ in turns)
    spent, returns = 0, []
    for gen, tool, payload, status in turns[:-1]:
        spent += gen + payload
        returns.append((ToolReturn(tool, payload, status), start - spent))
    return TrajectoryPath(prompt_id, start, tuple(returns), prompt_tokens)


def path_of(trajectory: Trajectory) -> TrajectoryPath:
    """The tree's view of a finished trajectory (an imported trace's or a live rollout's)."""
    return path_from_turns(trajectory.prompt_id, trajectory.prompt_tokens, [
        (t.gen_tokens, t.tool_name, t.tool_payload_tokens, t.tool_status.value) for t in trajectory.turns])


def paths_from_rows(trajectory_rows: Iterable[dict], return_rows: Iterable[dict]) -> list[TrajectoryPath]:
    """Store rows -> paths. `trajectory_rows` have step, trajectory_id, prompt_id, gen_tokens and
    tool_payload_tokens (the `trajectories` table); `return_rows` are the `remaining_length_paths`
    named query's rows."""
    by_trajectory: dict[tuple[int, str], list[dict]] = {}
    for row in return_rows:
        by_trajectory.setdefault((row["step"], row["trajectory_id"]), []).append(row)
    paths = []
    for t in trajectory_rows:
        rows = sorted(by_trajectory.get((t["step"], t["trajectory_id"]), []), key=lambda r: r["turn_idx"])
        returns = tuple(
            (ToolReturn(r["tool_name"], int(r["tool_payload_tokens"]), r["tool_status"]), int(r["remaining_tokens"]))
            for r in rows
        )
        paths.append(TrajectoryPath(t["prompt_id"], int(t["gen_tokens"]) + int(t["tool_payload_tokens"]), returns,
                                    int(t["prompt_tokens"])))
    return paths


@dataclass
class Match:
    node: Node
    position: int  # trajectory position (tokens) when it reached `node`
    on_path: bool  # still following the tree (False once a return had no child)


class Cursor:
    """Where one live trajectory stands in each root it has."""

    __slots__ = ("matches",)

    def __init__(self, matches: list[Match]) -> None:
        self.matches = matches  # most specific root first (the prompt's), then the global root

    def advance(self, key: Key, position: int) -> None:
        for match in self.matches:
            if match.on_path:
                child = match.node.children.get(key)
                if child is None:
                    match.on_path = False
                else:
                    match.node, match.position = child, position


class CausalTree:
    def __init__(self, scheme: KeyScheme | None = None, window: int = 64, max_nodes: int = 100_000,
                 per_prompt: bool = True, size_roots: bool = False, size_classes: int = 1) -> None:
        self.scheme = scheme or KeyScheme()
        self.window = window
        self.max_nodes = max_nodes
        self.per_prompt = per_prompt
        self.size_roots = size_roots
        if size_classes < 1:
            raise ValueError(f"size_classes must be at least 1 per doubling of the prompt size, got {size_classes}")
        self.size_classes = size_classes
        self.roots: dict[str, Node] = {GLOBAL: Node(window=window)}
        self.nodes = 1
        self._touched: list[Node] = []  # nodes whose samples changed since the last `refresh`

    def size_root(self, prompt_tokens: int) -> str:
        """The prompt-size class: `size_classes` classes per doubling of the prompt's tokens."""
        return f"__size_{math.floor(math.log2(max(prompt_tokens, 1)) * self.size_classes)}__"

    def cursor(self, prompt_id: str, prompt_tokens: int = 0) -> Cursor:
        """Matches from the most specific root (the prompt's) to the global one."""
        names = [prompt_id] if self.per_prompt else []
        if self.size_roots:
            names.append(self.size_root(prompt_tokens))
        matches = [Match(self.roots[n], 0, True) for n in names if n in self.roots]
        matches.append(Match(self.roots[GLOBAL], 0, True))
        return Cursor(matches)

    def insert(self, prompt_id: str, start_remaining: int, returns: Sequence[tuple[ToolReturn, int]],
               prompt_tokens: int = 0) -> None:
        """Add a finished trajectory: its remaining length at the start (after the prompt) and, for
        each tool return in order, (the return, the remaining length after it)."""
        keys = [self.scheme.key(ret) for ret, _ in returns]
        roots = [self.roots[GLOBAL]]
        names = ([prompt_id] if self.per_prompt else []) + ([self.size_root(prompt_tokens)] if self.size_roots else [])
        for name in names:
            if name not in self.roots:
                self.roots[name] = Node(window=self.window)
                self.nodes += 1
            roots.append(self.roots[name])
        touched = self._touched  # each node once: a node already unsorted is in it (or read lazily)
        for root in roots:
            node = root
            if node._sorted is not None or not node.count:
                touched.append(node)
            node.add(start_remaining)
            for key, (_, remaining) in zip(keys, returns, strict=True):
                child = node.children.get(key)
                if child is None:
                    child = node.children[key] = Node(key, self.window)
                    self.nodes += 1
                if child._sorted is not None or not child.count:
                    touched.append(child)
                child.add(remaining)
                node = child
        if self.nodes > self.max_nodes:
            self.prune(int(self.max_nodes * 0.9))

    def prune(self, target: int) -> int:
        """Remove the least-visited leaves (childless prompt roots included; never the global root)
        until at most `target` nodes remain: in each pass, the leaves in depth-first order (the
        prompt roots' last), the fewest-visited first (ties in that order)."""
        removed = 0
        while self.nodes > target:
            leaves, parents = self._leaves()
            names: list[str | None] = [None] * len(leaves)
            for name, root in self.roots.items():
                if name != GLOBAL and not root.children:
                    leaves.append(root)
                    parents.append(None)
                    names.append(name)
            if not leaves:
                break
            counts = [leaf.count for leaf in leaves]
            for i in sorted(range(len(leaves)), key=counts.__getitem__)[: max(1, self.nodes - target)]:
                leaf, parent, root_name = leaves[i], parents[i], names[i]
                if root_name is not None:
                    del self.roots[root_name]
                elif parent is not None and leaf.key is not None:
                    del parent.children[leaf.key]
                self.nodes -= 1
                removed += 1
        return removed

    def _leaves(self) -> tuple[list[Node], list[Node | None]]:
        """Every leaf below a root, depth first (a node's children pushed in order and taken from
        the end), with its parent. Walked with two stacks and no tuple per node: at 10^5 nodes a
        tree prunes every step or two."""
        leaves: list[Node] = []
        parents: list[Node | None] = []
        stack: list[Node] = list(self.roots.values())
        above: list[Node | None] = [None] * len(stack)
        while stack:
            node = stack.pop()
            parent = above.pop()
            if node.children:
                for child in node.children.values():
                    stack.append(child)
                    above.append(node)
            elif parent is not None:
                leaves.append(node)
                parents.append(parent)
        return leaves, parents

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        def dump(node: Node) -> dict:
            return {"count": node.count, "samples": list(node.samples),
                    "children": [[list(k), dump(c)] for k, c in node.children.items()]}

        return {"version": 1, "window": self.window, "max_nodes": self.max_nodes, "per_prompt": self.per_prompt,
                "size_roots": self.size_roots, "size_classes": self.size_classes,
                "scheme": {"granularity": self.scheme.granularity, "payload_bounds": list(self.scheme.payload_bounds)},
                "roots": {name: dump(root) for name, root in self.roots.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> CausalTree:
        if data.get("version") != 1:
            raise ValueError(f"unsupported causal tree version {data.get('version')!r}")
        scheme = KeyScheme(data["scheme"]["granularity"], tuple(data["scheme"]["payload_bounds"]))
        tree = cls(scheme, data["window"], data["max_nodes"], data["per_prompt"], data.get("size_roots", False),
                   data.get("size_classes", 1))
        tree.roots, tree.nodes = {}, 0

        def load(raw: dict, key: Key | None) -> Node:
            node = Node(key, tree.window)
            node.count = raw["count"]
            node.samples.extend(raw["samples"])
            tree.nodes += 1
            for raw_key, child in raw["children"]:
                k = (raw_key[0], int(raw_key[1]), raw_key[2])
                node.children[k] = load(child, k)
            return node

        for name, raw in data["roots"].items():
            tree.roots[name] = load(raw, None)
        return tree

    def rebuild(self, paths: Iterable[TrajectoryPath]) -> None:
        """Insert every path (e.g. the last few thousand trajectories read from the store), then
        `refresh`, so the decisions that follow find every node's statistics ready."""
        for path in paths:
            self.insert(path.prompt_id, path.start_remaining, path.returns, path.prompt_tokens)
        self.refresh()

    def refresh(self) -> None:
        """Prepare for the decisions that follow, off their path: sort the samples of every node
        changed since the last refresh (else the first decision reading one sorts its window), and
        run a young-generation garbage collection, which moves the new nodes to the old generation
        (else the collector traverses thousands of them inside some later decision: p99 x4). Where
        the collector is off (a simulation collects once a step itself) there is nothing to move."""
        for node in self._touched:
            node._ready()
        self._touched = []
        if gc.isenabled():
            gc.collect(1)

    def save(self, path: str | Path) -> None:
        """Write atomically (`libra.files.replacing`: a fresh temporary file, then rename)."""
        from libra.files import replacing

        with replacing(path) as f:
            f.write(json.dumps(self.to_dict()).encode())

    @classmethod
    def load(cls, path: str | Path) -> CausalTree:
        return cls.from_dict(json.loads(Path(path).read_text()))


def is_tree_file(path: str | Path) -> bool:
    """Whether `path` is a plain file that `CausalTree.save` wrote (what a tree may replace)."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            return False
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return False
    return head.startswith(b'{"version": ') and b'"window": ' in head
