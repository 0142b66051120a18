"""Hostile cases of typed task errors, the batch-id check and the local copy's storage faults:
real Spark, real RocksDB; each test states the behaviour it holds the code to."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import RunningCount
from trilink_spark.errors import (InvalidArgumentError, NullKeyError, StateCorruptError,
                                  StateStoreError, TrilinkError)
from trilink_spark.state.local import LocalState

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _frame(spark: Any, b: int, keys: int = 20, rows: int = 60) -> Any:
    rng = np.random.default_rng(b)
    data = pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, keys, rows)],
                         "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    return spark.createDataFrame(data, "k string, t long")


class AppError(Exception):
    """A user's own exception class."""


class MentionsPackageError(RunningCount):
    """A user error whose message quotes a package error's text (a log line, an upstream
    service's reply): it is a ValueError, not a StateCorruptError."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        raise ValueError("upstream replied 'trilink_spark.errors.StateCorruptError: "
                         "p00001.changelog fails its checksum' for key " + str(key))


class WrapsPackageError(RunningCount):
    """Catches a package error and raises its own exception from it: the exception that
    leaves the task is AppError."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        try:
            tl.ModuloPartitioner(0)
        except tl.TrilinkError as err:
            raise AppError(f"my app gave up on key {key}") from err
        return []


class FailsWhileHandling(RunningCount):
    """A package error is handled, and the handler itself fails with a KeyError (implicit
    chaining, 'During handling of the above exception'): the KeyError left the task."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        try:
            tl.ModuloPartitioner(0)
        except tl.TrilinkError:
            {}["handler-lookup-" + str(key)]
        return []


class Refusing(RunningCount):
    """Raises the package's own error inside the task."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        raise StateStoreError(f"refused key {key}")


# ---------------------------------------------------------------------------- the parser
def test_a_user_error_that_quotes_a_package_error_keeps_its_own_type(spark: Any,
                                                                     tmp_path: Path) -> None:
    """Held against a defect once in (task_errors.task_error, via KeyedBatchFunction.__call__): ``_NAMED`` is not
    anchored to the start of a traceback line and is searched anywhere in Spark's text, so a
    user's ValueError whose *message* contains ``trilink_spark.errors.StateCorruptError: ...``
    is re-raised on the driver as a StateCorruptError: the user is told their state is
    corrupt (and may wipe it) when their own code raised a ValueError."""
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", MentionsPackageError(),
                                 10, str(tmp_path / "s"))
    with pytest.raises(Exception) as caught:
        run(_frame(spark, 0), 0)
    assert not isinstance(caught.value, StateCorruptError), (
        f"a user ValueError became {type(caught.value).__name__}: {caught.value}")
    assert "upstream replied" in str(caught.value)


SIMPLIFIED = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


@pytest.fixture(params=["true", "false"], ids=["simplified", "full-traceback"])
def traceback_kind(spark: Any, request: Any) -> Iterator[str]:
    """Spark's simplified worker traceback (the default: the last exception only) and the
    full one (``...simplifiedTraceback.enabled=false``, set to debug UDFs), which prints the
    chained exceptions, the cause first."""
    spark.conf.set(SIMPLIFIED, request.param)
    try:
        yield str(request.param)
    finally:
        spark.conf.unset(SIMPLIFIED)


def test_a_user_error_raised_from_a_package_error_is_not_replaced_by_it(
        spark: Any, tmp_path: Path, traceback_kind: str) -> None:
    """Held against a defect once in (task_errors.task_error): the parser takes the *last* package-error line in the
    text, but a Python traceback of chained exceptions prints the cause first and the
    exception that left the task last. With the full worker traceback
    (``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled=false``) a process
    function that catches a TrilinkError and raises its own ``AppError(...) from err``
    reaches the driver as the InvalidArgumentError it handled; the user's exception (type
    and message) is gone from the raised error, so the module doc's "the exception that
    left the task" does not hold. (The default, simplified traceback prints only the last
    exception: that case holds and is kept as a guard.)"""
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", WrapsPackageError(),
                                 10, str(tmp_path / "s"))
    with pytest.raises(Exception) as caught:
        run(_frame(spark, 0), 0)
    assert not isinstance(caught.value, InvalidArgumentError), (
        f"AppError was replaced by {type(caught.value).__name__}: {caught.value}")
    assert "my app gave up" in str(caught.value)


def test_an_error_raised_while_handling_a_package_error_is_not_replaced_by_it(
        spark: Any, tmp_path: Path, traceback_kind: str) -> None:
    """Held against a defect once in (task_errors.task_error): implicit chaining ("During handling of the above
    exception, another exception occurred") has the same shape: with the full worker
    traceback, a KeyError raised in an ``except TrilinkError`` block reaches the driver as
    the handled InvalidArgumentError (the simplified default holds: a guard)."""
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", FailsWhileHandling(),
                                 10, str(tmp_path / "s"))
    with pytest.raises(Exception) as caught:
        run(_frame(spark, 0), 0)
    assert not isinstance(caught.value, InvalidArgumentError), (
        f"the KeyError was replaced by {type(caught.value).__name__}: {caught.value}")
    assert "handler-lookup-" in str(caught.value)


def test_a_jvm_raise_error_comes_back_with_the_same_message(spark: Any,
                                                            tmp_path: Path) -> None:
    """Held against a defect once in (task_errors.task_error, the JVM ``raise_error`` shape): Spark 4 appends
    `` SQLSTATE: P0001`` on the same line as the message of ``[USER_RAISED_EXCEPTION]``;
    ``_END`` does not cut it, so the typed NullKeyError's message is not the package's
    message (the README promises "the same class with the same message")."""
    data = pd.DataFrame({"k": ["a", None, "b"], "t": [1, 2, 3]})
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), null_policy="error")
    with pytest.raises(NullKeyError) as caught:
        run(spark.createDataFrame(data, "k string, t long"), 0)
    assert "column 'k' has null keys" in str(caught.value)
    assert "SQLSTATE" not in str(caught.value), str(caught.value)


# ---------------------------------------------------------------------------- a real stream
def _parquet(path: Path, name: str, data: pd.DataFrame, when: float) -> None:
    path.mkdir(parents=True, exist_ok=True)
    file = path / name
    data.to_parquet(file)
    os.utime(file, (when, when))


def test_a_streaming_query_s_exception_names_the_typed_error(spark: Any,
                                                             tmp_path: Path) -> None:
    """In a real ``writeStream.foreachBatch(run)`` query Spark wraps what the batch function
    raised in its StreamingQueryException: its message holds the typed error's
    ``trilink_spark.errors.<Name>: <message>`` line, as the README says, and
    ``task_error`` reads it back as that class."""
    from trilink_spark.errors import typed_error as task_error

    src = tmp_path / "src"
    _parquet(src, "0.parquet", pd.DataFrame({"k": ["a", "b"], "t": [1, 2]}), time.time() - 60)
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Refusing(), 10,
                                 str(tmp_path / "s"))
    query = (spark.readStream.schema("k string, t long").parquet(str(src)).writeStream
             .foreachBatch(run).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        with pytest.raises(Exception) as caught:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert "trilink_spark.errors.StateStoreError: refused key" in str(caught.value)
    assert isinstance(task_error(caught.value), StateStoreError)


@pytest.mark.parametrize("gaps", ["false", "true"])
def test_a_stream_whose_sink_skips_empty_micro_batches(spark: Any, tmp_path: Path,
                                                       gaps: str) -> None:
    """A real stream whose foreachBatch skips the runner for a micro-batch a filter left empty
    (``if df.isEmpty(): return``): by default the next batch is refused, naming that case and
    ``spark.trilink.state.allowBatchGaps``, with nothing written; with the conf set the stream
    runs, exact."""
    src = tmp_path / "src"
    now = time.time()
    _parquet(src, "0.parquet", pd.DataFrame({"k": ["a", "b"], "t": [1, 2]}), now - 300)
    _parquet(src, "1.parquet", pd.DataFrame({"k": ["skip", "skip"], "t": [3, 4]}), now - 200)
    _parquet(src, "2.parquet", pd.DataFrame({"k": ["a", "c"], "t": [5, 6]}), now - 100)
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10**9,
                                 str(tmp_path / "s"))
    seen: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        if df.isEmpty():  # nothing to do for this micro-batch
            return
        seen.append(batch_id)
        run(df, batch_id)

    spark.conf.set("spark.trilink.state.allowBatchGaps", gaps)  # before the query's session
    query = (spark.readStream.schema("k string, t long").option("maxFilesPerTrigger", 1)
             .parquet(str(src)).filter("k != 'skip'").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        if gaps == "true":
            query.awaitTermination(180)
        else:
            with pytest.raises(Exception, match="allowBatchGaps") as caught:
                query.awaitTermination(180)
            assert "isEmpty" in str(caught.value)
    finally:
        query.stop()
        spark.conf.unset("spark.trilink.state.allowBatchGaps")
    if gaps == "true":
        assert seen == [0, 2]
        assert run.state_values() == {"a": {"n": 2}, "b": {"n": 1}, "c": {"n": 1}}
    else:
        assert seen == [0, 2]
        assert run.state_values() == {"a": {"n": 1}, "b": {"n": 1}}  # batch 2 wrote nothing


# ---------------------------------------------------------------------------- storage faults
@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs (needs root and mount; skipped otherwise)."""
    root = tmp_path / "disk"
    root.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(root)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode()[:200]}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_a_copy_whose_flush_hits_a_full_disk_is_closed_and_its_lock_released(
        tiny_disk: Path) -> None:
    """Held against a defect once in (state/local.py LocalState.release, after the _guard change): ``release(keep=
    True)`` flushes a memtable over HELD_MEMTABLE_BYTES and catches only StateCorruptError
    to close the copy. A full disk is now a StateStoreError, which escapes release without
    ``close()``: the RocksDB handle stays open and the partition's flock stays held by this
    Python worker. The task fails (typed, good), but Spark's retry of the task (another
    worker, or the same one: flock conflicts across descriptors) waits the full 600 s lock
    timeout and then fails with "locked by another process" instead of the disk error.
    Before the change the flush error was a StateCorruptError and the copy was closed."""
    local = LocalState.open(str(tiny_disk), "store", 0)
    for i in range(12):  # 12 MiB of incompressible rows: the memtable passes 8 MiB
        local._db.put(b"row%05d" % i, os.urandom(1 << 20))
    stat = os.statvfs(tiny_disk)
    with open(tiny_disk / "filler", "wb") as filler:  # the disk fills up before the flush
        try:
            filler.write(b"\0" * (stat.f_bavail * stat.f_frsize))
        except OSError:
            pass
    try:
        try:
            local.release(keep=True)
        except StateStoreError as err:
            assert "disk is full" in str(err)  # typed: fine
        try:
            again = LocalState.open(str(tiny_disk), "store", 0, timeout=3)
        except StateStoreError as err:
            pytest.fail(f"the failed copy still holds its lock: {err}")
        again.close()
    finally:
        local.close()  # what release should have done


def test_a_read_only_local_dir_reaches_the_driver_as_a_storage_error(
        spark: Any, tmp_path: Path, tiny_disk: Path) -> None:
    """HOLDS (guards the change's main promise): ``spark.trilink.state.localDir`` on a
    read-only filesystem fails the batch with a StateStoreError at the driver, never a
    StateCorruptError or a rebuild loop, and the state path keeps nothing of the batch."""
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    spark.conf.set("spark.trilink.state.localDir", str(tiny_disk / "local"))
    try:
        run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                     str(tmp_path / "s"))
        with pytest.raises(StateStoreError) as caught:
            run(_frame(spark, 0), 0)
        assert not isinstance(caught.value, StateCorruptError)
        assert "localDir" in str(caught.value)
    finally:
        spark.conf.unset("spark.trilink.state.localDir")


# ---------------------------------------------------------------------------- the CLI
def test_the_state_command_exits_2_on_a_path_without_a_manifest(tmp_path: Path) -> None:
    """HOLDS: ``trilink-spark state`` on an existing directory without manifest.json prints
    one error line and exits 2 (the changed state_summary), with no traceback."""
    from trilink_spark.cli import main

    (tmp_path / "empty").mkdir()
    err = io.StringIO()
    old = sys.stderr
    sys.stderr = err
    try:
        code = main(["state", str(tmp_path / "empty")], out=io.StringIO())
    finally:
        sys.stderr = old
    assert code == 2
    assert "manifest.json" in err.getvalue() and "Traceback" not in err.getvalue()
    shutil.rmtree(tmp_path / "empty")


# ---------------------------------------------------------------------------- Spark Connect
@pytest.mark.connect
def test_a_task_error_reaches_a_connect_caller_as_itself(spark: Any, tmp_path: Path) -> None:
    """Spark Connect's text shape (run with ``TRILINK_TEST_SESSION=connect``; on a classic
    session it checks the classic shape): a StateStoreError raised in a task reaches
    ``run(df, id)``'s caller as a StateStoreError with the task's message, no traceback."""
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Refusing(), 10,
                                 str(tmp_path / "s"))
    with pytest.raises(StateStoreError, match=r"^refused key k\d+$") as caught:
        run(_frame(spark, 0), 0)
    assert "Traceback" not in str(caught.value)
