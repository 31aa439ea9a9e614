"""The simulated workloads: a recurring dataset of prompts, lengths whose between- and within-prompt
spread is fitted from the traces, tool calls that follow the prompt, the r2e-gym cap, trace replay."""

import math
import random
from dataclasses import replace

import pytest

from libra.errors import LibraError
from libra.sim.workloads import (
    PRESETS,
    TRACES,
    Spread,
    WorkloadGenerator,
    WorkloadSpec,
    fit_spread,
    pooled_spread,
    template_spread,
    workload_spec,
)
from libra.traces import read_trace
from libra.types import NO_TOOL, ToolStatus, Trajectory, Turn


def _synthetic(prompts: int, samples: int, gen: tuple[float, float], turns: tuple[float, float]) -> list[Trajectory]:
    """Trajectories whose log generated tokens and log turns are prompt level + sample luck, with
    the given (between, within) sigmas; tokens around 10,000 and turns around 30, so rounding is noise."""
    rng = random.Random(7)
    tool = Turn("t", "p", "s", 0, 0, 0, "search", 10, ToolStatus.OK)
    out = []
    for p in range(prompts):
        gen_level, turn_level = rng.gauss(math.log(10_000), gen[0]), rng.gauss(math.log(30), turns[0])
        for s in range(samples):
            n = max(1, round(math.exp(rng.gauss(turn_level, turns[1]))))
            final = Turn("t", "p", "s", n - 1, 0, round(math.exp(rng.gauss(gen_level, gen[1]))), NO_TOOL, 0, ToolStatus.NONE)
            out.append(Trajectory(f"q{p}/{s}", f"q{p}", str(s), "synthetic", 100, (tool,) * (n - 1) + (final,), None))
    return out


def test_fit_recovers_known_sigmas() -> None:
    spread = fit_spread(_synthetic(1_000, 4, gen=(0.5, 0.3), turns=(0.2, 0.4)))
    assert (spread.prompts, spread.samples) == (1_000, 4_000)
    assert spread.gen_between_sigma == pytest.approx(0.5, abs=0.025)
    assert spread.gen_within_sigma == pytest.approx(0.3, abs=0.01)
    assert spread.turns_between_sigma == pytest.approx(0.2, abs=0.025)
    assert spread.turns_within_sigma == pytest.approx(0.4, abs=0.015)
    with pytest.raises(LibraError, match="sampled twice or more"):
        fit_spread(_synthetic(50, 1, gen=(0.5, 0.3), turns=(0.2, 0.4)))


def _rounded(spread: Spread) -> tuple[float, ...]:
    return (round(spread.gen_between_sigma, 3), round(spread.gen_within_sigma, 3),
            round(spread.turns_between_sigma, 3), round(spread.turns_within_sigma, 3), spread.prompts, spread.samples)


def test_fitted_spreads_of_the_bundled_traces() -> None:
    """FireAct's samples are three models, hence its wide within-prompt spread; ToRA always makes
    one tool call. The SWE trace (one sample per prompt) splits its own spread (0.583 gen, 0.427
    turns) in the proportions pooled over the three traces with repeats."""
    fits = {name: _rounded(fit_spread(read_trace(TRACES / name).trajectories))
            for name in ("fireact_hotpotqa.csv", "tora_gsm8k.csv", "taubench_airline.csv")}
    assert fits == {
        "fireact_hotpotqa.csv": (0.341, 0.499, 0.210, 0.476, 500, 1464),
        "tora_gsm8k.csv": (0.255, 0.070, 0.019, 0.0, 1319, 2638),
        "taubench_airline.csv": (0.466, 0.360, 0.434, 0.328, 50, 200),
    }
    assert _rounded(pooled_spread()) == (0.365, 0.357, 0.279, 0.333, 1869, 4302)
    assert _rounded(template_spread(TRACES / "swe_gemini3_mini_A.csv")) == (0.417, 0.408, 0.274, 0.328, 1869, 4302)
    assert WorkloadGenerator(workload_spec("search-r1")).spread == template_spread(TRACES / "fireact_hotpotqa.csv")


def test_prompts_recur_epoch_by_epoch() -> None:
    spec = workload_spec("search-r1", group_size=2)
    assert spec.dataset_size == 32 * 60
    generator = WorkloadGenerator(spec, seed=0)
    steps = [generator.step(k) for k in range(200)]
    assert len({t.prompt_id for step in steps for t in step}) == 1920
    for step in steps[:3]:
        ids = [t.prompt_id for t in step]
        assert all(ids[2 * p] == ids[2 * p + 1] for p in range(32))  # a group is one prompt
    # a dataset that is no whole number of steps: steps straddle epochs, each prompt still once per epoch
    generator = WorkloadGenerator(replace(spec, dataset_prompts=50, prompts_per_step=8), seed=1)
    slots = [(k * 8 + p, i) for k in range(100) for p, i in enumerate(generator.step_prompts(k))]
    for epoch in range(16):
        assert sorted(i for j, i in slots if j // 50 == epoch) == list(range(50))
    assert [t.prompt_id for t in generator.step(0)[::2]] == [f"d{i}" for i in generator.step_prompts(0)]


def test_steps_depend_on_seed_and_step_only() -> None:
    spec = workload_spec("r2e-gym", group_size=2, prompts_per_step=4)
    first, second = WorkloadGenerator(spec, seed=3), WorkloadGenerator(spec, seed=3)
    assert [first.step(k) for k in range(5)] == [second.step(k) for k in range(5)]
    alone = WorkloadGenerator(spec, seed=3).step(17)
    assert first.step(17) == alone
    assert WorkloadGenerator(spec, seed=4).step(17) != alone
    assert len({t.trajectory_id for k in range(-1, 5) for t in first.step(k)}) == 6 * 8  # ids unique across steps


def test_samples_of_a_group_share_the_prompt_length() -> None:
    """Simulated lengths decompose like the trace's: between-prompt and within-prompt spread of log
    generated tokens (and of log turns) equal the fitted ones."""
    spec = replace(PRESETS["search-r1"], group_size=8, prompts_per_step=100, dataset_prompts=2_000,
                   length_drift=0.0, turn_drift=0.0)
    generator = WorkloadGenerator(spec, seed=3)
    trajectories = [t for k in range(20) for t in generator.step(k)]
    simulated = fit_spread(trajectories)
    assert (simulated.prompts, simulated.samples) == (2_000, 16_000)
    assert simulated.gen_between_sigma == pytest.approx(0.341, abs=0.015)  # 0.3413
    assert simulated.gen_within_sigma == pytest.approx(0.499, abs=0.01)  # 0.4957
    assert simulated.turns_between_sigma == pytest.approx(0.210, abs=0.015)  # 0.2117
    assert simulated.turns_within_sigma == pytest.approx(0.476, abs=0.025)  # 0.4957: whole turns add a little
    # the mean is gen_scale x the log-normal's with the trace's log mean (4.727) and spread: 4 x 135.6,
    # 3% under 4 x the trace's own mean (139.85), whose logs are skewed
    mean = sum(t.gen_tokens for t in trajectories) / len(trajectories)
    assert mean == pytest.approx(4 * math.exp(4.727 + (0.341**2 + 0.499**2) / 2), rel=0.02)


def test_tool_calls_follow_the_prompt() -> None:
    """All samples of a prompt, in every epoch, make the same tool calls in the same order (names,
    payload sizes, statuses); they differ only in how many."""
    spec = replace(PRESETS["r2e-gym"], group_size=4, prompts_per_step=16, dataset_prompts=16)
    generator = WorkloadGenerator(spec, seed=0)
    calls: dict[str, list[list[tuple[str, int, str]]]] = {}
    for k in (0, 1, 5):  # three epochs
        for t in generator.step(k):
            calls.setdefault(t.prompt_id, []).append([(u.tool_name, u.payload_tokens, u.status)
                                                      for u in t.turns if u.tool_name != NO_TOOL])
    assert len(calls) == 16 and all(len(samples) == 12 for samples in calls.values())
    for samples in calls.values():
        longest = max(samples, key=len)
        assert all(s == longest[:len(s)] for s in samples)
    assert sum(len({len(s) for s in samples}) > 1 for samples in calls.values()) == 16  # turn counts vary
    assert len({tuple(max(samples, key=len)[:3]) for samples in calls.values()}) == 16  # prompts differ


def test_r2e_gym_cap_leaves_the_tail() -> None:
    """The SWE trace's total tokens: p50 20,014, p90 36,273, p99 79,266, max 86,224; the cap is the
    next power of two at or above that max (also the engine's max context)."""
    totals = sorted(t.total_tokens for t in read_trace(TRACES / "swe_gemini3_mini_A.csv").trajectories)
    assert [totals[int(q * len(totals))] for q in (0.5, 0.9, 0.99)] + [totals[-1]] == [20_014, 36_273, 79_266, 86_224]
    cap = PRESETS["r2e-gym"].max_tokens
    assert cap == 131_072 == 2 ** math.ceil(math.log2(totals[-1]))
    generator = WorkloadGenerator(workload_spec("r2e-gym"), seed=0)
    for k, (low, high) in ((0, (30_000, 42_000)), (199, (38_000, 56_000))):  # drift: +60% tokens, +20% turns
        simulated = sorted(t.total_tokens for t in generator.step(k))
        p90 = simulated[int(0.9 * len(simulated))]
        assert low < p90 < high < cap / 2
        assert sum(t >= cap for t in simulated) <= 2


def test_trace_replay_is_the_trace() -> None:
    spec = workload_spec("trace:data/traces/taubench_airline.csv")
    generator = WorkloadGenerator(spec, seed=0)
    trace = read_trace("data/traces/taubench_airline.csv").trajectories
    step = generator.step(0)
    first_prompts = list(dict.fromkeys(t.prompt_id for t in trace))[:32]
    trace = [t for t in trace if t.prompt_id in first_prompts]  # step 0: the first 32 prompts, in file order
    assert [t.trajectory_id for t in step] == [f"0/{t.trajectory_id}" for t in trace]
    assert all([(u.gen_tokens, u.tool_name, u.payload_tokens, u.status) for u in s.turns]
               == [(u.gen_tokens, u.tool_name, u.tool_payload_tokens, u.tool_status.value) for u in t.turns]
               for s, t in zip(step, trace, strict=True))
    # pinned from the generator before the dataset was added: the same tool latencies
    assert (len(step), round(sum(u.tool_latency_s for t in step for u in t.turns), 6), sum(t.total_tokens for t in step)) \
        == (128, 847.204046, 470_096)
    later = generator.step(3)
    assert (len(later), later[0].trajectory_id, round(sum(u.tool_latency_s for t in later for u in t.turns), 6)) \
        == (72, "3/32/trial0", 263.26292)


@pytest.mark.parametrize(("change", "message"), [
    ({"dataset_prompts": 0}, "dataset_prompts must be at least 1, got 0; leave it unset"),
    ({"group_size": 0}, "group_size must be at least 1"),
    ({"prompts_per_step": -3}, "prompts_per_step must be at least 1"),
])
def test_bad_specs_say_what_is_wrong(change: dict[str, int], message: str) -> None:
    with pytest.raises(LibraError, match=message):
        WorkloadSpec("bad", "fireact_hotpotqa.csv", **change)
