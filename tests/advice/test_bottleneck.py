"""The bottleneck advisor: progress parsing, the flow network over stages, a real query."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.advice import BottleneckAdvisor, BottleneckListener, BottleneckReport
from trilink_spark.measurement import task_metrics
from conftest import wait_for
from trilink_spark.measurement.progress import parse_progress

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def progress(batch: int, rows: int, rate: float, ms: float = 1000.0,
             backlog: int | None = None) -> dict[str, Any]:
    sources = []
    if backlog is not None:
        sources = [{"description": "kafka", "endOffset": {"t": {"0": 100}},
                    "latestOffset": {"t": {"0": 100 + backlog}}}]
    return {"batchId": batch, "numInputRows": rows, "inputRowsPerSecond": rate,
            "processedRowsPerSecond": rows / (ms / 1000.0),
            "durationMs": {"triggerExecution": ms, "addBatch": ms * 0.9}, "sources": sources}


# ---------------------------------------------------------------------- progress
def test_progress_from_dict_json_and_backlog() -> None:
    p = parse_progress(json.dumps(progress(4, 500, 250.0, backlog=1200)))
    assert (p.batch_id, p.input_rows, p.input_rate, p.duration_ms, p.backlog_rows) == \
        (4, 500, 250.0, 1000.0, 1200)
    assert parse_progress(progress(0, 0, float("nan"))).input_rate == 0.0  # an empty batch


@pytest.mark.parametrize("bad", ["{not json", "[1]", json.dumps({"numInputRows": 3}),
                                 json.dumps({"batchId": -1}), json.dumps({"batchId": True}),
                                 json.dumps({"batchId": 1, "inputRowsPerSecond": -5}),
                                 json.dumps({"batchId": 1, "durationMs": [1]}),
                                 "[" * 100_000])
def test_bad_progress_is_refused_with_a_typed_error(bad: str) -> None:
    with pytest.raises(tl.TrilinkError):
        parse_progress(bad)
    with pytest.raises(TypeError):
        parse_progress(42)


# ---------------------------------------------------------------------- the network
def feed(adv: BottleneckAdvisor, rates: list[tuple[str, float, int]], rows: int,
         input_rate: float, batches: int = 3, backlog: int | None = None) -> None:
    """Each node processes ``rows`` per batch at ``rate`` rows per task-second."""
    for b in range(batches):
        for name, rate, tasks in rates:
            adv.observe_operator(name, rows, 1000.0 * rows / rate, tasks)
        adv.observe_progress(progress(b, rows, input_rate, backlog=backlog))


def test_the_slowest_operator_is_the_cut_and_ds2_sizes_it() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    feed(adv, [("parse", 5000.0, 2), ("count", 400.0, 2), ("write", 3000.0, 2)], 1000, 900.0)
    r = adv.report()
    assert r.bottleneck == ["count"]
    assert r.max_flow == pytest.approx(800.0)  # 400 rows/s per task x 2 tasks
    count = next(n for n in r.nodes if n.name == "count")
    assert count.utilisation == pytest.approx(900.0 / 800.0)
    assert count.ds2_parallelism == 3  # ceil(900 / 400)
    assert next(n for n in r.nodes if n.name == "parse").ds2_parallelism == 1
    assert any("maxOffsetsPerTrigger" in a["setting"] for a in r.actions)
    assert "count" in str(r)
    json.dumps(r.to_dict())


def test_an_operator_with_no_measured_time_keeps_an_infinite_rate() -> None:
    # a stage whose tasks took 0 ms (tiny batches) has no finite rate: the report says inf,
    # a float as the field is typed, and only its JSON form writes null
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(3):
        adv.observe_operator("parse", 1000, 0.0, 2)
        adv.observe_operator("count", 1000, 2500.0, 2)
        adv.observe_progress(progress(b, 1000, 300.0))
    r = adv.report()
    parse = next(n for n in r.nodes if n.name == "parse")
    assert parse.true_rate == float("inf") and parse.capacity == float("inf")
    assert all(isinstance(n.true_rate, float) for n in r.nodes)
    assert parse.to_dict()["true_rate"] is None
    assert next(n for n in r.nodes if n.name == "count").true_rate == pytest.approx(400.0)


@pytest.mark.parametrize("ops", [
    [("a", 0, 0.0, 1), ("b", 0, 0.0, 1)],  # all-zero figures
    [("a", 100, 0.0, 2), ("b", 100, 0.0, 2)],  # no stage spent measurable time
    [("a", 0, 50.0, 2), ("b", 0, 10.0, 2)],  # time but no rows: a zero rate
    [("a", 1000, 10.0, 2), ("b", 0, 0.0, 2)],  # nothing reaches the second node
])
@pytest.mark.parametrize("rate", [0.0, float("nan"), 300.0])
def test_degenerate_figures_give_typed_figures_and_strict_json(
        ops: list[tuple[str, int, float, int]], rate: float) -> None:
    # every figure stays a float (inf where unmeasured), DS2 asks for at least one task, and
    # only to_dict turns inf / NaN into null
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(3):
        for op in ops:
            adv.observe_operator(*op)
        adv.observe_progress(progress(b, 0 if rate != 300.0 else 1000, rate))
    r = adv.report()
    assert [n.name for n in r.nodes] == ["a", "b"]
    for n in r.nodes:
        assert all(isinstance(getattr(n, f), float) for f in
                   ("rows_per_batch", "selectivity", "true_rate", "capacity", "offered",
                    "utilisation"))
        assert isinstance(n.ds2_parallelism, int) and n.ds2_parallelism >= 1
    json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert str(r)


def test_headroom_below_lambda_names_no_bottleneck() -> None:
    adv = BottleneckAdvisor(lambda_=0.85, warmup_batches=0)
    feed(adv, [("parse", 5000.0, 2), ("count", 400.0, 2)], 1000, 500.0)  # 500 / 800 = 0.63
    r = adv.report()
    assert r.bottleneck == [] and "no bottleneck" in r.reason
    assert r.utilisation == pytest.approx(500.0 / 800.0)


def test_backlog_counts_as_unmet_flow() -> None:
    adv = BottleneckAdvisor(lambda_=0.85, warmup_batches=0)
    # 500 rows/s arrive, but 400 rows wait: over a 1 s batch, 400 rows/s more are offered
    feed(adv, [("parse", 5000.0, 2), ("count", 400.0, 2)], 1000, 500.0, backlog=400)
    r = adv.report()
    assert r.backlog_rate == pytest.approx(400.0)
    assert r.offered_rate == pytest.approx(900.0)
    assert r.bottleneck == ["count"]


def test_selectivity_converts_every_node_to_source_rows() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(3):
        adv.observe_operator("filter", 1000, 100.0, 2)   # 10,000 rows/s per task
        adv.observe_operator("enrich", 100, 500.0, 2)    # 10 % pass: 200 rows/s per task
        adv.observe_progress(progress(b, 1000, 1000.0))
    r = adv.report()
    enrich = next(n for n in r.nodes if n.name == "enrich")
    assert enrich.selectivity == pytest.approx(0.1)
    assert enrich.offered == pytest.approx(100.0)
    # enrich sustains 400 rows/s = 4,000 source rows/s: filter (20,000) is not the cut either
    assert r.max_flow == pytest.approx(4000.0)
    assert r.bottleneck == []


def test_warmup_and_window() -> None:
    adv = BottleneckAdvisor(window_batches=2, warmup_batches=2)
    assert adv.report().nodes == []
    feed(adv, [("slow", 10.0, 1)], 100, 5.0, batches=2)  # warm-up only
    assert adv.report().nodes == []
    feed(adv, [("slow", 1000.0, 1)], 100, 5.0, batches=3)
    assert adv.report().nodes[0].true_rate == pytest.approx(1000.0)
    assert adv.report().batches == 2


@pytest.mark.parametrize("kw", [{"lambda_": 0.3}, {"lambda_": 1.5}, {"window_batches": 0},
                                {"warmup_batches": -1}, {"slots": 0}])
def test_bad_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        BottleneckAdvisor(**kw)


def test_bad_operator_figures_are_refused() -> None:
    adv = BottleneckAdvisor()
    for args in (("", 1, 1, 1), ("source", 1, 1, 1), ("x", -1, 1, 1), ("x", 1, float("inf"), 1),
                 ("x", 1, 1, 0)):
        with pytest.raises(ValueError):
            adv.observe_operator(*args)
    with pytest.raises(TypeError):
        adv.observe_stages(pd.DataFrame({"a": [1]}))


# ---------------------------------------------------------------------- a real query
def slow_udf() -> Any:
    from pyspark.sql import functions as F

    @F.udf("long")
    def maybe_sleep(v: int, slow: bool) -> int:
        if slow:
            time.sleep(0.0015)
        return v

    return maybe_sleep


def three_stages(spark: Any, slowed: int) -> Any:
    """range -> udf -> shuffle -> udf -> shuffle -> udf -> noop: three stages; the udf of
    stage ``slowed`` sleeps 1.5 ms per row."""
    from pyspark.sql import functions as F

    f = slow_udf()
    df = spark.range(0, 1200, 1, 2)
    a = df.select(f("id", F.lit(slowed == 0)).alias("v")).repartition(2, "v")
    b = a.select(f("v", F.lit(slowed == 1)).alias("v")).repartition(2, "v")
    return b.select(f("v", F.lit(slowed == 2)).alias("v"))


def advise_once(spark: Any, slowed: int, tag: str) -> BottleneckReport:
    group = f"tl-bottleneck-{tag}"
    spark.sparkContext.setJobGroup(group, group)
    try:
        three_stages(spark, slowed).write.format("noop").mode("overwrite").save()
    finally:
        spark.sparkContext.setJobGroup("", "")
    adv = BottleneckAdvisor(warmup_batches=0, slots=2)
    adv.observe_stages(task_metrics(spark, job_group=group), close=True)
    return adv.report()


def test_a_real_query_names_its_slowed_stage(spark: Any) -> None:
    named = [advise_once(spark, 1, f"a{i}").bottleneck for i in range(5)]
    assert sum(b == ["stage 1"] for b in named) >= 4, named
    moved = advise_once(spark, 2, "b")
    assert moved.bottleneck == ["stage 2"], moved.reason
    assert [(n.name, n.kind) for n in moved.nodes] == [
        ("stage 0", "source read"), ("exchange after stage 0", "exchange"),
        ("stage 1", "shuffle read"), ("exchange after stage 1", "exchange"),
        ("stage 2", "shuffle read")]
    # each exchange carries what its writer stage wrote: 1200 rows, every time
    assert [n.rows_per_batch for n in moved.nodes if n.kind == "exchange"] == [1200, 1200]
    assert any(a["node"] == "stage 2" for a in moved.actions)


def test_the_listener_rates_equal_last_progress(spark: Any, tmp_path: Any) -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    listener = BottleneckListener(adv, spark)
    spark.streams.addListener(listener)
    query = None
    try:
        stream = spark.readStream.format("rate").option("rowsPerSecond", 200).load()
        query = (stream.selectExpr("value % 10 AS k").groupBy("k").count()
                 .writeStream.outputMode("update").format("noop")
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(processingTime="500 milliseconds").start())
        # the listener hears of a batch after lastProgress has it: under load it may trail by
        # a batch for as long as the query runs, so the two are compared once it stopped
        wait_for(lambda: query.lastProgress is not None and query.lastProgress["batchId"] >= 3
                 and adv.last_progress is not None, 60)
        query.stop()
        last = query.lastProgress
        wait_for(lambda: adv.last_progress is not None
                 and adv.last_progress.batch_id == last["batchId"], 30)
        assert adv.last_progress.input_rate == pytest.approx(
            float(last["inputRowsPerSecond"]) if last["inputRowsPerSecond"] == last[
                "inputRowsPerSecond"] else 0.0)
        assert adv.last_progress.processed_rate == pytest.approx(
            float(last["processedRowsPerSecond"]))
        assert adv.last_progress.input_rows == last["numInputRows"]
        report = adv.report()
        assert report.nodes and report.source_rate > 0
        assert listener.reports
    finally:
        if query is not None:
            query.stop()
        spark.streams.removeListener(listener)


# ---------------------------------------------------------------------- the command
def test_advise_command_reads_saved_progress(tmp_path: Any) -> None:
    import io

    from trilink_spark.cli import main

    path = tmp_path / "progress.jsonl"
    lines = []
    for b in range(6):
        p = progress(b, 1000, 1500.0, ms=900.0)
        p["durationMs"] = {"triggerExecution": 900, "getBatch": 20, "queryPlanning": 30,
                           "addBatch": 800, "walCommit": 50}
        lines.append(json.dumps(p))
    path.write_text("\n".join(lines) + "\n\n")
    out = io.StringIO()
    assert main(["advise", "--progress", str(path), "--json"], out) == 0
    report = json.loads(out.getvalue())
    assert report["events"] == 6 and report["batches"] == 4  # 2 warm-up batches
    # addBatch: 1,000 rows in 800 ms = 1,250 rows/s < the 1,500 offered
    assert report["bottleneck"] == ["phase addBatch"]
    assert report["max_flow"] == pytest.approx(1250.0)
    text = io.StringIO()
    assert main(["advise", "--progress", str(path)], text) == 0
    assert "phase addBatch" in text.getvalue() and "<- bottleneck" in text.getvalue()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n{oops\n")
    assert main(["advise", "--progress", str(bad)], io.StringIO()) == 2
    assert main(["advise", "--progress", str(tmp_path / "missing.jsonl")], io.StringIO()) == 2
