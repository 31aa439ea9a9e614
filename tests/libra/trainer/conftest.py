"""The tiny random policy the trainer's tests train (tests/libra/trainer/policies.py)."""

from pathlib import Path

import pytest

from tests.libra.trainer.policies import write_tiny_policy


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory) -> Path:
    return write_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))
