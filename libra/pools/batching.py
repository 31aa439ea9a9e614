"""How a step's global batch is divided among the replicas that are active in it.

The global batch is fixed by the RL algorithm (the step's trajectories); hybrids do not grow it.
Active replicas, in rank order (core ranks first, then hybrids by id), each take one contiguous
shard of near-equal size (the first `size % n` shards hold one sample more). Every replica sums
its losses (per sample, or per policy token for GRPO); the cross-replica all-reduce sums gradients
and the units summed over, and the update divides by that total, so it is the mean over the whole
batch whatever the membership. A replica that is not active contributes a zero gradient and a zero
weight: the update is then exactly the
one the other replicas would compute alone. Each sample is in exactly one shard, so no trajectory
is trained on twice or dropped; a step that fails is redone from the start by the core alone.
"""

from __future__ import annotations

from collections.abc import Sequence


def shards(batch_size: int, active: Sequence[str]) -> dict[str, range]:
    """Sample index ranges per active replica, in the given (rank) order."""
    if batch_size < 0:
        raise ValueError(f"batch size must be >= 0, got {batch_size}")
    if not active:
        raise ValueError("a step needs at least one active replica")
    if len(set(active)) != len(active):
        raise ValueError(f"replica ids must be unique, got {list(active)}")
    base, extra = divmod(batch_size, len(active))
    out, start = {}, 0
    for i, member in enumerate(active):
        size = base + (1 if i < extra else 0)
        out[member] = range(start, start + size)
        start += size
    return out
