"""Agentic workload generators for the simulator, fitted to real per-turn traces, with drift.

Each step has `prompts_per_step` prompts with `group_size` samples each (GRPO groups). A prompt
draws a real trajectory from its template trace (search-r1: FireAct, dapo-math: ToRA plus a long
reasoning phase, r2e-gym: the SWE agent); each sample then varies it: its generated tokens are
scaled by a per-sample log-normal factor, its number of turns by another (turns are resampled from
the template's, keeping their tools, payload sizes and statuses), and tool calls take a wall time
drawn per tool family. Drift: as training goes on, generated tokens grow by `length_drift` and turns
by `turn_drift` per 100 steps (the policy learns to think and to call tools more). A trajectory
stops once its context reaches `max_tokens`. `trace:FILE.csv` replays a trace file as it is.

The same seed gives the same steps; each step draws from its own seeded generator, so steps can be
produced in any order.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from libra.errors import LibraError
from libra.traces import group_by_step, read_trace
from libra.types import NO_TOOL, Trajectory

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
TIMEOUT_S = 30.0  # a tool call that ends in `timeout` held the trajectory this long


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

    @property
    def gen_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + sum(t.gen_tokens + t.payload_tokens for t in self.turns)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    template: str  # trace file name in data/traces (or a path for trace: workloads)
    group_size: int = 16
    prompts_per_step: int = 32
    gen_scale: float = 1.0  # multiplies the template's generated tokens
    reasoning_tokens: float = 0.0  # mean extra tokens of thinking on the first turn (log-normal)
    sample_sigma: float = 0.6  # log-normal spread of lengths between samples of a prompt
    turn_sigma: float = 0.3  # log-normal spread of turn counts between samples
    length_drift: float = 0.3  # relative growth of generated tokens per 100 steps
    turn_drift: float = 0.1  # relative growth of turns per 100 steps
    max_tokens: int = 40_960
    tool_latency_s: tuple[tuple[str, float], ...] = (
        ("search", 0.6), ("python", 1.0), ("bash", 2.0), ("api", 0.3), ("default", 0.5),
    )  # mean wall time per tool family (log-normal, sigma 0.5)


PRESETS: dict[str, WorkloadSpec] = {
    "search-r1": WorkloadSpec("search-r1", "fireact_hotpotqa.csv", gen_scale=4.0),
    "dapo-math": WorkloadSpec("dapo-math", "tora_gsm8k.csv", gen_scale=2.0, reasoning_tokens=3_000.0),
    "r2e-gym": WorkloadSpec("r2e-gym", "swe_gemini3_mini_A.csv", prompts_per_step=16),
}


def workload_spec(name: str, group_size: int | None = None, prompts_per_step: int | None = None) -> WorkloadSpec:
    """A preset by name, or `trace:FILE.csv` for a replayed trace."""
    if name.startswith("trace:"):
        spec = WorkloadSpec(name, name.split(":", 1)[1], group_size=1, sample_sigma=0.0, turn_sigma=0.0,
                            length_drift=0.0, turn_drift=0.0, max_tokens=10**9)
    elif name in PRESETS:
        spec = PRESETS[name]
    else:
        raise LibraError(f"unknown workload {name!r}; use one of {', '.join(PRESETS)} or trace:FILE.csv")
    changes = {}
    if group_size is not None:
        changes["group_size"] = group_size
    if prompts_per_step is not None:
        changes["prompts_per_step"] = prompts_per_step
    return spec if not changes else WorkloadSpec(**{**spec.__dict__, **changes})


class WorkloadGenerator:
    def __init__(self, spec: WorkloadSpec, seed: int = 0) -> None:
        self.spec = spec
        self.seed = seed
        path = Path(spec.template) if spec.name.startswith("trace:") else TRACES / spec.template
        self.templates: list[Trajectory] = list(read_trace(path).trajectories)
        self.latency = dict(spec.tool_latency_s)
        if spec.name.startswith("trace:"):
            self._replay = list(group_by_step(self.templates, spec.prompts_per_step).values())

    def step(self, step: int) -> list[SimTrajectory]:
        if self.spec.name.startswith("trace:"):
            rng = random.Random(f"{self.seed}:{step}")
            return [self._replay_one(t, rng, step) for t in self._replay[step % len(self._replay)]]
        rng = random.Random(f"{self.seed}:{step}")
        drift_len = 1 + self.spec.length_drift * step / 100
        drift_turns = 1 + self.spec.turn_drift * step / 100
        out = []
        for p in range(self.spec.prompts_per_step):
            template = rng.choice(self.templates)
            prompt_id = f"s{step}-p{p}"
            for s in range(self.spec.group_size):
                out.append(self._sample(template, f"{prompt_id}/{s}", prompt_id, rng, drift_len, drift_turns))
        return out

    def tool_latency(self, tool: str, status: str, rng: random.Random) -> float:
        if tool == NO_TOOL:
            return 0.0
        if status == "timeout":
            return TIMEOUT_S
        family = tool.split(":", 1)[0]
        mean = self.latency.get(family, self.latency.get("default", 0.5))
        return mean * math.exp(rng.gauss(-0.125, 0.5))  # log-normal with this mean (sigma 0.5)

    def _sample(self, template: Trajectory, tid: str, prompt_id: str, rng: random.Random,
                drift_len: float, drift_turns: float) -> SimTrajectory:
        spec = self.spec
        scale = spec.gen_scale * drift_len * math.exp(rng.gauss(0, spec.sample_sigma))
        tool_turns = [t for t in template.turns if t.tool_name != NO_TOOL]
        n_tools = round(len(tool_turns) * drift_turns * math.exp(rng.gauss(0, spec.turn_sigma))) if tool_turns else 0
        chosen = [tool_turns[0]] + [rng.choice(tool_turns) for _ in range(n_tools - 1)] if n_tools else []
        final = template.turns[-1]
        turns = []
        context = template.prompt_tokens
        for i, t in enumerate([*chosen, final]):
            gen = max(1, round(t.gen_tokens * scale))
            if i == 0 and spec.reasoning_tokens:
                gen += round(spec.reasoning_tokens * drift_len * math.exp(rng.gauss(-0.5, 1.0)))
            is_final = i == len(chosen)
            tool, payload, status = (NO_TOOL, 0, "none") if is_final else (t.tool_name, t.tool_payload_tokens, t.tool_status.value)
            if context + gen + payload >= spec.max_tokens:  # the length limit ends the trajectory in this turn
                turns.append(SimTurn(max(1, min(gen, spec.max_tokens - context)), NO_TOOL, 0, "none", 0.0))
                break
            turns.append(SimTurn(gen, tool, payload, status, self.tool_latency(tool, status, rng)))
            context += gen + payload
            if is_final:
                break
        return SimTrajectory(tid, prompt_id, template.prompt_tokens, tuple(turns))

    def _replay_one(self, t: Trajectory, rng: random.Random, step: int) -> SimTrajectory:
        turns = tuple(SimTurn(u.gen_tokens, u.tool_name, u.tool_payload_tokens, u.tool_status.value,
                              self.tool_latency(u.tool_name, u.tool_status.value, rng)) for u in t.turns)
        return SimTrajectory(f"{step}/{t.trajectory_id}", t.prompt_id, t.prompt_tokens, turns)

