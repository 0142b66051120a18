"""Keyed watermark on a stream: Spark's ``transformWithStateInPandas`` against ``keyed_foreach_batch``.

``keyed_watermark`` numbers rows with ``monotonically_increasing_id``, which a streaming frame
refuses, so it runs on batch frames only. Spark 4's arbitrary-state operator could carry each
key's high-water mark across micro-batches instead. This benchmark measures what that costs,
against the route the package offers for streams, on the same file stream:

- **tWS**: a ``mapInArrow`` numbering each input partition's rows (arrival order), then
  ``groupBy(key).transformWithStateInPandas`` with one value state per key (its largest event
  time). The handler sorts the key's rows by arrival, takes the running maximum from the stored
  one and emits every row with ``key_watermark`` and ``is_late`` (``n_keys=1``, no
  ``is_late_partition``: a handler sees one key, never its partition's progress).
  Spark's RocksDB state store provider (tWS needs it).
- **foreachBatch**: ``keyed_foreach_batch`` with a vectorised processor that emits every row
  with the same two columns (the runtime's verdict and a grouped running maximum), 4
  partitions, the package's executor-local state store.

Both queries read the same parquet files, one file per trigger (``availableNow``), and end in
the same sink (a ``foreachBatch`` summing ``is_late`` and counting rows), so the late counts
can be compared: both views are exact, so they must be equal. 5,000 keys; event times in order
per key up to a jitter larger than the delay, so some rows are late.

Three sizes (100k, 400k and 1M rows, 10 files each): the tWS time follows the keys touched
per micro-batch more than the rows. Run it on a machine with nothing else running.

Run: ``python benches/keyed/bench_stream_watermark.py [rows ...]`` (default 100000 400000
1000000; writes benches/results/stream_watermark.json).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

KEYS = 5_000
SIZES = (100_000, 400_000, 1_000_000)
FILES = 10
DELAY = 1.0
JITTER = 3.0  # event-time noise (units) around each key's clock: larger than DELAY, so late rows
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SCHEMA = "k long, t double, v double"


def stream_rows(rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` readings of ``KEYS`` keys in arrival order: key drawn at random, event time
    the arrival's clock plus a uniform jitter of ``JITTER``."""
    rng = np.random.default_rng(seed)
    clock = np.arange(rows) * (100.0 / rows)  # the stream spans 100 time units
    return pd.DataFrame({
        "k": rng.integers(0, KEYS, rows),
        "t": clock + rng.random(rows) * JITTER,
        "v": rng.random(rows),
    })


def write_files(spark: Any, frame: pd.DataFrame, root: Path, files: int = FILES) -> None:
    bounds = np.linspace(0, len(frame), files + 1).astype(int)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        spark.createDataFrame(frame.iloc[lo:hi]).coalesce(1).write.parquet(
            str(root / f"batch={i:03d}"))
        time.sleep(0.01)  # distinct modification times: the file source takes them in order


def read_stream(spark: Any, src: Path) -> Any:
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
            .option("recursiveFileLookup", "true").parquet(str(src)))


class Totals:
    """The shared sink: rows and late rows of every micro-batch (one small Spark job each)."""

    def __init__(self) -> None:
        self.rows = 0
        self.late = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        got = df.selectExpr("count(*) AS n", "sum(int(is_late)) AS late").first()
        self.rows += int(got["n"])
        self.late += int(got["late"] or 0)


def number_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow``: each row's arrival position, partition then row, as
    ``monotonically_increasing_id`` numbers a batch frame."""
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    base = (ctx.partitionId() if ctx is not None else 0) << 33
    seen = 0
    for batch in batches:
        pos = np.arange(seen, seen + batch.num_rows, dtype=np.int64) + base
        seen += batch.num_rows
        yield batch.append_column("arrival", pa.array(pos))


def key_watermark_processor(delay: float, columns: list[str]) -> Any:
    """A ``StatefulProcessor`` keeping one key's largest event time (tWS side)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class KeyHigh(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.high = handle.getValueState("high", "high double")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            parts = list(rows)
            frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
            arrival = frame["arrival"].to_numpy()
            if len(arrival) > 1 and not bool(np.all(arrival[1:] > arrival[:-1])):
                frame = frame.iloc[np.argsort(arrival, kind="stable")]
            et = frame["t"].to_numpy(dtype=np.float64, na_value=np.nan)
            stored = self.high.get()
            start = -np.inf if stored is None else float(stored[0])
            running = np.maximum.accumulate(
                np.concatenate(([start], np.where(np.isnan(et), -np.inf, et))))
            before = running[:-1]
            watermark = np.where(np.isfinite(before), before - delay, np.nan)
            late = pd.array(np.where(np.isnan(watermark), False, et < watermark),
                            dtype="boolean")
            late[np.isnan(et)] = pd.NA
            if np.isfinite(running[-1]) and running[-1] > start:
                self.high.update((float(running[-1]),))
            yield frame[columns].assign(key_watermark=watermark, is_late=late)

    return KeyHigh()


def run_tws(spark: Any, src: Path, work: Path) -> dict[str, Any]:
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StructField, StructType

    stream = read_stream(spark, src)
    columns = list(stream.columns)
    numbered = stream.mapInArrow(
        number_rows, StructType([*stream.schema.fields, StructField("arrival", LongType())]))
    out_schema = StructType([*stream.schema.fields, StructField("key_watermark", DoubleType()),
                             StructField("is_late", BooleanType())])
    marked = numbered.groupBy("k").transformWithStateInPandas(
        key_watermark_processor(DELAY, columns), out_schema, "append", "none")
    sink = Totals()
    start = time.perf_counter()
    query = (marked.writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(work / "tws-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return {"seconds": time.perf_counter() - start, "rows": sink.rows, "late": sink.late,
            "batches": len(query.recentProgress)}


def marking_processor() -> Any:
    """A vectorised processor emitting every row with ``key_watermark`` and ``is_late``."""

    class MarkLate(tl.KeyedWatermarkProcessFunction):
        output_schema = "k long, t double, v double, key_watermark double, is_late boolean"

        def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
            raise NotImplementedError  # vectorised: process_rows runs instead

        def process_rows(self, batch: Any, runtime: Any) -> Any:
            codes = batch.codes
            et = np.where(np.isnan(batch.event_time), -np.inf, batch.event_time)
            earlier = (pd.Series(et).groupby(codes).cummax().groupby(codes).shift(1)
                       .fillna(-np.inf).to_numpy())
            high = np.maximum(earlier, batch.watermark_before[codes] + runtime.delay)
            rows = batch.rows
            return pd.DataFrame({
                "k": rows["k"].to_numpy(), "t": rows["t"].to_numpy(),
                "v": rows["v"].to_numpy(),
                "key_watermark": np.where(np.isfinite(high), high - runtime.delay, np.nan),
                "is_late": batch.late,
            })

    return MarkLate()


def run_foreach_batch(spark: Any, src: Path, work: Path) -> dict[str, Any]:
    sink = Totals()
    run = tl.keyed_foreach_batch(sink, "k", "t", marking_processor(), DELAY,
                                 str(work / "keyed-state"), num_partitions=4)
    start = time.perf_counter()
    query = (read_stream(spark, src).writeStream.foreachBatch(run)
             .option("checkpointLocation", str(work / "keyed-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return {"seconds": time.perf_counter() - start, "rows": sink.rows, "late": sink.late,
            "runtime_late": run.counters()["late"], "batches": len(query.recentProgress)}


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4,
                           extra_conf={"spark.driver.memory": "2g",
                                       "spark.sql.streaming.stateStore.providerClass": ROCKSDB})
    warm = Path(tempfile.mkdtemp(prefix="tl-stream-wm-warm-"))
    try:  # JIT and Python workers warm for both queries before anything is timed
        write_files(spark, stream_rows(5_000), warm / "in", files=2)
        run_tws(spark, warm / "in", warm)
        run_foreach_batch(spark, warm / "in", warm)
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    results = []
    sizes = [int(a) for a in sys.argv[1:]] or list(SIZES)
    for size in sizes:
        work = Path(tempfile.mkdtemp(prefix="tl-stream-wm-"))
        try:
            write_files(spark, stream_rows(size), work / "in")
            tws = run_tws(spark, work / "in", work)
            kfb = run_foreach_batch(spark, work / "in", work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if tws["late"] != kfb["late"] or tws["rows"] != size or kfb["rows"] != size:
            raise SystemExit(f"the two views disagree at {size} rows: {tws} vs {kfb}")
        row = {
            "rows": size, "keys": KEYS, "files": FILES, "late_rows": kfb["late"],
            "tws_seconds": tws["seconds"], "foreach_batch_seconds": kfb["seconds"],
            "tws_rows_per_s": size / tws["seconds"],
            "foreach_batch_rows_per_s": size / kfb["seconds"],
            "tws_over_foreach_batch": tws["seconds"] / kfb["seconds"],
        }
        results.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()},
              flush=True)
    spark.stop()
    print(write_json("stream_watermark", {
        "keys": KEYS, "files_per_size": FILES, "delay": DELAY, "jitter": JITTER,
        "note": "local[2], 2 cores, nothing else running; the first run of each query "
                "warms the JVM and workers before anything is timed",
        "rows": results}))


if __name__ == "__main__":
    main()
