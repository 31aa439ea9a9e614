"""Iteration records in checkpoints: a record pickled before the placement choice was named
`strategy` (it was `policy`) still loads, with the strategy in place."""

import pickle

from libra.rl.records import Batch, IterationRecord, RolloutStats, Update
from libra.trainer.trainer import UpdateStats


def record(strategy: str) -> IterationRecord:
    stats = UpdateStats(0.5, 1.0, 0.0, 2.0, 0.1, 0.01, 64, 4, 80, 1e-5, 0.2)
    batch = Batch(3, (), (), RolloutStats(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0))
    return IterationRecord(3, batch, Update(stats, 4, 0, 1, 0.5), {"iteration": 1.0, "train": 0.5}, strategy=strategy)


def test_a_record_pickled_with_the_old_field_name_loads() -> None:
    new = pickle.dumps(record("static"), protocol=2)
    field = b"X\x08\x00\x00\x00strategy"  # BINUNICODE: the field's name as the state dict's key
    assert new.count(field) == 1
    old = new.replace(field, b"X\x06\x00\x00\x00policy")  # what the class wrote when the field was `policy`
    loaded = pickle.loads(old)
    assert loaded == record("static") and loaded.strategy == "static" and "policy" not in vars(loaded)
    assert loaded.steps_row("r")["policy"] == "static"  # the steps table's column keeps its name


def test_a_record_pickles_and_loads_unchanged() -> None:
    assert pickle.loads(pickle.dumps(record("libra"))) == record("libra")


def test_a_steps_row_counts_the_failed_trajectories_and_dropped_groups() -> None:
    stats = UpdateStats(0.5, 1.0, 0.0, 2.0, 0.1, 0.01, 64, 4, 80, 1e-5, 0.2)
    batch = Batch(3, (), (), RolloutStats(6, 900, 2.0, 0.5, 0.5, 0.5, 1.0, 150.0, 0, 0, failed=1, dropped_groups=1))
    row = IterationRecord(3, batch, Update(stats, 4, 0, 1, 0.5), {"iteration": 1.0, "train": 0.5}).steps_row("r")
    assert (row["trajectories"], row["failed_trajectories"], row["dropped_groups"]) == (6, 1, 1)


def test_records_from_before_partial_rollouts_load_with_none_counted() -> None:
    """A checkpoint's record pickled before partial rollouts (no suspended, resumed, stale_dropped
    or off-policy figures) loads with zeros, and its steps row says so."""
    stats = UpdateStats(0.5, 1.0, 0.0, 2.0, 0.1, 0.01, 64, 4, 80, 1e-5, 0.2)
    rollout = RolloutStats(6, 900, 2.0, 0.5, 0.5, 0.5, 1.0, 150.0, 0, 0)
    update = Update(stats, 4, 0, 1, 0.5)
    old_rollout, old_update = object.__new__(RolloutStats), object.__new__(Update)
    old_rollout.__dict__.update({k: v for k, v in vars(rollout).items()
                                 if k not in ("suspended", "resumed", "stale_dropped")})
    old_update.__dict__.update({k: v for k, v in vars(update).items()
                                if k not in ("offpolicy_share", "token_gap_mean", "token_gap_max")})
    loaded = pickle.loads(pickle.dumps(IterationRecord(3, Batch(3, (), (), old_rollout), old_update,
                                                       {"iteration": 1.0, "train": 0.5})))
    assert loaded.batch.stats == rollout and loaded.update == update
    row = loaded.steps_row("r")
    assert (row["suspended"], row["resumed"], row["stale_dropped"], row["offpolicy_share"], row["version_gap_max"]) == \
        (0, 0, 0, 0.0, 0)
