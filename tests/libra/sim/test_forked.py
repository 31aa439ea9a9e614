"""Independent simulations on a second core (`libra.sim.forked`): the same results as one core, to
the bit, in the same order; a failed child's share computed here; no fork where it would be unsafe."""

import os
import signal
import threading
import time

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

    def square(x: int) -> tuple[int, bool]:
        time.sleep(0.05)  # long enough for the child to take tickets too
        return x * x, os.getpid() == parent

    out = forked.forked_map(square, list(range(16)))
    assert [value for value, _ in out] == [x * x for x in range(16)]
    assert {here for _, here in out} == {True, False}  # each process took some
    assert len(forks) == 1


def test_a_long_item_does_not_hold_up_the_others(forks) -> None:
    parent = os.getpid()

    def work(x: int) -> bool:
        time.sleep(1.0 if x == 0 else 0.01)
        return os.getpid() == parent

    here = forked.forked_map(work, list(range(9)))
    assert here.count(here[0]) == 1  # whoever took the long first item took no other


def test_a_split_inside_a_split_runs_where_it_is(forks) -> None:
    out = forked.forked_map(lambda x: forked.forked_map(lambda y: x * y, [1, 2, 3]), [1, 2])
    assert out == [[1, 2, 3], [2, 4, 6]]
    assert len(forks) == 1


def test_a_child_that_fails_has_its_share_computed_here(forks) -> None:
    parent = os.getpid()

    def fragile(x: int) -> int:
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        time.sleep(0.02)  # the child takes a ticket meanwhile
        return x + 1

    assert forked.forked_map(fragile, [1, 2, 3, 4]) == [2, 3, 4, 5]
    assert len(forks) == 1

    def killed(x: int) -> int:
        if os.getpid() != parent:
            os._exit(0)  # leaves without writing anything
        time.sleep(0.02)
        return -x

    assert forked.forked_map(killed, [1, 2, 3]) == [-1, -2, -3]


def test_a_child_reaped_by_the_system_still_hands_back_its_share(forks) -> None:
    parent = os.getpid()

    def where(x: int) -> tuple[int, bool]:
        time.sleep(0.05)
        return x, os.getpid() == parent

    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped as they exit: no status to read
    try:
        out = forked.forked_map(where, list(range(10)))
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert [x for x, _ in out] == list(range(10)) and not all(here for _, here in out)


def test_an_error_here_ends_the_child_and_is_raised(forks) -> None:
    parent = os.getpid()

    def fails_here(x: int) -> int:
        if os.getpid() == parent:
            raise ValueError(f"item {x}")
        time.sleep(5)  # the child holds one ticket at a time: this process takes another
        return x

    started = time.monotonic()
    with pytest.raises(ValueError, match="item"):
        forked.forked_map(fails_here, [0, 1, 2])
    assert time.monotonic() - started < 4  # the child was not waited for
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


def test_the_systems_of_a_simulation_run_side_by_side_as_they_run_one_after_another(forks, monkeypatch) -> None:
    from libra.sim.runner import simulate

    def runs() -> dict:
        out = simulate(workload_spec("search-r1", prompts_per_step=8), CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"]),
                       5, ["static-uniform", "libra", "oracle"], seed=2, mode=RolloutMode("partial"))
        return {name: [(s.rollout_s, s.train_s, s.step_s, s.trained_tokens, s.suspended) for s in run.steps]
                for name, run in out.items()}

    two = runs()
    assert forks
    monkeypatch.setenv("LIBRA_FORK", "0")
    one = runs()
    assert list(one) == ["static-uniform", "libra", "oracle"] and one == two
