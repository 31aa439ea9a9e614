"""Which trainer a run trains with, in which parallel layout, and on which of its workers.

    placement = with_first_layout(config, placement, cluster, policy)   # trainer.layout planned
    trainer = open_trainer(config, weights, policy, root, placement, cluster, on_event)
    reshard = place_trainer(trainer, config, placement, cluster)        # after every move
    layout = layout_of(trainer, placement)                              # for the timing samples

The trainers:

- the torch trainer (`PolicyTrainer`): the HF model in the run's process, its threads the trainer's
  workers' cores (a data-parallel degree of that many workers, to the cost model);
- the elastic pool (`PooledTrainer`): with hybrids or on a Ray cluster;
- megatron-core (`MegatronTrainer`): `tp` x `pp` x `dp` rank processes, each pinned to its run of
  the trainer's workers' cores. `trainer.layout: fixed` takes the layout from trainer.tp/pp/dp;
  `planned` takes the planner's: at the start its training search for the first placement's
  trainer workers (for the longest step the configuration admits, `prior_workload`), then the
  layout of each plan applied (`placement_of`), the ranks resharded when it changes (the weights and
  AdamW's state leave whole and are split anew: `MegatronTrainer.relayout`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from libra.config import LibraConfig
from libra.errors import LibraError
from libra.pools.states import PoolEvent
from libra.rl.cluster import LocalCluster, Placement
from libra.trainer.layout import Layout
from libra.trainer.protocol import ShardedTrainer, Trainer


@dataclass(frozen=True)
class Reshard:
    """The megatron trainer's ranks restarted in another layout (`seconds`: all of it)."""

    before: Layout
    after: Layout
    seconds: float


def fixed_layout(config: LibraConfig) -> Layout | None:
    """The layout the configuration fixes (megatron's trainer.tp/pp/dp), or None (the planner's, or
    the torch trainer's, which has none to fix)."""
    t = config.trainer
    return Layout(t.tp, t.pp, t.dp) if t.backend == "megatron" and t.layout == "fixed" else None


def planned_running(config: LibraConfig, placement: Placement | None) -> Layout | None:
    """The layout a `planned` megatron trainer runs in `placement` (the plan in force is costed in
    it, as every candidate is in its own); None when the layout is not the planner's (fixed, the
    torch trainer, the pool), where the plans are costed in the planner's layouts alone."""
    if config.trainer.layout != "planned" or placement is None:
        return None
    return placement.layout


def check_layout_fits(config: LibraConfig, placement: Placement) -> None:
    """A fixed layout with more ranks than the placement gives the trainer workers is refused: each
    rank is a process on a worker of its own."""
    layout = fixed_layout(config)
    if layout is not None and layout.world > len(placement.train):
        raise LibraError(f"trainer.tp x pp x dp = {layout.world} ranks ({layout}), but placement.strategy "
                         f"{config.placement.strategy} gives the trainer {len(placement.train)} worker(s) "
                         f"({placement.describe()}); lower the layout, add workers (placement.cores_per_worker), or "
                         "set trainer.layout: planned")


def with_first_layout(config: LibraConfig, placement: Placement, cluster: LocalCluster, policy: Path) -> Placement:
    """`placement` with the layout a `planned` megatron trainer starts in: the one it has (a resumed
    run's, or a plan's), else the planner's for its trainer workers before anything is measured."""
    from libra.rl.planning import planned_layout, policy_cost_model, prior_workload

    if config.trainer.layout != "planned" or placement.layout is not None:
        return placement
    t = config.trainer
    cost = policy_cost_model(cluster, policy, config.planner)
    workload = prior_workload(t.prompts_per_step * t.samples_per_prompt, config.rollout.max_context)
    return replace(placement, layout=planned_layout(cost, workload, len(placement.train)))


def _units(config: LibraConfig, placement: Placement, cluster: LocalCluster, layout: Layout) -> tuple[int, ...]:
    """The cores (or GPUs) of the trainer's first `layout.world` workers, a worker a rank (a layout
    of fewer ranks than workers leaves the others idle, as the planner's plan on fewer GPUs than it
    is given does), when the trainer runs on the workers' kind of device; else none (unpinned)."""
    if cluster.device != config.trainer.device:
        return ()
    return cluster.units(placement.train[:layout.world])


def open_trainer(config: LibraConfig, weights: Path, policy: Path, root: Path, placement: Placement | None,
                 cluster: LocalCluster | None, on_event: Callable[[PoolEvent], None], pooled: bool) -> Trainer:
    """The run's trainer, started from `weights` (`policy`: the KL term's reference): the elastic
    pool's (`pooled`), megatron's (in the placement's layout when planned, on the trainer's workers
    when placed), or the torch trainer."""
    t, r = config.trainer, config.rollout
    if pooled:  # the trainer's ranks are the elastic pool's core
        from libra.trainer.pooled import PooledTrainer

        return PooledTrainer(weights, t, r, config.pool, root / "pool", hybrids=config.placement.hybrids,
                             reference_dir=policy, on_event=on_event)
    if t.backend == "megatron":
        from libra.trainer.megatron_trainer import MegatronTrainer

        layout = fixed_layout(config) or (placement.layout if placement is not None else None)
        if layout is None:
            raise LibraError("trainer.layout planned needs a placement (placement.strategy libra, static or colocated)")
        units: tuple[int, ...] = ()
        if placement is not None and cluster is not None:
            check_layout_fits(config, placement)
            units = _units(config, placement, cluster, layout)
        return MegatronTrainer(weights, t, r, layout, device=t.device, reference_dir=policy, units=units)
    from libra.trainer.trainer import PolicyTrainer

    return PolicyTrainer(weights, t, r, device=t.device, reference_dir=policy)


def place_trainer(trainer: Trainer, config: LibraConfig, placement: Placement, cluster: LocalCluster) -> Reshard | None:
    """Put a megatron trainer where `placement` says: resharded into the placement's layout when a
    planned layout changes, else its ranks pinned anew to the trainer's workers. The torch trainer's
    threads and cores are the session's (they are its own process's). What a reshard cost, or None."""
    if not isinstance(trainer, ShardedTrainer):
        return None
    check_layout_fits(config, placement)
    target = planned_running(config, placement) or trainer.layout
    units = _units(config, placement, cluster, target)
    if target != trainer.layout:
        before = trainer.layout
        return Reshard(before, target, trainer.relayout(target, units))
    if units and units != trainer.units:
        trainer.place(units)
    return None


def layout_of(trainer: Trainer, placement: Placement | None, hybrids: int = 0) -> Layout:
    """The layout an update ran in, in the cost model's terms: megatron's ranks; the torch trainer
    (or the pool) as data parallel over its workers (and the hybrids that trained with it); without
    a placement, over its threads."""
    if isinstance(trainer, ShardedTrainer):
        return trainer.layout
    return Layout(dp=len(placement.train) + hybrids if placement else trainer.threads())


def reshard_row(step: int, time_s: float, reshard: Reshard, workers: int) -> dict:
    """A reshard as a row of the store's `pool_events` table."""
    return {"step": step, "time_s": time_s, "worker_id": "trainer", "gpus": workers, "from_state": "training",
            "to_state": "training", "event": "trainer_resharded",
            "detail": f"{reshard.before} -> {reshard.after} in {reshard.seconds:.1f} s"}
