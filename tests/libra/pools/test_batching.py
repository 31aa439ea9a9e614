import pytest
from hypothesis import given
from hypothesis import strategies as st

from libra.pools.batching import shards


def test_contiguous_near_equal_shards_in_rank_order():
    assert shards(10, ["core-0", "core-1", "hybrid-0"]) == {
        "core-0": range(0, 4), "core-1": range(4, 7), "hybrid-0": range(7, 10)}
    assert shards(2, ["a", "b", "c"]) == {"a": range(0, 1), "b": range(1, 2), "c": range(2, 2)}


@given(st.integers(0, 500), st.integers(1, 12))
def test_every_sample_is_in_exactly_one_shard(size, replicas):
    parts = shards(size, [f"r{i}" for i in range(replicas)])
    covered = [i for r in parts.values() for i in r]
    assert covered == list(range(size))
    assert max(map(len, parts.values())) - min(map(len, parts.values())) <= 1


def test_bad_membership_is_refused():
    with pytest.raises(ValueError, match="at least one active replica"):
        shards(8, [])
    with pytest.raises(ValueError, match="unique"):
        shards(8, ["a", "a"])
