"""How much room a partial rollout leaves over the best fixed split: every fixed split, the
relaxation, and what 1.15x the best split would take.

Each cell runs `--steps` RL steps of one workload with partial rollouts (Qwen3-14B on A800s, seed 0,
the batch grown with the cluster as in `bench_modes`, over-provision 1.5, staleness bound 4; r2e-gym
at 48 GPUs only, as in `bench_modes`' 256-GPU table):

- every fixed split (`FixedSplit`: `t` GPUs train, the rest roll out on uniform instances of the
  tuned size, never moved) for `t` in steps of a node's GPUs / 2 (48 GPUs) or two nodes (256),
  where both stages fit their GPUs;
- AReaL-static-optimal and Libra, for reference;
- the relaxation (`libra.sim.relaxation`): every trajectory decoding alone and training on the
  whole cluster at once, which no system is expected to beat;
- two clairvoyant probes around the best split, which read every trajectory's future: the groups
  that will close the batch on instances of their own (`ClairvoyantClose`: the best split and its
  neighbours at 48 GPUs, the best split at 256; the lanes a quarter, half or three quarters of the
  rollout GPUs, of every instance size pair, holding 1x or 1.25x the groups the batch needs), and
  hybrids leaving the rollout's tail for training (`HybridSplit`: one or two quanta of hybrid
  GPUs, leaving at 0.2-0.8 of the needed groups still to complete), their joins at the pool's cost
  and free. Each reports its best configuration.

Figures: trained tokens per second of simulated time, the mean rollout close and training time of
each split (steps after the first, which has no carried groups), the relaxation's ceiling over the
best split, and for a step 1.15x shorter than the best split's: the fewest training GPUs that train
a batch in it, and the close a uniform rollout reaches on the GPUs left and on all but the fewest.

    python -m benchmarks.bench_headroom [--steps 30] [--nodes 6 32] [--workloads search-r1 ...]
"""

from __future__ import annotations

import argparse
import itertools
import time

from benchmarks.bench_sim import REPLAY
from benchmarks.common import DECODE_FIT, save
from libra.errors import InfeasibleError
from libra.planner.cost_model import CostModel
from libra.planner.planner import PlannerSettings
from libra.planner.profiles import MODELS, parse_cluster
from libra.planner.trigger import TriggerSettings
from libra.sim.modes import RolloutMode
from libra.sim.probes import ClairvoyantClose, HybridSplit
from libra.sim.relaxation import Relaxation
from libra.sim.runner import SystemRun, draw, simulate_system
from libra.sim.systems import FixedSplit, best_uniform_tp, full_context_tps
from libra.sim.workloads import PRESETS, workload_spec

GOAL = 1.15  # the goal: Libra with partial rollouts over the best fixed split with them
STEPS = {6: 30, 32: 10}  # steps per cell by nodes (as bench_modes and its 256-GPU table)


def means(run: SystemRun) -> tuple[float, float, float]:
    """(rollout close, training, step) seconds, mean over the steps after the first."""
    later = run.steps[1:] or run.steps
    return (sum(s.rollout_s for s in later) / len(later), sum(s.train_s for s in later) / len(later),
            sum(s.step_s for s in later) / len(later))


LANE_SHARES = (0.25, 0.5, 0.75)  # of the rollout GPUs given to the closing groups' instances
MARGINS = (1.0, 1.25)  # closing groups set apart, per group the batch needs
LEAVE = (0.2, 0.4, 0.6, 0.8)  # hybrids leave once this share of the needed groups is still to complete


def best_of(runs: dict[str, SystemRun]) -> dict | None:
    """The configuration that trained the most tokens per second, with its means."""
    if not runs:
        return None
    key = max(runs, key=lambda k: runs[k].tokens_per_s)
    rollout_s, train_s, step_s = means(runs[key])
    return {"config": key, "tokens_per_s": runs[key].tokens_per_s, "rollout_s": rollout_s, "train_s": train_s,
            "step_s": step_s, "tried": len(runs)}


def lane_configs(rollout_gpus: int, sizes: tuple[int, ...]):
    """(lane, rest) instance sets over `rollout_gpus`, each once: the lane (count, TP) a share of
    them (`LANE_SHARES`, rounded to its instance size), the rest (count, TP) as many instances as
    the GPUs left hold."""
    seen = set()
    for lane_tp, rest_tp in itertools.product(sizes, repeat=2):
        for share in LANE_SHARES:
            lane_gpus = min(max(lane_tp, round(share * rollout_gpus / lane_tp) * lane_tp), rollout_gpus - rest_tp)
            rest = (rollout_gpus - lane_gpus) // rest_tp
            config = ((lane_gpus // lane_tp, lane_tp), (rest, rest_tp))
            if lane_gpus >= lane_tp and rest >= 1 and config not in seen:
                seen.add(config)
                yield config


class Watched(FixedSplit):
    """A fixed split that keeps its rollouts (to see how crowded its instances are as groups complete,
    `crowd`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rollouts = []
        self.carried = []  # per rollout: (groups it carried in, how many of them completed before its close)

    def rollout(self, step, config, batch, resume=None, close=None):
        result = super().rollout(step, config, batch, resume, close)
        self.rollouts.append(result)
        if close is not None:
            carried = {close.groups[tid] for tid in resume or {}}
            self.carried.append((len(carried), sum(g in carried for g in result.completed_groups)))
        return result


def crowd(system: Watched) -> dict:
    """Turns on the rollout instances when the first of the batch's groups completed, when half of
    them had, and at its close, per instance, mean over the steps after the first; and the range,
    over those steps, of the groups carried in and of how many of them completed before the close."""
    later = [r for r in system.rollouts[1:] if r.group_crowd] or system.rollouts
    instances = len(system.config.layout)

    def mean(at) -> float:
        return sum(r.group_crowd[at(len(r.group_crowd))] for r in later) / len(later) / instances

    steady = system.carried[1:] or system.carried
    return {"instances": instances, "tp": system.config.layout[0].tp, "at_first": mean(lambda n: 0),
            "at_half": mean(lambda n: (n - 1) // 2), "at_close": mean(lambda n: n - 1),
            "carried": [min(c for c, _ in steady), max(c for c, _ in steady)],
            "carried_completed": [min(d for _, d in steady), max(d for _, d in steady)]}


def cell(name: str, nodes: int, steps: int) -> dict:
    base = workload_spec(name)
    spec = workload_spec(name, prompts_per_step=max(1, base.prompts_per_step * nodes // 6))
    drawn = draw(spec, CostModel(parse_cluster(f"{nodes}x8:a800"), MODELS["qwen3-14b"]), steps, 0, RolloutMode("partial"))
    cost, mode, group = drawn.cost, drawn.mode, drawn.group_size
    settings, trigger = PlannerSettings(), TriggerSettings()
    started = time.perf_counter()

    def run(system) -> SystemRun:
        return drawn.run(system, settings)

    quantum = 4 if nodes * 8 <= 64 else 16
    splits, crowds = {}, {}
    for train in range(quantum, cost.cluster.gpus, quantum):
        watched = Watched(cost, settings, trigger, mode, group, train_gpus=train)
        try:
            r = run(watched)
        except InfeasibleError:  # training (or the rollout) does not fit the GPUs this split gives it
            continue
        rollout_s, train_s, step_s = means(r)
        splits[train] = {"tokens_per_s": r.tokens_per_s, "rollout_s": rollout_s, "train_s": train_s, "step_s": step_s}
        crowds[train] = crowd(watched)
    planned = {name: simulate_system(name, drawn, settings, trigger) for name in ("areal-static-optimal", "libra")}
    relaxed = run(Relaxation(cost, settings, trigger, mode, group))
    best = max(splits, key=lambda t: splits[t]["tokens_per_s"])
    # clairvoyant probes around the best split: the closing groups on instances of their own, and
    # hybrids (joins at their cost, and free)
    workload = FixedSplit(cost, settings, trigger, mode, group, train_gpus=best).planned_workload(drawn.warmup)
    fits = full_context_tps(cost)
    wide = cost.cluster.gpus <= 64
    lanes, hybrids, free = {}, {}, {}
    for train in ([best - quantum, best, best + quantum] if wide else [best]):
        if train not in splits:
            continue
        rollout_gpus = cost.cluster.gpus - train
        uniform = best_uniform_tp(cost, rollout_gpus, workload)
        sizes = tuple(tp for tp in fits if tp >= 2) if wide else tuple(sorted({uniform, max(fits)}))
        for (lane, rest), margin in itertools.product(lane_configs(rollout_gpus, sizes), MARGINS):
            lanes[f"train {train}, lane {lane[0]}xTP{lane[1]}, rest {rest[0]}xTP{rest[1]}, margin {margin}"] = run(
                ClairvoyantClose(cost, settings, trigger, mode, group, train_gpus=train, lane=lane, rest=rest,
                                 margin=margin))
    for train in ([best - 2 * quantum, best - quantum, best] if wide else [best - quantum, best]):
        for extra in (quantum, 2 * quantum):
            core = cost.cluster.gpus - train - extra
            if train not in splits or core < 1 or extra % best_uniform_tp(cost, core, workload):
                continue
            for leave, join_s in itertools.product(LEAVE, (None, 0.0)):
                key = f"train {train}, hybrids {extra}, leave at {leave}"
                (free if join_s == 0.0 else hybrids)[key] = run(HybridSplit(
                    cost, settings, trigger, mode, group, train_gpus=train, hybrid_gpus=extra, leave_fraction=leave,
                    join_s=join_s))
    target_s = splits[best]["step_s"] / GOAL
    sync = cost.weight_sync_s()
    enough = [t for t in splits if splits[t]["train_s"] + sync <= target_s]
    train_needed = min(enough) if enough else None
    fewest = min(splits)
    relaxed_rollout, relaxed_train, _ = means(relaxed)
    label = "trace replay (tau-bench)" if name == REPLAY else name
    out = {
        "workload": label, "gpus": cost.cluster.gpus, "steps": steps, "splits": splits, "best_split": best,
        "half": splits.get(cost.cluster.gpus // 2, {}).get("tokens_per_s"),
        "planned": {s: r.tokens_per_s for s, r in planned.items()},
        "relaxation": {"tokens_per_s": relaxed.tokens_per_s, "rollout_s": relaxed_rollout, "train_s": relaxed_train},
        "ceiling_over_best": relaxed.tokens_per_s / splits[best]["tokens_per_s"],
        "target_step_s": target_s, "train_needed": train_needed,
        "rollout_left_s": splits[train_needed]["rollout_s"] if train_needed else None,
        "fewest_train": fewest, "rollout_most_s": splits[fewest]["rollout_s"],
        "crowd": crowds[best], "clairvoyant_lanes": best_of(lanes), "hybrids": best_of(hybrids), "free_hybrids": best_of(free),
        "wall_s": time.perf_counter() - started,
    }
    print(f"{label}, {cost.cluster.gpus} GPUs, {steps} steps, partial ({out['wall_s']:.0f} s):")
    for t, m in splits.items():
        mark = "  <- best" if t == best else ""
        print(f"  train {t:>3} GPUs: {m['tokens_per_s']:8.0f} tokens/s  rollout {m['rollout_s']:6.1f} s  "
              f"training {m['train_s']:6.1f} s{mark}")
    print(f"  areal-static-optimal {planned['areal-static-optimal'].tokens_per_s:.0f}, libra {planned['libra'].tokens_per_s:.0f}; "
          f"relaxation {relaxed.tokens_per_s:.0f} (rollout {relaxed_rollout:.1f} s, training {relaxed_train:.1f} s): "
          f"{out['ceiling_over_best']:.2f}x the best split")
    c = out["crowd"]
    print(f"  the best split's {c['instances']} TP{c['tp']} instances hold {c['at_first']:.1f} turns each when the first of "
          f"the batch's groups completes, {c['at_half']:.1f} when half have, {c['at_close']:.1f} at its close; "
          f"{c['carried_completed'][0]}-{c['carried_completed'][1]} of the {c['carried'][0]}-{c['carried'][1]} groups "
          "a step carries complete before it closes")
    for label_, probe in (("clairvoyant lanes", out["clairvoyant_lanes"]), ("hybrids", out["hybrids"]),
                          ("free hybrids", out["free_hybrids"])):
        if probe:
            print(f"  best of {probe['tried']} {label_}: {probe['tokens_per_s']:.0f} tokens/s "
                  f"({probe['tokens_per_s'] / splits[best]['tokens_per_s']:.3f}x the best split; {probe['config']})")
    if train_needed is None:
        print(f"  {GOAL}x the best split needs steps of {target_s:.1f} s: no split trains a batch that fast")
    else:
        print(f"  {GOAL}x the best split needs steps of {target_s:.1f} s: training needs {train_needed} GPUs, "
              f"leaving {cost.cluster.gpus - train_needed} to a rollout that closes at {out['rollout_left_s']:.1f} s "
              f"(uniform); on {cost.cluster.gpus - fewest} GPUs it closes at {out['rollout_most_s']:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="steps per cell (default: 30 at 6 nodes, 10 at 32)")
    parser.add_argument("--nodes", type=int, nargs="*", default=[6, 32])
    parser.add_argument("--workloads", nargs="*", default=[*PRESETS, "tau-bench-replay"],
                        help="presets, trace:FILE.csv, or tau-bench-replay (the bundled tau-bench trace replayed)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    workloads = [REPLAY if name == "tau-bench-replay" else name for name in args.workloads]
    cells = [cell(name, nodes, args.steps or STEPS.get(nodes, 30)) for nodes in args.nodes for name in workloads
             if nodes == 6 or name != "r2e-gym"]
    if not args.no_save:
        print(f"wrote {save('headroom', {'model': 'Qwen3-14B', 'hardware': 'A800', 'decode_fit': DECODE_FIT, 'goal': GOAL, 'cells': cells})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
