"""A relaxation of a partial or asynchronous run: each stage given the whole cluster at once.

The proven bound of a partial run (`bound.pooled_bound_s`) is loose: it prices every GPU at a full
batch, while a partial rollout closes when its groups' slowest samples end, at a latency that
batching slows down. The relaxation keeps that latency and takes the GPU budget away:

- every trajectory decodes alone on an instance of its own, of the TP that decodes one sequence
  fastest (as many instances as trajectories in flight), so no sample waits for a batch slot or
  shares a decode step;
- training runs on the whole cluster, in the configuration fastest for the step's workload
  (`TrainingTable.best`: the fastest on any count of GPUs up to the cluster's);
- the rest is the run's own: the same batches, over-provision, close, staleness bound, weight sync
  and one-step-off pipelining (`runner.run_system`).

A split, a layout, a router or a pool can only add batching to the rollout and take GPUs from
training, so no system is expected to train faster. It is not proven: a suspended trajectory's head
start depends on when the step before closed, so a slower step can give the next one a head start
the relaxed run does not have (tests check that no system beats it on the bundled workloads). What
it answers is how much any policy could gain over the best fixed split in this physics: the gap
between them is all the room there is.
"""

from __future__ import annotations

import math

from libra.errors import InfeasibleError
from libra.planner.training_search import TrainingTable
from libra.sim.bound import TPS
from libra.sim.rollout import InstanceSpec, mean_context
from libra.sim.systems import StepConfig, System


class Relaxation(System):
    """Not a system a cluster can run: the whole cluster trains while every trajectory decodes alone."""

    name = "relaxation"

    def configure(self, step, previous, upcoming, times):
        gpus = self.cost.cluster.gpus
        workload = self.planned_workload(previous)
        train = TrainingTable(self.cost, workload).best(gpus)
        if train is None:
            raise InfeasibleError(f"no training configuration fits {gpus} GPUs")
        context = mean_context(previous)
        tp = min(self.cost.instance_tps(TPS), key=lambda tp: (self.cost.decode_step_s(tp, 1, context), -tp))
        in_flight = math.ceil(self.mode.overprovision * len(upcoming)) + len(upcoming) if self.mode.partial else len(upcoming)
        return StepConfig("one_step_off", gpus, train.config, tuple(InstanceSpec(tp, 0) for _ in range(in_flight)), ())
