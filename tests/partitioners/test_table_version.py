"""A table strategy's version names one state of its table; a copy's table is its own."""

from __future__ import annotations

import pickle

import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError


@pytest.mark.parametrize("make", [
    lambda: tl.LeastKeyPartitioner(4),
    lambda: tl.LeastCountPartitioner(4),
    lambda: tl.WeightPartitioner([10, 20, 30, 40], mode="random", seed=3),
], ids=["least_key", "least_count", "weight_random"])
def test_the_version_grows_with_the_table_only(make) -> None:
    p = make().fit([f"k{i}" for i in range(50)])
    version = p.table_version
    assert version >= 50
    p.partition("k1")  # known keys: no change
    p.assign(["k1", "k2"])
    p.lookup(["unknown"])  # a lookup never places
    assert p.table_version == version
    p.partition("new")
    assert p.table_version > version


@pytest.mark.parametrize("make", [
    lambda: tl.LeastKeyPartitioner(4),
    lambda: tl.LeastCountPartitioner(4),
    lambda: tl.WeightPartitioner([10, 20, 30, 40], mode="random", seed=3),
], ids=["least_key", "least_count", "weight_random"])
def test_a_copy_is_equal_and_independent(make) -> None:
    p = make().fit({f"k{i}": i % 5 + 1 for i in range(200)})
    q = p.copy()
    assert q == p and q.assignments == p.assignments and q.table_version == p.table_version
    # the same state goes on deciding alike: the next new keys land on the same partitions
    fresh = [f"n{i}" for i in range(30)]
    assert q.copy().assign(fresh).tolist() == p.copy().assign(fresh).tolist()
    q.partition("only-in-the-copy")
    assert "only-in-the-copy" in q and "only-in-the-copy" not in p
    assert q.table_version > p.table_version
    again = pickle.loads(pickle.dumps(p))
    assert again == p and again.table_version == p.table_version


@pytest.mark.parametrize("keys", [[f"k{i}" for i in range(300)], list(range(-50, 250)),
                                  [b"a", b"b", b"c"]], ids=["str", "int", "bytes"])
def test_a_stored_table_loads_as_it_was(keys) -> None:
    p = tl.LeastKeyPartitioner(4).fit(keys)
    again = tl.Partitioner.from_dict(p.to_dict())
    assert again == p and list(again.assignments.items()) == list(p.assignments.items())
    assert again.table_version >= len(keys)
    assert again.lookup(keys).tolist() == p.lookup(keys).tolist()


@pytest.mark.parametrize("table, message", [
    ([["a", 0], ["b", 1], ["a", 2]], "twice"),
    ([[1, 0], [2, 1], [1, 1]], "twice"),
    ([["a", 0], ["b", 4]], r"\[0, 4\)"),
    ([["a", 0], ["b", -1]], r"\[0, 4\)"),
    ([["a", 0], [2, 1]], None),  # mixed kinds: loaded row by row, as before
], ids=["duplicate-str", "duplicate-int", "above", "below", "mixed"])
def test_a_stored_table_is_checked_row_by_row_when_it_is_not_plain(table, message) -> None:
    data = {"strategy": "least_key", "num_partitions": 4, "table": table}
    if message is None:
        assert tl.Partitioner.from_dict(data).assignments == dict(map(tuple, table))
        return
    with pytest.raises(InvalidArgumentError, match=message):
        tl.Partitioner.from_dict(data)
