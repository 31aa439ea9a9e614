"""The machine's devices: its memory, its cores as a worker names them, how many GPUs torch can use,
and device names checked against them."""

from __future__ import annotations

import os
from collections.abc import Sequence

from libra.errors import LibraError


def machine_memory_bytes() -> int:
    """This machine's memory in bytes (16 GiB where the system does not say)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 16 * 2**30


def host_cores(cores: Sequence[int]) -> set[int]:
    """A worker's core numbers as cores of this host. They count the CPUs the host offers (on a Ray
    cluster, what `ray start --num-cpus` said), which may be more than it has: a number beyond the
    host's CPUs wraps onto them (core 5 of a 4-CPU host is core 1), so workers share the cores there
    are instead of failing to pin."""
    count = os.cpu_count() or 1
    return {core % count for core in cores}


def gpu_count() -> int:
    """GPUs torch can use in this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_gpus(needed: int, what: str, instead: str) -> int:
    """The GPUs torch can use here, or a LibraError when they are fewer than `needed`: `what` names
    what needs them (`rollout.device cuda`), `instead` what to do (`use device cpu`)."""
    count = gpu_count()
    if count < needed:
        have = "torch sees no GPU here" if count == 0 else f"this machine has {count} GPU(s) torch can use"
        raise LibraError(f"{what}: {have}; {instead}")
    return count


def torch_device(device: str):
    """The torch device named by `device` ("cpu", "cuda", "cuda:N"), checked against the machine."""
    import torch

    try:
        found = torch.device(device)
    except RuntimeError as exc:
        raise LibraError(f"engine device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from exc
    if found.type not in ("cpu", "cuda"):
        raise LibraError(f"engine device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if found.type == "cuda":
        count = gpu_count()
        if (found.index or 0) >= count:
            raise LibraError(f"engine device {device!r}: this machine has {count} GPU(s) torch can use; use 'cpu'"
                             + (f" or 'cuda:0'..'cuda:{count - 1}'" if count else ""))
    return found
