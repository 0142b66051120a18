"""Swaps on the executor-local store: a swap batch reads, writes and logs only the keys it
touches and moves, and the local copies stay current through it (no rebuild after a swap)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import KeylessCount, RunningCount
from testkit.swaps import check_invariants, dies_at

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"u{i:04d}" for i in range(1_200)]


def batch(spark: Any, b: int, keys: list[str], rows: int) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(100 + b)
    picked = np.concatenate([np.arange(len(keys)), rng.choice(len(keys), size=rows)]) \
        if b == 0 else rng.choice(len(keys), size=rows)
    rows = len(picked)
    frame = pd.DataFrame({"k": [keys[i] for i in picked],
                          "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    return spark.createDataFrame(frame), frame["k"].value_counts()


def make_run(tmp_path: Path, func: Any = None, **kw: Any) -> tl.keyed.KeyedBatchFunction:
    kw.setdefault("num_partitions", 4)
    return tl.keyed_foreach_batch(func or (lambda df, b: df.count()), "k", "t", RunningCount(),
                                  1_000_000, str(tmp_path / "state"), **kw)


def load(spark: Any, run: Any) -> pd.Series:
    """Batch 0 gives every key state; batch 1 touches a few."""
    df, total = batch(spark, 0, KEYS, 6_000)
    run(df, 0)
    assert set(total.index) == set(KEYS)
    df, counts = batch(spark, 1, KEYS[:40], 200)
    run(df, 1)
    return total.add(counts, fill_value=0)


def versions_written(tmp_path: Path, b: int) -> tuple[set[int], set[int]]:
    """Partitions with a snapshot of batch ``b``, and with a changelog of it."""
    root = tmp_path / "state"
    snaps = {int(p.parent.name.split("=")[1]) for p in root.glob(f"partition=*/{b:012d}.state")}
    logs = {int(p.parent.name.split("=")[1]) for p in root.glob(f"partition=*/{b:012d}.log")}
    return snaps, logs


@pytest.mark.parametrize("strategy,swap", [
    (lambda: tl.BlockPartitioner(4, num_blocks=64), {"num_partitions": 6}),
    (lambda: "hash", {"num_partitions": 3}),
    (lambda: tl.BlockPartitioner(4, num_blocks=64), {"strategy": "hash"}),  # another layout
])
def test_a_swap_batch_logs_only_the_moved_and_touched_keys(spark: Any, tmp_path: Path,
                                                          strategy: Any, swap: Any) -> None:
    run = make_run(tmp_path, strategy=strategy())
    total = load(spark, run)
    before = run.owners()
    run.request_swap(**swap)
    df, counts = batch(spark, 2, KEYS[:30], 150)
    run(df, 2)
    total = total.add(counts, fill_value=0)
    check_invariants(run, total)
    after = run.owners()
    moved = {k for k in before if before[k] != after[k]}
    report = run.swaps[-1]
    assert report.moved_keys == len(moved) > 0 and report.complete
    n = report.partitions_after
    snaps, logs = versions_written(tmp_path, 2)
    assert snaps == set() and logs == set(range(n))  # changelogs, not whole versions
    timings = run.task_timings(2).set_index("partition")
    assert (timings["upkeep_ms"] >= 0).all()  # the copies' flush and compaction, timed
    for p in range(n):
        out_of_p = sum(1 for k in moved if before[k] == p)
        into_p = sum(1 for k in moved if after[k] == p)
        # a task reads its batch keys, the due ones and the keys that leave it, and the
        # changelog holds those plus the arriving ones: never the partition
        assert timings.loc[p, "keys_read"] <= 30 + out_of_p
        log = run.store.load_changelog(p, 2)
        touched = {k for k in counts.index if after[k] == p}
        assert log.num_rows == len(touched | {k for k in moved if after[k] == p}) + out_of_p
        assert log.num_rows <= 30 + into_p + out_of_p
    # the copies are current after the swap: the next batch rebuilds nothing
    df, counts = batch(spark, 3, KEYS, 300)
    run(df, 3)
    check_invariants(run, total.add(counts, fill_value=0))
    assert set(run.task_timings(3)["sync"]) == {"current"}


def test_a_replayed_swap_batch_gives_the_same_state(spark: Any, tmp_path: Path) -> None:
    dying = make_run(tmp_path, func=dies_at(2),
                     strategy=tl.BlockPartitioner(4, num_blocks=64))
    total = load(spark, dying)
    dying.request_swap(num_partitions=5)
    df, counts = batch(spark, 2, KEYS[:30], 150)
    with pytest.raises(Exception, match="driver died"):
        dying(df, 2)  # the tasks applied the swap to their copies, then the driver died
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=64), takeover=True)
    run(df, 2)  # the replay finds the plan, undoes the copies' batch and runs it again
    total = total.add(counts, fill_value=0)
    check_invariants(run, total)
    assert run.swaps[-1].partitions_after == 5
    sync = run.task_timings(2).set_index("partition")["sync"]
    # the segment job undid the sources' batch; the added partition's copy was emptied
    assert set(sync.loc[[0, 1, 2, 3]]) <= {"undo", "current"} and sync.loc[4] == "rebuild"
    df, counts = batch(spark, 3, KEYS, 300)
    run(df, 3)
    check_invariants(run, total.add(counts, fill_value=0))


def test_a_swap_after_the_local_copies_are_lost_rebuilds_and_stays_exact(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=64))
    total = load(spark, run)
    shutil.rmtree(local_root)  # another machine: the segment job and the tasks rebuild
    run.request_swap(num_partitions=2)
    df, counts = batch(spark, 2, KEYS[:30], 150)
    run(df, 2)
    total = total.add(counts, fill_value=0)
    check_invariants(run, total)
    df, counts = batch(spark, 3, KEYS, 300)
    run(df, 3)
    check_invariants(run, total.add(counts, fill_value=0))
    assert set(run.task_timings(3)["sync"]) == {"current"}


def test_a_stale_version_from_an_attempt_without_the_swap_is_discarded(
        spark: Any, tmp_path: Path) -> None:
    """Batch 2 ran once without a swap and died before its commit; its replay plans a swap
    (a restart with another partition count). What the first attempt wrote as version 2
    must not pass for the swap's."""
    dying = make_run(tmp_path, func=dies_at(2))
    total = load(spark, dying)
    df, counts = batch(spark, 2, KEYS[:30], 150)
    with pytest.raises(Exception, match="driver died"):
        dying(df, 2)
    assert versions_written(tmp_path, 2)[1] == {0, 1, 2, 3}
    run = make_run(tmp_path, num_partitions=6, takeover=True)  # another count: a swap
    run(df, 2)
    assert run.swaps and run.swaps[-1].partitions_after == 6
    total = total.add(counts, fill_value=0)
    check_invariants(run, total)
    df, counts = batch(spark, 3, KEYS, 300)
    run(df, 3)
    check_invariants(run, total.add(counts, fill_value=0))


@pytest.mark.parametrize("kind,make", [
    ("date", lambda i: __import__("datetime").date(2024, 1, 1 + i % 25)),
    ("timestamp", lambda i: __import__("datetime").datetime(2024, 1, 1, i % 24, 30)),
])
def test_date_and_timestamp_keys_live_on_the_local_store_through_a_swap(
        spark: Any, tmp_path: Path, kind: str, make: Any) -> None:
    """Date keys were kept in the file store ("date32[day]" was not recognised), and a
    timestamp key column failed before its first batch (its Arrow type needs a time zone)."""
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", KeylessCount(), 1000,
                                 str(tmp_path / "state"), num_partitions=3)
    total: dict[str, int] = {}

    def label(k: Any) -> str:
        return str(pd.Timestamp(k).tz_localize(None)) if kind == "timestamp" else str(k)

    for b in range(4):
        if b == 2:
            run.request_swap(num_partitions=2)
        rows = [(make(i * (b + 1)), b * 100 + i) for i in range(60)]
        for k, _ in rows:
            total[label(k)] = total.get(label(k), 0) + 1
        run(spark.createDataFrame(rows, f"k {kind}, t long"), b)
        timings = run.task_timings()
        assert (timings["keys_read"] >= 0).all()  # the local store (the file store: -1)
    assert {label(k): int(v["n"]) for k, v in run.state_values().items()} == total
    assert set(run.task_timings()["sync"]) == {"current"}
