"""The RL training loop, measured: learning across seeds, the pipeline, Prefect's cost and the trainer.

    python -m benchmarks.bench_train [--steps 30] [--seeds 0 1 2] [--learning-only] [--reference] [--quick]

1. Learning: `libra train`'s flow with the main job's recipe (configs/demo.yaml: its rollout and
   trainer sections) from the shipped copy of its policy (the shipped policy tuned on math,
   data/policy-math) for `--steps` updates, once per seed: held-out reward
   (128 held-out prompts, greedy) every 10 updates; each seed's gain beside the spread of the gains
   between seeds. `--learning-only` measures this part alone and keeps the others' saved figures.
2. Pipeline: the same steps with one-step-off and with synchronous iterations (same seed):
   wall seconds of the iterations, synchronous / one-step-off.
3. Prefect's cost: on the synchronous run, each iteration's wall time minus the time spent inside
   the stages (the session's methods, timed around their bodies), as a share of the iteration.
4. Trainer: tokens/s of `PolicyTrainer.train_step` against a bare torch loop (forward, masked
   log-prob loss, backward, AdamW step) over the same micro-batches of the same samples.

5. Supervised reference (`--reference`, alone; the other figures kept): what the same number of
   updates and samples reach with perfect labels instead of a reward. The shipped base policy
   (data/policy, before any tuning) is trained on as many of the math expert's demonstrations
   (fresh tasks, each seen once) as the recipe's run rolls out, one update per batch of
   prompts_per_step x samples_per_prompt, at a few learning rates,
   then at 2x and 4x the updates; each is evaluated as the runs are (greedy, the 128 held-out tasks).
   Reinforcement from a 0/1 reward on the policy's own samples carries less per sample than the
   expert's whole answer, so these say how far the recipe's budget can take this policy.

Every run writes to a temporary directory (store, MLflow, Prefect, checkpoints); the figures go to
benchmarks/out/train.json and the README's performance section (`python -m benchmarks.report`).
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, quiet_engines, run_locations, save, saved
from benchmarks.report_training import gain_over_spread, seed_spread
from libra.config import LibraConfig
from libra.rollout.policy import SHIPPED, SHIPPED_TUNED, tuned_dir

STAGES = ("rollout", "score", "update", "sync", "evaluate", "checkpoint")


def config_for(base: Path, run: str, steps: int, seed: int, pipeline: str, eval_every: int, lr: float = 1e-4,
               eval_prompts: int = 128, backend: str = "torch") -> LibraConfig:
    return LibraConfig.model_validate({
        **run_locations(base),
        "rollout": {"engine": "vllm", "instances": 1},
        "trainer": {"policy": str(SHIPPED), "run": run, "env": "math", "steps": steps, "seed": seed, "lr": lr,
                    "prompts_per_step": 8, "samples_per_prompt": 8, "eval_prompts": eval_prompts, "eval_every": eval_every,
                    "pipeline": pipeline, "checkpoint_dir": str(base / "checkpoints"), "backend": backend},
    })


DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def recipe_policy(policy: str) -> Path:
    """The shipped directory of the recipe's policy, one of Libra's own (`.libra/policy` or a tuning of
    it, `.libra/policy-<env>`), which a fresh checkout does not hold yet."""
    base = Path(".libra/policy")
    shipped = {base: SHIPPED, **{tuned_dir(base, env): path for env, path in SHIPPED_TUNED.items()}}
    if Path(policy) not in shipped:
        raise SystemExit(f"configs/demo.yaml's trainer.policy {policy!r} is not a shipped policy: one of "
                         f"{', '.join(map(str, shipped))}")
    return shipped[Path(policy)]


def recipe_config(base: Path, run: str, steps: int, seed: int) -> LibraConfig:
    """The main job's recipe (configs/demo.yaml's rollout and trainer sections) as run `run`, seeded,
    from the shipped copy of its policy, its files under `base`."""
    import yaml

    demo = yaml.safe_load(DEMO.read_text())
    policy = recipe_policy(demo["trainer"].get("policy", ".libra/policy"))
    return LibraConfig.model_validate({
        **run_locations(base), "rollout": demo.get("rollout", {}),
        "trainer": {**demo["trainer"], "policy": str(policy), "run": run, "steps": steps, "seed": seed,
                    "eval_every": 10, "eval_prompts": 128, "checkpoint_dir": str(base / "checkpoints")},
    })


class StageClock:
    """Seconds spent inside the session's stage methods, per iteration (a benchmark-only wrapper)."""

    def __init__(self) -> None:
        self.inside = 0.0
        self.depth = 0  # stages call stages (evaluate rolls out and scores): only the outermost counts
        self.originals: dict[str, Any] = {}

    def __enter__(self) -> StageClock:
        from libra.rl.session import TrainingSession

        for name in STAGES:
            original = getattr(TrainingSession, name)
            self.originals[name] = original

            @functools.wraps(original)
            def timed(*args, __original=original, **kwargs):
                began = time.perf_counter()
                self.depth += 1
                try:
                    return __original(*args, **kwargs)
                finally:
                    self.depth -= 1
                    if self.depth == 0:
                        self.inside += time.perf_counter() - began
            setattr(TrainingSession, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        from libra.rl.session import TrainingSession

        for name, original in self.originals.items():
            setattr(TrainingSession, name, original)


def train_run(config: LibraConfig) -> dict[str, Any]:
    from flows.train import train_flow

    seconds: list[float] = []
    result = train_flow(config, listeners=(lambda record: seconds.append(record.seconds["iteration"]),))
    heldout = {int(v): r for v, r in result["state"]["heldout"].items()}
    return {"reward_start": heldout[0], "reward_end": heldout[max(heldout)], "heldout": heldout,
            "iteration_s": seconds, "generated_tokens": result["state"]["generated_tokens"]}


def prefect_overhead(config: LibraConfig) -> dict[str, Any]:
    """Iterations of the synchronous pipeline (no stage overlaps another): wall minus stage time."""
    from flows.rl_iteration import rl_iteration_flow
    from tasks.run_context import RunContext
    from tasks.train_tasks import close_session_task, open_session_task, start_tracking_task

    context = RunContext()
    open_session_task(context, config)
    shares = []
    try:
        run_id = start_tracking_task(context)
        for step in range(config.trainer.steps):
            with StageClock() as clock:
                began = time.perf_counter()
                rl_iteration_flow(context, step, config.trainer.steps, "math", "sync", 10**6, False, run_id)
                wall = time.perf_counter() - began
            shares.append({"wall_s": wall, "stages_s": clock.inside, "overhead_s": wall - clock.inside})
    finally:
        close_session_task(context)
    overhead = sum(s["overhead_s"] for s in shares) / sum(s["wall_s"] for s in shares)
    return {"iterations": shares, "overhead_share": overhead}


def math_like_samples(count: int = 64, seed: int = 0) -> list:
    """`count` trajectories of the shipped policy's vocabulary with the math tasks' lengths (180 to
    300 tokens, the first 110 the prompt, two thirds of the rest the policy's), in groups of 8 with
    rewards of +-1: the batches the trainer benchmarks time."""
    import json

    from libra.trainer.samples import TrainingSample

    vocab = json.loads((SHIPPED / "config.json").read_text())["vocab_size"]
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        n = rng.randint(180, 300)
        ids = tuple(rng.randrange(8, vocab) for _ in range(n))
        mask = tuple(int(j >= 110 and j % 3 != 0) for j in range(n))
        logprobs = tuple(-rng.random() if m else 0.0 for m in mask)
        samples.append(TrainingSample(str(i), str(i // 8), ids, mask, logprobs, rng.choice((-1.0, 1.0)), 0.0, 0))
    return samples


def trainer_throughput(updates: int = 4) -> dict[str, Any]:
    """PolicyTrainer against a bare loop on the same samples (math-like lengths, half policy tokens)."""
    import torch
    from transformers import AutoModelForCausalLM

    from libra.config import TrainerConfig
    from libra.trainer.grpo import token_logprobs
    from libra.trainer.samples import collate, micro_batches
    from libra.trainer.trainer import PolicyTrainer

    samples = math_like_samples()
    config = TrainerConfig(lr=1e-5, warmup_steps=0)
    tokens = sum(s.policy_tokens for s in samples) * updates

    trainer = PolicyTrainer(SHIPPED, config)
    trainer.train_step(samples)  # warm-up
    began = time.perf_counter()
    for _ in range(updates):
        trainer.train_step(samples)
    libra_s = time.perf_counter() - began

    model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    batches = [collate(group) for group in micro_batches(samples, config.micro_batch_tokens)]
    total = float(sum(s.policy_tokens for s in samples))

    def bare_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for batch in batches:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention).logits[:, :-1]
            logp = token_logprobs(logits, batch.targets)
            (-(logp * batch.advantages[:, None] * batch.mask).sum() / total).backward()
        optimizer.step()

    bare_step()
    began = time.perf_counter()
    for _ in range(updates):
        bare_step()
    bare_s = time.perf_counter() - began
    return {"updates": updates, "policy_tokens": tokens, "libra_tokens_per_s": tokens / libra_s,
            "bare_tokens_per_s": tokens / bare_s, "ratio": bare_s / libra_s}


REFERENCE_SEED = 20_000  # the expert demonstrations' tasks: neither the held-out (0) nor the warm start's (>= 10000 + seed 0)
REFERENCE_RUNS = ((1e-4, 1), (3e-4, 1), (1e-3, 1), (1e-3, 2), (1e-3, 4))  # (learning rate, budget multiple)


def supervised_reference(base: Path, steps: int, batch: int, eval_prompts: int = 128) -> list[dict[str, Any]]:
    """For each (learning rate, multiple) of REFERENCE_RUNS: the shipped policy after multiple x `steps`
    supervised updates of `batch` fresh expert demonstrations each (AdamW, constant rate, no weight
    decay, as the recipe's updates), and its greedy held-out reward."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flows.rollout import rollout_flow
    from libra.optim import make_optimizer
    from libra.rl.schedule import EVAL_SEED
    from libra.rollout.envs import demonstration, make_env
    from libra.rollout.policy import POLICY_FILES, encode, supervised_step
    from libra.rollout.workroots import temporary_workroot

    env, tokenizer = make_env("math"), AutoTokenizer.from_pretrained(SHIPPED)
    most = max(multiple for _, multiple in REFERENCE_RUNS) * steps * batch
    examples = []
    for task in env.tasks(most, seed=REFERENCE_SEED):
        with temporary_workroot("libra-reference-") as workdir:
            examples.append(encode(tokenizer, *demonstration(env, task, workdir)))
    rows = []
    for lr, multiple in REFERENCE_RUNS:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).train()
        optimizer = make_optimizer(model.parameters(), lr, weight_decay=0.0)
        began = time.perf_counter()
        updates = multiple * steps
        losses = [supervised_step(model, optimizer, examples[u * batch:(u + 1) * batch]) for u in range(updates)]
        train_s = time.perf_counter() - began
        policy = base / f"reference-{lr:g}-{multiple}x"
        model.save_pretrained(policy, safe_serialization=True)
        for name in POLICY_FILES:
            if not (policy / name).exists():
                shutil.copyfile(SHIPPED / name, policy / name)
        summary = rollout_flow("math", prompts=eval_prompts, samples=1, engine="vllm", instances=1, temperature=0.0,
                               policy=str(policy), seed=EVAL_SEED, run=f"reference-{len(rows)}", track=False,
                               config=LibraConfig.model_validate(run_locations(base)))
        rows.append({"lr": lr, "updates": updates, "demonstrations": updates * batch, "heldout": summary["solved_fraction"],
                     "final_loss": statistics.fmean(losses[-5:]), "train_s": train_s})
        print(f"supervised reference: lr {lr:g}, {updates} updates of {batch} demonstrations: held-out reward "
              f"{rows[-1]['heldout']:.3f} (loss {rows[-1]['final_loss']:.3f}, {train_s:.0f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pipeline-steps", type=int, default=8)
    parser.add_argument("--learning-only", action="store_true", help="the learning runs alone (the other figures "
                        "kept from the saved result)")
    parser.add_argument("--reference", action="store_true", help="the supervised reference alone (the other "
                        "figures kept from the saved result)")
    parser.add_argument("--quick", action="store_true", help="2 steps, one seed (a smoke run; figures not saved)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.pipeline_steps = 2, [0], 2
    quiet_engines()
    began = time.perf_counter()
    if args.reference:
        import yaml

        recipe = yaml.safe_load(DEMO.read_text())["trainer"]
        with tempfile.TemporaryDirectory(prefix="libra-bench-reference-") as tmp:
            from flows.runtime import prepare_runtime, start_prefect

            prepare_runtime(LibraConfig.model_validate(run_locations(Path(tmp))))
            start_prefect()
            rows = supervised_reference(Path(tmp), 2 if args.quick else recipe["steps"],
                                        recipe["prompts_per_step"] * recipe["samples_per_prompt"])
        if not args.quick:
            kept = {k: v for k, v in saved("train").items() if k not in ("benchmark", "machine")}
            print(f"saved {save('train', {**kept, 'reference': rows})}")
        return 0
    if args.learning_only:
        kept = saved("train")
        trainer = kept["trainer"]
    else:
        trainer = trainer_throughput()
        print(f"trainer: {trainer['libra_tokens_per_s']:.0f} policy tokens/s, bare torch loop "
              f"{trainer['bare_tokens_per_s']:.0f}: ratio {trainer['ratio']:.2f} (goal >= 0.8)", flush=True)
    with tempfile.TemporaryDirectory(prefix="libra-bench-train-") as tmp:
        base = Path(tmp)
        probe = config_for(base, "probe", 1, 0, "sync", 10)
        from flows.runtime import prepare_runtime, start_prefect

        prepare_runtime(probe)
        start_prefect()
        seeds = {}
        for seed in args.seeds:
            seeds[seed] = train_run(recipe_config(base, f"learn-seed{seed}", args.steps, seed))
            s = seeds[seed]
            curve = ", ".join(f"{k}: {v:.3f}" for k, v in sorted(s["heldout"].items(), key=lambda kv: int(kv[0])))
            print(f"seed {seed}: held-out reward {s['reward_start']:.3f} -> {s['reward_end']:.3f} ({curve}; "
                  f"{args.steps} steps, {sum(s['iteration_s']):.0f} s)", flush=True)
        gains = [s["reward_end"] - s["reward_start"] for s in seeds.values()]
        if args.learning_only:
            result = {**kept, **learning_figures(args.steps, seeds, gains), "bench_s": time.perf_counter() - began}
            report_learning(result)
            if not args.quick:
                print(f"saved {save('train', {k: v for k, v in result.items() if k not in ('benchmark', 'machine')})}")
            return 0
        pipelined = train_run(config_for(base, "one-step-off", args.pipeline_steps, 7, "one_step_off", 10**6))
        synchronous = train_run(config_for(base, "sync", args.pipeline_steps, 7, "sync", 10**6))
        ratio = sum(synchronous["iteration_s"]) / sum(pipelined["iteration_s"])
        print(f"pipeline: {args.pipeline_steps} iterations synchronous {sum(synchronous['iteration_s']):.1f} s, "
              f"one-step-off {sum(pipelined['iteration_s']):.1f} s: ratio {ratio:.2f}", flush=True)
        overhead = prefect_overhead(config_for(base, "prefect", args.pipeline_steps, 8, "sync", 10**6))
        print(f"Prefect: {overhead['overhead_share']:.1%} of each iteration's wall time (goal < 5%)", flush=True)
    result = {
        **learning_figures(args.steps, seeds, gains),
        "pipeline": {"iterations": args.pipeline_steps, "sync_s": sum(synchronous["iteration_s"]),
                     "one_step_off_s": sum(pipelined["iteration_s"]), "ratio_sync_over_one_step_off": ratio},
        "prefect": overhead, "trainer": trainer, "bench_s": time.perf_counter() - began,
    }
    previous = saved("train") if (OUT / "train.json").exists() else {}
    if "reference" in previous:  # measured alone (--reference): kept
        result["reference"] = previous["reference"]
    report_learning(result)
    if not args.quick:
        print(f"saved {save('train', result)}")
    return 0


def learning_figures(steps: int, seeds: dict[int, dict[str, Any]], gains: list[float]) -> dict[str, Any]:
    import yaml

    return {"steps": steps, "recipe": yaml.safe_load(DEMO.read_text())["trainer"],
            "seeds": {str(k): v for k, v in seeds.items()},
            "gain_mean": statistics.fmean(gains), "gain_min": min(gains),
            # between seeds: none with one seed
            "gain_spread": (max(gains) - min(gains)) if len(gains) > 1 else None,
            "gain_stdev": statistics.stdev(gains) if len(gains) > 1 else None,
            "end_min": min(s["reward_end"] for s in seeds.values())}


def report_learning(result: dict[str, Any]) -> None:
    least, spread = result["gain_min"], seed_spread(result)
    print(f"learning: gains {least:+.3f} (least) to {least + (spread or 0.0):+.3f}, mean {result['gain_mean']:+.3f}, "
          f"held-out reward over {result['steps']} steps; {spread_against_goal(least, spread)}; "
          f"lowest final held-out reward {result['end_min']:.3f} (goal >= 0.35)")


def spread_against_goal(least: float, spread: float | None) -> str:
    """The least gain against the spread of the gains between seeds (the goal: at least 3x), in words."""
    if spread is None:
        return "one seed: no spread between seeds to compare the gain with (goal: least gain >= 3x the spread)"
    return f"spread between seeds {spread:.3f}: least gain / spread {gain_over_spread(least, spread):.1f} (goal >= 3)"


if __name__ == "__main__":
    raise SystemExit(main())
