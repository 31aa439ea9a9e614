"""Reference runs for checking the elastic pool's arithmetic: plain `DistributedDataParallel` over a
fixed set of replicas, with the same task, the same global batches and the same shards. Used by the
tests and the pool benchmark; not part of the training path."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from libra.pools.batching import shards
from libra.pools.elastic import exit_done
from libra.pools.task import TrainTask


def _replica(rank: int, world: int, port: int, task: TrainTask, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    model, optimizer = task.build()
    ddp = DistributedDataParallel(model)
    ids = [str(r) for r in range(world)]
    for step in range(steps):
        shard = shards(task.step_size(step), ids)[str(rank)]
        optimizer.zero_grad(set_to_none=True)
        # dividing by each replica's (equal) shard weight makes DDP's average the whole batch's mean
        weight = task.accumulate(ddp, step, shard).weight  # DDP averages the summed gradients over replicas
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= weight
        task.update(model, optimizer, step)
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, Path(out) / "ddp.pt")
    dist.barrier()  # tearing groups down while a peer is still in a collective can abort the process
    dist.destroy_process_group()
    exit_done()


def ddp_run(task: TrainTask, replicas: int, steps: int) -> dict:
    """Final {"model", "optimizer"} state of plain DDP over `replicas` processes for `steps` steps;
    the global batch must divide evenly among them."""
    uneven = [s for s in range(steps) if task.step_size(s) % replicas]
    if uneven:
        raise ValueError(f"step {uneven[0]}'s global batch ({task.step_size(uneven[0])}) does not divide among "
                         f"{replicas} replicas")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
        procs = [ctx.Process(target=_replica, args=(r, replicas, store.port, task, steps, out)) for r in range(replicas)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"DDP reference failed: exit codes {[p.exitcode for p in procs]}")
        return torch.load(Path(out) / "ddp.pt", weights_only=True)
