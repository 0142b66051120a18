"""Keyed watermarks on sensors whose sources disagree about the time.

Three sources report voltage readings, in order per sensor; one source's clock runs 4 s
ahead. A single watermark (one per partition or query) calls most readings of the other two
sources late; a keyed watermark calls none late, and per-key windows close as soon as each
sensor's own readings pass their end. The last part runs the same window aggregate on a
Structured Streaming query, with its state kept between micro-batches.

Run: ``python examples/sensor_windows.py`` (local Spark, no servers).
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

import trilink_spark as tl


def readings(seconds: int = 60, sensors: int = 30, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sensor = np.repeat(np.arange(sensors), seconds)
    true = np.tile(np.arange(seconds), sensors) + rng.random(sensor.size) * 0.9
    clock = true + np.where(sensor % 3 == 0, 4.0, 0.0)  # source 0 is 4 s ahead
    order = np.argsort(true, kind="stable")  # rows arrive in true-time order
    frame = pd.DataFrame({
        "sensor": sensor[order],
        "ts": pd.to_datetime(np.rint(clock[order] * 1e6).astype(np.int64), unit="us"),
        "volts": rng.normal(220.0, 3.0, sensor.size),
        "arrival": np.arange(sensor.size),
    })
    return frame


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    df = spark.createDataFrame(readings()).coalesce(1)

    marked = tl.keyed_watermark(df, "sensor", "ts", timedelta(seconds=1), order_by="arrival")
    late = marked.selectExpr("count(*) AS rows", "sum(int(is_late)) AS key_late",
                             "sum(int(is_late_partition)) AS partition_late").first()
    print(f"rows {late['rows']} late by key watermark: {late['key_late']} "
          f"late by partition watermark: {late['partition_late']}")

    agg = tl.KeyedWindowAggregate(timedelta(seconds=10), value="volts", aggs=("count", "mean"))
    windows = tl.keyed_process(df, "sensor", "ts", agg, delay=1.0, order_by="arrival",
                               num_partitions=4)
    print(f"windows {windows.count()} rows counted: {windows.agg({'count': 'sum'}).first()[0]}")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        frame = readings(seed=4)
        for i, part in enumerate(np.array_split(frame.to_numpy(), 6)):
            batch = pd.DataFrame(part, columns=frame.columns).astype(frame.dtypes.to_dict())
            spark.createDataFrame(batch).coalesce(1).write.parquet(str(root / f"in/batch={i}"))
        emitted: list[int] = []
        run = tl.keyed_foreach_batch(
            lambda out, batch_id: emitted.append(out.count()),
            "sensor", "ts", tl.KeyedWindowAggregate(10.0), delay=1.0,
            state_path=str(root / "state"), num_partitions=4,
        )
        stream = (spark.readStream.schema(spark.createDataFrame(frame).schema)
                  .option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
                  .parquet(str(root / "in")))
        query = (stream.writeStream.foreachBatch(run)
                 .option("checkpointLocation", str(root / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        counters = run.counters()
        print(f"streaming: {len(emitted)} micro-batches, {sum(emitted)} windows emitted, "
              f"late rows {counters['late']} (a single watermark: {counters['late_partition']})")


if __name__ == "__main__":
    main()
