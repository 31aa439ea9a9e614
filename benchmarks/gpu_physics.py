"""Decode steps and prefills of a model profile measured on this machine's GPU, beside the planner's
cost model for that GPU: the check that the simulator's and the planner's physics hold here.

The model is written directly in torch from the profile (random bf16 weights, the profile's real
shapes; dense profiles only), on one GPU (TP1):
- decode: one step of `batch` sequences each at `context` tokens, the whole step (norms, QKV, the
  KV-cache write, attention over the cache with grouped queries, O, the gated MLP, the LM head and
  an argmax) captured in one CUDA graph and replayed; what an engine with CUDA graphs achieves,
  without its scheduler or sampler (an engine is slower than this, never faster);
- prefill: one sequence of `tokens` tokens, causal flash attention, eager, the LM head on the last
  token only.
Rows that do not fit the GPU's memory are skipped and said so.

    python -m benchmarks.gpu_physics [--model qwen3-8b] [--hardware h100] [--json out.json]

`--hardware` names the cost model's profile of this GPU (guessed from its name: H200, H100, A100,
A800). A ratio `model / measured` below 1 means the model is optimistic. `make gpu-check` runs it
after the `gpu`-marked tests.
"""

from __future__ import annotations

import argparse
import json
import sys

from libra.planner.cost_model import CostModel
from libra.planner.profiles import HARDWARE, MODELS, Cluster, ModelProfile

DECODE_ROWS = ((1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 4096), (64, 4096), (128, 2048), (256, 1024))
PREFILL_ROWS = (1024, 4096, 16384)
NAMES = (("H200", "h200"), ("H100", "h100"), ("A800", "a800"), ("A100", "a100"))


def hardware_of(device_name: str) -> str | None:
    """The cost model's hardware profile for a CUDA device name, or None."""
    return next((key for marker, key in NAMES if marker in device_name.upper()), None)


class Model:
    """The profile's decoder with random bf16 weights on one GPU."""

    def __init__(self, profile: ModelProfile, device: str) -> None:
        import torch

        if profile.is_moe:
            raise SystemExit(f"{profile.name}: mixture-of-experts profiles are not measured here (dense models only)")
        self.p, self.device, self.dtype = profile, device, torch.bfloat16
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(*shape):
            return torch.randn(*shape, device=device, dtype=self.dtype, generator=gen) * 0.02

        q, kv, h = profile.heads * profile.head_dim, profile.kv_heads * profile.head_dim, profile.hidden
        self.layers = [{"qkv": weight(h, q + 2 * kv), "o": weight(q, h), "gate_up": weight(h, 2 * profile.intermediate),
                        "down": weight(profile.intermediate, h), "norm1": torch.ones(h, device=device, dtype=self.dtype),
                        "norm2": torch.ones(h, device=device, dtype=self.dtype)} for _ in range(profile.layers)]
        self.embed = weight(profile.vocab, h)
        self.head = self.embed.t() if profile.tied_embeddings else weight(h, profile.vocab)

    def _norm(self, x, w):
        import torch

        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(self.dtype) * w

    def _layer(self, x, layer, k_cache, v_cache, position):
        """One decoder layer over x [B, T, H]; with caches [B, KVH, C, D], the new keys and values
        are written at `position` and attention reads the whole cache (decode), else causal."""
        import torch.nn.functional as F

        p = self.p
        b, t, _ = x.shape
        q_size, kv_size = p.heads * p.head_dim, p.kv_heads * p.head_dim
        q, k, v = (self._norm(x, layer["norm1"]) @ layer["qkv"]).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(b, t, p.heads, p.head_dim).transpose(1, 2)
        k = k.view(b, t, p.kv_heads, p.head_dim).transpose(1, 2)
        v = v.view(b, t, p.kv_heads, p.head_dim).transpose(1, 2)
        if k_cache is not None:
            k_cache[:, :, position:position + 1] = k
            v_cache[:, :, position:position + 1] = v
            attended = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + attended.transpose(1, 2).reshape(b, t, q_size) @ layer["o"]
        gate, up = (self._norm(x, layer["norm2"]) @ layer["gate_up"]).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ layer["down"]

    def decode_ms(self, batch: int, context: int, replays: int = 20) -> float:
        import torch

        p = self.p
        caches = [(torch.zeros(batch, p.kv_heads, context, p.head_dim, device=self.device, dtype=self.dtype),
                   torch.zeros(batch, p.kv_heads, context, p.head_dim, device=self.device, dtype=self.dtype))
                  for _ in self.layers]
        tokens = torch.zeros(batch, 1, dtype=torch.long, device=self.device)

        def step():
            x = self.embed[tokens]
            for layer, (k_cache, v_cache) in zip(self.layers, caches, strict=True):
                x = self._layer(x, layer, k_cache, v_cache, context - 1)
            return (x[:, -1] @ self.head).argmax(-1)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return _timed_ms(graph.replay, replays)

    def prefill_ms(self, tokens: int, repeats: int = 3) -> float:
        import torch

        ids = torch.zeros(1, tokens, dtype=torch.long, device=self.device)

        def run():
            x = self.embed[ids]
            for layer in self.layers:
                x = self._layer(x, layer, None, None, 0)
            return (x[:, -1] @ self.head).argmax(-1)

        with torch.no_grad():
            run()
            return _timed_ms(run, repeats)


def _timed_ms(fn, repeats: int) -> float:
    """The fastest of `repeats` calls of `fn`, in milliseconds, timed with CUDA events."""
    import torch

    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def fits(profile: ModelProfile, batch: int, context: int, free_bytes: float) -> bool:
    """Whether a decode row's KV cache (and its activations' margin) fits next to the weights."""
    return batch * context * profile.kv_bytes_per_token(1) + 2e9 < free_bytes


def measure(profile: ModelProfile, hardware: str) -> dict:
    import torch

    cost = CostModel(Cluster(1, 8, HARDWARE[hardware]), profile)
    model = Model(profile, "cuda")
    rows: dict[str, list] = {"decode": [], "prefill": [], "skipped": []}
    with torch.no_grad():
        for batch, context in DECODE_ROWS:
            free, _ = torch.cuda.mem_get_info()
            if not fits(profile, batch, context, free):
                rows["skipped"].append(f"decode {batch} x {context}: its KV cache does not fit next to the weights")
                continue
            ms = model.decode_ms(batch, context)
            rows["decode"].append({"batch": batch, "context": context, "measured_ms": ms,
                                   "model_ms": cost.decode_step_s(1, batch, context) * 1e3})
            torch.cuda.empty_cache()
        for tokens in PREFILL_ROWS:
            ms = model.prefill_ms(tokens)
            rows["prefill"].append({"tokens": tokens, "measured_ms": ms, "model_ms": cost.prefill_s(1, tokens, tokens / 2) * 1e3})
    return {"device": torch.cuda.get_device_name(), "hardware": hardware, "model": profile.name, **rows}


def report(result: dict) -> list[str]:
    lines = [f"{result['model']} on {result['device']} (cost model: {result['hardware']}, TP1, default coefficients)",
             "| step | measured ms | model ms | model / measured |", "|---|---|---|---|"]
    for row in result["decode"]:
        lines.append(f"| decode {row['batch']} x {row['context']:,} | {row['measured_ms']:.2f} | {row['model_ms']:.2f} | "
                     f"{row['model_ms'] / row['measured_ms']:.2f} |")
    for row in result["prefill"]:
        lines.append(f"| prefill {row['tokens']:,} | {row['measured_ms']:.1f} | {row['model_ms']:.1f} | "
                     f"{row['model_ms'] / row['measured_ms']:.2f} |")
    lines += [f"skipped: {reason}" for reason in result["skipped"]]
    ratios = [r["model_ms"] / r["measured_ms"] for r in result["decode"] + result["prefill"]]
    if ratios:
        lines.append(f"model / measured: {min(ratios):.2f} to {max(ratios):.2f} "
                     f"({sum(0.85 <= r <= 1.15 for r in ratios)} of {len(ratios)} rows within 15%)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS))
    parser.add_argument("--hardware", default="", help=f"the cost model's profile of this GPU ({', '.join(HARDWARE)})")
    parser.add_argument("--json", default="", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_physics: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    hardware = args.hardware or hardware_of(torch.cuda.get_device_name())
    if hardware not in HARDWARE:
        print(f"gpu_physics: no cost-model profile for {torch.cuda.get_device_name()!r}; pass --hardware "
              f"({', '.join(HARDWARE)})", file=sys.stderr)
        return 2
    result = measure(MODELS[args.model], hardware)
    print("\n".join(report(result)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
