"""Agentic workload generators for the simulator, fitted to real per-turn traces, with drift.

Each step has `prompts_per_step` prompts with `group_size` samples each (GRPO groups). The prompts
come from a dataset that recurs, as in a real RL run: `dataset_prompts` prompts `d0`, `d1`, ...,
iterated epoch after epoch in a fresh seeded order each epoch, like a shuffled dataloader, so every
prompt is seen once per epoch (by default the dataset holds 60 steps' prompts, so a 200-step run
sees each prompt 3-4 times). Everything about a prompt is drawn from a generator seeded by (seed,
prompt) and never by step, so a prompt looks the same every epoch: its template (a real trajectory
from the preset's trace: search-r1 FireAct, dapo-math ToRA plus a long reasoning phase, r2e-gym the
SWE agent), its typical length and turn count, and its tool calls.

Lengths. In the traces the log of a trajectory's generated tokens is the prompt's level plus the
sample's luck; `fit_spread` splits its variance into a between-prompt and a within-prompt part (a
one-way random-effects decomposition over the prompts sampled several times), and the same for the
log of the turn count. A template already carries the between-prompt spread, but not cleanly: it is
one sample of its prompt, so its deviation from the trace's mean is the prompt's plus its own luck.
Putting a between-prompt factor on top of the template's own length would count the between spread
twice, and using the template's length as the prompt's level would count the within spread twice
(once inside the template, once in the samples): FireAct's simulated spread would grow from 0.60 to
0.78. So a prompt keeps the share between^2 / (between^2 + within^2) of its template's deviation
(the part of it that predicts the prompt, as in a regression of prompt level on one sample), adds a
fresh log-normal prompt factor for the rest of the between spread, and each sample then adds its
own log-normal luck with the within spread. Between, within and total spread of the simulated lengths
then equal the trace's. In the traces a sample that takes more turns also generates more tokens
(within-prompt correlation of the two logs: 0.90 FireAct, 0.78 tau-bench), so one normal draw per
prompt and one per sample drive both. The SWE trace has one sample per prompt: its own total spread
is split between and within prompts in the proportion pooled over the traces that have repeats.

A sample takes its prompt's tool calls in order, as agents on the same task call the same tools
with the same results: fewer turns cut the list, more turns repeat it from the start; only the
number of turns varies per sample, so a tool's name, payload size and status follow from the prompt
and the turns so far. A prompt's tool calls are the longest list among the trace's samples of its
template's task (the template's own where the task was sampled once): in FireAct the 10% of samples
that answer without searching are all one model's, whose other samples of the task do search. A
sample's generated tokens are spread over its turns in the proportions of the trace turns it took.

Tool calls take a wall time drawn per tool family. dapo-math adds a reasoning phase on the first
turn, drawn per sample. Drift: as training goes on, generated tokens grow by `length_drift` and turns
by `turn_drift` per 100 steps (the policy learns to think and to call tools more). A trajectory stops
once its context reaches `max_tokens`. `trace:FILE.csv` replays a trace file as it is.

The same seed gives the same steps; each step is computed from (seed, step) alone, so steps can be
produced in any order.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean, pvariance

from libra.errors import LibraError
from libra.planner.workload import TrajectoryLength
from libra.traces import BUNDLED, bundled_traces, group_by_step, read_trace
from libra.types import NO_TOOL, Trajectory, Turn

TRACES = BUNDLED  # the traces shipped with Libra
TIMEOUT_S = 30.0  # a tool call that ends in `timeout` held the trajectory this long
EPOCH_STEPS = 60  # default dataset: one epoch every 60 steps, so a 200-step run sees each prompt 3-4 times


@dataclass(frozen=True, slots=True)
class SimTurn:
    gen_tokens: int
    tool_name: str  # NO_TOOL on the final turn
    payload_tokens: int
    status: str  # ok / error / timeout ("none" on the final turn)
    tool_latency_s: float


@dataclass(frozen=True, slots=True)
class SimTrajectory:
    trajectory_id: str
    prompt_id: str
    prompt_tokens: int
    turns: tuple[SimTurn, ...]
    # the planner's record of it, summed once (the planner and the runner ask for it every step)
    length: TrajectoryLength = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", TrajectoryLength(
            self.prompt_tokens, sum(t.gen_tokens for t in self.turns), sum(t.payload_tokens for t in self.turns),
            len(self.turns), sum(t.tool_latency_s for t in self.turns)))

    @property
    def gen_tokens(self) -> int:
        return self.length.gen_tokens

    @property
    def total_tokens(self) -> int:
        return self.length.total_tokens


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    template: str  # trace file name in data/traces (or a path for trace: workloads)
    group_size: int = 16
    prompts_per_step: int = 32
    # prompts in the dataset; None: prompts_per_step * EPOCH_STEPS. The default follows the batch
    # size, so that any preset, at any prompts_per_step, sees each prompt 3-4 times in 200 steps
    dataset_prompts: int | None = None
    gen_scale: float = 1.0  # multiplies the template's generated tokens
    reasoning_tokens: float = 0.0  # mean extra tokens of thinking on the first turn (log-normal)
    length_drift: float = 0.3  # relative growth of generated tokens per 100 steps
    turn_drift: float = 0.1  # relative growth of turns per 100 steps
    max_tokens: int = 40_960
    tool_latency_s: tuple[tuple[str, float], ...] = (
        ("search", 0.6), ("python", 1.0), ("bash", 2.0), ("api", 0.3), ("default", 0.5),
    )  # mean wall time per tool family (log-normal, sigma 0.5)

    def __post_init__(self) -> None:
        for name in ("group_size", "prompts_per_step"):
            if getattr(self, name) < 1:
                raise LibraError(f"workload {self.name!r}: {name} must be at least 1, got {getattr(self, name)}")
        if self.dataset_prompts is not None and self.dataset_prompts < 1:
            raise LibraError(f"workload {self.name!r}: dataset_prompts must be at least 1, got {self.dataset_prompts}; "
                             f"leave it unset for a dataset of prompts_per_step x {EPOCH_STEPS} prompts")

    @property
    def dataset_size(self) -> int:
        """Prompts in the dataset the steps iterate over."""
        return self.dataset_prompts if self.dataset_prompts is not None else self.prompts_per_step * EPOCH_STEPS


PRESETS: dict[str, WorkloadSpec] = {
    "search-r1": WorkloadSpec("search-r1", "fireact_hotpotqa.csv", gen_scale=4.0),
    "dapo-math": WorkloadSpec("dapo-math", "tora_gsm8k.csv", gen_scale=2.0, reasoning_tokens=3_000.0),
    # The SWE trace's total tokens are 20,014 / 36,273 / 79,266 / 86,224 at p50 / p90 / p99 / max; a
    # cap of 40,960 cut its p90 (and grew drift past it). 131,072 is the next power of two above the
    # longest trajectory and the engine's max context, so only drift's far tail reaches it.
    "r2e-gym": WorkloadSpec("r2e-gym", "swe_gemini3_mini_A.csv", prompts_per_step=16, max_tokens=131_072),
}


def workload_spec(name: str, group_size: int | None = None, prompts_per_step: int | None = None) -> WorkloadSpec:
    """A preset by name, or `trace:FILE.csv` for a replayed trace."""
    if name.startswith("trace:"):
        if not name.split(":", 1)[1].strip():
            raise LibraError(f"workload {name!r} names no file: give trace:FILE.csv, a trace in the per-turn format")
        spec = WorkloadSpec(name, name.split(":", 1)[1], group_size=1, length_drift=0.0, turn_drift=0.0,
                            max_tokens=10**9)
    elif name in PRESETS:
        spec = PRESETS[name]
    else:
        raise LibraError(f"unknown workload {name!r}; use one of {', '.join(PRESETS)} or trace:FILE.csv")
    if group_size is not None:
        spec = replace(spec, group_size=group_size)
    if prompts_per_step is not None:
        spec = replace(spec, prompts_per_step=prompts_per_step)
    return spec


@dataclass(frozen=True, slots=True)
class Spread:
    """Log-normal spread of trajectory lengths, split into a between-prompt and a within-prompt part:
    sigmas of log(generated tokens) and of log(turns)."""

    gen_between_sigma: float
    gen_within_sigma: float
    turns_between_sigma: float
    turns_within_sigma: float
    prompts: int  # prompts sampled at least twice that the fit used
    samples: int  # their trajectories


def fit_spread(trajectories: Iterable[Trajectory | SimTrajectory]) -> Spread:
    """Between- and within-prompt spread of log(generated tokens) and log(turns), by a one-way
    random-effects variance decomposition over the prompts sampled at least twice (the ANOVA method
    of moments, for groups of unequal size). Prompts sampled once carry no within-prompt information
    and are left out."""
    by_prompt: dict[str, list[Sequence[Turn] | Sequence[SimTurn]]] = {}
    for t in trajectories:
        by_prompt.setdefault(t.prompt_id, []).append(t.turns)
    groups = [g for g in by_prompt.values() if len(g) >= 2]
    if len(groups) < 2:
        raise LibraError(f"fitting a length spread needs at least 2 prompts sampled twice or more (same prompt_id), "
                         f"got {len(groups)}; use a trace with repeated prompts or pool_spreads() of such traces")
    gen_between, gen_within = _components([[math.log(max(1, sum(u.gen_tokens for u in turns))) for turns in g]
                                           for g in groups])
    turns_between, turns_within = _components([[math.log(len(turns)) for turns in g] for g in groups])
    return Spread(gen_between, gen_within, turns_between, turns_within, len(groups), sum(len(g) for g in groups))


def _components(groups: list[list[float]]) -> tuple[float, float]:
    """Between- and within-group sigma: the within variance is the mean square within groups; the
    between variance is what the mean square between groups holds beyond it, per effective group size."""
    n, k = sum(len(g) for g in groups), len(groups)
    means = [(fmean(g), g) for g in groups]
    grand = sum(m * len(g) for m, g in means) / n
    within = sum((x - m) ** 2 for m, g in means for x in g) / (n - k)
    between_mean_square = sum(len(g) * (m - grand) ** 2 for m, g in means) / (k - 1)
    group_size = (n - sum(len(g) ** 2 for g in groups) / n) / (k - 1)
    return math.sqrt(max(0.0, (between_mean_square - within) / group_size)), math.sqrt(within)


def pool_spreads(spreads: Sequence[Spread]) -> Spread:
    """The spreads' variances averaged with equal weight per trace: each trace is one kind of agent,
    and weighting by prompts would let ToRA's 1,319 one-tool-call prompts decide for every agent."""
    def pooled(sigma: str) -> float:
        return math.sqrt(fmean(getattr(s, sigma) ** 2 for s in spreads))
    return Spread(pooled("gen_between_sigma"), pooled("gen_within_sigma"), pooled("turns_between_sigma"),
                  pooled("turns_within_sigma"), sum(s.prompts for s in spreads), sum(s.samples for s in spreads))


def split_spread(trajectories: Sequence[Trajectory], proportions: Spread) -> Spread:
    """The spread of a trace without repeated prompts: its own total spread (which one sample per
    prompt does measure), split between and within prompts in the proportions of `proportions`."""
    def split(logs: list[float], between: float, within: float) -> tuple[float, float]:
        total, parts = pvariance(logs), between**2 + within**2
        share = between**2 / parts if parts else 1.0
        return math.sqrt(share * total), math.sqrt((1 - share) * total)
    gen = split([math.log(max(1, t.gen_tokens)) for t in trajectories],
                proportions.gen_between_sigma, proportions.gen_within_sigma)
    turns = split([math.log(len(t.turns)) for t in trajectories],
                  proportions.turns_between_sigma, proportions.turns_within_sigma)
    return Spread(*gen, *turns, proportions.prompts, proportions.samples)


@functools.cache
def _trajectories(path: Path) -> tuple[Trajectory, ...]:
    return read_trace(path).trajectories


def _repeats(trajectories: Sequence[Trajectory]) -> bool:
    return len({t.prompt_id for t in trajectories}) < len(trajectories)


@functools.cache
def pooled_spread() -> Spread:
    """The spread pooled over the bundled traces that sample prompts more than once."""
    return pool_spreads([fit_spread(_trajectories(p)) for p in bundled_traces() if _repeats(_trajectories(p))])


@functools.cache
def template_spread(path: Path) -> Spread:
    """The spread a template trace gives its workload: fitted on the trace when it repeats prompts,
    else (the SWE trace) its own total spread split in the pooled proportions."""
    trajectories = _trajectories(path)
    return fit_spread(trajectories) if _repeats(trajectories) else split_spread(trajectories, pooled_spread())


@dataclass(frozen=True, slots=True)
class _LogLength:
    """How a simulated prompt's and sample's log length (of generated tokens or of turns) follow from
    its template's: the prompt keeps `keep` of the template's deviation from the trace's mean and
    adds a fresh part (sigma `fresh`); a sample adds its own part (sigma `within`)."""

    mean: float  # mean log length over the trace
    keep: float  # between^2 / (between^2 + within^2): the share of a sample's deviation that is its prompt's
    fresh: float  # the rest of the between-prompt sigma, which the template does not supply
    within: float

    @classmethod
    def of(cls, logs: list[float], between: float, within: float) -> _LogLength:
        mean, parts = fmean(logs), between**2 + within**2
        keep = between**2 / parts if parts else 1.0
        return cls(mean, keep, math.sqrt(max(0.0, between**2 - keep**2 * pvariance(logs, mean))), within)

    def prompt(self, template: float, z: float) -> float:
        return self.mean + self.keep * (template - self.mean) + self.fresh * z


@dataclass(frozen=True, slots=True)
class _Prompt:
    """A dataset prompt: its template and its typical log generated tokens and log turns (before
    gen_scale and drift)."""

    prompt_id: str
    template: Trajectory
    tool_turns: tuple[Turn, ...]  # the tool calls its samples make, in order
    log_gen: float
    log_turns: float


class WorkloadGenerator:
    def __init__(self, spec: WorkloadSpec, seed: int = 0) -> None:
        self.spec = spec
        self.seed = seed
        self.latency = dict(spec.tool_latency_s)
        replay = spec.name.startswith("trace:")
        path = Path(spec.template) if replay else TRACES / spec.template
        self.templates: list[Trajectory] = list(read_trace(path).trajectories if replay else _trajectories(path))
        if replay:
            self._replay = list(group_by_step(self.templates, spec.prompts_per_step).values())
            return
        self.spread = template_spread(path)
        s = self.spread
        self._gen = _LogLength.of([math.log(max(1, t.gen_tokens)) for t in self.templates],
                                  s.gen_between_sigma, s.gen_within_sigma)
        self._turns = _LogLength.of([math.log(len(t.turns)) for t in self.templates],
                                    s.turns_between_sigma, s.turns_within_sigma)
        self._tool_turns: dict[str, tuple[Turn, ...]] = {}  # trace prompt -> the longest list of tool calls of its samples
        for t in self.templates:
            if len(t.turns) - 1 > len(self._tool_turns.get(t.prompt_id, ())):
                self._tool_turns[t.prompt_id] = t.turns[:-1]  # every turn but the last calls a tool
        self._orders: dict[int, list[int]] = {}  # epoch -> dataset order (a cache: each is seeded by its epoch)
        self._prompts: dict[int, _Prompt] = {}  # a cache: each is seeded by its index

    def step(self, step: int) -> list[SimTrajectory]:
        rng = random.Random(f"{self.seed}:{step}")
        if self.spec.name.startswith("trace:"):
            return [self._replay_one(t, rng, step) for t in self._replay[step % len(self._replay)]]
        drift_len = 1 + self.spec.length_drift * step / 100
        drift_turns = 1 + self.spec.turn_drift * step / 100
        out = []
        for p, index in enumerate(self.step_prompts(step)):
            prompt = self._prompt(index)
            for s in range(self.spec.group_size):
                tid = f"{prompt.prompt_id}/s{step}.p{p}.{s}"
                out.append(self._sample(prompt, tid, rng, drift_len, drift_turns))
        return out

    def step_prompts(self, step: int) -> list[int]:
        """Dataset indices of the step's prompts: the step's slice of the dataset read epoch by epoch,
        each epoch in its own seeded order (a step at an epoch's end continues into the next)."""
        size, per_step = self.spec.dataset_size, self.spec.prompts_per_step
        return [self._order(epoch)[position] for epoch, position in
                (divmod(step * per_step + p, size) for p in range(per_step))]

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(self.spec.dataset_size))
            random.Random(f"{self.seed}:epoch:{epoch}").shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    def _prompt(self, index: int) -> _Prompt:
        if index not in self._prompts:
            rng = random.Random(f"{self.seed}:prompt:{index}")
            template = rng.choice(self.templates)
            z = rng.gauss(0, 1)
            self._prompts[index] = _Prompt(f"d{index}", template, self._tool_turns.get(template.prompt_id, ()),
                                           self._gen.prompt(math.log(max(1, template.gen_tokens)), z),
                                           self._turns.prompt(math.log(len(template.turns)), z))
        return self._prompts[index]

    def tool_latency(self, tool: str, status: str, rng: random.Random) -> float:
        if tool == NO_TOOL:
            return 0.0
        if status == "timeout":
            return TIMEOUT_S
        family = tool.split(":", 1)[0]
        mean = self.latency.get(family, self.latency.get("default", 0.5))
        return mean * math.exp(rng.gauss(-0.125, 0.5))  # log-normal with this mean (sigma 0.5)

    def _sample(self, prompt: _Prompt, tid: str, rng: random.Random, drift_len: float,
                drift_turns: float) -> SimTrajectory:
        """One sample: the prompt's tool calls cut or repeated to the sample's turn count, then the
        template's final turn; the sample's generated tokens spread over them in their proportions."""
        spec, template, tool_turns = self.spec, prompt.template, prompt.tool_turns
        z = rng.gauss(0, 1)
        n_turns = max(1, round(math.exp(prompt.log_turns + self._turns.within * z) * drift_turns))
        chosen = [tool_turns[i % len(tool_turns)] for i in range(n_turns - 1)] if tool_turns else []
        chosen.append(template.turns[-1])
        gen_total = math.exp(prompt.log_gen + self._gen.within * z) * spec.gen_scale * drift_len
        per_template_token = gen_total / max(1, sum(t.gen_tokens for t in chosen))
        turns = []
        context = template.prompt_tokens
        for i, t in enumerate(chosen):
            gen = max(1, round(t.gen_tokens * per_template_token))
            if i == 0 and spec.reasoning_tokens:
                gen += round(spec.reasoning_tokens * drift_len * math.exp(rng.gauss(-0.5, 1.0)))
            is_final = i == len(chosen) - 1
            tool, payload, status = (NO_TOOL, 0, "none") if is_final else (t.tool_name, t.tool_payload_tokens, t.tool_status.value)
            if context + gen + payload >= spec.max_tokens:  # the length limit ends the trajectory in this turn
                turns.append(SimTurn(max(1, min(gen, spec.max_tokens - context)), NO_TOOL, 0, "none", 0.0))
                break
            turns.append(SimTurn(gen, tool, payload, status, self.tool_latency(tool, status, rng)))
            context += gen + payload
        return SimTrajectory(tid, prompt.prompt_id, template.prompt_tokens, tuple(turns))

    def _replay_one(self, t: Trajectory, rng: random.Random, step: int) -> SimTrajectory:
        turns = tuple(SimTurn(u.gen_tokens, u.tool_name, u.tool_payload_tokens, u.tool_status.value,
                              self.tool_latency(u.tool_name, u.tool_status.value, rng)) for u in t.turns)
        return SimTrajectory(f"{step}/{t.trajectory_id}", t.prompt_id, t.prompt_tokens, turns)
