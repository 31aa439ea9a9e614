"""The join policy the pool's leader and the simulator share (pure, on an injected clock)."""

import pytest

from libra.clock import SimClock
from libra.pools.joins import JoinAction, JoinProgress, JoinSettings, decide

SETTINGS = JoinSettings(enter_gap=1, join_timeout_s=60.0)


def test_a_join_waits_while_it_fetches_then_enters_within_the_gap_and_takes_its_shard():
    clock = SimClock()
    join = JoinProgress(clock.now())
    clock.advance(5.0)
    assert decide(join, step=3, now_s=clock.now(), settings=SETTINGS) is JoinAction.WAIT
    assert decide(JoinProgress(0.0, synced=3), 3, 5.0, SETTINGS) is JoinAction.ENTER  # at the core's step
    assert decide(JoinProgress(0.0, synced=2), 3, 5.0, SETTINGS) is JoinAction.ENTER  # one update to replay at entry
    assert decide(JoinProgress(0.0, synced=3, entered=3), 4, 5.0, SETTINGS) is JoinAction.WAIT


def test_a_join_too_far_behind_replays_while_it_gets_closer_then_enters_idle():
    assert decide(JoinProgress(0.0, synced=2), 6, 1.0, SETTINGS) is JoinAction.REPLAY  # 4 behind
    assert decide(JoinProgress(0.0, synced=5, last_gap=4), 8, 2.0, SETTINGS) is JoinAction.REPLAY  # 3: closer
    assert decide(JoinProgress(0.0, synced=5, last_gap=3), 8, 2.0, SETTINGS) is JoinAction.ENTER_IDLE  # 3 again
    assert decide(JoinProgress(0.0, synced=2), 6, 1.0, JoinSettings(enter_gap=4)) is JoinAction.ENTER


def test_a_join_not_entered_by_its_timeout_is_abandoned_on_the_clock_it_is_given():
    clock = SimClock(100.0)
    join = JoinProgress(clock.now(), synced=1)
    clock.advance(60.0)
    assert decide(join, 9, clock.now(), SETTINGS) is JoinAction.REPLAY  # exactly the timeout: still on
    clock.advance(0.5)
    assert decide(join, 9, clock.now(), SETTINGS) is JoinAction.TIMED_OUT
    assert decide(JoinProgress(100.0, synced=9, entered=9), 12, 1_000.0, SETTINGS) is JoinAction.WAIT  # entered: kept


def test_settings_are_checked():
    with pytest.raises(ValueError, match="enter_gap must be >= 0"):
        JoinSettings(enter_gap=-1)
    with pytest.raises(ValueError, match="join_timeout_s > 0"):
        JoinSettings(join_timeout_s=0.0)


def test_the_pool_config_defaults_are_the_policy_defaults():
    from libra.config import PoolConfig
    from libra.pools.spec import WorkerSpec

    pool = PoolConfig()
    assert (pool.enter_gap, pool.join_timeout_s) == (JoinSettings.enter_gap, JoinSettings.join_timeout_s) == (1, 180.0)
    assert WorkerSpec.__dataclass_fields__["join_timeout_s"].default == JoinSettings.join_timeout_s
