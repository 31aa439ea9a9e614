"""Checkpoints: written whole or not at all, the newest named by LATEST, old ones pruned."""

import json
import os

import pytest

from libra.errors import LibraError
from libra.trainer.checkpoint import (
    CheckpointState,
    latest_checkpoint,
    load_blob,
    load_state,
    restore_rng,
    rng_state,
    save_checkpoint,
)


def weights(directory):
    (directory / "model.safetensors").write_bytes(b"weights")


def test_checkpoints_round_trip_and_the_newest_two_are_kept(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (1, 2, 3):
        state = CheckpointState("run", step, step, "abc", "mlflow-id", {"heldout": {"0": 0.5}})
        path = save_checkpoint(tmp_path, state, weights, {"pending": {step: [1, 2]}}, keep=2)
    assert path.name == "step-000003" and latest_checkpoint(tmp_path) == path
    assert load_state(path) == state
    assert load_blob(path, "pending") == {3: [1, 2]} and load_blob(path, "absent") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step-000002", "step-000003"]


def test_a_write_killed_before_the_rename_leaves_the_previous_checkpoint_and_is_swept(tmp_path):
    good = save_checkpoint(tmp_path, CheckpointState("run", 1, 1, "abc"), weights, {})
    partial = tmp_path / "step-000002.partial-999999"  # a process killed while writing step 2
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path) == good
    save_checkpoint(tmp_path, CheckpointState("run", 2, 2, "abc"), weights, {})
    assert not partial.exists()


def test_a_checkpoint_renamed_but_not_yet_named_by_latest_is_rewritten(tmp_path):
    good = save_checkpoint(tmp_path, CheckpointState("run", 1, 1, "abc"), weights, {})
    orphan = tmp_path / "step-000002"  # killed after the rename, before LATEST moved
    orphan.mkdir()
    (orphan / "state.json").write_text(json.dumps({"stale": True}))
    assert latest_checkpoint(tmp_path) == good
    path = save_checkpoint(tmp_path, CheckpointState("run", 2, 2, "abc"), weights, {})
    assert load_state(path).step == 2


def test_a_latest_pointer_to_nothing_is_a_clear_error(tmp_path):
    (tmp_path / "LATEST").write_text("step-000009\n")
    with pytest.raises(LibraError, match="not a complete checkpoint; remove"):
        latest_checkpoint(tmp_path)


def test_rng_states_restore(tmp_path):
    import random

    import torch

    state = rng_state()
    a = (torch.rand(3).tolist(), random.random())
    restore_rng(state)
    assert (torch.rand(3).tolist(), random.random()) == a
    assert not list(tmp_path.iterdir()) and os.getpid() > 0
