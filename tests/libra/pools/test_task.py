"""The regression task: a replica's shard is the same rows as the step's global batch."""

import torch

from libra.pools.task import RegressionTask


def test_a_shard_is_those_rows_of_the_global_batch():
    task = RegressionTask(dim=8, global_batch=12)
    inputs, targets = task.batch(5)
    assert inputs.shape == targets.shape == (12, 8)
    shard_inputs, shard_targets = task.batch(5, range(4, 9))
    assert torch.equal(shard_inputs, inputs[4:9])
    torch.testing.assert_close(shard_targets, targets[4:9], rtol=0, atol=1e-7)
    assert not torch.equal(task.batch(6)[0], inputs)  # every step draws a new batch
