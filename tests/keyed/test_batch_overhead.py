"""A steady micro-batch of ``keyed_foreach_batch`` builds no column expression again.

The driver's planning of a batch goes over Py4J on a classic session; the stream's tagging
plan and its columns are built at the first batch and reused, so a steady batch sends a
bounded number of commands whatever the batch. Counted here, with the emitted windows
checked against an exact group-by so that a cheaper batch cannot be a wrong one.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
import pytest

import trilink_spark as tl

#: Commands a steady batch may send from the calling thread, the batch function's own left
#: out (measured on PySpark 4.1: 15; 17 while the tagged frame read its schema each batch,
#: about 83 when each batch registered its ``mapInArrow`` function and converted its column
#: lists again, and about 270 before the columns were built once). Py4J's own
#: garbage-collection thread is not counted.
STEADY_BUDGET = 15

ROWS = 2_000
KEYS = 50


class Py4JCount:
    """Commands the calling thread sends to the JVM while :attr:`on` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.on = False
        self.thread = threading.get_ident()
        self._patched: list[tuple[Any, Any]] = []

    def __enter__(self) -> Py4JCount:
        import py4j.clientserver as cs
        import py4j.java_gateway as jg

        for cls in (cs.ClientServerConnection, jg.GatewayConnection):
            original = cls.send_command

            def send(conn: Any, command: str, *args: Any, _orig: Any = original,
                     **kwargs: Any) -> Any:
                if self.on and threading.get_ident() == self.thread:
                    self.calls += 1
                return _orig(conn, command, *args, **kwargs)

            self._patched.append((cls, original))
            cls.send_command = send
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, original in self._patched:
            cls.send_command = original


@pytest.fixture()
def counter() -> Iterator[Py4JCount]:
    with Py4JCount() as count:
        yield count


def batch(spark: Any, b: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(ROWS).select(
        (F.col("id") % KEYS).cast("string").alias("key"),
        (F.lit(1_000 * b) + F.col("id") / ROWS * 1_000).alias("ts"),
        F.col("id").cast("double").alias("v"))


def test_a_steady_batch_sends_a_bounded_number_of_py4j_commands(
        spark: Any, tmp_path: Path, counter: Py4JCount) -> None:
    emitted: list[Any] = []

    def collect(df: Any, _: int) -> None:  # the user's commands are not the runner's
        counting, counter.on = counter.on, False
        emitted.extend(df.collect())
        counter.on = counting

    run = tl.keyed_foreach_batch(
        collect, "key", "ts",
        tl.KeyedWindowAggregate(100.0, value="v", aggs=("count", "min")), 5.0,
        str(tmp_path / "state"), num_partitions=4)
    steady: list[int] = []
    for b in range(5):
        frame = batch(spark, b)
        counter.calls, counter.on = 0, True
        run(frame, b)
        counter.on = False
        if b >= 2:
            steady.append(counter.calls)
        if b == 0:
            plan = run._tagging
    assert run._tagging is plan  # built once: the schema did not change
    tagged = plan[1].tag(batch(spark, 9))  # its schema given, not read from the JVM
    assert tagged.schema == tagged.select("*").schema
    assert steady and max(steady) <= STEADY_BUDGET, steady
    # batch b covers [1000 b, 1000 b + 1000): every window of batches 0-3 closed by now
    got = {(r["key"], r["window_start"]): (r["count"], r["min"]) for r in emitted}
    for b in range(4):
        for w in range(10):
            start = 1_000 * b + 100 * w
            ids = [i for i in range(ROWS) if w * 100 <= i / ROWS * 1_000 < (w + 1) * 100]
            for k in range(KEYS):
                mine = [i for i in ids if i % KEYS == k]
                assert got[(str(k), float(start))] == (len(mine), float(min(mine)))


def test_a_new_schema_builds_the_plan_again_and_a_copy_builds_its_own(
        spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    out: list[int] = []
    run = tl.keyed_foreach_batch(lambda df, _: out.append(df.count()), "key", "ts",
                                 tl.KeyedWindowAggregate(100.0), 5.0,
                                 str(tmp_path / "state"), num_partitions=2)
    run(batch(spark, 0), 0)
    first = run._tagging
    run(batch(spark, 1).withColumn("extra", F.lit(1)), 1)  # another schema: planned anew
    assert run._tagging is not first and run._tagging is not None
    second = run._tagging
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    try:  # ANSI mode may change a cast's nullability: the tagged schema is read again
        spark.conf.set("spark.sql.ansi.enabled", "false" if ansi == "true" else "true")
        run(batch(spark, 2).withColumn("extra", F.lit(1)), 2)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)
    assert run._tagging is not second
    copy = pickle.loads(cloudpickle.dumps(run))  # noqa: S301 - the test's own bytes
    assert copy._tagging is None  # column expressions stay with the session that built them
    copy.options["takeover"] = True
    copy(batch(spark, 3), 3)
    assert copy._tagging is not None and out[-1] >= 0


def test_an_output_frame_computed_after_its_batch_is_refused_and_state_stays_exact(
        spark: Any, tmp_path: Path) -> None:
    """A steady batch's tasks get their batch's versions from the calling thread while the
    batch runs; the same output frame computed after the batch has none, and fails (it
    never writes state under another batch's versions), and the next batch is exact."""
    kept: list[Any] = []
    counts: list[int] = []
    run = tl.keyed_foreach_batch(
        lambda df, _: (kept.append(df), counts.append(
            sum(r["count"] for r in df.collect()))), "key", "ts",
        tl.KeyedWindowAggregate(100.0, value="v", aggs=("count",)), 5.0,
        str(tmp_path / "state"), num_partitions=2)
    for b in range(3):
        run(batch(spark, b), b)
    before = run.state_values()
    with pytest.raises(Exception, match="without its batch's values"):
        kept[-1].collect()
    assert run.state_values() == before
    run(batch(spark, 3), 3)
    # each row counted once: batches 0-2 whole, and batch 3's nine windows its watermark
    # (3999.5 - 5) closed; the refused recompute added nothing
    assert sum(counts) == 3 * ROWS + 9 * ROWS // 10


@pytest.mark.connect  # the connect tier runs it on a Spark Connect session too
def test_batch_profile_splits_the_newest_batch_into_its_phases(
        spark: Any, tmp_path: Path) -> None:
    """The driver's phases add up to the batch, every task's timed phases fit in its own
    time, and the slowest task fits in the job that ran it."""
    from trilink_spark.errors import InvalidArgumentError

    run = tl.keyed_foreach_batch(
        lambda df, _: df.count(), "key", "ts",
        tl.KeyedWindowAggregate(100.0, value="v", aggs=("count",)), 5.0,
        str(tmp_path / "state"), num_partitions=2)
    with pytest.raises(InvalidArgumentError, match="no batch has run"):
        run.batch_profile()
    for b in range(3):
        run(batch(spark, b), b)
        profile = run.batch_profile()
        assert profile["batch"] == b
        driver = profile["plan_ms"] + profile["job_ms"] + profile["commit_ms"]
        assert min(profile["plan_ms"], profile["job_ms"], profile["commit_ms"]) > 0
        assert abs(driver - profile["total_ms"]) < 0.01
        assert 0 < profile["task_ms"] <= profile["job_ms"] + 1.0
        tasks = run.task_timings(b)
        phases = tasks[["sync_ms", "read_ms", "hooks_ms", "write_ms"]]
        assert (phases >= 0).all().all() and (tasks["hooks_ms"] > 0).all()
        inside = phases.sum(axis=1) + tasks["upkeep_ms"]
        assert (inside <= tasks["process_ms"] + tasks["upkeep_ms"] + 1.0).all()
        assert profile["hooks_ms"] == tasks["hooks_ms"].max()
        assert profile["job_other_ms"] == pytest.approx(
            profile["job_ms"] - profile["task_ms"], abs=0.01)
    files = tl.keyed_foreach_batch(
        lambda df, _: df.count(), "key", "ts", tl.KeyedWindowAggregate(100.0), 5.0,
        str(tmp_path / "files"), num_partitions=2, state_store="files")
    files(batch(spark, 0), 0)
    measured = files.batch_profile()
    assert measured["total_ms"] > 0 and measured["read_ms"] == -1.0  # no phases there
