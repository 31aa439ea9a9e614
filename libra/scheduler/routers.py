"""Routers: which instance bucket runs a trajectory's next turn, decided at its start and at every
tool return. All share one interface so they can be replayed, simulated and deployed alike.

- `CMLFQ`: the original rule. Start in the shortest bucket; at a return, look up the deepest
  matching node of the causal tree (the prompt's root when the prompt was seen, else the global
  root) and migrate only if bucket(mean) == bucket(P90) != current bucket.
- `LibraRouter` (in `libra_router`, built on these): no extra model inference either, with a
  better estimator and decision: bucket shares conditioned on the tokens already spent past the
  deepest match (survival statistics), back-off along the matched path and from the prompt's root
  to its size class and the global root, and, for a prompt without history of its own, the evidence
  of its sibling samples (`lengths`); a balanced decision rule, migrations priced against a budget,
  a key granularity chosen online; or, told the instances (`Lane`s), a decision for their makespan.
- Baselines: `LeastLoad` (spread starts over buckets, never migrate), `LeastLatency` (starts to the
  instances that would decode fastest with them: Libra's makespan placement without length
  evidence), `AlwaysShortest`, `MLFQ`
  (demote when tokens so far pass the bucket bound), `LengthPredictor` (per-prompt history mean,
  else a log-log regression on prompt size; optionally re-predicts at each return), `Oracle` and
  `GroupLanes` (named groups apart from the rest: a clairvoyant probe of placement, not a policy).
  `Budgeted` puts any of them under the same migration budget as Libra's router.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mypy_extensions import mypyc_attr  # routers compiled by `libra.native` stay open to Python subclasses

from libra.scheduler.causal_tree import CausalTree, Cursor, TrajectoryPath
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.lengths import LogLogFit, from_log


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


@mypyc_attr(allow_interpreted_subclasses=True)
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

    def drop(self, trajectory_id: str) -> None:
        """The trajectory is gone without an end (dropped as too stale while suspended): forget it,
        learning nothing from it. Routers that learn at `finish` override this."""
        self.finish(trajectory_id, 0)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        """The step's finished trajectories become visible (RL order: at the end of the step)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class AlwaysShortest(Router):
    name = "always-shortest"


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastLoad(Router):
    """No length information: each new trajectory goes to the bucket with the fewest active ones."""

    name = "least-load"

    def __init__(self, buckets: Buckets, measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        self.active = [0] * buckets.count

    def _place(self) -> int:
        return min(range(self.buckets.count), key=lambda b: (self.active[b], b))

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        bucket = self._place()
        self.active[bucket] += 1
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, None)

    def finish(self, trajectory_id: str, position: int) -> None:
        bucket = self.current.pop(trajectory_id, None)
        if bucket is not None:
            self.active[bucket] -= 1


@mypyc_attr(allow_interpreted_subclasses=True)
class GroupLanes(Router):
    """The trajectories of the groups in `first` run on bucket 0's instances and every other one on
    bucket 1's, from their start to their end. Told which groups will close a partial batch (by
    someone who knows the lengths), it measures what placing those apart could give; it is not a
    policy anyone can run."""

    name = "group-lanes"

    def __init__(self, groups: Mapping[str, str], first: frozenset[str]) -> None:
        super().__init__(Buckets((1,)), measure="total")
        self.groups = groups
        self.first = first

    def start(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> RouteDecision:
        bucket = 0 if self.groups[trajectory_id] in self.first else 1
        self.current[trajectory_id] = bucket
        return RouteDecision(bucket, None)


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastLatency(LeastLoad):
    """No length information, but knows the instances: each new trajectory goes to the lane that
    would decode fastest with it added (`fastest_lane`); never migrates. Libra's router without its
    length evidence."""

    name = "least-latency"

    def __init__(self, buckets: Buckets, lanes: Sequence[Lane], measure: str = "remaining") -> None:
        super().__init__(buckets, measure)
        if len(lanes) != buckets.count:
            raise ValueError(f"one lane per bucket: {buckets.count} buckets, {len(lanes)} lanes")
        self.lanes = tuple(lanes)

    def _place(self) -> int:
        return fastest_lane(self.lanes, self.active)


@mypyc_attr(allow_interpreted_subclasses=True)
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


@mypyc_attr(allow_interpreted_subclasses=True)
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


@mypyc_attr(allow_interpreted_subclasses=True)
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


@mypyc_attr(allow_interpreted_subclasses=True)
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


@mypyc_attr(allow_interpreted_subclasses=True)
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

    def drop(self, trajectory_id: str) -> None:
        super().finish(trajectory_id, 0)
        self.inner.drop(trajectory_id)
        self.budget.finished(trajectory_id)

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        self.budget.end_step(paths)
        self.inner.observe_step(paths, prompt_tokens)


# the trees Libra's router keeps: tool-name granularity x prompt-size classes per doubling
