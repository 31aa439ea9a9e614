"""The placement reconciler over a recording site: engines restart only when their workers change
(or the cluster did), the trainer is placed on every apply, and hosts that leave or come back are
typed events with the reason in words."""

from pathlib import Path

from libra.clock import SimClock
from libra.rl.cluster import LocalCluster, Placement
from libra.rl.placing import Event, Placer, TrainerPlaced, host_change, placed_events


class Engine:
    def __init__(self, index: int, workers: tuple[int, ...]) -> None:
        self.index, self.workers, self.closed = index, workers, False

    def close(self) -> None:
        self.closed = True


class Trainer:
    def __init__(self) -> None:
        self.thread_count = 4

    def threads(self) -> int:
        return self.thread_count

    def set_threads(self, n: int) -> None:
        self.thread_count = n


class Site:
    """Records what the reconciler asks of it; its clock moves 2 s per engine started."""

    spans_hosts = True

    def __init__(self, cluster: LocalCluster, clock: SimClock) -> None:
        self.cluster, self.clock, self.calls = cluster, clock, []
        self.later = cluster

    def start_engine(self, index, workers, weights):
        self.calls.append(("start", index, workers))
        self.clock.advance(2.0)
        return Engine(index, workers)

    def engines_stopped(self, before, after):
        self.calls.append(("stopped", before, after))

    def place_trainer(self, trainer, placement, previous, force):
        self.calls.append(("trainer", placement.train, force))
        return TrainerPlaced(hybrids=())

    def survey(self):
        return self.later

    def await_departure(self, host, timeout_s):
        return True

    def close(self):
        self.calls.append(("close",))


def two_hosts() -> LocalCluster:
    return LocalCluster(((0,), (1,), (0,), (1,)), "cpu", hosts=("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"))


def test_engines_restart_only_when_their_workers_change_and_their_start_is_timed():
    clock = SimClock()
    site = Site(two_hosts(), clock)
    placer = Placer(site, Trainer(), clock)
    first = placer.apply(Placement(((0,), (1,)), (2, 3), False), Path("w"), [], 0, 0.0)
    assert first.restarted and first.start.seconds == 4.0 and first.start.workers == 2
    assert [e.workers for e in first.engines] == [(0,), (1,)]
    assert site.calls == [("stopped", 0, 2), ("start", 0, (0,)), ("start", 1, (1,)), ("trainer", (2, 3), False)]
    site.calls.clear()
    same = placer.apply(Placement(((0,), (1,)), (2, 3), False, "plan-1"), Path("w"), first.engines, 1, 10.0)
    assert not same.restarted and same.start is None and same.engines is first.engines
    assert site.calls == [("trainer", (2, 3), False)]
    site.calls.clear()
    moved = placer.apply(Placement(((0, 1),), (2, 3), False, "plan-2"), Path("w"), same.engines, 2, 20.0)
    assert moved.restarted and all(e.closed for e in first.engines) and moved.start.seconds == 2.0
    assert site.calls == [("stopped", 2, 1), ("start", 0, (0, 1)), ("trainer", (2, 3), False)]
    # placed events name where each engine, core rank and hybrid runs, at the step and time given
    assert [(e.worker_id, e.event, e.step, e.time_s) for e in moved.events] == [
        ("engine-0", Event.PLACED, 2, 20.0), ("core-0", Event.PLACED, 2, 20.0), ("core-1", Event.PLACED, 2, 20.0)]
    assert moved.events[0].detail == "host 10.0.0.1 cores 0,1 (workers 0,1)"
    assert placer.host_of_rank(1) == "10.0.0.2"


def test_a_lost_host_is_a_change_with_one_event_per_host_and_a_forced_apply_restarts_everything():
    clock = SimClock()
    site = Site(two_hosts(), clock)
    placer = Placer(site, Trainer(), clock)
    placed = placer.apply(Placement(((0,), (1,)), (2, 3), False), Path("w"), [], 0, 0.0)
    assert placer.follow_hosts(3, 30.0) is None
    site.later = LocalCluster(((0,), (1,)), "cpu", hosts=("10.0.0.1", "10.0.0.1"))
    change = placer.follow_hosts(3, 30.0)
    assert [(e.worker_id, e.gpus, e.from_state, e.to_state, e.event) for e in change.events] == [
        ("host-10.0.0.2", 2, "serving", "absent", Event.HOST_LOST)]
    assert change.reason == "lost host 10.0.0.2: placed anew on 2 workers of 1 host(s)"
    assert placer.cluster == site.later
    site.calls.clear()
    again = placer.apply(Placement(((0,), (1,)), (0, 1), True), Path("w"), placed.engines, 3, 30.0, force=True)
    assert again.restarted and site.calls[-1] == ("trainer", (0, 1), True)


def test_a_host_back_is_named_and_the_process_gets_its_threads_back_at_close():
    back = host_change(5, 50.0, LocalCluster(((0,),), hosts=("h1",)), LocalCluster(((0,), (0,)), hosts=("h1", "h2")))
    assert [(e.event, e.from_state, e.to_state) for e in back.events] == [(Event.HOST_JOINED, "absent", "serving")]
    assert back.reason == "host h2 back: placed anew on 2 workers of 2 host(s)"
    trainer = Trainer()
    placer = Placer(Site(two_hosts(), SimClock()), trainer, SimClock(), threads=4)
    trainer.set_threads(1)
    placer.close()
    assert trainer.thread_count == 4 and placer.site.calls == [("close",)]


def test_placed_events_count_a_workers_units():
    cluster = LocalCluster(((0, 1), (2, 3)), "cpu")
    events = placed_events(cluster, Placement(((0,),), (1,), False), (1,), 0, 0.0)
    assert [(e.worker_id, e.gpus, e.detail) for e in events] == [
        ("engine-0", 1, "host  cores 0,1 (workers 0)"), ("core-0", 1, "host  cores 2,3 (workers 1)"),
        ("hybrid-0", 1, "host  cores 2,3 (workers 1)")]
