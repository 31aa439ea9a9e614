"""The planner's cost model against a real device: prefills and training steps of a model profile
(random weights, transformers + torch, bf16 on GPUs) are timed on the local device and set next to
what the cost model predicts for that device's hardware profile, first with its default
coefficients (published efficiencies), then with the coefficients `calibrate.fit` finds from these
same timings (what `libra plan --calibrate` does with a run's timings).

- prefill: one forward pass over `batch` sequences of `length` new tokens, logits for the last
  token only (as an engine's prefill); the mean attended context is half the length (causal).
- training step, shaped as the cost model counts one (full recomputation, one extra log-prob
  pass): a no-grad forward over the step's sequences (old-policy log-probs), then forward and
  backward with activation checkpointing per micro-batch, then one AdamW step.
Decode steps are not timed: the cost model's decode is that of a serving engine (vLLM: CUDA graphs,
paged attention); eager transformers decoding would measure its kernel launches instead.

    python -m benchmarks.bench_cost_model [--models qwen2.5-3b,qwen3-8b] [--hardware h200] [--device cuda]

A ratio `measured / predicted` above 1 means the device is slower than the model assumed.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import save
from libra.devices import torch_device
from libra.errors import LibraError
from libra.planner.calibrate import TimingSample, fit, predict
from libra.planner.cost_model import CostModel
from libra.planner.profiles import HARDWARE, MODELS, Cluster, ModelProfile

PREFILLS = ((1, 4096), (8, 2048), (32, 1024), (64, 512))  # (sequences, tokens each)
TRAIN_STEPS = ((8, 1024), (16, 1024), (8, 2048), (32, 512), (4, 4096))  # (sequences, tokens each)


def hf_model(profile: ModelProfile, device: str, dtype):
    """A randomly initialised transformers model of the profile's architecture, built on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    if profile.is_moe:
        raise SystemExit(f"{profile.name}: mixture-of-experts profiles are not timed here (dense models only)")
    common = dict(vocab_size=profile.vocab, hidden_size=profile.hidden, intermediate_size=profile.intermediate,
                  num_hidden_layers=profile.layers, num_attention_heads=profile.heads,
                  num_key_value_heads=profile.kv_heads, tie_word_embeddings=profile.tied_embeddings,
                  max_position_embeddings=8192)
    if profile.qk_norm:  # Qwen3: no QKV bias, RMSNorm on queries and keys, explicit head size
        config = Qwen3Config(head_dim=profile.head_dim, attention_bias=profile.qkv_bias, **common)
    elif profile.qkv_bias and profile.head_dim * profile.heads == profile.hidden:  # Qwen2: QKV bias
        config = Qwen2Config(**common)
    else:
        raise SystemExit(f"{profile.name}: no transformers architecture here matches this profile")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model


def median_seconds(fn, device: str, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` calls after one warm-up call, the GPU drained around
    each call."""
    import torch

    def wait() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    fn()
    times = []
    for _ in range(repeats):
        wait()
        began = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def time_prefill(model, sequences: int, length: int, device: str, repeats: int) -> float:
    import torch

    ids = torch.randint(0, model.config.vocab_size, (sequences, length), device=device)

    def prefill() -> None:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return median_seconds(prefill, device, repeats)


def time_train_step(model, optimizer, sequences: int, length: int, micro_batch: int, device: str,
                    repeats: int) -> float:
    import torch

    ids = torch.randint(0, model.config.vocab_size, (sequences, length), device=device)

    def step() -> None:
        with torch.no_grad():  # old-policy log-probs
            for chunk in ids.split(micro_batch):
                model(input_ids=chunk, use_cache=False)
        for chunk in ids.split(micro_batch):
            loss = model(input_ids=chunk, labels=chunk, use_cache=False).loss
            (loss * len(chunk) / sequences).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return median_seconds(step, device, repeats)


def measure(profile: ModelProfile, device: str, prefills, train_steps, micro_tokens: int,
            repeats: int) -> tuple[list[TimingSample], int]:
    """Timing samples of the profile's model on `device`, and the model's parameter count."""
    import torch

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = hf_model(profile, device, dtype)
    parameters = sum(p.numel() for p in model.parameters())
    samples = []
    model.eval()
    for sequences, length in prefills:
        seconds = time_prefill(model, sequences, length, device, repeats)
        samples.append(TimingSample("prefill", seconds, tokens=sequences * length, context_tokens=length / 2))
    model.train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    for sequences, length in train_steps:
        micro_batch = max(1, min(sequences, micro_tokens // length))
        seconds = time_train_step(model, optimizer, sequences, length, micro_batch, device, repeats)
        samples.append(TimingSample("train_step", seconds, micro_batch=micro_batch, sequences=sequences,
                                    tokens=sequences * length, max_tokens=length))
    return samples, parameters


def compare(cost: CostModel, samples: list[TimingSample], shapes: list[str]) -> dict:
    calibration = fit(cost, samples)
    fitted = CostModel(cost.cluster, cost.model, calibration.coefficients)
    rows = [{"kind": s.kind, "shape": shape, "tokens": int(s.tokens), "measured_s": s.seconds,
             "predicted_s": predict(cost, s), "ratio": s.seconds / predict(cost, s), "fitted_s": predict(fitted, s)}
            for s, shape in zip(samples, shapes, strict=True)]
    c = calibration.coefficients
    return {"samples": rows, "mean_abs_rel_error_default": {
                kind: statistics.mean(abs(r["ratio"] - 1) for r in rows if r["kind"] == kind) for kind in ("prefill", "train_step")},
            "mean_abs_rel_error_fitted": calibration.mean_abs_rel_error,
            "coefficients_fitted": {"train_compute": c.train_compute, "train_step_s": c.train_step_s,
                                    "prefill_compute": c.prefill_compute},
            "coefficients_default": {"train_compute": cost.coefficients.train_compute,
                                     "train_step_s": cost.coefficients.train_step_s,
                                     "prefill_compute": cost.coefficients.prefill_compute},
            "training_mfu_fitted": 1 / c.train_compute if c.train_compute else None,
            "prefill_efficiency_fitted": 1 / c.prefill_compute if c.prefill_compute else None,
            "kept_defaults": list(calibration.kept_defaults)}


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def run(name: str, hardware: str, device: str, prefills, train_steps, micro_tokens: int, repeats: int) -> dict:
    profile = MODELS[name]
    samples, parameters = measure(profile, device, prefills, train_steps, micro_tokens, repeats)
    if parameters != profile.total_params:
        raise SystemExit(f"the built model has {parameters:,} parameters, the profile {profile.total_params:,}")
    shapes = [f"{n}x{length}" for n, length in (*prefills, *train_steps)]
    cost = CostModel(Cluster(1, 1, HARDWARE[hardware]), profile)
    result = {"model": profile.name, "parameters": parameters, **compare(cost, samples, shapes)}
    for r in result["samples"]:
        print(f"{r['kind']:<10} {r['shape']:>7} tokens: measured {r['measured_s'] * 1e3:8.1f} ms, cost model "
              f"{r['predicted_s'] * 1e3:8.1f} ms (ratio {r['ratio']:.2f}), fitted {r['fitted_s'] * 1e3:8.1f} ms")
    errors = result["mean_abs_rel_error_default"]
    print(f"{profile.name} on {device_name(device)} against the {HARDWARE[hardware].name} profile: mean error with "
          f"default coefficients prefill {errors['prefill']:.0%}, training {errors['train_step']:.0%}; fitted: "
          + ", ".join(f"{k} {v:.0%}" for k, v in result["mean_abs_rel_error_fitted"].items())
          + f"; fitted training MFU {result['training_mfu_fitted'] or 0:.0%} (default 40%), prefill at "
          f"{result['prefill_efficiency_fitted'] or 0:.0%} of peak (default 55%), fixed "
          f"{result['coefficients_fitted']['train_step_s']:.2f} s per step (default 2.00)", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen2.5-3b,qwen3-8b", help=f"model profiles, comma-separated ({', '.join(MODELS)})")
    parser.add_argument("--hardware", default="h200", choices=sorted(HARDWARE), help="the profile to predict with")
    parser.add_argument("--device", default="cuda", help="torch device to time on (cuda, cuda:N or cpu)")
    parser.add_argument("--micro-tokens", type=int, default=8192, help="tokens per training micro-batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per sample (median; one warm-up first)")
    parser.add_argument("--small", action="store_true", help="small sizes (a CPU smoke run)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    import torch

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise SystemExit(f"--models {args.models!r}: unknown {', '.join(unknown) or 'none given'}; known: {', '.join(MODELS)}")
    try:
        torch_device(args.device)
    except LibraError as exc:
        raise SystemExit(f"{exc} (this benchmark times a GPU; `--device cpu --small` is a smoke run)") from exc
    prefills, train_steps = ((2, 64), (4, 32)), ((2, 64), (4, 64), (2, 128), (8, 32))
    if not args.small:
        prefills, train_steps = PREFILLS, TRAIN_STEPS
    rows = []
    for name in names:
        rows.append(run(name, args.hardware, args.device, prefills, train_steps, args.micro_tokens, args.repeats))
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()  # the last model's memory, before the next one is built
    if not args.no_save:
        save("cost_model", {"device": device_name(args.device), "hardware_profile": HARDWARE[args.hardware].name,
                            "models": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
