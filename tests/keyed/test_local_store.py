"""The executor-local keyed state store: the same results as the file store, reading only
what a batch touches, surviving lost, stale and damaged local copies."""

from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import StateCorruptError, StateStoreError
from trilink_spark.keyed import KeyedContext
from trilink_spark.state.local import LocalState
from trilink_spark.state.held import ask_release

SIZE, DELAY = 10.0, 2.0
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Counting ships to the tasks


class Counting(tl.KeyedWatermarkProcessFunction):
    """Counts rows per key; a timer 5 after each batch's newest row emits the count."""

    output_schema = "kind string, k string, n long, at double"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        ctx.register_timer(int(rows["_tl_event_time"].max()) + 5)
        return [("row", key, n, math.nan)]

    def process_late(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        return [("late", key, len(rows), math.nan)]

    def on_timer(self, key: Any, timestamp: int, ctx: KeyedContext) -> Any:
        return [("timer", key, ctx.get_state("n", 0), float(timestamp))]


def stream(seed: int, batches: int, keys: int = 40) -> list[pd.DataFrame]:
    """Random batches: keys that go quiet for a while (so they turn idle) and late rows;
    event times advance about 4 per batch."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(batches):
        n = int(rng.integers(5, 60))
        active = rng.integers(0, keys, n) if b % 3 else rng.integers(0, keys // 4, n)
        names = np.array([f"k{i:03d}" for i in active], dtype=object)
        t = np.floor(b * 4 + rng.normal(0, 3, n))
        out.append(pd.DataFrame({"k": names, "t": t.astype(float), "v": rng.random(n)}))
    return out


def run_both(spark: Any, tmp_path: Path, processor: Any, batches: list[pd.DataFrame],
             idle: Any, **kw: Any) -> tuple[list[Any], list[Any], Any, Any]:
    """Each batch through the file store and the local store; the outputs per batch and the
    stored values agree after every batch (the invariant)."""
    outs: dict[str, list[Any]] = {"files": [], "rocksdb": []}
    runs = {}
    for store in outs:
        sink = outs[store]
        runs[store] = tl.keyed_foreach_batch(
            lambda df, b, sink=sink: sink.append(df.toPandas()), "k", "t", processor, DELAY,
            str(tmp_path / store), num_partitions=3, idle_timeout=idle, state_store=store,
            **kw)
    for b, part in enumerate(batches):
        for store, run in runs.items():
            run(spark.createDataFrame(part, "k string, t double, v double"), b)
        got = [ordered(outs[s][-1]) for s in outs]
        assert got[0].equals(got[1]), f"batch {b}: outputs differ\n{got[0]}\n{got[1]}"
        assert values(runs["files"]) == values(runs["rocksdb"]), f"batch {b}: state differs"
        assert runs["files"].counters() == runs["rocksdb"].counters()
    return outs["files"], outs["rocksdb"], runs["files"], runs["rocksdb"]


def one_partition_run(tmp_path: Path) -> Any:
    """A Counting runner on one partition, on the local store."""
    return tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                                  str(tmp_path / "s"), num_partitions=1, state_store="rocksdb")


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(list(frame.columns), na_position="first").reset_index(drop=True)


def values(run: Any) -> dict[Any, Any]:
    got = run.state_values()
    return {("<null>" if isinstance(k, float) and math.isnan(k) else k): v
            for k, v in got.items()}


@pytest.mark.parametrize("seed", [1, 2])
def test_per_key_processor_with_timers_and_idle_keys_matches_the_file_store(
        spark: Any, tmp_path: Path, seed: int) -> None:
    run_both(spark, tmp_path, Counting(), stream(seed, 10), idle=8.0)


def test_window_aggregate_with_idle_keys_matches_the_file_store(spark: Any,
                                                               tmp_path: Path) -> None:
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    files, local, _, run = run_both(spark, tmp_path, agg, stream(3, 12), idle=6.0)
    assert sum(len(f) for f in local) > 0  # windows closed, some by the idle rule
    timings = run.task_timings()
    assert set(timings["sync"]) <= {"current", "catch-up", ""}


def test_a_batch_reads_only_its_keys_and_the_due_ones(spark: Any, tmp_path: Path) -> None:
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count",))
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", agg, DELAY,
                                 str(tmp_path / "s"), num_partitions=2,
                                 idle_timeout=math.inf, state_store="rocksdb")
    load = pd.DataFrame({"k": [f"k{i:05d}" for i in range(3000)], "t": 1.0, "v": 1.0})
    run(spark.createDataFrame(load), 0)
    few = pd.DataFrame({"k": ["k00001", "k00002", "k02999"], "t": 2.0, "v": 1.0})
    run(spark.createDataFrame(few), 1)
    timings = run.task_timings()
    assert timings["keys_read"].sum() == 3  # of 3,000 stored keys
    assert run.counters()["rows"] == 3003
    assert tl.read_state(spark, run.store.path).count() == 3000


def test_a_replayed_batch_undoes_the_local_copy_and_gives_the_same_result(
        spark: Any, tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    run = tl.keyed_foreach_batch(lambda df, b: sink.append(df.toPandas()), "k", "t",
                                 Counting(), DELAY, str(tmp_path / "s"), num_partitions=2,
                                 state_store="rocksdb")
    batches = stream(5, 4)
    for b, part in enumerate(batches):
        run(spark.createDataFrame(part, "k string, t double, v double"), b)
    before = values(run)
    first = ordered(sink[-1])
    run(spark.createDataFrame(batches[-1], "k string, t double, v double"), 3)  # replayed
    assert ordered(sink[-1]).equals(first)
    assert values(run) == before
    assert "undo" in set(run.task_timings()["sync"])


def test_a_lost_or_foreign_local_copy_is_rebuilt_from_the_state_path(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    batches = stream(7, 8)
    sink: list[pd.DataFrame] = []
    reference: list[pd.DataFrame] = []
    ref = tl.keyed_foreach_batch(lambda df, b: reference.append(df.toPandas()), "k", "t",
                                 Counting(), DELAY, str(tmp_path / "ref"),
                                 num_partitions=2, idle_timeout=8.0, state_store="files")
    run = tl.keyed_foreach_batch(lambda df, b: sink.append(df.toPandas()), "k", "t",
                                 Counting(), DELAY, str(tmp_path / "s"), num_partitions=2,
                                 idle_timeout=8.0, state_store="rocksdb")
    syncs = []
    for b, part in enumerate(batches):
        if b == 3:
            shutil.rmtree(local_root)  # the executor's disk is gone
        if b == 5:  # partition 0's copy alone is lost
            for db in local_root.rglob("p00000.db"):
                shutil.rmtree(db)
        frame = spark.createDataFrame(part, "k string, t double, v double")
        ref(frame, b)
        run(frame, b)
        assert ordered(sink[-1]).equals(ordered(reference[-1]))
        syncs.append(sorted(set(run.task_timings()["sync"])))
    assert "rebuild" in syncs[3] and "rebuild" in syncs[5]
    assert values(run) == values(ref)


def test_a_damaged_local_copy_is_rebuilt_not_trusted(spark: Any, tmp_path: Path,
                                                    local_root: Path) -> None:
    run = one_partition_run(tmp_path)
    batches = stream(9, 3)
    run(spark.createDataFrame(batches[0], "k string, t double, v double"), 0)
    from rocksdict import Options, Rdict

    for db_dir in local_root.rglob("p00000.db"):
        ask_release(str(db_dir))  # a worker holds it open since its task
        db = Rdict(str(db_dir), Options(raw_mode=True))
        for k in list(db.keys()):
            if k.startswith(b"r"):
                db[k] = db[k][:12] + b"\x07garbage"  # a row no decoder accepts
        db.close()
    run(spark.createDataFrame(batches[1], "k string, t double, v double"), 1)
    assert "rebuild" in set(run.task_timings()["sync"])
    total = sum(len(b) for b in batches[:2])
    assert run.counters()["rows"] == total


def test_snapshots_bound_the_changelogs_kept(spark: Any, tmp_path: Path) -> None:
    spark.conf.set("spark.trilink.state.snapshotInterval", "2")
    try:
        run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                                     str(tmp_path / "s"), num_partitions=1, keep_versions=1,
                                     state_store="rocksdb")
        ref = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                                     str(tmp_path / "ref"), num_partitions=1,
                                     state_store="files")
        batches = stream(11, 10)
        started = []
        for b, part in enumerate(batches):
            frame = spark.createDataFrame(part, "k string, t double, v double")
            run(frame, b)
            ref(frame, b)
            started.append(bool(run.task_timings()["snapshot"].any()))
            deadline = time.monotonic() + 30
            while started[-1] and time.monotonic() < deadline:
                if b - 1 in run.store.listing(0)[0]:  # the snapshot of the version before
                    break
                time.sleep(0.05)
        snapshots, logs = run.store.listing(0)
        assert any(started) and not started[0]  # reported with the task's timing
        assert snapshots and max(snapshots) >= 5
        # older ones pruned: the last prune ran before the newest snapshot was written (off
        # the task's path), so nothing older than the one before it is left
        assert len(snapshots) <= 2 and min(snapshots | logs) >= min(snapshots)
        assert run.counters()["rows"] == sum(len(b) for b in batches)
        table = run.store.load_table(0, 9)  # snapshot + changelogs since
        assert table.num_rows == len(run.state_values())
        assert values(run) == values(ref)  # what the snapshots hold is the state
    finally:
        spark.conf.unset("spark.trilink.state.snapshotInterval")


def test_state_written_by_the_file_store_is_taken_over(spark: Any, tmp_path: Path) -> None:
    batches = stream(13, 6)
    path = str(tmp_path / "s")
    ref_out: list[pd.DataFrame] = []
    out: list[pd.DataFrame] = []
    ref = tl.keyed_foreach_batch(lambda df, b: ref_out.append(df.toPandas()), "k", "t",
                                 Counting(), DELAY, str(tmp_path / "ref"), num_partitions=2,
                                 state_store="files")
    for b, part in enumerate(batches):
        store = "files" if b < 3 else "rocksdb"  # an upgrade between two batches
        run = tl.keyed_foreach_batch(lambda df, b: out.append(df.toPandas()), "k", "t",
                                     Counting(), DELAY, path, num_partitions=2,
                                     state_store=store, takeover=True)
        frame = spark.createDataFrame(part, "k string, t double, v double")
        ref(frame, b)
        run(frame, b)
        assert ordered(out[-1]).equals(ordered(ref_out[-1]))
    assert values(run) == values(ref)
    back = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY, path,
                                  num_partitions=2, state_store="files",
                                  takeover=True)  # and back again
    back(spark.createDataFrame(batches[0], "k string, t double, v double"), 6)
    assert back.counters()["rows"] == sum(len(b) for b in batches) + len(batches[0])


def test_state_ttl_expires_quiet_keys_by_event_time(spark: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                                 str(tmp_path / "s"), num_partitions=1, state_ttl=20.0,
                                 idle_timeout=math.inf)  # TTL follows the partition's time
    run(spark.createDataFrame(pd.DataFrame({"k": ["a", "b"], "t": [0.0, 0.0], "v": 1.0})), 0)
    run(spark.createDataFrame(pd.DataFrame({"k": ["a"], "t": [15.0], "v": 1.0})), 1)
    assert set(values(run)) == {"a", "b"}
    run(spark.createDataFrame(pd.DataFrame({"k": ["a"], "t": [25.0], "v": 1.0})), 2)
    assert set(values(run)) == {"a"}  # b sent nothing for 25 >= 20
    run(spark.createDataFrame(pd.DataFrame({"k": ["b"], "t": [26.0], "v": 1.0})), 3)
    assert values(run)["b"] == {"n": 1}  # a new life
    summary = tl.read_state(spark, run.store.path).toPandas()
    assert sorted(summary["key"]) == ["a", "b"]


@pytest.mark.parametrize("value,error", [
    (0, InvalidArgumentError), (-1.0, InvalidArgumentError), (True, InvalidArgumentTypeError),
    ([1], InvalidArgumentTypeError)])
def test_bad_state_ttl_is_refused_at_call_time(tmp_path: Path, value: Any,
                                               error: type) -> None:
    with pytest.raises(error, match="state_ttl"):
        tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                               str(tmp_path / "s"), state_ttl=value)


def test_bad_state_store_is_refused(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="state_store"):
        tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                               str(tmp_path / "s"), state_store="memory")
    spark.conf.set("spark.trilink.state.store", "memory")
    try:
        run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                                     str(tmp_path / "s2"))
        with pytest.raises(InvalidArgumentError, match="spark.trilink.state.store"):
            run(spark.createDataFrame(pd.DataFrame({"k": ["a"], "t": [0.0], "v": 1.0})), 0)
    finally:
        spark.conf.unset("spark.trilink.state.store")


def test_one_process_per_partition_and_the_lock_is_released(tmp_path: Path) -> None:
    first = LocalState.open(str(tmp_path), "x", 0)
    with pytest.raises(StateStoreError, match="locked"):
        LocalState.open(str(tmp_path), "x", 0, timeout=0.2)
    first.close()
    with LocalState.open(str(tmp_path), "x", 0, timeout=0.2) as again:
        assert again.version is None


def test_a_garbled_local_record_empties_the_copy(tmp_path: Path) -> None:
    with LocalState.open(str(tmp_path), "x", 0) as local:
        local.apply(3, "a", {}, [], [], {})
    from rocksdict import Options, Rdict

    db = Rdict(str(tmp_path / "x" / "p00000.db"), Options(raw_mode=True))
    db[b"m"] = b"{not json"
    db.close()
    with LocalState.open(str(tmp_path), "x", 0) as local:
        assert local.version is None  # emptied: the caller rebuilds it


def test_corrupt_changelog_is_named_when_a_rebuild_needs_it(spark: Any, tmp_path: Path,
                                                           local_root: Path) -> None:
    run = one_partition_run(tmp_path)
    batches = stream(17, 3)
    for b in range(2):
        run(spark.createDataFrame(batches[b], "k string, t double, v double"), b)
    log = Path(run.store.changelog_path(0, 0))
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    shutil.rmtree(local_root)
    with pytest.raises(Exception, match=r"000000000000\.log") as info:
        run(spark.createDataFrame(batches[2], "k string, t double, v double"), 2)
    assert "StateCorruptError" in str(info.value) or isinstance(info.value,
                                                               StateCorruptError)


def test_a_wiped_state_path_begun_again_gets_local_copies_of_its_own(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    path = str(tmp_path / "s")

    def runner(where: str) -> Any:
        return tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY, where,
                                      num_partitions=2, state_store="rocksdb")

    old = runner(path)
    for b, part in enumerate(stream(21, 4)):
        old(spark.createDataFrame(part, "k string, t double, v double"), b)
    shutil.rmtree(path)  # wiped; the executors' copies of it stay on their disks
    new, ref = runner(path), runner(str(tmp_path / "ref"))
    for b, part in enumerate(stream(22, 4)):  # other rows, the same batch ids
        frame = spark.createDataFrame(part, "k string, t double, v double")
        new(frame, b)
        ref(frame, b)
        # fresh copies of their own: none was reset (a "rebuild") or taken as current
        assert set(new.task_timings()["sync"]) <= {"current", ""}
        assert values(new) == values(ref)
    assert len([d for d in local_root.iterdir() if d.is_dir()]) == 3  # old, new and ref
