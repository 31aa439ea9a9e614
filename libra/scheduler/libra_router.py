"""Libra's router: bucket shares from the causal tree (and, for prompts without history, the
prompt-length model), a balanced decision rule and migrations priced against a budget; or, told the
instances that serve the buckets, a decision for their makespan. See `LibraRouter`."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mypy_extensions import mypyc_attr

from libra.config import SchedulerConfig
from libra.scheduler.causal_tree import CausalTree, Cursor, Node, TrajectoryPath
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.lengths import PromptLengths
from libra.scheduler.metrics import DecisionRecord, balanced_accuracy
from libra.scheduler.routers import (
    CMLFQ,
    Buckets,
    Lane,
    MigrationBudget,
    RouteDecision,
    Router,
    fastest_lane,
)

GRANULARITIES = {"fine": (1, 4), "coarse": (1, 4)}
SCORED_PATHS = 128  # a step's finished trajectories the granularities are scored on (evenly spaced)


class _Found(NamedTuple):
    """What the tree says at a decision: bucket shares, mean remaining tokens, samples behind them,
    and whether they come from the prompt's own root."""

    shares: list[float]
    mean: float
    support: int
    own: bool


@dataclass
class _Track:
    granularity: str  # the tree chosen when the trajectory started (it keeps to it)
    cursor: Cursor
    paths: list[list[tuple[Node, int]]]  # per root (prompt's, size class, global): matched nodes and positions


_DEFAULTS = SchedulerConfig()  # the documented `scheduler` defaults: one source for the router and the config


@mypyc_attr(allow_interpreted_subclasses=True)
class LibraRouter(CMLFQ):
    """Bucket shares from the causal tree, a balanced decision rule and migrations priced against a
    budget.

    Estimator: at each decision the deepest matched node of the most specific root that has support
    (the prompt's own history from one sample, its prompt-size class and the global root from
    `min_support`), its samples conditioned on the tokens already spent past that node (survival
    statistics: only trajectories that went that far count, minus what was spent); the shares of
    the buckets among them, and their mean as the remaining-length estimate. When the prompt's own
    root does not answer, the size class's or global root's shares are combined with the
    prompt-length model's (`lengths.PromptLengths`: the prompt's level from its siblings that
    finished in this step and those still running, a regression on prompt size before that), as
    independent evidence (naive Bayes), and the estimate is the geometric mean of both.

    Decision: bucket b scores w_b * share_b, where w_b is inversely proportional to how often b was
    the true bucket of past decisions (so a rare long bucket is not starved by the common short one:
    balanced accuracy). The start costs nothing to place. At a tool return, moving costs
    price * context / (mean trajectory tokens); the trajectory moves to the best-scoring bucket net
    of that cost, and only while re-prefilled tokens stay within `migration_budget` of the tokens
    seen. The price is a dual variable: after every step it is multiplied by exp(step x (the step's
    migrated share / budget - 1)), so cheap early moves are made and expensive late ones are not,
    with spending near the budget.

    The key granularity (`bash:cat` or `bash`) is chosen online by how each tree would have routed
    the last finished steps. No model inference, no predictor to retrain.

    With `lanes` (how many instances serve each bucket and how fast they decode at each batch
    size), as Libra runs it on the planner's instances, the decision serves the rollout's makespan
    instead: a trajectory the estimate says is likely to need the longest bucket goes there, any
    other to the lane that would decode fastest with it added, and a trajectory is promoted at a
    return only when it likely needs the longest bucket and has at least its context still to go.
    Balanced accuracy rewards naming rare long buckets; on instances, sending every uncertain
    trajectory to a rare bucket's few instances, or all of them to the common one, builds the very
    tail routing is meant to cut (measured in `libra.sim.routing`)."""

    name = "libra"

    def __init__(self, buckets: Buckets, min_support: int = _DEFAULTS.min_support, decay: float = 0.95,
                 migration_budget: float = _DEFAULTS.migration_budget, size_roots: bool = True,
                 payload_bounds: tuple[int, ...] = _DEFAULTS.payload_bounds, window: int = _DEFAULTS.window,
                 max_nodes: int = _DEFAULTS.max_nodes, measure: str = "remaining",
                 prior_shares: Sequence[float] | None = None, price_step: float = 0.5,
                 prompt_lengths: bool = True, trees: Mapping[str, CausalTree] | None = None,
                 lanes: Sequence[Lane] | None = None, long_share: float = 0.5) -> None:
        """`prior_shares`: the share of trajectories expected in each bucket (e.g. the planner's); a
        trajectory nothing is known about is placed by smooth weighted round-robin over them instead
        of all going to the shortest bucket. `prompt_lengths=False` leaves out the prompt-length
        model (the tree alone). `lanes` (one per bucket): route for the makespan of the instances
        serving the buckets instead of for balanced accuracy (see `_place`); `long_share`: how
        likely a trajectory must be to need the longest bucket to be sent there."""
        Router.__init__(self, buckets, measure)
        if lanes is not None and len(lanes) != buckets.count:
            raise ValueError(f"one lane per bucket: {buckets.count} buckets, {len(lanes)} lanes")
        self.lanes = tuple(lanes) if lanes is not None else None
        self.long_share = long_share
        self.active = [0] * buckets.count  # live trajectories routed to each bucket
        self.lengths = PromptLengths() if prompt_lengths else None
        self.prior = list(prior_shares) if prior_shares else None
        self._credit = [0.0] * buckets.count
        self.budget = MigrationBudget(migration_budget)
        self.price = 1.0
        self.price_step = price_step
        self.step_migrated = 0
        self.truth_counts = [1] * buckets.count  # decisions per true bucket (plus one each)
        self.tokens = [0, 0]  # trajectory tokens seen at the end of steps: sum, trajectories
        self.size_roots = size_roots
        self.trees = dict(trees) if trees is not None else {
            f"{g}/{c}": CausalTree(KeyScheme(g, payload_bounds), window, max_nodes, size_roots=size_roots, size_classes=c)
            for g in ("fine", "coarse") for c in GRANULARITIES[g]}
        self.tree = self.trees["coarse/1"]
        self.min_support = min_support
        self.decay = decay
        self.score = {g: 0.0 for g in self.trees}  # decayed balanced accuracy of each granularity
        self.tracks: dict[str, _Track] = {}

    def carried_to(self, buckets: Buckets, prior_shares: Sequence[float] | None = None, *,
                   lanes: Sequence[Lane] | None = None, detached: bool = False) -> LibraRouter:
        """A router over `buckets` that keeps what this one learned: its trees, their scores and the
        prompt-length model (what it counted per bucket and its migration price start afresh when the
        buckets change).
        `detached`: the new router gets its own copy of the prompt-length model, so running it (a
        planner's probe replaying a step) leaves this router as it was; the trees are only read
        within a step."""
        new = LibraRouter(buckets, self.min_support, self.decay, self.budget.share, self.size_roots,
                          measure=self.measure, prior_shares=prior_shares, price_step=self.price_step,
                          prompt_lengths=self.lengths is not None, trees=self.trees, lanes=lanes,
                          long_share=self.long_share)
        new.score = dict(self.score) if detached else self.score
        new.lengths = copy.deepcopy(self.lengths) if detached else self.lengths
        if buckets == self.buckets:  # what it counted per bucket and its migration price still hold
            new.truth_counts, new.tokens, new.price = list(self.truth_counts), list(self.tokens), self.price
        return new

    def rebuild_trees(self, paths: Sequence[TrajectoryPath]) -> int:
        """Replace what the trees learned with `paths` (e.g. the run's recent steps read from the
        store): fresh trees of the same granularities, built off the decision path, then swapped in
        (a workload that drifted is no longer predicted from the steps before the drift). Their
        scores are kept. Returns the nodes of the tree in use."""
        fresh = {g: CausalTree(t.scheme, t.window, t.max_nodes, t.per_prompt, t.size_roots, t.size_classes)
                 for g, t in self.trees.items()}
        for tree in fresh.values():
            tree.rebuild(paths)
        self.trees = fresh
        self.tree = fresh["coarse/1"]
        return fresh[self.granularity].nodes

    def _prior_bucket(self) -> int:
        if not self.prior:
            return 0
        for b, share in enumerate(self.prior):
            self._credit[b] += share
        bucket = max(range(len(self.prior)), key=lambda b: (self._credit[b], -b))
        self._credit[bucket] -= sum(self.prior)
        return bucket

    @property
    def granularity(self) -> str:
        return max(self.score, key=lambda g: (self.score[g], g == "coarse/1"))

    def _distribution(self, paths: list[list[tuple[Node, int]]], position: int,
                      offset: int = 0) -> _Found | None:
        """Bucket shares, mean and support from the most specific root with support, deepest node
        first (see the class docstring); `offset` shifts the bounds (the `total` measure)."""
        bounds = [b - offset for b in self.buckets.bounds]
        for level, nodes in enumerate(paths):
            own = level == 0 and len(paths) == (3 if self.size_roots else 2)
            needed = 1 if own else self.min_support
            for node, reached in reversed(nodes):
                found = node.distribution(position - reached, bounds)
                if found is not None and found[2] >= needed:
                    return _Found(found[0], found[1], found[2], own)
        return None

    def _estimate(self, trajectory_id: str, track: _Track, position: int) -> tuple[list[float], float] | None:
        """Bucket shares and remaining-length estimate at a decision. The prompt's own history in
        the tree is used as it is; otherwise the tree's shares (size class or global root, smoothed
        by one prior sample) are combined with the prompt-length model's as independent evidence
        (naive Bayes: the product over the prior), and the estimate is the geometric mean of both."""
        offset = self.offset.get(trajectory_id, 0)
        found = self._distribution(track.paths, position, offset)
        if self.lengths is None or (found is not None and found.own):
            return None if found is None else (found.shares, found.mean)
        model = self.lengths.distribution(trajectory_id, position, [b - offset for b in self.buckets.bounds])
        if model is None or found is None:
            return model if found is None else (found.shares, found.mean)
        total = sum(self.truth_counts)
        prior = [count / total for count in self.truth_counts]
        combined = [(tree * found.support + p) / (found.support + 1) * length / p
                    for tree, length, p in zip(found.shares, model[0], prior, strict=True)]
        norm = sum(combined)
        return [c / norm for c in combined], math.sqrt(max(found.mean, 1.0) * max(model[1], 1.0))

    def _choose(self, shares: Sequence[float], current: int | None = None, move_cost: float = 0.0) -> int:
        """The bucket with the best weighted share, net of `move_cost` for leaving `current`."""
        total = sum(self.truth_counts)
        scores = [total * share / (len(shares) * count) - (move_cost if b != current else 0.0)
                  for b, (share, count) in enumerate(zip(shares, self.truth_counts, strict=True))]
        best = max(scores)
        return current if current is not None and scores[current] == best else scores.index(best)

    @staticmethod
    def _follow(cursor: Cursor, paths: list[list[tuple[Node, int]]], key: tuple, position: int) -> None:
        """Advance a cursor and extend each root's matched path (O(1) per root)."""
        on_path = [m.on_path for m in cursor.matches]
        cursor.advance(key, position)
        for was, match, nodes in zip(on_path, cursor.matches, paths, strict=True):
            if was and match.on_path:
                nodes.append((match.node, position))

    def _place(self, found: tuple[list[float], float] | None) -> int:
        """Makespan placement (with lanes): a trajectory at least `long_share` likely to need the
        longest bucket goes there (its instances are the fastest per token); any other goes to the
        lane whose sequences would decode fastest with it added, which evens out per-token latency,
        so whichever trajectory turns out longest is not stuck on a crowded or slow instance."""
        assert self.lanes is not None
        longest = self.buckets.count - 1
        if found is not None and found[0][longest] >= self.long_share:
            return longest
        return fastest_lane(self.lanes, self.active)

    def _move(self, trajectory_id: str, bucket: int) -> None:
        self.active[self.current[trajectory_id]] -= 1
        self.active[bucket] += 1
        self.current[trajectory_id] = bucket

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        granularity = self.granularity
        cursor = self.trees[granularity].cursor(prompt_id, prompt_tokens)
        track = self.tracks[trajectory_id] = _Track(granularity, cursor, [[(m.node, prompt_tokens)] for m in cursor.matches])
        self.budget.started(trajectory_id, prompt_tokens)
        if self.lengths is not None:
            self.lengths.started(trajectory_id, prompt_id, prompt_tokens)
        self._at(trajectory_id, prompt_tokens)
        found = self._estimate(trajectory_id, track, prompt_tokens)
        if self.lanes is not None:
            bucket = self._place(found)
        elif found is None:
            bucket = self._prior_bucket()
        else:
            bucket = self._choose(found[0])  # placing costs no migration
        self.current[trajectory_id] = bucket
        self.active[bucket] += 1
        return RouteDecision(bucket, None if found is None else found[1])

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        track = self.tracks[trajectory_id]
        self._follow(track.cursor, track.paths, self.trees[track.granularity].scheme.key(ret), position)
        self.budget.returned(trajectory_id, position)
        if self.lengths is not None:
            self.lengths.advanced(trajectory_id, position)
        self._at(trajectory_id, position)
        current = self.current[trajectory_id]
        found = self._estimate(trajectory_id, track, position)
        if found is None:
            return RouteDecision(current, None)
        if self.lanes is not None:
            # makespan: promote to the longest bucket only a trajectory likely to need it with at least
            # its context still to generate (re-prefilling the context must buy a long remainder)
            longest = self.buckets.count - 1
            target = longest if found[0][longest] >= self.long_share and found[1] >= position else current
        else:
            mean_tokens = self.tokens[0] / self.tokens[1] if self.tokens[1] else position
            target = self._choose(found[0], current, self.price * position / max(mean_tokens, 1))
        if target != current and self.budget.allows(position):
            self.budget.spend(position)
            self.step_migrated += position
            self._move(trajectory_id, target)
            current = target
        return RouteDecision(current, found[1])

    def finish(self, trajectory_id: str, position: int) -> None:
        self._release(trajectory_id)
        if self.lengths is not None:
            self.lengths.finished(trajectory_id, position)

    def drop(self, trajectory_id: str) -> None:
        self._release(trajectory_id)
        if self.lengths is not None:
            self.lengths.dropped(trajectory_id)

    def _release(self, trajectory_id: str) -> None:
        bucket = self.current.get(trajectory_id)
        if bucket is not None:
            self.active[bucket] -= 1
        Router.finish(self, trajectory_id, 0)
        self.tracks.pop(trajectory_id, None)
        self.budget.finished(trajectory_id)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        step_tokens = sum(prompt_tokens[p.prompt_id] + p.start_remaining for p in paths)
        if step_tokens and self.budget.share > 0:
            ratio = self.step_migrated / step_tokens
            self.price *= math.exp(max(-2.0, min(2.0, self.price_step * (ratio / self.budget.share - 1))))
        self.step_migrated = 0
        scored = paths[:: max(1, len(paths) // SCORED_PATHS)]
        for g, tree in self.trees.items():  # score each granularity on the step before learning from it
            self.score[g] = self.decay * self.score[g] + (1 - self.decay) * self._balanced_accuracy(tree, scored, prompt_tokens)
        self.budget.end_step(paths)
        for path in paths:
            total = prompt_tokens[path.prompt_id] + path.start_remaining
            for remaining in path.remaining_at_decisions:
                self.truth_counts[self.buckets.of(total if self.measure == "total" else remaining)] += 1
            self.tokens[0] += total
            self.tokens[1] += 1
        for tree in self.trees.values():
            tree.rebuild(paths)
        if self.lengths is not None:
            self.lengths.observe_step(paths, prompt_tokens)

    def _balanced_accuracy(self, tree: CausalTree, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> float:
        """How `tree` would have placed `paths`' decisions, free of migration cost (no estimate
        counts as a miss); 0 for no decisions."""
        records = []
        for path in paths:
            start = prompt_tokens[path.prompt_id]
            offset = start if self.measure == "total" else 0
            total = start + path.start_remaining
            cursor = tree.cursor(path.prompt_id, start)
            nodes = [[(m.node, start)] for m in cursor.matches]
            decisions = [(self._distribution(nodes, start, offset), path.start_remaining, offset)]
            for ret, remaining in path.returns:
                position = total - remaining
                self._follow(cursor, nodes, tree.scheme.key(ret), position)
                offset = position if self.measure == "total" else 0
                decisions.append((self._distribution(nodes, position, offset), remaining, offset))
            records += [DecisionRecord(-1 if found is None else self._choose(found.shares), self.buckets.of(offset + truth),
                                       None, truth, 0, 0) for found, truth, offset in decisions]
        score = balanced_accuracy(records, self.buckets.count)
        return 0.0 if math.isnan(score) else score
