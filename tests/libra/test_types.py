"""Records at the boundaries (`libra.types`): a trajectory pickled in a checkpoint loads in a later
version, and one from a later version is refused with the reason."""

import dataclasses
import pickle

import pytest

from libra.types import NO_TOOL, ToolStatus, Trajectory, Turn


def test_a_pickled_trajectory_from_a_later_version_is_refused_with_the_reason() -> None:
    turn = Turn("p/0", "p", "0", 0, 10, 5, NO_TOOL, 0, ToolStatus.NONE)
    trajectory = Trajectory("p/0", "p", "0", "math", 10, (turn,), 1.0, model_version=3)
    assert pickle.loads(pickle.dumps(trajectory)) == trajectory
    state = tuple(getattr(trajectory, f.name) for f in dataclasses.fields(trajectory))
    older = object.__new__(Trajectory)
    older.__setstate__(state[:7])  # pickled before the later fields existed: their defaults
    assert older == Trajectory("p/0", "p", "0", "math", 10, (turn,), 1.0)
    with pytest.raises(ValueError, match="load it with the version of Libra that wrote it"):
        object.__new__(Trajectory).__setstate__((*state, "a field this version lacks"))
