"""What megatron-core needs to run on a CPU, in one place, applied only when the trainer's device
is the CPU (`use_cpu`).

megatron-core 0.16 assumes CUDA in these spots that a CPU run reaches:
- `torch.cuda.current_device()` names the device of the global memory buffer and of RoPE's inverse
  frequencies: it is made to answer the CPU device.
- the CUDA RNG tracker forks a CUDA generator around the parallel layers' initialisation and
  dropout: `initialize_rng_tracker(inference_rng_tracker=True)` makes that fork a no-op (the
  trainer loads its weights and uses no dropout, so no random stream is lost).
- the pipeline schedules count a step's tokens in `torch.zeros(..., device="cuda")`, and the
  pipeline's sends call `torch.cuda.synchronize()`: the schedules module sees a `torch` whose
  `zeros` puts a "cuda" tensor on the CPU, and synchronising is a no-op (a CPU has no stream).
- with tied embeddings over pipeline stages, the model moves the last stage's copy of the embedding
  with `Tensor.cuda()` before summing the stages' copies: on the CPU, `cuda()` keeps a tensor where
  it is (a rank process has no other use for it: torch built without CUDA would only fail).
- the default causal mask is built on "cuda": the trainer passes its own mask
  (`megatron_rank.causal_mask`), so nothing needs patching for it.
"""

from __future__ import annotations

import types

import torch

_applied = False


class _TorchOnCpu(types.ModuleType):
    """torch, but `zeros(..., device="cuda")` is made on the CPU."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def zeros(*size, device=None, **kwargs) -> torch.Tensor:
        return torch.zeros(*size, device="cpu" if device == "cuda" else device, **kwargs)


def use_cpu() -> None:
    """Apply the shims (idempotent). Call before building a megatron model on the CPU."""
    global _applied
    if _applied:
        return
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _TorchOnCpu("torch")
    _applied = True

