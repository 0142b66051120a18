"""Hostile checks of operator timing (trilink_spark._internal.optiming) and the advisor's use of it:
corrupt frames, partial metrics, bad directories, retries read across calls, a listener that
must keep closing batches whatever the timing directory does."""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.advice.bottleneck import BottleneckAdvisor, BottleneckListener
from trilink_spark.measurement.metrics import TASK_METRIC_COLUMNS
from trilink_spark._internal.optiming import (OPERATOR_TIMING_COLUMNS, OperatorTimer,
                                    OperatorTimingReader, operator_timer,
                                    read_operator_timings)


def progress(batch: int, rows: int = 1000) -> str:
    return json.dumps({"batchId": batch, "numInputRows": rows, "inputRowsPerSecond": 900.0,
                       "durationMs": {"triggerExecution": 1000.0, "addBatch": 900.0},
                       "sources": []})


def timing_row(**over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"operator": "local_merge", "run": "r", "stage_id": 3,
                           "partition": 0, "attempt": 0, "rows_in": 100, "rows_out": 10,
                           "busy_ms": 5.0, "wait_ms": 0.0, "written_ms": 0.0}
    row.update(over)
    return row


def metrics_row(stage: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"stage_id": stage, "stage_attempt": 0, "partition": 0,
                           "attempt": 0, "status": "SUCCESS", "rows": 100,
                           "duration_ms": 100, "run_ms": 100, "shuffle_read_records": 0,
                           "input_records": 100, "shuffle_write_records": 0,
                           "shuffle_write_ms": 0, "fetch_wait_ms": 0}
    row.update(over)
    return row


def busy_seconds(report: Any) -> dict[str, float]:
    return {n.name: n.rows_per_batch / n.true_rate for n in report.nodes}


# ---------------------------------------------------------------------- observe_stages
def test_partial_exchange_columns_are_a_typed_error_not_a_key_error() -> None:
    frame = pd.DataFrame([metrics_row(1)])[list(TASK_METRIC_COLUMNS[:10])
                                           + ["shuffle_write_records"]]
    adv = BottleneckAdvisor(warmup_batches=0)
    with pytest.raises(InvalidArgumentTypeError, match="shuffle_write_ms"):
        adv.observe_stages(frame)


def test_fetch_wait_without_an_observed_writer_is_not_lost() -> None:
    # the stage that wrote the shuffle ran before (a listener only sees fresh stages): the
    # 40 ms the reader waited on the fetch must still be counted somewhere
    frame = pd.DataFrame([metrics_row(7, input_records=0, shuffle_read_records=100,
                                      fetch_wait_ms=40)])
    adv = BottleneckAdvisor(warmup_batches=0)
    adv.observe_stages(frame, close=True)
    busy = busy_seconds(adv.report())
    assert sum(busy.values()) == pytest.approx(0.100)
    exchanges = [n for n in adv.report().nodes if n.kind == "exchange"]
    assert len(exchanges) == 1 and busy[exchanges[0].name] == pytest.approx(0.040)


# ---------------------------------------------------------------------- observe_timings
@pytest.mark.parametrize("name", [None, float("nan"), "stage 0", "exchange after stage 0",
                                  "a/b", "x" * 65])
def test_operator_names_that_are_missing_or_clash_with_nodes_are_refused(name: Any) -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    adv.observe_stages(pd.DataFrame([metrics_row(3)]))
    frame = pd.DataFrame([timing_row(), timing_row(operator=name, partition=1)],
                         columns=list(OPERATOR_TIMING_COLUMNS))
    with pytest.raises(InvalidArgumentError, match="operator"):
        adv.observe_timings(frame)


@pytest.mark.parametrize("over", [{"stage_id": 1.5}, {"stage_id": 1e300},
                                  {"partition": 2.0 ** 70}, {"partition": 0.25}])
def test_stage_ids_and_partitions_must_be_integers(over: dict[str, Any]) -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    with pytest.raises(InvalidArgumentError, match="timings column"):
        adv.observe_timings(pd.DataFrame([timing_row(**over)]))


def test_boolean_figures_are_a_type_error() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    frame = pd.DataFrame([timing_row(busy_ms=True)])
    with pytest.raises(InvalidArgumentTypeError, match="busy_ms"):
        adv.observe_timings(frame)


def test_duplicate_columns_are_a_typed_error() -> None:
    frame = pd.DataFrame([timing_row()])
    frame = pd.concat([frame, frame[["busy_ms"]]], axis=1)
    adv = BottleneckAdvisor(warmup_batches=0)
    with pytest.raises(InvalidArgumentTypeError, match="busy_ms"):
        adv.observe_timings(frame)


# ---------------------------------------------------------------------- writer and reader
def test_write_never_raises_whatever_it_is_given(tmp_path: Any, caplog: Any) -> None:
    timer = OperatorTimer(str(tmp_path), "keyed", "r")
    with caplog.at_level(logging.WARNING):
        timer.write(rows_in="many", rows_out=1, busy_ms=1.0)  # type: ignore[arg-type]
        timer.write(rows_in=1, rows_out=1, busy_ms=object())  # type: ignore[arg-type]
        timer.write(rows_in=1, rows_out=1, busy_ms=1.0, partition="x")  # type: ignore
    assert caplog.text.count("operator timing not written") == 3
    assert len(read_operator_timings(str(tmp_path))) == 0


def test_a_later_attempt_of_a_task_already_handed_out_is_not_counted_again(
        tmp_path: Any) -> None:
    root = str(tmp_path)
    reader = OperatorTimingReader(root)
    OperatorTimer(root, "keyed", "r").write(rows_in=10, rows_out=1, busy_ms=1.0, partition=2)
    assert reader.new()["rows_in"].tolist() == [10]
    # the same task ran again (its first attempt failed after writing, or a speculative copy
    # finished late): its record must not be counted a second time
    directory = os.path.join(root, "keyed", "r")
    record = json.loads(open(os.path.join(directory, "stage-0-part-2-attempt-0.json")).read())
    record.update(attempt=1)
    with open(os.path.join(directory, "stage-0-part-2-attempt-1.json"), "w") as f:
        f.write(json.dumps(record))
    later = reader.new()
    assert len(later) == 0
    # the whole directory still says one task, its last attempt
    assert read_operator_timings(root)["attempt"].tolist() == [1]


def test_a_root_that_is_no_filesystem_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgumentError, match="nosuch://"):
        read_operator_timings("nosuch://x/timings")


def test_the_listener_closes_batches_whatever_the_timing_directory(
        caplog: pytest.LogCaptureFixture) -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    listener = BottleneckListener(adv, None, timings="nosuch://x/timings")
    with caplog.at_level(logging.WARNING):
        for batch in range(3):
            event = SimpleNamespace(progress=SimpleNamespace(
                json=progress(batch), batchId=batch, runId="run"))
            listener.onQueryProgress(event)
    assert len(listener.reports) == 3
    assert adv.last_progress is not None and adv.last_progress.batch_id == 2
    assert "nosuch://" in caplog.text


def test_the_listener_reads_the_directory_the_operators_write(tmp_path: Any) -> None:
    root = str(tmp_path / "timings")

    class Conf:
        def get(self, key: str, default: Any = None) -> Any:
            return f"  {root} \n"  # as typed into a conf file

    spark = SimpleNamespace(conf=Conf())
    timer = operator_timer(spark, "keyed")
    assert timer is not None
    timer.write(rows_in=5, rows_out=5, busy_ms=1.0, partition=0)
    listener = BottleneckListener(BottleneckAdvisor(warmup_batches=0), spark)
    assert listener.timings.new()["rows_in"].tolist() == [5]


def test_names_with_a_trailing_newline_are_refused(tmp_path: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        OperatorTimer(str(tmp_path), "keyed\n", "r")
    adv = BottleneckAdvisor(warmup_batches=0)
    with pytest.raises(InvalidArgumentError, match="operator"):
        adv.observe_timings(pd.DataFrame([timing_row(operator="keyed\n")]))


def test_four_threads_reading_new_records_hand_each_out_once(tmp_path: Any) -> None:
    import threading

    root = str(tmp_path)
    for p in range(300):
        OperatorTimer(root, "keyed", "r").write(rows_in=1, rows_out=1, busy_ms=1.0,
                                                partition=p)
    reader = OperatorTimingReader(root)
    got: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work() -> None:
        try:
            start.wait()
            for _ in range(3):
                got.append(int(reader.new()["rows_in"].sum()))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(got) == 300


def test_duplicate_metric_columns_are_a_typed_error() -> None:
    frame = pd.DataFrame([metrics_row(1)])
    frame = pd.concat([frame, frame[["run_ms"]]], axis=1)
    with pytest.raises(InvalidArgumentTypeError, match="run_ms"):
        BottleneckAdvisor(warmup_batches=0).observe_stages(frame)
