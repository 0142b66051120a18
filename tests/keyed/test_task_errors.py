"""Faults reach the caller of a keyed runner as typed errors: a TrilinkError raised inside a
Spark task comes back as itself (Spark's exception chained), a state path older than the query
(missing batch ids) is refused before it loses them, and a full or read-only local disk is a
storage error, not corruption."""

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
from conftest import RunningCount
from testkit.swaps import check_invariants
from trilink_spark.errors import typed_error as task_error, typed_task_errors
from trilink_spark.errors import (InvalidArgumentError, StateCorruptError, StateStoreError,
                                  TrilinkError)
from trilink_spark.state.local import storage_fault

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def frame(spark: Any, b: int, keys: int = 50, rows: int = 200) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    data = pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, keys, rows)],
                         "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    return spark.createDataFrame(data, "k string, t long"), data["k"].value_counts()


class WrongOutput(RunningCount):
    """Emits an int where its output schema says string: the task refuses it."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        return [(1, 2)]


class Refusing(RunningCount):
    """Raises the package's own error from inside the process function."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        raise StateStoreError(f"refused key {key}\nsecond line")


@pytest.mark.parametrize("store", ["rocksdb", "files"])
def test_an_error_a_task_raises_reaches_the_caller_as_itself(spark: Any, tmp_path: Path,
                                                            store: str) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", WrongOutput(), 10,
                                 str(tmp_path / "s"), state_store=store)
    with pytest.raises(InvalidArgumentError, match="does not fit its output_schema") as caught:
        run(frame(spark, 0)[0], 0)
    assert "Traceback" not in str(caught.value)
    assert caught.value.__cause__ is not None  # Spark's exception, with the task's traceback
    assert "Traceback" in str(caught.value.__cause__)
    other = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Refusing(), 10,
                                   str(tmp_path / "r"), state_store=store)
    with pytest.raises(StateStoreError, match=r"refused key k\d+\nsecond line$"):
        other(frame(spark, 0)[0], 0)


def test_task_error_reads_only_the_package_errors_out_of_sparks_text() -> None:
    worker = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):"
              "\n  File \"x.py\", line 3, in run\nValueError: inner\n\nDuring handling of the "
              "above exception, another exception occurred:\n\nTraceback (most recent call "
              "last):\n  File \"y.py\", line 9\ntrilink_spark.errors.StateCorruptError: "
              "/p/00001.changelog fails its checksum\n\n\tat org.apache.spark.api.python."
              "BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n")
    found = task_error(RuntimeError(worker))
    assert isinstance(found, StateCorruptError)
    assert str(found) == "/p/00001.changelog fails its checksum"
    jvm = ("[USER_RAISED_EXCEPTION] trilink_spark.errors.NullKeyError: column 'k' has null "
           "keys SQLSTATE: P0001\n\nJVM stacktrace:\norg.apache.spark...")
    null = task_error(RuntimeError(jvm))
    assert type(null).__name__ == "NullKeyError" and "column 'k'" in str(null)
    for text in ("trilink_spark.errors.NoSuchError: x", "trilink_spark.errors.TrilinkWarning: w",
                 "builtins.ValueError: y", "os.system: z", ""):
        assert task_error(RuntimeError(text)) is None, text
    typed = StateCorruptError("already typed")
    assert task_error(typed) is None
    with pytest.raises(StateCorruptError) as raised:
        with typed_task_errors():
            raise RuntimeError(worker)
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(KeyError):
        with typed_task_errors():
            raise KeyError("untouched")
    big = "trilink_spark.errors.StateStoreError: " + "x" * 100_000
    assert len(str(task_error(RuntimeError(big)))) == 8_000


def test_a_state_path_older_than_the_query_is_refused_before_it_loses_batches(
        spark: Any, tmp_path: Path) -> None:
    """The state path is put back to a copy taken after batch 1 once batch 2 committed; batch 3
    is refused (batch 2's rows would be lost), naming the missing batch and both ways out."""
    path = tmp_path / "state"
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10**9,
                                 str(path))
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = frame(spark, b)
        run(df, b)
        total = total.add(counts, fill_value=0)
    shutil.copytree(path, tmp_path / "after-1")
    run(frame(spark, 2)[0], 2)
    shutil.rmtree(path)
    shutil.copytree(tmp_path / "after-1", path)
    fresh = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10**9,
                                   str(path), takeover=True)  # the old runner has stopped
    with pytest.raises(StateCorruptError, match=r"batch\(es\) 2 are missing") as caught:
        fresh(frame(spark, 3)[0], 3)
    assert "restore the state path" in str(caught.value)
    assert "spark.trilink.state.allowBatchGaps" in str(caught.value)
    with pytest.raises(StateCorruptError, match=r"2 to 4 are missing"):
        fresh(frame(spark, 5)[0], 5)
    check_invariants(fresh, total)  # nothing was written
    df, counts = frame(spark, 2)  # the lost batch, replayed: it goes on
    fresh(df, 2)
    check_invariants(fresh, total.add(counts, fill_value=0))


def test_a_rolled_back_state_path_is_seen_by_the_copy_that_is_ahead(
        spark: Any, tmp_path: Path) -> None:
    """With gaps allowed the batch id check lets batch 3 through after a rollback to batch 1;
    the local copy still holds batch 2, which the state path lost: refused, nothing written.
    A replay of batch 2 (the same id) is a legitimate undo and goes on."""
    path = tmp_path / "state"
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10**9,
                                 str(path))
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = frame(spark, b)
        run(df, b)
        total = total.add(counts, fill_value=0)
    shutil.copytree(path, tmp_path / "after-1")
    run(frame(spark, 2)[0], 2)
    shutil.rmtree(path)
    shutil.copytree(tmp_path / "after-1", path)
    spark.conf.set("spark.trilink.state.allowBatchGaps", "true")
    try:
        fresh = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(),
                                       10**9, str(path), takeover=True)
        with pytest.raises(StateCorruptError, match="rolled back") as caught:
            fresh(frame(spark, 3)[0], 3)
        assert "holds state version 2" in str(caught.value)
        assert "restore the state path" in str(caught.value).lower()
        check_invariants(fresh, total)  # nothing was written
        df, counts = frame(spark, 2)  # the lost batch, replayed: the copy undoes it
        fresh(df, 2)
        check_invariants(fresh, total.add(counts, fill_value=0))
    finally:
        spark.conf.unset("spark.trilink.state.allowBatchGaps")


def test_a_runner_fed_by_hand_may_skip_ids_when_it_says_so(spark: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10**9,
                                 str(tmp_path / "s"))
    total = pd.Series(dtype=np.int64)
    df, counts = frame(spark, 0)
    run(df, 0)
    total = total.add(counts, fill_value=0)
    with pytest.raises(StateCorruptError, match="missing"):
        run(frame(spark, 10)[0], 10)
    spark.conf.set("spark.trilink.state.allowBatchGaps", "true")
    try:
        for b in (10, 20):
            df, counts = frame(spark, b)
            run(df, b)
            total = total.add(counts, fill_value=0)
        check_invariants(run, total)
        spark.conf.set("spark.trilink.state.allowBatchGaps", "sometimes")
        with pytest.raises(InvalidArgumentError, match="allowBatchGaps"):
            run(frame(spark, 30)[0], 30)
    finally:
        spark.conf.unset("spark.trilink.state.allowBatchGaps")


def test_a_full_or_read_only_disk_is_a_storage_fault_not_corruption() -> None:
    assert storage_fault(Exception("IO error: No space left on device: While appending to "
                                   "file: /d/000012.log")) == "the disk is full"
    assert storage_fault(Exception("IO error: While open a file for appending: /d/LOG: "
                                   "Read-only file system")) == "the disk is read-only"
    assert storage_fault(Exception("IO error: /d/LOCK: Permission denied")) \
        == "the directory is not writable"
    for text in ("Corruption: block checksum mismatch", "IO error: Writer has previous error.",
                 ""):
        assert storage_fault(Exception(text)) is None
    assert issubclass(StateStoreError, TrilinkError) and issubclass(StateStoreError, OSError)
