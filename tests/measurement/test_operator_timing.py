"""Operators that time themselves (``spark.trilink.operatorTiming``) and the advisor's use of
their records: local_merge, global_merge and the keyed runtime, beside Spark's stages."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.advice import BottleneckAdvisor, BottleneckListener
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.measurement import task_metrics
from trilink_spark._internal.optiming import (OPERATOR_TIMING_COLUMNS,
                                    OperatorTimer, OperatorTimingReader, Stopwatch,
                                    operator_timer, read_operator_timings)



def test_records_round_trip_and_a_retry_counts_once(tmp_path: Any) -> None:
    root = str(tmp_path)
    OperatorTimer(root, "local_merge", "r1").write(rows_in=10, rows_out=2, busy_ms=1.5,
                                                   partition=3)
    # a second attempt of the same task replaces the first
    path = os.path.join(root, "local_merge", "r1")
    first = os.path.join(path, "stage-0-part-3-attempt-0.json")
    record = json.loads(open(first).read())
    record.update(attempt=1, rows_in=11)
    with open(os.path.join(path, "stage-0-part-3-attempt-1.json"), "w") as f:
        f.write(json.dumps(record))
    t = read_operator_timings(root)
    assert list(t.columns) == list(OPERATOR_TIMING_COLUMNS)
    assert t[["partition", "attempt", "rows_in", "rows_out"]].values.tolist() == [[3, 1, 11, 2]]
    assert t.attrs["skipped"] == []


@pytest.mark.parametrize("content", [
    b"not json", b'{"format": "other"}', b"[1, 2]",
    b'{"format": "trilink-operator-timing/1", "operator": "x", "run": "r", "stage_id": -1,'
    b' "partition": 0, "attempt": 0, "rows_in": 1, "rows_out": 1, "busy_ms": 1,'
    b' "wait_ms": 0, "written_ms": 0}',
    b'{"format": "trilink-operator-timing/1", "operator": "../x", "run": "r", "stage_id": 0,'
    b' "partition": 0, "attempt": 0, "rows_in": 1, "rows_out": 1, "busy_ms": 1,'
    b' "wait_ms": 0, "written_ms": 0}',
    b'{"format": "trilink-operator-timing/1", "operator": "x", "run": "r", "stage_id": 0,'
    b' "partition": 0, "attempt": 0, "rows_in": 1, "rows_out": 1, "busy_ms": "NaN",'
    b' "wait_ms": 0, "written_ms": 0}',
    b"{" * 5000,
])
def test_foreign_or_corrupt_records_are_skipped_and_named(tmp_path: Any, content: bytes) -> None:
    OperatorTimer(str(tmp_path), "keyed", "r").write(rows_in=5, rows_out=5, busy_ms=2.0)
    bad = tmp_path / "keyed" / "other"
    bad.mkdir()
    (bad / "stage-1-part-0-attempt-0.json").write_bytes(content)
    (bad / "notes.txt").write_bytes(b"ignored: not a record name")
    t = read_operator_timings(str(tmp_path))
    assert t["rows_in"].tolist() == [5]
    assert t.attrs["skipped"] == [str(bad / "stage-1-part-0-attempt-0.json")]


def test_reader_hands_out_each_record_once_and_can_delete(tmp_path: Any) -> None:
    root = str(tmp_path)
    reader = OperatorTimingReader(root)
    assert len(reader.new()) == 0  # no directory yet
    OperatorTimer(root, "keyed", "a").write(rows_in=1, rows_out=1, busy_ms=1.0, partition=0)
    OperatorTimer(root, "keyed", "a").write(rows_in=2, rows_out=1, busy_ms=1.0, partition=1)
    assert reader.new()["rows_in"].sum() == 3
    assert len(reader.new()) == 0
    OperatorTimer(root, "keyed", "b").write(rows_in=4, rows_out=1, busy_ms=1.0)
    assert reader.new()["rows_in"].tolist() == [4]
    consuming = OperatorTimingReader(root, delete=True)
    assert len(consuming.new()) == 3
    assert len(read_operator_timings(root)) == 0


def test_a_write_that_fails_never_fails_the_task(tmp_path: Any, caplog: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory should be")
    OperatorTimer(str(blocker), "keyed", "r").write(rows_in=1, rows_out=1, busy_ms=1.0)
    assert "operator timing not written" in caplog.text


@pytest.mark.parametrize("kw", [
    {"root": "", "operator": "x", "run": "r"},
    {"root": "/tmp/x", "operator": "a/b", "run": "r"},
    {"root": "/tmp/x", "operator": "x", "run": ""},
    {"root": "/tmp/x", "operator": 3, "run": "r"},
])
def test_bad_timer_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)):
        OperatorTimer(**kw)


def test_stopwatch_splits_waiting_from_work() -> None:
    import time

    def slow_input() -> Iterator[int]:
        for i in range(3):
            time.sleep(0.02)
            yield i

    watch = Stopwatch()
    items = list(watch.pull(slow_input()))
    for _ in watch.emit(items):
        time.sleep(0.02)  # the consumer's time is not the operator's
    assert items == [0, 1, 2]
    assert watch.wait_ms >= 55.0
    assert watch.paused_ms >= 55.0
    assert watch.busy_ms() < 30.0


def test_timing_is_off_unless_the_conf_names_a_directory(spark: Any) -> None:
    assert operator_timer(spark, "local_merge") is None


def sensor_frame(spark: Any, rows: int = 4000, parts: int = 2) -> Any:
    return spark.range(0, rows, 1, parts).selectExpr(
        "id % 37 AS k", "CAST(id AS DOUBLE) AS t", "id AS v")


def test_local_merge_global_merge_and_keyed_time_themselves(spark: Any,
                                                            timing_dir: str) -> None:
    df = sensor_frame(spark)
    # the Python engine's tasks time themselves (the Spark engine runs no Python task)
    partial = tl.local_merge(df, "k", "t", 100.0, {"n": ("count", None)}, engine="python")
    out_rows = partial.count()
    # "first" needs the algebra: the Python path (Spark's own aggregates run in the JVM)
    merged = tl.global_merge(df, "k", {"n": ("count", None), "f": ("first", "v")}).toPandas()
    native = tl.global_merge(df, "k", {"n": ("count", None)}).toPandas()
    assert native.sort_values("k").n.tolist() == merged.sort_values("k").n.tolist()
    t = read_operator_timings(timing_dir)
    lm = t[t.operator == "local_merge"]
    # the count job and global_merge's own partials: one planning each, 2 tasks each
    assert sorted(lm.groupby("run").size().tolist()) == [2, 2]
    assert set(lm.partition) == {0, 1}
    by_run = lm.groupby("run")[["rows_in", "rows_out"]].sum()
    assert (by_run.rows_in == 4000).all()
    assert out_rows in by_run.rows_out.tolist()
    gm = t[t.operator == "global_merge"]
    assert len(gm) == 1 and int(gm.rows_out.iloc[0]) == len(merged) == 37
    assert (t.busy_ms >= 0).all() and (t.wait_ms >= 0).all()


def test_keyed_process_times_itself(spark: Any, timing_dir: str) -> None:
    df = sensor_frame(spark, 2000)
    # the Python runtime times its tasks; the Spark plan of KeyedWindowAggregate runs none
    out = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(100.0), delay=0.0,
                           num_partitions=3, engine="python").toPandas()
    t = read_operator_timings(timing_dir)
    keyed = t[t.operator == "keyed"]
    assert sorted(keyed.partition) == [0, 1, 2]
    assert int(keyed.rows_in.sum()) == 2000
    assert int(keyed.rows_out.sum()) == len(out)


def test_keyed_process_on_the_spark_plan_runs_no_python_task(spark: Any, timing_dir: str
                                                              ) -> None:
    df = sensor_frame(spark, 2000)
    before = len(read_operator_timings(timing_dir))
    out = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(100.0), delay=0.0,
                           num_partitions=3).toPandas()
    assert len(out) > 0
    assert len(read_operator_timings(timing_dir)) == before


def test_the_advisor_places_operators_inside_their_stage(spark: Any, timing_dir: str) -> None:
    group = "tl-operator-timing"
    df = sensor_frame(spark, 6000)
    spark.sparkContext.setJobGroup(group, group)
    try:
        partial = tl.local_merge(df, "k", "t", 1000.0, {"n": ("count", None)}, engine="python")
        partial.repartition(2, "k").write.format("noop").mode("overwrite").save()
    finally:
        spark.sparkContext.setJobGroup("", "")
    metrics = task_metrics(spark, job_group=group)
    timings = read_operator_timings(timing_dir)
    adv = BottleneckAdvisor(warmup_batches=0, slots=2)
    adv.observe_timings(timings)
    adv.observe_stages(metrics, close=True)
    report = adv.report()
    names = [n.name for n in report.nodes]
    assert names == ["stage 0", "local_merge", "exchange after stage 0", "stage 1"]
    by = {n.name: n for n in report.nodes}
    assert by["local_merge"].rows_per_batch == 6000
    written = int(metrics[metrics.status == "SUCCESS"].shuffle_write_records.sum())
    assert by["exchange after stage 0"].rows_per_batch == written == int(
        timings.rows_out.sum())
    assert by["local_merge"].kind == "trilink operator"
    assert report.bottleneck  # a bounded job: its slowest cut is named


def test_observe_timings_refuses_what_is_not_a_timing_frame() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    with pytest.raises(InvalidArgumentTypeError):
        adv.observe_timings(pd.DataFrame({"a": [1]}))
    bad = pd.DataFrame([["x", "r", 0, 0, 0, 1, 1, -5.0, 0.0, 0.0]],
                       columns=list(OPERATOR_TIMING_COLUMNS))
    with pytest.raises(InvalidArgumentError):
        adv.observe_timings(bad)
    sink = bad.assign(busy_ms=1.0, operator="sink")
    with pytest.raises(InvalidArgumentError):
        adv.observe_timings(sink)
    adv.observe_timings(bad.iloc[:0])  # nothing to record
    assert adv.report().nodes == []


def test_the_listener_feeds_each_batch_its_operator_timings(spark: Any, timing_dir: str,
                                                            tmp_path: Any) -> None:
    from conftest import wait_for

    adv = BottleneckAdvisor(warmup_batches=0)
    listener = BottleneckListener(adv, spark)  # the directory comes from the conf
    spark.streams.addListener(listener)
    query = None

    def merge_batch(batch: Any, batch_id: int) -> None:
        tl.local_merge(batch, "k", "t", 10.0, {"n": ("count", None)}, engine="python") \
            .write.format("noop").mode("overwrite").save()

    try:
        stream = spark.readStream.format("rate").option("rowsPerSecond", 200).load()
        query = (stream.selectExpr("value % 10 AS k", "CAST(value AS DOUBLE) AS t")
                 .writeStream.foreachBatch(merge_batch)
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(processingTime="500 milliseconds").start())
        wait_for(lambda: adv.last_progress is not None and adv.last_progress.batch_id >= 3
                 and any(n.name == "local_merge" for n in adv.report().nodes), 60)
        query.stop()
        report = adv.report()
        lm = [n for n in report.nodes if n.name == "local_merge"][0]
        assert lm.kind == "trilink operator" and lm.rows_per_batch > 0
        # each batch plans local_merge once (one run): every finished batch's rows were
        # seen by its run, once (an empty batch may run no task); at most one more run (a
        # batch cut short by stop())
        runs = read_operator_timings(timing_dir).groupby("run")["rows_in"].sum().tolist()
        batches = [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]
        for rows in batches:
            assert rows in runs, (rows, runs)
            runs.remove(rows)
        assert len(runs) <= 1
    finally:
        if query is not None:
            query.stop()
        spark.streams.removeListener(listener)
