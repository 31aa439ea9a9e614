"""How long a prompt's trajectories run, from what its samples did: evidence the causal tree cannot
use when the prompt has no history of its own.

A hierarchical log-normal model. A trajectory's length after its prompt (tokens generated or
received) is log-normal around its prompt's level mu_p with spread `within`; mu_p is normal around
a log-log regression on the prompt's size with spread `between`. Both spreads and the regression
are refitted from sufficient statistics at every step's end (no training, no model inference). The
evidence about mu_p:

- the prompt's samples from earlier steps (exact lengths);
- its siblings in the current step that already finished (exact lengths, known before the step
  ends: a GRPO group's samples run side by side);
- its siblings still running: each is known to be longer than it is so far (censored).

Given them, the remaining length of a trajectory that has already run `spent` tokens is the
model's length conditioned on being longer than `spent` (survival), integrated over mu_p's posterior:
the normal posterior from the exact lengths, reweighted by the censored ones, by Gauss-Hermite
quadrature (`NODES` points). One decision costs O(NODES x (buckets + running siblings)).

Memory: three floats per prompt ever seen and one entry per running trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from numpy.polynomial.hermite_e import hermegauss

from libra.scheduler.causal_tree import TrajectoryPath

NODES = 10
_X, _W = hermegauss(NODES)
GH = tuple(zip(_X.tolist(), (_W / _W.sum()).tolist(), strict=True))  # standard normal nodes, weights summing to 1
MIN_SPREAD = 0.1  # floor of both spreads (log tokens): replayed samples of a prompt can be identical
_SQRT2 = math.sqrt(2.0)


def _log_length(tokens: float) -> float:
    return math.log(max(tokens, 1.0))


def from_log(log_length: float) -> float:
    """exp of a log length, capped at exp(700) (about 1e304 tokens: past any context, as good as
    infinite). A log-log fit over a few prompts of very different sizes can extrapolate past what
    exp takes."""
    return math.exp(min(log_length, 700.0))


class LogLogFit:
    """Least squares log(length) = a + b log(prompt tokens), from running sums (O(1) per sample)."""

    def __init__(self) -> None:
        self.sums = [0.0] * 6  # 1, x, y, x^2, xy, y^2

    def add(self, prompt_tokens: int, length: int) -> float:
        """Add one trajectory; returns its log length."""
        x, y = _log_length(prompt_tokens), _log_length(length)
        for i, term in enumerate((1.0, x, y, x * x, x * y, y * y)):
            self.sums[i] += term
        return y

    def fit(self) -> tuple[float, float, float] | None:
        """(a, b, residual variance); b = 0 when the prompt sizes do not vary; None below 2 samples."""
        n, sx, sy, sxx, sxy, syy = self.sums
        if n < 2:
            return None
        vx, vxy, vy = sxx - sx * sx / n, sxy - sx * sy / n, syy - sy * sy / n
        b = vxy / vx if vx > 1e-12 else 0.0
        return (sy - b * sx) / n, b, max(0.0, vy - b * vxy) / max(1.0, n - 2)


class PromptLengths:
    """The model above, fed by the router's events (`started`, `advanced`, `finished`,
    `observe_step`) and asked at decisions (`distribution`)."""

    def __init__(self) -> None:
        self.prompts: dict[str, list[float]] = {}  # prompt -> count, sum, sum of squares of earlier log lengths
        self.regression = LogLogFit()  # over every earlier trajectory
        self.fit: tuple[float, float, float, float] | None = None  # a, b, within spread, between spread
        self.running: dict[str, tuple[str, int, int]] = {}  # trajectory -> prompt, prompt tokens, tokens so far
        self.siblings: dict[str, set[str]] = {}  # prompt -> its running trajectories
        self.same_step: dict[str, list[float]] = {}  # prompt -> log lengths of samples finished in this step
        self._answers: dict[tuple, tuple[list[float], float] | None] = {}  # `distribution`'s, this step's

    # ------------------------------------------------------------------ events
    def started(self, trajectory_id: str, prompt_id: str, prompt_tokens: int) -> None:
        self.running[trajectory_id] = (prompt_id, prompt_tokens, prompt_tokens)
        self.siblings.setdefault(prompt_id, set()).add(trajectory_id)

    def dropped(self, trajectory_id: str) -> tuple[str, int] | None:
        """The trajectory is gone without an end (a partial rollout dropped it as too stale): no
        length is learned from it. Its (prompt, prompt tokens), or None if it was not running."""
        found = self.running.pop(trajectory_id, None)
        if found is None:
            return None
        prompt_id, prompt_tokens, _ = found
        self.siblings[prompt_id].discard(trajectory_id)
        if not self.siblings[prompt_id]:
            del self.siblings[prompt_id]
        return prompt_id, prompt_tokens

    def advanced(self, trajectory_id: str, position: int) -> None:
        """The trajectory's context is `position` tokens (prompt included)."""
        prompt_id, prompt_tokens, _ = self.running[trajectory_id]
        self.running[trajectory_id] = (prompt_id, prompt_tokens, position)

    def finished(self, trajectory_id: str, position: int) -> None:
        """The trajectory ended with `position` tokens (prompt included): an exact length for its
        siblings from now on."""
        found = self.dropped(trajectory_id)
        if found is None:
            return
        prompt_id, prompt_tokens = found
        self.same_step.setdefault(prompt_id, []).append(_log_length(position - prompt_tokens))

    def observe_step(self, paths: Sequence[TrajectoryPath], prompt_tokens: Mapping[str, int]) -> None:
        """The step's trajectories become history (their entries among this step's finished
        siblings are dropped), and the model is refitted."""
        for path in paths:
            y = self.regression.add(prompt_tokens[path.prompt_id], path.start_remaining)
            moments = self.prompts.setdefault(path.prompt_id, [0.0, 0.0, 0.0])
            moments[0] += 1
            moments[1] += y
            moments[2] += y * y
            same_step = self.same_step.get(path.prompt_id)
            if same_step and y in same_step:
                same_step.remove(y)
                if not same_step:
                    del self.same_step[path.prompt_id]
        self._answers = {}
        fitted = self.regression.fit()
        if fitted is None:
            return
        a, b, residual = fitted
        within_ss = within_df = 0.0
        for count, total, squares in self.prompts.values():
            if count > 1:
                within_ss += squares - total * total / count
                within_df += count - 1
        within = within_ss / within_df if within_df else residual / 2
        self.fit = (a, b, max(MIN_SPREAD, math.sqrt(max(within, 0.0))),
                    max(MIN_SPREAD, math.sqrt(max(residual - within, 0.0))))

    # ------------------------------------------------------------------ decisions
    def distribution(self, trajectory_id: str, position: int, bounds: Sequence[float]) -> tuple[list[float], float] | None:
        """(share of each bucket, mean) of the trajectory's remaining tokens at `position`; bucket i
        holds remaining lengths <= bounds[i], one more bucket above. None before the first fit, for
        a trajectory not started here, or when the model gives its survival no mass."""
        if self.fit is None or trajectory_id not in self.running:
            return None
        a, b, within, between = self.fit
        prompt_id, prompt_tokens, _ = self.running[trajectory_id]
        spent = position - prompt_tokens
        count, total, _ = self.prompts.get(prompt_id, (0.0, 0.0, 0.0))
        same_step = self.same_step.get(prompt_id, ())
        count, total = count + len(same_step), total + sum(same_step)
        # normal posterior of mu_p from the exact lengths
        precision = 1 / between**2 + count / within**2
        centre = ((a + b * _log_length(prompt_tokens)) / between**2 + total / within**2) / precision
        spread = 1 / math.sqrt(precision)
        censored = tuple(math.log(s - prompt_tokens) for t in self.siblings.get(prompt_id, ())
                         if t != trajectory_id and (s := self.running[t][2]) > prompt_tokens)
        # the answer is a function of these alone: a group's samples starting side by side ask the same
        key = (centre, spread, within, censored, spent, tuple(bounds))
        known = self._answers.get(key)
        if known is None:
            known = self._answers[key] = self._integrate(centre, spread, within, censored, spent, bounds)
        return None if known is None else (list(known[0]), known[1])

    @staticmethod
    def _integrate(centre: float, spread: float, within: float, censored: tuple[float, ...], spent: int,
                   bounds: Sequence[float]) -> tuple[list[float], float] | None:
        """`distribution`'s quadrature: mu_p ~ N(centre, spread) reweighted by the censored log
        lengths, the length log-normal around mu_p with spread `within`, conditioned on > `spent`."""
        cuts = [math.log(spent + bound) if spent + bound > 0 else -math.inf for bound in bounds]
        log_spent = math.log(spent) if spent > 0 else -math.inf
        erfc, inv = math.erfc, 1 / (within * _SQRT2)
        variance = within * within
        shares = [0.0] * (len(bounds) + 1)
        alive = mean = 0.0
        for x, weight in GH:
            mu = centre + spread * x
            for c in censored:  # 2 P(sibling's length > c), the factor 2 cancels below
                weight *= erfc((c - mu) * inv)
            above = erfc((log_spent - mu) * inv) if spent > 0 else 2.0  # 2 P(length > spent)
            alive += weight * above
            for i, cut in enumerate(cuts):
                beyond = erfc((cut - mu) * inv) if cut > log_spent else above
                shares[i] += weight * (above - beyond)
                above = beyond
            shares[-1] += weight * above
            tail = erfc((log_spent - mu - variance) * inv) if spent > 0 else 2.0
            mean += weight * from_log(mu + variance / 2) * tail  # 2 E[length; length > spent]
        if alive <= 0.0:
            return None
        return [share / alive for share in shares], mean / alive - spent
