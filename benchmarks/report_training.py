"""The README's performance tables of the live training loop: learning and its supervised reference,
partial rollouts and the asynchronous pipeline (live and simulated), placement policies, hybrids in a
run and the megatron trainer (`benchmarks.report` puts them in order with the others)."""

from __future__ import annotations


def seed_spread(result: dict) -> float | None:
    """The spread of the gains between the seeds of `bench_train`'s learning figures; None with one seed
    (files saved before one seed was told apart hold 0.0 there)."""
    return result["gain_spread"] if len(result["seeds"]) > 1 else None


def gain_over_spread(least: float, spread: float) -> float:
    """The least gain over the spread of the gains between seeds (the goal: at least 3)."""
    return least / spread if spread > 0 else float("inf")


def train_section(result: dict) -> list[str]:
    seeds = result["seeds"]

    def curve(v: dict) -> str:
        return " / ".join(f"{r:.3f}" for _, r in sorted(v["heldout"].items(), key=lambda kv: int(kv[0])))

    rows = "; ".join(f"seed {k}: {curve(v)}" for k, v in seeds.items())
    pipeline, prefect, trainer = result["pipeline"], result["prefect"], result["trainer"]
    least, end_min = result["gain_min"], result["end_min"]
    spread = seed_spread(result)
    shown = ", ".join(f"{k} {v}" for k, v in result["recipe"].items()
                      if k in ("lr", "overlong_filter", "dynamic_sampling", "oversample", "samples_per_prompt",
                               "prompts_per_step"))
    return [
        f"**Training** (`python -m benchmarks.bench_train`; GRPO on the math tasks, vLLM on the CPU, the main job's "
        f"recipe (configs/demo.yaml: {shown}); the learning runs from {result['recipe'].get('policy', '.libra/policy')} "
        f"(the shipped copy), the pipeline, Prefect and trainer rows from the base policy (data/policy); "
        f"{result['machine']})",
        "",
        "| measure | Libra | baseline in the same run | figure | goal |",
        "|---|---|---|---|---|",
        f"| held-out reward (128 held-out prompts, greedy) every 10 updates to {result['steps']} | {rows} | "
        + (f"spread of the gain between seeds: {spread:.3f} | least gain {least:+.3f}, "
           f"{gain_over_spread(least, spread):.1f}x the spread" if spread is not None else
           f"one seed: no spread between seeds | gain {least:+.3f}")
        + f"; lowest final {end_min:.3f} | gain >= 3x spread; final >= 0.35 |",
        f"| one-step-off pipeline, {pipeline['iterations']} iterations | {pipeline['one_step_off_s']:.1f} s | "
        f"synchronous: {pipeline['sync_s']:.1f} s | ratio {pipeline['ratio_sync_over_one_step_off']:.2f} | > 1 |",
        f"| Prefect's share of an iteration (synchronous iterations) | {prefect['overhead_share']:.1%} | - | "
        f"{'met' if prefect['overhead_share'] < 0.05 else 'missed'} | < 5% |",
        f"| trainer policy tokens/s | {trainer['libra_tokens_per_s']:.0f} | bare torch loop over the same micro-batches: "
        f"{trainer['bare_tokens_per_s']:.0f} | ratio {trainer['ratio']:.2f} | >= 0.8 |",
        *reference_lines(result),
    ]


def reference_lines(result: dict) -> list[str]:
    """The supervised reference (`bench_train --reference`): the recipe's updates with perfect labels."""
    if "reference" not in result:
        return []
    lines = ["", "Supervised reference (`python -m benchmarks.bench_train --reference`): the shipped base policy "
             "(data/policy, before tuning) trained on the math expert's demonstrations of fresh tasks (each once, one "
             "update per batch of the recipe's size) instead of rewarded on its own samples; held-out reward as above.", "",
             "| learning rate | updates | demonstrations | held-out reward | / the goal 0.35 |",
             "|---|---|---|---|---|"]
    for row in result["reference"]:
        lines.append(f"| {row['lr']:g} | {row['updates']} | {row['demonstrations']:,} | {row['heldout']:.3f} | "
                     f"{row['heldout'] / 0.35:.2f} |")
    return lines


def partial_static_section(result: dict) -> list[str]:
    lines = [
        f"**The simulator's modes against the live loop** (`python -m benchmarks.bench_partial --seeds "
        f"{' '.join(result['seeds'])} --placement static --save-as partial_static`; the partial-rollout benchmark's "
        f"workload, {result['steps']} updates, on a static split of this machine's workers; {result['machine']}). Each "
        "mode's trained tokens/s over one-step-off's, live and as the simulator predicts it from the one-step-off "
        "run's trajectories in this machine's physics fitted to the runs' timings. Goal: within 15%.",
        "",
        "| seed | mode | live | simulated | simulated / live | timing fit's error (decode steps, training steps) |",
        "|---|---|---|---|---|---|",
    ]
    for seed, s in result["seeds"].items():
        sim = s["simulated"]
        for mode in ("partial", "async"):
            live, predicted = s[f"{mode}_over_one_step_off"], sim[f"{mode}_over_one_step_off"]
            errors = sim["fit_error"]
            lines.append(f"| {seed} | {mode} | {live:.2f}x | {predicted:.2f}x | {predicted / live:.2f} | "
                         f"{errors.get('decode_step', 0):.1%}, {errors.get('train_step', 0):.1%} |")
    return lines


def partial_section(result: dict) -> list[str]:
    modes = ("one_step_off", "partial", "async")
    names = {"one_step_off": "one-step-off", "partial": "partial rollouts", "async": "asynchronous"}
    seeds = result["seeds"]

    def each(mode: str, key: str, fmt: str) -> str:
        return ", ".join(format(s["runs"][mode][key], fmt) for s in seeds.values())

    def ratio(mode: str, kind: str = "") -> str:
        r = result[f"{mode}_over_one_step_off{kind}"]
        return f"{r['mean']:.2f} ({r['min']:.2f}-{r['max']:.2f})"

    tail = result["tail"]
    rows = [f"| {names[m]} | {each(m, 'tokens_per_s', '.0f')} | {each(m, 'steady_tokens_per_s', '.0f')} | "
            f"{'-' if m == 'one_step_off' else ratio(m)} | {'-' if m == 'one_step_off' else ratio(m, '_steady')} | "
            f"{each(m, 'step_s_cv', '.2f')} | {each(m, 'offpolicy_share', '.0%')} (gap {each(m, 'version_gap_mean', '.2f')}) | "
            f"{each(m, 'stale_dropped', '.0f')} | {each(m, 'heldout_end', '.3f')} |" for m in modes]
    best = max(result[f"partial_over_one_step_off{k}"]["mean"] for k in ("", "_steady"))
    return [
        f"**Partial rollouts and the asynchronous pipeline** (`python -m benchmarks.bench_partial`; the main job's "
        f"recipe from the base policy (data/policy) with a per-turn floor of 24 tokens growing 15% an iteration, {result['steps']} updates, "
        f"{len(seeds)} seeds, over-provision {result['overprovision']:g}x, max_staleness 4 with partial rollouts; "
        f"{result['machine']}). Trained tokens/s over the training time; steady state: iterations 1 to "
        f"{result['steps'] - 2}; off-policy: the share of trained tokens from older weights than the update's. "
        "Figures per seed.",
        "",
        "| mode | trained tokens/s | steady state | / one-step-off | steady / one-step-off | step time cv | "
        "off-policy | dropped stale | held-out reward at the end |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Goal: partial rollouts >= 1.3x one-step-off's trained tokens/s: {'met' if best >= 1.3 else 'missed'} "
        f"(means {result['partial_over_one_step_off']['mean']:.2f}x, steady state "
        f"{result['partial_over_one_step_off_steady']['mean']:.2f}x). The tail's bound here (one rollout of step {tail['step']}'s workload alone): the "
        f"engine busy {tail['busy_s']:.1f} s, of which {tail['waste_s']:.1f} s below a full batch's per-sequence "
        f"cost ({tail['full_batch_ms_per_sequence']:.2f} ms; a batch of 1: {tail['batch1_ms']:.2f} ms a step), so "
        f"no early close can make that rollout more than {tail['rollout_speedup_bound']:.2f}x as fast; the first of "
        f"its 8 groups was complete at {tail['first_group_done_share']:.0%} of the last one's time.",
    ]


def train_policies_section(result: dict) -> list[str]:
    seeds = result["seeds"]

    def ratio(name: str) -> str:
        r = result[name]
        return f"{r['mean']:.2f} (seeds {r['min']:.2f}-{r['max']:.2f})"

    def to_target(seed: dict, policy: str) -> str:
        t = seed["runs"][policy]["time_to_target_s"]
        return "not reached" if t is None else f"{t:.0f} s"

    lines = [
        f"**Placement policies on the training loop** (`python -m benchmarks.bench_train_policies`; the shipped policy "
        f"on drifting math tasks, {result['steps']} iterations per run, seeds {', '.join(seeds)}; {result['workers']} "
        f"workers of one core; {result['machine']})",
        "",
        "| measure | Libra | baseline in the same run | figure | goal |",
        "|---|---|---|---|---|",
        "| generated tokens / s of training time, libra / static | "
        + ", ".join(f"seed {k}: {v['runs']['libra']['tokens_per_s']:.0f}" for k, v in seeds.items())
        + " | static: " + ", ".join(f"{v['runs']['static']['tokens_per_s']:.0f}" for v in seeds.values())
        + f" | ratio {ratio('libra_over_static')} | > 1 |",
        "| the same, libra / colocated | - | colocated: "
        + ", ".join(f"{v['runs']['colocated']['tokens_per_s']:.0f}" for v in seeds.values())
        + f" | ratio {ratio('libra_over_colocated')} | > 1 |",
    ]
    if "simulated" in result:
        sim, agree = result["simulated"], result["agree"]

        def predicted(name: str) -> str:
            r = sim[name]
            return (f"{r['mean']:.2f} (seeds {r['min']:.2f}-{r['max']:.2f}); "
                    f"{'agrees' if agree[name] else 'disagrees'} with live")

        lines += [f"| simulator's prediction, same workload: libra / static | - | - | {predicted('libra_over_static')} | "
                  "agrees |",
                  f"| simulator's prediction: libra / colocated | - | - | {predicted('libra_over_colocated')} | agrees |"]
    for k, v in seeds.items():
        lines.append(f"| seed {k}: training time to held-out reward {v['target']} | {to_target(v, 'libra')} "
                     f"({v['runs']['libra']['plans_applied']} plans applied, {v['runs']['libra']['workers_moved']} "
                     f"workers moved) | static {to_target(v, 'static')}, colocated {to_target(v, 'colocated')} | - | "
                     "shorter |")
    return lines


def live_hybrids_section(result: dict) -> list[str]:
    seeds = result["seeds"]
    runs = {k: v["runs"] for k, v in seeds.items()}
    return [
        f"**A hybrid in a live training run** (`python -m benchmarks.bench_live_hybrids`; the shipped policy on drifting "
        f"math tasks, {result['steps']} iterations per run, seeds {', '.join(seeds)}, a static split of two one-core "
        f"workers, its rollout worker also training as a hybrid; {result['machine']})",
        "",
        "| measure | with the hybrid | static split in the same run | figure | goal |",
        "|---|---|---|---|---|",
        "| generated tokens / s of training time | "
        + ", ".join(f"seed {k}: {r['hybrid']['tokens_per_s']:.0f}" for k, r in runs.items()) + " | "
        + ", ".join(f"{r['static']['tokens_per_s']:.0f}" for r in runs.values())
        + f" | ratio {result['throughput_ratio']:.2f} | > 1 |",
        "| update seconds (iterations 1 on, mean) | "
        + ", ".join(f"{sum(r['hybrid']['train_s'][1:]) / len(r['hybrid']['train_s'][1:]):.1f} s "
                    f"(hybrid in {r['hybrid']['hybrid_updates']} updates)" for r in runs.values()) + " | "
        + ", ".join(f"{sum(r['static']['train_s'][1:]) / len(r['static']['train_s'][1:]):.1f} s" for r in runs.values())
        + f" | ratio {result['train_ratio']:.2f} | < 1 |",
        "| rollout seconds (iterations 1 on, mean) | "
        + ", ".join(f"{sum(r['hybrid']['rollout_s'][1:]) / len(r['hybrid']['rollout_s'][1:]):.1f} s" for r in runs.values())
        + " | " + ", ".join(f"{sum(r['static']['rollout_s'][1:]) / len(r['static']['rollout_s'][1:]):.1f} s"
                            for r in runs.values())
        + f" | ratio {result['rollout_ratio']:.2f} | - |",
    ]


def megatron_section(result: dict) -> list[str]:
    speed, learned = result["throughput"], result["learning"]
    runs = learned["runs"]

    def curve(run: dict) -> str:
        return " -> ".join(f"{reward:.3f}" for _, reward in sorted((int(k), v) for k, v in run["heldout"].items()))

    lines = [
        f"**megatron-core trainer** (`python -m benchmarks.bench_megatron`; the shipped policy, 64 math-like samples "
        f"an update ({speed['policy_tokens_per_update']:,} policy tokens), {speed['threads']} threads in all; "
        f"{result['machine']})",
        "",
        "| measure | megatron | baseline in the same run | figure | goal |",
        "|---|---|---|---|---|",
        f"| trainer policy tokens/s, TP=PP=DP=1 | {speed['megatron_tokens_per_s']:.0f} | torch trainer on the same "
        f"samples: {speed['torch_tokens_per_s']:.0f} | ratio {speed['megatron_over_torch']:.2f} | - |",
    ]
    for row in speed["layouts"][1:]:
        lines.append(f"| {row['layout']}, {row['ranks']} processes on the same threads | {row['seconds_per_update']:.2f} s "
                     f"an update | TP=1, one process: {speed['layouts'][0]['seconds_per_update']:.2f} s | speed "
                     f"ratio {row['speed_over_tp1']:.2f} | - |")
    reshard = speed.get("reshard")
    if reshard:
        lines.append(f"| reshard {reshard['from']} -> {reshard['to']} after an update (weights and AdamW state) | "
                     f"{reshard['reshard_s']:.1f} s | fresh start of {reshard['to']}'s ranks: {reshard['start_s']:.1f} s | "
                     f"ratio {reshard['reshard_over_start']:.2f} | - |")
    lines.append(f"| held-out reward over {learned['steps']} updates (demo settings from the base policy, seed {learned['seed']}) | "
                 f"{curve(runs['megatron'])} ({runs['megatron']['wall_s']:.0f} s) | torch: {curve(runs['torch'])} "
                 f"({runs['torch']['wall_s']:.0f} s) | gain {runs['megatron']['reward_end'] - runs['megatron']['reward_start']:+.3f}"
                 f" / {runs['torch']['reward_end'] - runs['torch']['reward_start']:+.3f} | rises as with torch |")
    if learned.get("note"):
        lines += ["", learned["note"]]
    return lines
