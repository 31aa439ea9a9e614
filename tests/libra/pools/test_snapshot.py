import threading

import pytest
import torch

from libra.pools import snapshot
from libra.pools.task import RegressionTask


def test_weights_and_optimizer_state_round_trip_exactly(tmp_path):
    task = RegressionTask(dim=4, hidden=8, global_batch=6)
    model, optimizer = task.build()
    inputs, targets = task.batch(0)
    task.loss_sum(model, inputs, targets).backward()
    optimizer.step()
    copied = threading.Event()
    size = snapshot.write({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "s.snap",
                          {"step": 7}, copied)
    assert copied.is_set() and size == (tmp_path / "s.snap").stat().st_size
    assert not list(tmp_path.glob(".*.tmp"))
    state, extra = snapshot.read(tmp_path / "s.snap")
    assert extra == {"step": 7}
    fresh_model, fresh_optimizer = task.build()
    fresh_model.load_state_dict(state["model"])
    fresh_optimizer.load_state_dict(state["optimizer"])
    for a, b in zip(model.parameters(), fresh_model.parameters(), strict=True):
        assert torch.equal(a, b)
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]  # ints, floats, tuples and None survive
    for key, values in saved["state"].items():
        for name, value in values.items():
            assert torch.equal(value, loaded["state"][key][name]), (key, name)


def test_odd_shapes_and_dtypes(tmp_path):
    state = {"empty": torch.zeros(0, 3), "scalar": torch.tensor(3.5, dtype=torch.float64),
             "ints": torch.arange(5, dtype=torch.int16), 1: [torch.ones(2, 2).t(), None, (True, "x")]}
    snapshot.write(state, tmp_path / "s.snap")
    back, _ = snapshot.read(tmp_path / "s.snap")
    assert back["empty"].shape == (0, 3) and back["scalar"].item() == 3.5 and back["scalar"].dtype == torch.float64
    assert back["ints"].tolist() == [0, 1, 2, 3, 4] and back[1][1:] == [None, (True, "x")]
    assert torch.equal(back[1][0], torch.ones(2, 2))


def test_unsupported_values_fail_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match="cannot snapshot a set"):
        snapshot.write({"x": {1, 2}}, tmp_path / "s.snap")
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_file_is_refused(tmp_path):
    snapshot.write({"w": torch.ones(100)}, tmp_path / "s.snap")
    data = (tmp_path / "s.snap").read_bytes()
    (tmp_path / "s.snap").write_bytes(data[:-64])
    with pytest.raises(ValueError, match="truncated"):
        snapshot.read(tmp_path / "s.snap")
