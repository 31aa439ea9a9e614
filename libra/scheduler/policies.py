"""Routers: which instance bucket runs a trajectory's next turn, decided at its start and at every
tool return. All share one interface so they can be replayed, simulated and deployed alike.

- `CMLFQ`: the original rule. Start in the shortest bucket; at a return, look up the deepest
  matching node of the causal tree (the prompt's root when the prompt was seen, else the global
  root) and migrate only if bucket(mean) == bucket(P90) != current bucket.
- `LibraRouter`: no extra model inference either, with a better estimator and decision: bucket
  shares conditioned on the tokens already spent past the deepest match (survival statistics), back-off
  along the matched path and from the prompt's root to its size class and the global root, and,
  for a prompt without history of its own, the evidence of its sibling samples (`lengths`: those
  finished in this step and those still running); a balanced decision rule (rare buckets weighted
  by their rarity), migrations priced by the context they re-prefill against a budget (a dual
  price adjusted every step), and a key granularity (fine or coarse tool names) chosen online by
  how well each would have routed the last finished steps.
- Baselines: `LeastLoad` (spread starts over buckets, never migrate), `LeastLatency` (starts to the
  instances that would decode fastest with them: Libra's makespan placement without length
  evidence), `AlwaysShortest`, `MLFQ`
  (demote when tokens so far pass the bucket bound), `LengthPredictor` (per-prompt history mean,
  else a log-log regression on prompt size; optionally re-predicts at each return) and `Oracle`.
  `Budgeted` puts any of them under the same migration budget as Libra's router.
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from libra.config import SchedulerConfig
from libra.scheduler.causal_tree import CausalTree, Cursor, Node, TrajectoryPath
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.lengths import LogLogFit, PromptLengths, from_log
from libra.scheduler.metrics import DecisionRecord, balanced_accuracy


@dataclass(frozen=True)
class Buckets:
    bounds: tuple[int, ...]  # bucket i holds remaining lengths <= bounds[i]; one more bucket above

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)) or any(b < 1 for b in self.bounds):
            raise ValueError(f"bucket bounds must be increasing positive token counts, got {self.bounds}")

    @property
    def count(self) -> int:
        return len(self.bounds) + 1

    def of(self, tokens: float) -> int:
        return bisect.bisect_left(self.bounds, tokens)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    bucket: int
    estimate: float | None  # estimated remaining tokens (None: the router has no estimate)


@dataclass(frozen=True)
class Lane:
    """One bucket's instances as a router prices a placement on them: how many instances serve the
    bucket and the seconds one decode step takes at each batch size (index 0: a batch of one)."""

    instances: int
    step_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.instances < 1 or not self.step_s or any(s <= 0 for s in self.step_s):
            raise ValueError(f"a lane needs at least one instance and positive step times, got {self}")

    def token_s(self, active: int) -> float:
        """Seconds per generated token of each of `active` sequences spread evenly over the lane's
        instances; past the largest batch the extra sequences wait their turn."""
        batch = max(1, math.ceil(active / self.instances))
        largest = len(self.step_s)
        return self.step_s[batch - 1] if batch <= largest else self.step_s[-1] * batch / largest


def fastest_lane(lanes: Sequence[Lane], active: Sequence[int]) -> int:
    """The bucket whose lane would decode a token fastest with one more sequence on it (ties: the
    smaller bucket)."""
    return min(range(len(lanes)), key=lambda b: (lanes[b].token_s(active[b] + 1), b))


class Router:
    """Base class: per-trajectory current bucket and the step-end hook.

    `measure` says what the buckets are ranges of: `remaining` tokens from the decision on (how
    routing is scored on traces), or the trajectory's `total` length (how the planner sizes its
    instance groups; the simulator routes this way), i.e. the tokens so far plus the remaining ones.
    """

    name = "router"

    def __init__(self, buckets: Buckets, measure: str = "remaining") -> None:
        if measure not in ("remaining", "total"):
            raise ValueError(f"measure must be 'remaining' or 'total', got {measure!r}")
        self.buckets = buckets
        self.measure = measure
        self.current: dict[str, int] = {}
        self.offset: dict[str, int] = {}  # added to remaining-length estimates (the position in `total` mode)

    def _at(self, trajectory_id: str, position: int) -> None:
        if self.measure == "total":
            self.offset[trajectory_id] = position

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        self.current[trajectory_id] = 0
        return RouteDecision(0, None)

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        return RouteDecision(self.current[trajectory_id], None)

    def finish(self, trajectory_id: str, position: int) -> None:
        """The trajectory ended with `position` tokens of context (prompt included)."""
        self.current.pop(trajectory_id, None)
        self.offset.pop(trajectory_id, None)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        """The step's finished trajectories become visible (RL order: at the end of the step)."""


class AlwaysShortest(Router):
    name = "always-shortest"


class LeastLoad(Router):
    """No length information: each new trajectory goes to the bucket with the fewest active ones."""

    name = "least-load"

    def __init__(self, buckets: Buckets, measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        self.active = [0] * buckets.count

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        bucket = min(range(self.buckets.count), key=lambda b: (self.active[b], b))
        self.active[bucket] += 1
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, None)

    def finish(self, trajectory_id: str, position: int) -> None:
        bucket = self.current.pop(trajectory_id, None)
        if bucket is not None:
            self.active[bucket] -= 1


class LeastLatency(Router):
    """No length information, but knows the instances: each new trajectory goes to the lane that
    would decode fastest with it added (`fastest_lane`); never migrates. Libra's router without its
    length evidence."""

    name = "least-latency"

    def __init__(self, buckets: Buckets, lanes: Sequence[Lane], measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        if len(lanes) != buckets.count:
            raise ValueError(f"one lane per bucket: {buckets.count} buckets, {len(lanes)} lanes")
        self.lanes = tuple(lanes)
        self.active = [0] * buckets.count

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        bucket = fastest_lane(self.lanes, self.active)
        self.active[bucket] += 1
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, None)

    def finish(self, trajectory_id: str, position: int) -> None:
        bucket = self.current.pop(trajectory_id, None)
        if bucket is not None:
            self.active[bucket] -= 1


class MLFQ(Router):
    """Demote to the bucket of the tokens spent so far once they pass the current bucket's bound."""

    name = "mlfq"

    def __init__(self, buckets: Buckets, measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        self.prompt_tokens: dict[str, int] = {}

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        self.prompt_tokens[trajectory_id] = prompt_tokens
        return super().start(trajectory_id, prompt_id, prompt_tokens)

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        spent = position if self.measure == "total" else position - self.prompt_tokens[trajectory_id]
        bucket = max(self.current[trajectory_id], self.buckets.of(spent))
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, None)

    def finish(self, trajectory_id: str, position: int) -> None:
        super().finish(trajectory_id, position)
        self.prompt_tokens.pop(trajectory_id, None)


class LengthPredictor(Router):
    """Predicts the tokens after the prompt at the start: the prompt's mean over earlier steps, else
    exp(a + b * log(prompt tokens)) fitted on every trajectory seen. With `repredict`, at each
    return the estimate is the prediction minus the tokens spent (or the tokens spent, once the
    trajectory has outlived its prediction) and the trajectory moves to that estimate's bucket."""

    def __init__(self, buckets: Buckets, repredict: bool = False, measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        self.repredict = repredict
        self.name = "predictor-repredict" if repredict else "predictor"
        self.history: dict[str, tuple[float, int]] = {}  # prompt -> (sum, count)
        self.fit: tuple[float, float] | None = None
        self.regression = LogLogFit()
        self.predicted: dict[str, tuple[float, int]] = {}  # trajectory -> (prediction, prompt tokens)

    def _predict(self, prompt_id: str, prompt_tokens: int) -> float | None:
        if prompt_id in self.history:
            total, count = self.history[prompt_id]
            return total / count
        if self.fit is None:
            return None
        a, b = self.fit
        return from_log(a + b * math.log(max(prompt_tokens, 1)))

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        prediction = self._predict(prompt_id, prompt_tokens)
        self._at(trajectory_id, prompt_tokens)
        bucket = 0 if prediction is None else self.buckets.of(self.offset.get(trajectory_id, 0) + prediction)
        self.current[trajectory_id] = bucket
        if prediction is not None:
            self.predicted[trajectory_id] = (prediction, prompt_tokens)
        return RouteDecision(bucket, prediction)

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        if trajectory_id not in self.predicted:
            return RouteDecision(self.current[trajectory_id], None)
        prediction, prompt_tokens = self.predicted[trajectory_id]
        spent = position - prompt_tokens
        estimate = prediction - spent if prediction > spent else float(spent)
        self._at(trajectory_id, position)
        if self.repredict:
            self.current[trajectory_id] = self.buckets.of(self.offset.get(trajectory_id, 0) + estimate)
        return RouteDecision(self.current[trajectory_id], estimate)

    def finish(self, trajectory_id: str, position: int) -> None:
        super().finish(trajectory_id, position)
        self.predicted.pop(trajectory_id, None)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        for path in paths:
            total, count = self.history.get(path.prompt_id, (0.0, 0))
            self.history[path.prompt_id] = (total + path.start_remaining, count + 1)
            self.regression.add(prompt_tokens[path.prompt_id], path.start_remaining)
        fitted = self.regression.fit()
        if fitted is not None:
            self.fit = fitted[:2]


class Oracle(Router):
    """Knows the true remaining length at every decision (the replay hands it over)."""

    name = "oracle"

    def __init__(self, buckets: Buckets, truth: Mapping[str, Sequence[int]], measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        self.truth = truth  # trajectory -> remaining at start, after return 1, 2, ... (or the total, repeated)
        self.index: dict[str, int] = {}

    def _decide(self, trajectory_id: str) -> RouteDecision:
        remaining = self.truth[trajectory_id][self.index[trajectory_id]]
        self.index[trajectory_id] += 1
        bucket = self.buckets.of(self.offset.get(trajectory_id, 0) + remaining)
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, float(remaining))

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        self.index[trajectory_id] = 0
        self._at(trajectory_id, prompt_tokens)
        return self._decide(trajectory_id)

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        self._at(trajectory_id, position)
        return self._decide(trajectory_id)


class CMLFQ(Router):
    """The original causal MLFQ router (see the module docstring)."""

    name = "cmlfq"

    def __init__(self, buckets: Buckets, tree: CausalTree | None = None, measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        self.tree = tree or CausalTree(KeyScheme("fine"))
        self.cursors: dict[str, Cursor] = {}

    def _gate(self, trajectory_id: str, stats: tuple[float, float, int] | None) -> RouteDecision:
        current = self.current[trajectory_id]
        if stats is None:
            return RouteDecision(current, None)
        mean, p90, _ = stats
        offset = self.offset.get(trajectory_id, 0)
        target = self.buckets.of(offset + mean)
        if target == self.buckets.of(offset + p90) and target != current:
            self.current[trajectory_id] = current = target
        return RouteDecision(current, mean)

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        self.current[trajectory_id] = 0
        self.cursors[trajectory_id] = self.tree.cursor(prompt_id)
        return RouteDecision(0, None)

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        self._at(trajectory_id, position)
        cursor = self.cursors[trajectory_id]
        cursor.advance(self.tree.scheme.key(ret), position)
        match = cursor.matches[0]  # the prompt's root if seen, else the global one
        return self._gate(trajectory_id, match.node.estimate())

    def finish(self, trajectory_id: str, position: int) -> None:
        super().finish(trajectory_id, position)
        self.cursors.pop(trajectory_id, None)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        self.tree.rebuild(paths)


class MigrationBudget:
    """Re-prefilled tokens may be at most `share` of the tokens seen (prompts, generated tokens and
    tool results, counted as they arrive: at a trajectory's start and returns, and its final turn
    when its step ends): every token seen earns `share` tokens of credit and a migration spends its
    context. At the end of a step unspent credit is capped at that step's earnings, so quiet
    stretches cannot save up a burst for later (over any run of steps the spending exceeds `share`
    of its tokens by at most one step's earnings)."""

    def __init__(self, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"migration budget must be a share between 0 and 1, got {share}")
        self.share = share
        self.credit = 0.0
        self.earned = 0.0  # this step's earnings
        self.position: dict[str, int] = {}  # live trajectories' tokens seen so far

    def see(self, tokens: int) -> None:
        self.credit += self.share * tokens
        self.earned += self.share * tokens

    def started(self, trajectory_id: str, prompt_tokens: int) -> None:
        self.position[trajectory_id] = prompt_tokens
        self.see(prompt_tokens)

    def returned(self, trajectory_id: str, position: int) -> None:
        self.see(position - self.position[trajectory_id])
        self.position[trajectory_id] = position

    def finished(self, trajectory_id: str) -> None:
        self.position.pop(trajectory_id, None)

    def allows(self, tokens: int) -> bool:
        return tokens <= self.credit

    def spend(self, tokens: int) -> None:
        self.credit -= tokens

    def end_step(self, paths: Sequence[TrajectoryPath] = ()) -> None:
        """The step's trajectories ended: their final turns are seen, and credit is capped."""
        for path in paths:  # the tokens after each one's last decision
            self.see(path.returns[-1][1] if path.returns else path.start_remaining)
        self.credit = min(self.credit, self.earned)
        self.earned = 0.0


class Budgeted(Router):
    """Any router under a migration budget: a move the budget does not allow is not made (the
    trajectory stays where it is). Used to compare baselines with Libra at equal migration cost."""

    def __init__(self, inner: Router, share: float) -> None:
        super().__init__(inner.buckets, inner.measure)
        self.inner = inner
        self.name = f"{inner.name}@budget"
        self.budget = MigrationBudget(share)

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        decision = self.inner.start(trajectory_id, prompt_id, prompt_tokens)
        self.budget.started(trajectory_id, prompt_tokens)
        self.current[trajectory_id] = decision.bucket
        return decision

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        self.budget.returned(trajectory_id, position)
        before = self.current[trajectory_id]
        decision = self.inner.on_return(trajectory_id, ret, position)
        if decision.bucket != before:
            if self.budget.allows(position):
                self.budget.spend(position)
            else:
                self.inner.current[trajectory_id] = before
                decision = RouteDecision(before, decision.estimate)
        self.current[trajectory_id] = decision.bucket
        return decision

    def finish(self, trajectory_id: str, position: int) -> None:
        super().finish(trajectory_id, position)
        self.inner.finish(trajectory_id, position)
        self.budget.finished(trajectory_id)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        self.budget.end_step(paths)
        self.inner.observe_step(paths, prompt_tokens)


# the trees Libra's router keeps: tool-name granularity x prompt-size classes per doubling
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
        bucket = self.current.get(trajectory_id)
        if bucket is not None:
            self.active[bucket] -= 1
        Router.finish(self, trajectory_id, position)
        self.tracks.pop(trajectory_id, None)
        self.budget.finished(trajectory_id)
        if self.lengths is not None:
            self.lengths.finished(trajectory_id, position)

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
