"""A keyed stream's snapshots are incremental: a lost copy is rebuilt from the snapshot's
table files and the changelogs since, exact, and pruning keeps every file a kept snapshot
lists."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.state.incremental import TABLES_DIR, read_record
from test_local_store import DELAY, Counting, ordered, stream, values

SCHEMA = "k string, t double, v double"


def referenced_files_present(store: Any, partitions: int) -> int:
    """Every blob each remaining record lists is there with its size; returns the records."""
    n = 0
    for p in range(partitions):
        blobs = Path(store.partition_dir(p)) / TABLES_DIR
        for version in store.listing(p)[0]:
            record = read_record(store, p, version)
            if record is None:
                continue  # an Arrow snapshot
            n += 1
            for f in record["files"]:
                assert (blobs / f["blob"]).stat().st_size == f["size"], (p, version, f)
    return n


def writers_done(run: Any, local_root: Path, partitions: int, before: int) -> None:
    """Wait (30 s at most) until each partition has a snapshot older than ``before`` and no
    snapshot writer is still at work: a writer removes its checkpoint (``snap-<p>-*``) last."""
    deadline = time.monotonic() + 30  # the snapshot writers run off the task
    while time.monotonic() < deadline and (
            not all(any(v < before for v in run.store.listing(p)[0]) for p in range(partitions))
            or list(local_root.rglob("snap-*"))):
        time.sleep(0.05)


def test_a_lost_copy_is_rebuilt_from_the_table_files(spark: Any, tmp_path: Path,
                                                     local_root: Path) -> None:
    spark.conf.set("spark.trilink.state.snapshotInterval", "2")
    try:
        sink: list[pd.DataFrame] = []
        reference: list[pd.DataFrame] = []
        ref = tl.keyed_foreach_batch(lambda df, b: reference.append(df.toPandas()), "k", "t",
                                     Counting(), DELAY, str(tmp_path / "ref"),
                                     num_partitions=2, state_store="files")
        run = tl.keyed_foreach_batch(lambda df, b: sink.append(df.toPandas()), "k", "t",
                                     Counting(), DELAY, str(tmp_path / "s"), num_partitions=2,
                                     keep_versions=2, state_store="rocksdb")
        batches = stream(23, 14)
        records = 0
        rebuilt = []
        for b, part in enumerate(batches):
            if b in (9, 12):
                writers_done(run, local_root, 2, b)
                shutil.rmtree(local_root)  # the executor's disk is gone
            frame = spark.createDataFrame(part, SCHEMA)
            ref(frame, b)
            run(frame, b)
            assert ordered(sink[-1]).equals(ordered(reference[-1])), b
            if "rebuild" in set(run.task_timings()["sync"]):
                rebuilt.append(b)
                # restored from table files (download leaves what the copy inherited)
                assert list(local_root.rglob("TRILINK-INHERITED.json")), b
            records = max(records, referenced_files_present(run.store, 2))
        assert rebuilt == [9, 12]
        assert records >= 2  # incremental snapshots were written and kept
        assert values(run) == values(ref)
        assert run.counters() == ref.counters()
    finally:
        spark.conf.unset("spark.trilink.state.snapshotInterval")


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_table_file_a_rebuild_needs_is_a_typed_error(
        spark: Any, tmp_path: Path, local_root: Path, damage: str) -> None:
    spark.conf.set("spark.trilink.state.snapshotInterval", "2")
    try:
        run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), DELAY,
                                     str(tmp_path / "s"), num_partitions=1, keep_versions=1,
                                     state_store="rocksdb")
        batches = stream(29, 8)
        for b, part in enumerate(batches[:6]):
            run(spark.createDataFrame(part, SCHEMA), b)
        writers_done(run, local_root, 1, 6)
        version = max(run.store.listing(0)[0])
        record = read_record(run.store, 0, version)
        assert record is not None
        # prune has dropped the changelogs before the snapshot: only it can rebuild
        sst = next(f for f in record["files"] if f["name"].endswith(".sst"))
        blob = Path(run.store.partition_dir(0)) / TABLES_DIR / sst["blob"]
        if damage == "flip":
            data = bytearray(blob.read_bytes())
            data[len(data) // 3] ^= 0x10
            blob.write_bytes(bytes(data))
        else:
            blob.unlink()
        shutil.rmtree(local_root)
        with pytest.raises(tl.errors.StateCorruptError, match=sst["blob"]):
            run(spark.createDataFrame(batches[6], SCHEMA), 6)
    finally:
        spark.conf.unset("spark.trilink.state.snapshotInterval")
