"""Independent simulations on a second core (`libra.sim.forked`): the same results as one core, to
the bit, in the same order; a failed child's share computed here; no fork where it would be unsafe."""

import os
import signal
import threading

import pytest

from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.sim import forked
from libra.sim.modes import RolloutMode
from libra.sim.runner import draw
from libra.sim.workloads import workload_spec


@pytest.fixture
def forks(monkeypatch) -> list[int]:
    """Counts the forks made (a test of the split must see one)."""
    made: list[int] = []
    real = os.fork

    def counted() -> int:
        pid = real()
        if pid:
            made.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted)
    monkeypatch.delenv("LIBRA_FORK", raising=False)
    monkeypatch.setattr(forked, "usable_cores", lambda: 2)
    # threads other tests left behind (Prefect's) would turn forking off; the children here run only
    # the simulator, which takes none of their locks
    monkeypatch.setattr(forked, "other_threads", lambda: False)
    return made


def test_items_are_computed_on_two_processes_and_come_back_in_order(forks) -> None:
    parent = os.getpid()
    out = forked.forked_map(lambda x: (x * x, os.getpid() == parent), list(range(7)))
    assert [value for value, _ in out] == [0, 1, 4, 9, 16, 25, 36]
    assert [here for _, here in out] == [True, False] * 3 + [True]  # the odd ones in the child
    assert len(forks) == 1


def test_a_child_that_fails_has_its_share_computed_here(forks) -> None:
    parent = os.getpid()

    def fragile(x: int) -> int:
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        return x + 1

    assert forked.forked_map(fragile, [1, 2, 3, 4]) == [2, 3, 4, 5]
    assert len(forks) == 1

    def killed(x: int) -> int:
        if os.getpid() != parent:
            os._exit(0)  # leaves without writing anything
        return -x

    assert forked.forked_map(killed, [1, 2, 3]) == [-1, -2, -3]


def test_a_child_reaped_by_the_system_still_hands_back_its_share(forks) -> None:
    parent = os.getpid()
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped as they exit: no status to read
    try:
        out = forked.forked_map(lambda x: (x, os.getpid() == parent), [1, 2, 3])
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert out == [(1, True), (2, False), (3, True)]


def test_an_error_here_ends_the_child_and_is_raised(forks) -> None:
    parent = os.getpid()

    def fails_here(x: int) -> int:
        if os.getpid() == parent:
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 0"):
        forked.forked_map(fails_here, [0, 1])
    with pytest.raises(ChildProcessError):
        os.waitpid(forks[0], os.WNOHANG)  # reaped


def test_no_fork_with_another_thread_one_core_one_item_or_turned_off(forks, monkeypatch) -> None:
    assert forked.forked_map(str, [1]) == ["1"]
    monkeypatch.undo()  # the real thread count, with one more thread running
    monkeypatch.setattr(os, "fork", forks.append)  # (a fork here fails the test)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert forked.other_threads() and not forked.can_fork()
        assert forked.forked_map(str, [1, 2]) == ["1", "2"]
    finally:
        release.set()
        other.join()
    monkeypatch.setattr(forked, "other_threads", lambda: False)
    monkeypatch.setattr(forked, "usable_cores", lambda: 2)
    monkeypatch.setenv("LIBRA_FORK", "0")
    assert forked.forked_map(str, [1, 2]) == ["1", "2"]
    monkeypatch.delenv("LIBRA_FORK")
    monkeypatch.setattr(forked, "usable_cores", lambda: 1)
    assert forked.forked_map(str, [1, 2]) == ["1", "2"]
    assert forks == []


@pytest.mark.parametrize("mode", ["sync", "partial"])
def test_probes_and_the_oracle_on_two_cores_simulate_what_one_core_does(forks, monkeypatch, mode: str) -> None:
    drawn = draw(workload_spec("search-r1", prompts_per_step=8), CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"]),
                 12, seed=1, mode=RolloutMode(mode))

    def runs() -> dict:
        from libra.sim.runner import simulate_system

        out = {}
        for name in ("libra", "oracle"):
            before = len(forks)
            out[name] = [(s.rollout_s, s.train_s, s.step_s, s.migrated_tokens, s.plan_reason)
                         for s in simulate_system(name, drawn).steps]
            out[f"{name} forks"] = len(forks) - before
        return out

    two = runs()
    assert two["libra forks"] >= 1 and two["oracle forks"] == 1  # Libra's probes; the oracle's plan
    monkeypatch.setenv("LIBRA_FORK", "0")
    assert runs() == two | {"libra forks": 0, "oracle forks": 0}
