"""Seed 002 Table 10: keyed watermarks against Spark's query watermark on skewed sources.

Sensors whose readings are in order per sensor, from three sources; one source's clock runs
4 s ahead. Arrival interleaves the sources so that 25, 50 and 75 % of rows are out of order
overall (a row is out of order when an earlier-arriving row has a later event time). The rows,
in arrival order, are cut into micro-batches written as files, and two Structured Streaming
queries read the same files (one file per trigger):

- Spark: ``withWatermark("ts", "1 second").groupBy(window("ts", "10 seconds"), "sensor")
  .count()`` in append mode (late rows dropped: ``numRowsDroppedByWatermark``);
- trilink: ``keyed_foreach_batch`` with ``KeyedWindowAggregate(10 s)``, delay 1 s.

Reported: rows dropped as late, completeness (share of the oracle's windows that both could
have closed, i.e. ending at least 11 s before the newest event, emitted with the oracle's exact
count), and the throughput ratio (rows / query wall time).

Run: ``python benches/keyed/bench_keyed_window.py`` (writes benches/results/keyed_window.json).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

SENSORS = 1500
SKEW_S = 4.0
SECONDS = 120
BATCHES = 120  # 1-second micro-batches
WINDOW_S = 10
DELAY_S = 1


def stream_rows(out_of_order: float, seed: int = 0) -> pd.DataFrame:
    """Readings in order per sensor; one source (a fifth of the sensors) 4 s ahead.

    Rows arrive in true-time order, each source's rows at their true time. The skewed source's
    rows carry its clock, 4 s ahead, so they make the rows of the other sources that arrive
    after them out of order. From a point in the stream on, its network delay grows to 4 s
    (never shrinking, so each sensor stays in order) and the disorder stops; where that point
    lies sets the share of out-of-order rows overall.
    """
    rng = np.random.default_rng(seed)
    sensor = np.repeat(np.arange(SENSORS), SECONDS)
    true = np.tile(np.arange(SECONDS), SENSORS) + rng.random(sensor.size) * 0.99
    skewed = sensor % 5 == 0
    event = true + np.where(skewed, SKEW_S, 0.0)
    calm_from = SECONDS * min(1.0, out_of_order / 0.8)  # 80 % of rows are from calm sources
    delay = np.where(skewed & (true >= calm_from), SKEW_S, 0.0)
    order = np.argsort(true + delay, kind="stable")
    frame = pd.DataFrame({"sensor": sensor[order], "t": event[order]})
    ts = frame["t"].to_numpy()
    frame.attrs["out_of_order"] = float(np.mean(ts < np.maximum.accumulate(ts)))
    frame["ts"] = pd.to_datetime(np.rint(frame["t"] * 1e6).astype(np.int64), unit="us")
    return frame


def write_batches(spark: Any, frame: pd.DataFrame, root: Path, batches: int = BATCHES) -> None:
    bounds = np.linspace(0, len(frame), batches + 1).astype(int)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        part = frame.iloc[lo:hi]
        spark.createDataFrame(part[["sensor", "ts"]]).coalesce(1).write.parquet(
            str(root / f"batch={i:03d}"))
        time.sleep(0.01)  # distinct modification times: the file source takes them in order


def oracle(frame: pd.DataFrame) -> pd.DataFrame:
    start = np.floor(frame["t"] / WINDOW_S) * WINDOW_S
    counts = frame.assign(start=start).groupby(["sensor", "start"]).size().rename("count")
    out = counts.reset_index()
    closable = out["start"] + WINDOW_S <= frame["t"].max() - DELAY_S - WINDOW_S
    return out[closable]


def completeness(want: pd.DataFrame, got: pd.DataFrame) -> float:
    merged = want.merge(got, on=["sensor", "start"], how="left", suffixes=("", "_got"))
    return float((merged["count"] == merged["count_got"]).mean())


def run_spark(spark: Any, src: Path, work: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    stream = (spark.readStream.schema("sensor long, ts timestamp")
              .option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
              .parquet(str(src)))
    counts = (stream.withWatermark("ts", f"{DELAY_S} second")
              .groupBy(F.window("ts", f"{WINDOW_S} seconds"), "sensor").count())
    sink: list[pd.DataFrame] = []

    def collect(df: Any, batch_id: int) -> None:
        sink.append(df.select("sensor", F.col("window.start").alias("start"), "count").toPandas())

    start = time.perf_counter()
    query = (counts.writeStream.outputMode("append").foreachBatch(collect)
             .option("checkpointLocation", str(work / "spark-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - start
    dropped = sum(op.get("numRowsDroppedByWatermark", 0)
                  for p in query.recentProgress for op in p.get("stateOperators", []))
    got = pd.concat(sink, ignore_index=True) if sink else pd.DataFrame(
        columns=["sensor", "start", "count"])
    got["start"] = got["start"].astype("int64") // 10**9 if len(got) else got["start"]
    return {"seconds": seconds, "dropped": int(dropped), "windows": got}


def run_keyed(spark: Any, src: Path, work: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    stream = (spark.readStream.schema("sensor long, ts timestamp")
              .option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
              .parquet(str(src)))
    sink: list[pd.DataFrame] = []

    def collect(df: Any, batch_id: int) -> None:
        sink.append(df.select("sensor", F.unix_seconds("window_start").alias("start"),
                              "count").toPandas())

    agg = tl.KeyedWindowAggregate(float(WINDOW_S))
    run = tl.keyed_foreach_batch(collect, "sensor", "ts", agg, float(DELAY_S),
                                 str(work / "keyed-state"), num_partitions=4)
    start = time.perf_counter()
    query = (stream.writeStream.foreachBatch(run)
             .option("checkpointLocation", str(work / "keyed-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - start
    got = pd.concat(sink, ignore_index=True) if sink else pd.DataFrame(
        columns=["sensor", "start", "count"])
    counters = run.counters()
    return {"seconds": seconds, "dropped": counters["late"], "windows": got,
            "late_partition": counters["late_partition"], "state_bytes": run.store.state_bytes()}


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4,
                           extra_conf={"spark.driver.memory": "4g"})
    results = []
    warm = Path(tempfile.mkdtemp(prefix="tl-table10-warm-"))
    try:  # JIT and Python workers warm for both queries before anything is timed
        write_batches(spark, stream_rows(0.25).iloc[:3000], warm / "in", batches=3)
        run_spark(spark, warm / "in", warm)
        run_keyed(spark, warm / "in", warm)
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    for disorder in (0.25, 0.5, 0.75):
        frame = stream_rows(disorder)
        frame.attrs.setdefault("out_of_order", 0.0)
        work = Path(tempfile.mkdtemp(prefix="tl-table10-"))
        try:
            write_batches(spark, frame, work / "in")
            want = oracle(frame)
            native = run_spark(spark, work / "in", work)
            keyed = run_keyed(spark, work / "in", work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows = len(frame)
        row = {
            "out_of_order_target": disorder,
            "out_of_order_overall": frame.attrs["out_of_order"],
            "rows": rows,
            "spark_dropped": native["dropped"],
            "keyed_dropped": keyed["dropped"],
            "keyed_late_partition_level": keyed["late_partition"],
            "spark_completeness": completeness(want, native["windows"]),
            "keyed_completeness": completeness(want, keyed["windows"]),
            "spark_rows_per_s": rows / native["seconds"],
            "keyed_rows_per_s": rows / keyed["seconds"],
            "throughput_ratio": native["seconds"] / keyed["seconds"],
            "keyed_state_bytes_end": keyed["state_bytes"],
            "oracle_windows": len(want),
        }
        results.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()},
              flush=True)
    spark.stop()
    print(write_json("keyed_window", {"sensors": SENSORS, "seconds": SECONDS,
                                      "batches": BATCHES, "window_s": WINDOW_S,
                                      "delay_s": DELAY_S, "rows": results}))


if __name__ == "__main__":
    main()
