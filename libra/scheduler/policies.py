"""Routers: which instance bucket runs a trajectory's next turn, decided at its start and at every
tool return. All share one interface so they can be replayed, simulated and deployed alike.

- `CMLFQ`: the original rule. Start in the shortest bucket; at a return, look up the deepest
  matching node of the causal tree (the prompt's root when the prompt was seen, else the global
  root) and migrate only if bucket(mean) == bucket(P90) != current bucket.
- `LibraRouter`: the same gate and no extra model inference, with a better estimator: estimates
  conditioned on the tokens already spent past the deepest match (survival statistics), back-off
  along the matched path when nothing outlived them, a start decision from the root's statistics,
  and a key granularity (fine or coarse tool names) chosen online by how well each would have routed
  the last finished steps.
- Baselines: `LeastLoad` (spread starts over buckets, never migrate), `AlwaysShortest`, `MLFQ`
  (demote when tokens so far pass the bucket bound), `LengthPredictor` (per-prompt history mean,
  else a log-log regression on prompt size; optionally re-predicts at each return) and `Oracle`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libra.scheduler.causal_tree import CausalTree, Cursor, Node, TrajectoryPath
from libra.scheduler.keys import KeyScheme, ToolReturn
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

    def finish(self, trajectory_id: str) -> None:
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

    def finish(self, trajectory_id: str) -> None:
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

    def finish(self, trajectory_id: str) -> None:
        super().finish(trajectory_id)
        self.prompt_tokens.pop(trajectory_id, None)


class LengthPredictor(Router):
    """Predicts the tokens after the prompt at the start: the prompt's mean over earlier steps, else
    exp(a + b * log(prompt tokens)) fitted on every trajectory seen. With `repredict`, at each
    return the estimate is the prediction minus the tokens spent (or the tokens spent, once the
    trajectory has outlived its prediction) and the trajectory moves to that estimate's bucket."""

    def __init__(self, buckets: Buckets, repredict: bool = False) -> None:
        super().__init__(buckets)
        self.repredict = repredict
        self.name = "predictor-repredict" if repredict else "predictor"
        self.history: dict[str, tuple[float, int]] = {}  # prompt -> (sum, count)
        self.fit: tuple[float, float] | None = None
        self._xy: list[tuple[float, float]] = []
        self.predicted: dict[str, tuple[float, int]] = {}  # trajectory -> (prediction, prompt tokens)

    def _predict(self, prompt_id: str, prompt_tokens: int) -> float | None:
        if prompt_id in self.history:
            total, count = self.history[prompt_id]
            return total / count
        if self.fit is None:
            return None
        a, b = self.fit
        return math.exp(a + b * math.log(max(prompt_tokens, 1)))

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        prediction = self._predict(prompt_id, prompt_tokens)
        bucket = 0 if prediction is None else self.buckets.of(prediction)
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
        if self.repredict:
            self.current[trajectory_id] = self.buckets.of(estimate)
        return RouteDecision(self.current[trajectory_id], estimate)

    def finish(self, trajectory_id: str) -> None:
        super().finish(trajectory_id)
        self.predicted.pop(trajectory_id, None)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        for path in paths:
            total, count = self.history.get(path.prompt_id, (0.0, 0))
            self.history[path.prompt_id] = (total + path.start_remaining, count + 1)
            self._xy.append((math.log(max(prompt_tokens[path.prompt_id], 1)), math.log(max(path.start_remaining, 1))))
        if len(self._xy) >= 2:
            n = len(self._xy)
            mx = sum(x for x, _ in self._xy) / n
            my = sum(y for _, y in self._xy) / n
            var = sum((x - mx) ** 2 for x, _ in self._xy)
            b = sum((x - mx) * (y - my) for x, y in self._xy) / var if var > 0 else 0.0
            self.fit = (my - b * mx, b)


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
        if target == self.buckets.of(offset + p90) and target != current and self._pays(trajectory_id, mean):
            self.current[trajectory_id] = current = target
        return RouteDecision(current, mean)

    def _pays(self, trajectory_id: str, remaining: float) -> bool:
        """Whether moving is worth re-prefilling the context (the original rule always moves)."""
        return True

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

    def finish(self, trajectory_id: str) -> None:
        super().finish(trajectory_id)
        self.cursors.pop(trajectory_id, None)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        self.tree.rebuild(paths)


@dataclass
class _Track:
    cursors: dict[str, Cursor]  # per key granularity
    paths: dict[str, list[list[tuple[Node, int]]]]  # per granularity, per root (prompt's, global): matched nodes and positions


class LibraRouter(CMLFQ):
    """C-MLFQ's gate with a survival-conditioned, backed-off estimator and learned key granularity."""

    name = "libra"

    def __init__(self, buckets: Buckets, min_support: int = 2, decay: float = 0.5, payoff: float = 2.0,
                 size_roots: bool = True, payload_bounds: tuple[int, ...] = (500, 5_000), window: int = 64,
                 max_nodes: int = 100_000, measure: str = "remaining",
                 prior_shares: Sequence[float] | None = None) -> None:
        """`prior_shares`: the share of trajectories expected in each bucket (e.g. the planner's); a
        trajectory the tree knows nothing about is placed by smooth weighted round-robin over them
        instead of all going to the shortest bucket."""
        Router.__init__(self, buckets, measure)
        self.prior = list(prior_shares) if prior_shares else None
        self._credit = [0.0] * buckets.count
        self.payoff = payoff  # migrate only if the estimated remaining tokens >= payoff x the context to re-prefill
        self.position: dict[str, int] = {}
        self.size_roots = size_roots
        self.trees = {g: CausalTree(KeyScheme(g, payload_bounds), window, max_nodes, size_roots=size_roots)
                      for g in ("fine", "coarse")}
        self.tree = self.trees["coarse"]
        self.min_support = min_support
        self.decay = decay
        self.score = {g: 0.0 for g in self.trees}  # decayed balanced accuracy of each granularity
        self.tracks: dict[str, _Track] = {}

    def _prior_bucket(self) -> int:
        if not self.prior:
            return 0
        for b, share in enumerate(self.prior):
            self._credit[b] += share
        bucket = max(range(len(self.prior)), key=lambda b: (self._credit[b], -b))
        self._credit[bucket] -= sum(self.prior)
        return bucket

    def _pays(self, trajectory_id: str, remaining: float) -> bool:
        """A move must leave at least `payoff` times the context it re-prefills still to generate."""
        position = self.position.get(trajectory_id, 0)
        return position == 0 or remaining >= self.payoff * position

    @property
    def granularity(self) -> str:
        return max(self.score, key=lambda g: (self.score[g], g == "coarse"))

    def _estimate(self, paths: list[list[tuple[Node, int]]], position: int) -> tuple[float, float, int] | None:
        """The most specific root's path first (the prompt's own history, then its size class, then
        every prompt), deepest node first; each node's statistics are conditioned on the tokens spent
        since the trajectory reached it. A prompt's own history counts from one sample; shared roots
        need `min_support`."""
        for level, nodes in enumerate(paths):
            own = level == 0 and len(paths) == (3 if self.size_roots else 2)
            needed = 1 if own else self.min_support
            for node, reached in reversed(nodes):
                stats = node.estimate(position - reached)
                if stats is not None and stats[2] >= needed:
                    return stats
        return None

    @staticmethod
    def _follow(cursor: Cursor, paths: list[list[tuple[Node, int]]], key: tuple, position: int) -> None:
        """Advance a cursor and extend each root's matched path (O(1) per root)."""
        on_path = [m.on_path for m in cursor.matches]
        cursor.advance(key, position)
        for was, match, nodes in zip(on_path, cursor.matches, paths, strict=True):
            if was and match.on_path:
                nodes.append((match.node, position))

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        self.current[trajectory_id] = 0
        cursors = {g: tree.cursor(prompt_id, prompt_tokens) for g, tree in self.trees.items()}
        paths = {g: [[(m.node, prompt_tokens)] for m in c.matches] for g, c in cursors.items()}
        self.tracks[trajectory_id] = _Track(cursors, paths)
        self.position[trajectory_id] = 0
        self._at(trajectory_id, prompt_tokens)
        stats = self._estimate(paths[self.granularity], prompt_tokens)
        if stats is None:
            bucket = self._prior_bucket()
            self.current[trajectory_id] = bucket
            return RouteDecision(bucket, None)
        # placing a new trajectory costs no migration, so the best point estimate decides (no gate)
        bucket = self.buckets.of(self.offset.get(trajectory_id, 0) + stats[0])
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, stats[0])

    def on_return(self, trajectory_id: str, ret: ToolReturn, position: int) -> RouteDecision:
        track = self.tracks[trajectory_id]
        for g, tree in self.trees.items():
            self._follow(track.cursors[g], track.paths[g], tree.scheme.key(ret), position)
        self.position[trajectory_id] = position
        self._at(trajectory_id, position)
        return self._gate(trajectory_id, self._estimate(track.paths[self.granularity], position))

    def finish(self, trajectory_id: str) -> None:
        Router.finish(self, trajectory_id)
        self.tracks.pop(trajectory_id, None)
        self.position.pop(trajectory_id, None)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        for g, tree in self.trees.items():  # score each granularity on the step before learning from it
            self.score[g] = self.decay * self.score[g] + (1 - self.decay) * self._balanced_accuracy(tree, paths, prompt_tokens)
        for tree in self.trees.values():
            tree.rebuild(paths)

    def _balanced_accuracy(self, tree: CausalTree, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> float:
        """How `tree` would have routed `paths` (no estimate counts as a miss); 0 for no decisions."""
        records = []
        for path in paths:
            start = prompt_tokens[path.prompt_id]
            cursor = tree.cursor(path.prompt_id, start)
            nodes = [[(m.node, start)] for m in cursor.matches]
            decisions = [(self._estimate(nodes, start), path.start_remaining)]
            for ret, remaining in path.returns:
                position = start + path.start_remaining - remaining
                self._follow(cursor, nodes, tree.scheme.key(ret), position)
                decisions.append((self._estimate(nodes, position), remaining))
            records += [DecisionRecord(-1 if stats is None else self.buckets.of(stats[0]), self.buckets.of(truth),
                                       None, truth, 0, 0) for stats, truth in decisions]
        score = balanced_accuracy(records, self.buckets.count)
        return 0.0 if math.isnan(score) else score


