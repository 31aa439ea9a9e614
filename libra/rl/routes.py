"""A training run's router: one length bucket per engine, over the environment's expert bounds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from libra.config import LibraConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from libra.rollout.envs.base import Env
    from libra.scheduler.routers import Router


def router_for(config: LibraConfig, env: Env, tokenizer: PreTrainedTokenizerBase, instances: int,
               current: Router | None = None) -> Router:
    """The router over `instances` buckets: `current` when it has as many, else a new one that keeps
    what `current` learned where the router can carry it (Libra's router)."""
    from libra.rollout.envs import expert_bounds
    from libra.scheduler.replay import make_router
    from libra.scheduler.routers import Buckets

    if current is not None and current.buckets.count == instances:
        return current
    buckets = Buckets(expert_bounds(env, instances, tokenizer))
    carried = getattr(current, "carried_to", None)
    return carried(buckets) if carried else make_router(config.rollout.router, buckets, {}, config.scheduler)
