"""Hostile cases of the executor-local store, driven without Spark: each one broke an
earlier build of it (a loop on a forged changelog, a lock kept after a RocksDB error, a wake
time one rounding too late, ...)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from trilink_spark.columns import EVENT_TIME_COL
from trilink_spark.errors import StateCorruptError, StateStoreError, StateTypeError
from trilink_spark.keyed.durable.local_sync import LocalConfig, expire, load_touched, save_touched
from trilink_spark.keyed.durable.local_sync import (MAX_CHAIN_INTERVALS, snapshot_due, sync,
                                                    wake_times)
from trilink_spark.keyed.semantics.process import KeyedRuntime, KeyedWatermarkProcessFunction
from trilink_spark.keyed.semantics.keys import PartitionState
from trilink_spark.keyed.durable.codec import decode_state, encode_state
from trilink_spark.keyed.run.task import StateIO
from trilink_spark.state.changelog import changelog_table
from trilink_spark.state.local import LocalState, head, split_head
from trilink_spark.state.store import KeyedStateStore


class Count(KeyedWatermarkProcessFunction):
    state_schema = None

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
        return None


def setup(tmp: Path, interval: int = 1000, ttl: float = math.inf
          ) -> tuple[KeyedStateStore, LocalConfig]:
    return (KeyedStateStore(str(tmp / "state")),
            LocalConfig(str(tmp / "local"), "sid", interval, ttl, None))


def task(store: KeyedStateStore, config: LocalConfig, batch_id: int, prev: int | None,
         keys: list[Any], times: list[float], key_type: Any = pa.string(),
         snapshots: list[int] | None = None) -> str:
    """One task of partition 0 as ``task._run_local`` runs it (no Spark); ``snapshots``
    gets ``batch_id`` when the task started a snapshot."""
    frame = pd.DataFrame({"k": keys, EVENT_TIME_COL: np.asarray(times, dtype=float)})
    proc = Count()
    with LocalState.open(config.root, config.store_id, 0) as local:
        synced = sync(local, store, config, 0, prev, proc, 0.0, math.inf)
        state, before = load_touched(local, config, frame, "k", key_type, "test")
        runtime = KeyedRuntime(proc, "k", 0.0, math.inf, state, None)
        runtime.process(frame)
        _, started = save_touched(local, store, config, 0, batch_id, prev, runtime.snapshot(),
                                  before, key_type, None, proc, 0.0, math.inf, lambda: None)
        local.settle()
    if started is not None and snapshots is not None:
        snapshots.append(batch_id)
    return synced


def counts(store: KeyedStateStore, version: int) -> dict[Any, int]:
    state = decode_state(store.load_table(0, version))
    return {k: v["n"] for k, v in state.values.items()}


def test_a_changelog_that_points_at_itself_is_refused_not_followed(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    task(store, config, 0, None, ["a"], [1.0])
    forged = changelog_table(encode_state(PartitionState(), pa.string()),
                             pa.array([], pa.string()), 2, "forged")
    store.save_changelog(0, 2, forged)  # "version 2 applies to version 2"
    with LocalState.open(config.root, "other", 0) as local:  # a fresh executor: a rebuild
        with pytest.raises(StateCorruptError, match="applies to version 2"):
            sync(local, store, config, 0, 2, Count(), 0.0, math.inf)


def test_a_damaged_rocksdb_file_empties_the_copy_and_frees_the_lock(tmp_path: Path) -> None:
    with LocalState.open(str(tmp_path), "x", 0) as local:
        local.apply(1, "t", {}, [(b"k" * 20, head(math.inf, 1) + b"r" * 4000)], [], {})
    with LocalState.open(str(tmp_path), "x", 0):
        pass  # closing flushes the memtable into a table file
    tables = list((tmp_path / "x" / "p00000.db").glob("*.sst"))
    assert tables
    for table in tables:
        data = bytearray(table.read_bytes())
        for i in range(0, min(len(data), 2000), 7):
            data[i] ^= 0x5A
        table.write_bytes(bytes(data))
    with LocalState.open(str(tmp_path), "x", 0, timeout=1.0) as local:
        assert local.version is None  # emptied: its task rebuilds it
    with LocalState.open(str(tmp_path), "x", 0, timeout=1.0) as local:  # not locked
        assert local.version is None


def test_a_long_changelog_schema_still_names_its_attempt(tmp_path: Path) -> None:
    store, _ = setup(tmp_path)
    table = pa.table({"key": ["a"], "n": [1]}).replace_schema_metadata(
        {b"trilink.shared": json.dumps({"x": "y" * 300_000}).encode()})
    store.save_changelog(0, 3, changelog_table(table, pa.array([], pa.string()), None, "tok"))
    assert store.changelog_attempt(0, 3) == "tok"


def test_wake_times_never_nan_and_never_a_rounding_late() -> None:
    table = encode_state(PartitionState(key_high={"a": 1.0, "b": 1.0},
                                        last_seen={"a": -math.inf, "b": 5.0},
                                        timers=[("b", 7)]), pa.string())
    wakes = wake_times(table, Count(), 0.0, math.inf, math.inf)
    assert wakes.tolist() == [math.inf, math.inf]  # never idle: nothing wakes them
    rng = np.random.default_rng(0)
    for _ in range(2000):  # what the runtime fires (t <= H - d), the index reads (wake <= H)
        t, d = rng.uniform(0, 1e5), rng.uniform(0, 1e4)
        h = t + d
        if not t <= h - d:
            continue
        state = PartitionState(key_high={"k": 0.0}, last_seen={"k": -1e18}, timers=[("k", 0)])
        table = encode_state(state, pa.string())
        table = table.set_column(table.column_names.index("timers"), "timers",
                                 pa.array([[int(t)]], pa.list_(pa.int64())))
        wake = wake_times(table, Count(), d, 1.0, math.inf)[0]
        assert wake <= max(float(int(t)) + d, -1e18 + 1.0)


def test_ttl_keeps_keys_without_event_time() -> None:
    state = PartitionState(key_high={"x": -math.inf}, last_seen={"x": -math.inf},
                           values={"x": {"n": 2}}, partition_high=-math.inf)
    assert expire(state, 100.0) == [] and "x" in state.values
    state.partition_high = 500.0
    assert expire(state, 100.0) == ["x"] and "x" not in state.values


def test_keys_that_do_not_convert_to_the_key_type_are_refused(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    task(store, config, 0, None, [1, 2], [1.0, 1.0], key_type=pa.int64())
    with pytest.raises(StateTypeError, match="int64"):  # pandas made the column float
        task(store, config, 1, 0, [1.0, 2.0**63], [2.0, 2.0], key_type=pa.int64())
    assert counts(store, 0) == {1: 1, 2: 1}


def test_due_reads_keys_of_every_block_at_the_bound(tmp_path: Path) -> None:
    keys = [bytes([0, 0, b, 0, 3]) + b"k" for b in (0x00, 0xFF, 0x11)] + [b"\xff" * 6]
    with LocalState.open(str(tmp_path), "x", 0) as local:
        local.apply(1, "t", {}, [(k, head(10.0, 1) + b"r") for k in keys], [], {})
        assert sorted(local.due(10.0)) == sorted(keys)
        assert local.due(9.999) == []


def test_short_and_junk_local_records_are_state_corrupt(tmp_path: Path) -> None:
    with pytest.raises(StateCorruptError, match="2 bytes"):
        split_head(b"ab")
    with LocalState.open(str(tmp_path), "x", 0) as local:
        local.apply(1, "t", {}, [(b"k", head(1.0, 7) + b"r")], [], {})
        with pytest.raises(StateCorruptError, match="unknown schema 7"):
            local.schema(7)


def test_the_wake_index_follows_each_write_its_undo_and_refuses_a_short_row(
        tmp_path: Path) -> None:
    """``apply`` builds the wake entries of a whole write at once: each key keeps exactly
    the entry of its row's wake time (none for +inf or NaN, -0.0 filed as 0.0), whether the
    key is new, rewritten, deleted or had no row before, and an undo restores them."""
    keys = [b"\x00\x00\x00\x00\x01" + bytes([i]) for i in range(7)]
    first = [1.0, -math.inf, math.inf, math.nan, -0.0, 5.0]
    with LocalState.open(str(tmp_path), "x", 0) as local:
        local.apply(1, "t", {}, [(k, head(w, 1) + b"r") for k, w in zip(keys, first)], [], {})
        local.check()
        assert local.due(0.0) == [keys[1], keys[4]]
        assert local.due(5.0) == [keys[1], keys[4], keys[0], keys[5]]
        before = {k: v for k, v in zip(keys, local.get(keys)) if v is not None}
        assert len(before) == 6  # keys[6] has no row yet
        second = [1e9, 2.0, -math.inf, 0.5, math.nan]
        puts = [(k, head(w, 1) + b"s") for k, w in zip(keys[:5], second)]
        puts.append((keys[6], head(3.0, 1) + b"s"))
        local.apply(2, "t", {}, puts, [keys[5]], before)
        local.check()
        assert local.due(3.0) == [keys[2], keys[3], keys[1], keys[6]]
        assert local.keys == 6
        assert local.undo()
        local.check()
        assert local.due(5.0) == [keys[1], keys[4], keys[0], keys[5]]
        rows = dict(zip(keys, local.get(keys)))
        with pytest.raises(StateCorruptError, match="3 bytes"):
            local.apply(3, "t", {}, [(keys[0], b"abc")], [], rows)
        with pytest.raises(StateCorruptError, match="2 bytes"):
            local.apply(3, "t", {}, [(keys[0], head(1.0, 1))], [], {keys[0]: b"ab"})
        local.check()  # a refused write changed nothing


def test_a_whole_version_replaces_an_earlier_attempts_changelog(tmp_path: Path) -> None:
    """A batch first run without a swap (its changelog written, its commit lost), then
    replayed as a swap: the swap's snapshot is the version, never the stale changelog."""
    store, config = setup(tmp_path)
    task(store, config, 0, None, ["a", "z"], [1.0, 1.0])
    task(store, config, 1, 0, ["a"], [2.0])  # the first attempt of batch 1
    assert 1 in store.listing(0)[1]
    io = StateIO(store, 1, 0, 1, False, pa.string(), None)  # the replay, as whole versions
    state = decode_state(store.load_table(0, 0))
    state.values["a"] = {"n": 5}
    io.save(0, state)
    assert store.listing(0) == ({1}, {0})  # the stale changelog is gone
    assert counts(store, 1) == {"a": 5, "z": 1}
    assert task(store, config, 2, 1, ["z"], [3.0]) == "rebuild"  # the copy follows
    assert counts(store, 2) == {"a": 5, "z": 2}


def test_a_partition_without_rows_gets_a_snapshot_once_its_chain_is_long(tmp_path: Path
                                                                         ) -> None:
    store, config = setup(tmp_path, interval=1)
    store.keep_versions = 1
    task(store, config, 0, None, ["a"], [1.0])
    bound = MAX_CHAIN_INTERVALS * config.snapshot_interval
    for b in range(1, bound + 3):
        io = StateIO(store, b, b - 1, 1, False, pa.string(), None, local=config)
        io.carry_forward(0)
        store.prune(1, b, keep_from=b - 1)
        if b < bound - 1:
            assert not store.listing(0)[0], b  # changelogs only: O(1) each
    snapshots, logs = store.listing(0)
    assert snapshots == {bound - 1}  # the chain is cut, and pruned behind the cut
    assert min(snapshots | logs) >= bound - 1
    assert counts(store, bound + 2) == {"a": 1}


def test_a_snapshot_waits_until_the_changelogs_hold_as_much_as_the_state(tmp_path: Path
                                                                         ) -> None:
    store, config = setup(tmp_path, interval=2)
    keys = [f"k{i:03d}" for i in range(100)]
    started: list[int] = []
    expected = dict.fromkeys(keys, 1)
    task(store, config, 0, None, keys, [1.0] * 100, snapshots=started)
    for b in range(1, 26):  # 10 keys a batch: a tenth of the state
        some = keys[(b * 10) % 100:(b * 10) % 100 + 10]
        task(store, config, b, b - 1, some, [float(b)] * 10, snapshots=started)
        for k in some:
            expected[k] += 1
    # the first once the interval passed (batch 0's changelog held every key); then each
    # once ten changelogs of 10 rows hold as many rows as the 100 keys
    assert started == [2, 12, 22]
    deadline = time.monotonic() + 60
    while store.listing(0)[0] != {1, 11, 21} and time.monotonic() < deadline:
        time.sleep(0.05)  # written off the task's path
    assert store.listing(0)[0] == {1, 11, 21}  # each of the version its task started from
    with LocalState.open(config.root, "fresh", 0) as local:  # another executor: a rebuild
        assert sync(local, store, config, 0, 25, Count(), 0.0, math.inf) == "rebuild"
        assert local.keys == 100
        assert local.chain == {"at": 21, "logged": 40}  # batches 22 to 25's changelogs
        cap = 22 + MAX_CHAIN_INTERVALS * 2  # 40 rows logged of 100 keys: only the cap
        assert not snapshot_due(local, 26, 2) and not snapshot_due(local, cap - 1, 2)
        assert snapshot_due(local, cap, 2)
    assert counts(store, 25) == expected


def test_a_stale_checkpoint_directory_is_removed(tmp_path: Path) -> None:
    stale = tmp_path / "x" / "snap-0-old"
    stale.mkdir(parents=True)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / "x" / "snap-0-new"
    fresh.mkdir()
    with LocalState.open(str(tmp_path), "x", 0):
        pass
    assert not stale.exists() and fresh.exists()


def test_open_times_out_with_a_typed_error(tmp_path: Path) -> None:
    with LocalState.open(str(tmp_path), "x", 0):
        with pytest.raises(StateStoreError, match="locked"):
            LocalState.open(str(tmp_path), "x", 0, timeout=0.1)


def test_the_snapshot_writer_process_refuses_a_bad_request_and_writes_a_good_one(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    run = [sys.executable, "-m", "trilink_spark.keyed.durable.snapshot_writer"]
    bad = subprocess.run(run, input=b'{"checkpoint": 1}', capture_output=True, timeout=120)
    assert bad.returncode == 2 and b"bad snapshot request" in bad.stderr
    store, config = setup(tmp_path)
    task(store, config, 0, None, ["a", "b"], [1.0, 1.0])
    with LocalState.open(config.root, config.store_id, 0) as local:
        local.checkpoint(str(tmp_path / "ckpt"))
        meta = dict(local.meta["meta"])
    request = {"checkpoint": str(tmp_path / "ckpt"), "state_path": store.path, "partition": 0,
               "version": 0, "meta": meta}
    good = subprocess.run(run, input=json.dumps(request).encode(), capture_output=True,
                          timeout=120)
    assert good.returncode == 0, good.stderr
    assert store.listing(0)[0] == {0} and not (tmp_path / "ckpt").exists()
    assert counts(store, 0) == {"a": 1, "b": 1}  # the snapshot, read before the changelog


def test_settle_keeps_level0_bounded_where_closing_alone_lets_it_grow(tmp_path: Path
                                                                      ) -> None:
    def key(i: int) -> bytes:
        return b"\0\0\0\0s" + b"k%09d" % i

    rng = np.random.default_rng(3)
    found = {}
    for settle in (False, True):
        root = str(tmp_path / str(settle))
        with LocalState.open(root, "x", 0) as local:  # 300,000 keys, then batches of 5,000
            local.apply(0, "a", {}, [(key(i), head(math.inf, 1) + b"v" * 90)
                                     for i in range(300_000)], [], {}, undo=False)
        most = 0
        for b in range(1, 21):
            with LocalState.open(root, "x", 0) as local:
                most = max(most, local.level0_files())  # the files this task's reads search
                ids = rng.integers(0, 300_000, 5_000)
                before = dict(zip([key(i) for i in ids], local.get([key(i) for i in ids])))
                local.apply(b, "a", {}, [(key(i), head(math.inf, 1) + b"w" * 90) for i in ids],
                            [], {k: v for k, v in before.items() if v is not None})
                if settle:
                    local.settle()
        found[settle] = most
        with LocalState.open(root, "x", 0) as local:
            assert local.keys == 300_000 and local.version == 20
    # closing alone: each task's writes stay one more file, until RocksDB slows the writes
    # down at 20 of them (and its compaction gets the time)
    assert found[False] >= 10, found
    assert found[True] < 8, found


@pytest.mark.parametrize("interval", [1, 2, 3, 5])
def test_snapshots_of_a_state_rewritten_each_batch_are_an_interval_apart(
        tmp_path: Path, interval: int) -> None:
    store, config = setup(tmp_path, interval=interval)
    keys = [f"k{i}" for i in range(10)]
    started: list[int] = []
    for b in range(16):
        task(store, config, b, None if b == 0 else b - 1, keys, [float(b)] * 10,
             snapshots=started)
    assert started == list(range(interval, 16, interval))


def write_record(config: LocalConfig, change: Any) -> None:
    """Rewrite partition 0's local record (the ``m`` entry) through ``change(record)``."""
    from rocksdict import Options, Rdict

    db = Rdict(os.path.join(config.root, config.store_id, "p00000.db"),
               Options(raw_mode=True))
    record = json.loads(db[b"m"])
    change(record)
    db[b"m"] = json.dumps(record).encode()
    db.close()


def test_a_copy_without_a_key_count_counts_once_and_keeps_the_rule(tmp_path: Path) -> None:
    store, config = setup(tmp_path, interval=2)
    keys = [f"k{i:03d}" for i in range(200)]
    task(store, config, 0, None, keys, [1.0] * 200)
    task(store, config, 1, 0, keys[:2], [2.0] * 2)
    write_record(config, lambda r: (r.pop("keys"), r.pop("chain")))  # as older builds wrote
    started: list[int] = []
    for b in range(2, 30):  # 2 keys a batch: 1 % of the state
        task(store, config, b, b - 1, keys[b % 100 * 2:b % 100 * 2 + 2], [float(b)] * 2,
             snapshots=started)
    assert started == [2]  # unknown chain: one snapshot at the interval, then the rule
    with LocalState.open(config.root, config.store_id, 0) as local:
        assert local.keys == 200 and local.chain["at"] == 1


@pytest.mark.parametrize("bad", [None, "x", float("inf"), [1], -3, True])
def test_a_malformed_chain_record_is_not_a_failure(tmp_path: Path, bad: Any) -> None:
    store, config = setup(tmp_path, interval=2)
    task(store, config, 0, None, ["a", "b"], [1.0, 1.0])
    write_record(config, lambda r: r.update(chain={"at": 0, "logged": bad}, keys=bad))
    started: list[int] = []
    for b in range(1, 5):
        task(store, config, b, b - 1, ["a"], [float(b)], snapshots=started)
    assert started and counts(store, 4) == {"a": 5, "b": 1}
    with LocalState.open(config.root, config.store_id, 0) as local:
        assert local.keys == 2


def test_keys_arriving_in_a_swap_raise_the_partition_time_before_due_keys_are_read(
        tmp_path: Path) -> None:
    """The arriving keys raise the partition's event time (merge_in); keys of the copy that
    are due by that raised time are read (here: expired by the TTL) in the swap batch itself,
    as when the whole partition was read."""
    from trilink_spark.keyed.durable.local_sync import SwapIn

    store, config = setup(tmp_path, ttl=50.0)
    task(store, config, 0, None, ["a"], [0.0])
    arriving = pd.DataFrame({"k": ["b"], EVENT_TIME_COL: [100.0]})
    runtime = KeyedRuntime(Count(), "k", 0.0, math.inf, PartitionState(), None)
    runtime.process(arriving)
    segment = encode_state(runtime.snapshot(), pa.string())
    proc = Count()
    swap = SwapIn(pa.array([], pa.string()), [segment])
    with LocalState.open(config.root, config.store_id, 0) as local:
        sync(local, store, config, 0, 0, proc, 0.0, math.inf)
        state, before = load_touched(local, config, None, "k", pa.string(), "test", None, swap)
        assert set(state.key_high) == {"a", "b"} and state.partition_high == 100.0
        save_touched(local, store, config, 0, 1, 0, state, before, pa.string(), None, proc, 0.0,
                     math.inf, lambda: None)
    assert counts(store, 1) == {"b": 1}  # "a" expired: 100 - 0 >= 50


@pytest.mark.parametrize("interval,partitions", [(4, 4), (10, 8), (3, 7)])
def test_partitions_that_fill_alike_take_their_snapshots_in_different_batches(
        tmp_path: Path, interval: int, partitions: int) -> None:
    """All partitions loaded at once would otherwise all be due in the same batch: that many
    snapshot writers beside the next batches. Each takes its first snapshot within one more
    interval, and no batch holds more than ceil(partitions / interval) of them."""
    first: dict[int, int] = {}
    for pid in range(partitions):
        with LocalState.open(str(tmp_path), "stagger", pid) as local:
            local.apply(0, "a", {}, [(b"\x00" * 4 + b"\x03k", head(1.0, 0) + b"r")], [], {},
                        chain={"at": None, "logged": 5})
            first[pid] = next(b for b in range(1, 10 * interval)
                              if snapshot_due(local, b, interval, pid))
    assert all(interval <= b < 2 * interval for b in first.values())
    per_batch = pd.Series(list(first.values())).value_counts()
    assert per_batch.max() <= -(-partitions // interval)
