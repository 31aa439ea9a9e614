"""Device names checked against the machine."""

import pytest
import torch

from libra.devices import gpu_count, torch_device
from libra.errors import LibraError


def test_engine_devices_are_checked_against_the_machine():
    assert torch_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "tpu", "cuda:x"):
        with pytest.raises(LibraError, match="use 'cpu', 'cuda' or 'cuda:N'"):
            torch_device(bad)
    count = gpu_count()
    with pytest.raises(LibraError, match=f"this machine has {count} GPU\\(s\\) torch can use"):
        torch_device(f"cuda:{count}")
