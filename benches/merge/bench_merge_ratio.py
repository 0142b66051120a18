"""Local Merge's default on batch DataFrames: how many rows it keeps, sorted and unsorted.

The issue's workload: 3,000 sensors, one reading per second each, on 4 input partitions
(sensors split between partitions as Kafka partitions keyed by sensor), 60-second slots,
``count`` and ``min`` per sensor and slot. Three input lengths (60, 180 and 600 seconds:
180,000 / 540,000 / 1,800,000 rows), each time-ordered within its partitions ("sorted") and
shuffled within them ("unsorted"). In the same run:

* ``auto``: ``tl.local_merge(df, "sensor", "ts", 60.0, aggs, engine="python")``, the Python
  engine in the default mode (``"groups"`` on a batch DataFrame, ``max_groups`` 1,000,000);
* ``quantity``: the previous default, ``mode="quantity"`` with ``quantity=10,000``;
* Spark's ``groupBy("sensor", slot).agg(count, min)`` (the baseline the merge's time is
  compared with).

Kept share = partial rows / input rows; the floor is the number of (partition, sensor, slot)
groups / input rows (one partial row per group). Times: median of 3 runs after a warm-up,
each materialised with Spark's ``noop`` writer; the results of both modes, merged with
``merge_partials``, are checked against Spark's.

Run: ``python benches/merge/bench_merge_ratio.py`` (writes benches/results/merge_ratio.json).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import median_time, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402

SENSORS, PARTITIONS, SLOT = 3_000, 4, 60.0
SECONDS = (60, 180, 600)


def frame(spark: Any, seconds: int, shuffled: bool) -> Any:
    from pyspark.sql import functions as F

    rows = SENSORS * seconds
    df = spark.range(rows, numPartitions=1).selectExpr(
        f"id % {SENSORS} AS sensor", f"CAST(id DIV {SENSORS} AS DOUBLE) AS ts",
        "CAST(pmod(hash(id), 1000) AS DOUBLE) / 100.0 + 200.0 AS volts")
    df = df.repartitionByRange(PARTITIONS, "sensor")  # disjoint sensors per partition
    order = F.rand(7) if shuffled else F.col("ts")
    return df.sortWithinPartitions(order).cache()


def aggs() -> list[Any]:
    from pyspark.sql import functions as F

    return [F.count("*").alias("n"), F.min("volts").alias("low")]


def spark_groupby(df: Any) -> Any:
    from pyspark.sql import functions as F

    slot = (F.floor(F.col("ts") / SLOT) * SLOT).alias("slot_start")
    return df.groupBy("sensor", slot).agg(*aggs())


def noop(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def measure(spark: Any, seconds: int, shuffled: bool) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = frame(spark, seconds, shuffled)
    rows = df.count()
    floor = (df.withColumn("pid", F.spark_partition_id())
             .select("pid", "sensor", F.floor(F.col("ts") / SLOT)).distinct().count())
    expected = sorted(spark_groupby(df).groupBy("sensor").agg(
        F.sum("n").alias("n"), F.min("low").alias("low")).collect())
    out: dict[str, Any] = {"seconds": seconds, "rows": rows, "order": "unsorted" if shuffled
                           else "sorted", "floor_share": floor / rows, "groups": floor}
    for mode in ("auto", "quantity"):
        partial = tl.local_merge(df, "sensor", "ts", SLOT, aggs(), mode, engine="python")
        kept = partial.count()
        merged = sorted(tl.merge_partials(partial, "sensor", aggs()).collect())
        out[mode] = {"partial_rows": kept, "kept_share": kept / rows,
                     "seconds": median_time(lambda: noop(partial), repeat=3),
                     "equals_spark": merged == expected}
    out["spark_groupby_seconds"] = median_time(lambda: noop(spark_groupby(df)), repeat=3)
    out["auto_over_spark_time"] = out["auto"]["seconds"] / out["spark_groupby_seconds"]
    out["quantity_over_auto_kept"] = out["quantity"]["kept_share"] / out["auto"]["kept_share"]
    df.unpersist()
    print({k: v for k, v in out.items()}, flush=True)
    return out


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    started = time.perf_counter()
    runs = [measure(spark, s, shuffled) for shuffled in (False, True) for s in SECONDS]
    targets = {
        "auto_keeps_one_row_per_partition_key_slot": all(
            r["auto"]["partial_rows"] == r["groups"] for r in runs),
        "results_equal_spark": all(r[m]["equals_spark"] for r in runs
                                   for m in ("auto", "quantity")),
    }
    print(write_json("merge_ratio", {"sensors": SENSORS, "partitions": PARTITIONS,
                                     "slot_seconds": SLOT, "runs": runs, "targets": targets,
                                     "bench_seconds": time.perf_counter() - started}))
    print(targets)
    spark.stop()


if __name__ == "__main__":
    main()
