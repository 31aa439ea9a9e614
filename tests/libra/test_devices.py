"""Device names checked against the machine."""

import pytest
import torch

import libra.devices
from libra.devices import gpu_count, require_gpus, torch_device
from libra.errors import LibraError


def test_engine_devices_are_checked_against_the_machine():
    assert torch_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "tpu", "cuda:x"):
        with pytest.raises(LibraError, match="use 'cpu', 'cuda' or 'cuda:N'"):
            torch_device(bad)
    count = gpu_count()
    with pytest.raises(LibraError, match=f"this machine has {count} GPU\\(s\\) torch can use"):
        torch_device(f"cuda:{count}")


def test_cores_beyond_the_hosts_wrap_onto_them(monkeypatch):
    import os

    from libra.devices import host_cores

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert host_cores([0, 1]) == {0, 1}  # cores the host has: as they are
    assert host_cores([2, 3]) == {2, 3}
    assert host_cores([5]) == {1} and host_cores([4, 5, 6, 7]) == {0, 1, 2, 3}  # a host offering Ray 8 of its 4
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert host_cores([3]) == {0}  # count unknown: one core


def test_too_few_gpus_is_one_line_that_says_what_to_do(monkeypatch):
    monkeypatch.setattr(libra.devices, "gpu_count", lambda: 0)
    with pytest.raises(LibraError, match=r"^rollout.device is cuda: torch sees no GPU here; set it to cpu$"):
        require_gpus(1, "rollout.device is cuda", "set it to cpu")
    monkeypatch.setattr(libra.devices, "gpu_count", lambda: 2)
    assert require_gpus(2, "two instances", "use fewer") == 2
    with pytest.raises(LibraError, match=r"^3 instances: this machine has 2 GPU\(s\) torch can use; use fewer$"):
        require_gpus(3, "3 instances", "use fewer")
