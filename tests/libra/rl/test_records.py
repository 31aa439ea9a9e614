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
