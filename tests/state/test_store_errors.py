"""A state path with foreign content, or one that cannot be written, gives a typed error."""

from __future__ import annotations

import pytest

import trilink_spark as tl
from trilink_spark.errors import StateCorruptError, StateStoreError
from trilink_spark.state import KeyedStateStore


def test_junk_version_file_is_named(tmp_path):
    store = KeyedStateStore(str(tmp_path))
    store.save(0, 3, b"x")
    (tmp_path / "partition=00000" / "notes.state").write_text("hello")
    with pytest.raises(StateCorruptError, match="notes.state"):
        store.versions(0)
    # files that are not versions at all (a crashed writer's temporary) are not state
    (tmp_path / "partition=00000" / "notes.state").unlink()
    (tmp_path / "partition=00000" / "000000000004.state.tmp-abc").write_text("half")
    assert store.versions(0) == [3]


def test_non_numeric_partition_directory_is_named(tmp_path):
    store = KeyedStateStore(str(tmp_path))
    (tmp_path / "partition=abc").mkdir()
    with pytest.raises(StateCorruptError, match="partition=abc"):
        store.partitions()
    (tmp_path / "partition=abc").rmdir()
    (tmp_path / "other").mkdir()  # not a partition directory: ignored
    assert store.partitions() == []


def test_unwritable_state_path_is_refused_on_the_driver(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(StateStoreError, match="cannot be written"):
        KeyedStateStore(str(blocker / "state"))
    assert isinstance(StateStoreError("x"), OSError)


def test_corrupt_strategy_file_is_named(tmp_path):
    store = KeyedStateStore(str(tmp_path))
    store.save_strategy(tl.LeastKeyPartitioner(2).fit(["a"]))
    assert store.load_strategy().partition("a") == 0
    for junk in ("{not json", '{"strategy": "nope"}', '["a list"]', '{"strategy": "least_key"'):
        (tmp_path / "strategy.json").write_text(junk)
        with pytest.raises(StateCorruptError, match="strategy.json"):
            store.load_strategy()
