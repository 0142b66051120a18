"""Periodic Local Merge on unsorted rows, against Spark's native ``groupBy`` of the same aggregates.

Periodic mode (Trilink paper, §4.3 (1), Table 7) flushes a partition's buffer when its oldest
row is ``delay`` older than its newest. On rows whose event times are shuffled within each
partition, nearly every row starts a new flush: the case that used to rescan the rest of the
partition at every flush (quadratic) and to run one pandas group-by per flush. Three ways, in
one run, for 30k, 100k and 300k rows (4 input partitions, ``local[2]``):

* ``local_merge``: ``tl.local_merge(df, "k", "t", SLOT, aggs, "periodic", delay=DELAY)``;
* ``local_merge + merge_partials``: the same, then the partials merged per (key, slot) (the
  result equals Spark's, which is checked);
* ``spark groupBy``: ``df.groupBy("k", slot_start).agg(count, sum, min, max, avg)``.

Each is materialised with Spark's ``noop`` writer; the time is the median of 3 runs after one
warm-up. Rows/s are input rows per second. ``ratio`` is local_merge's rows/s over Spark's.

Run: ``python benches/merge/bench_periodic.py`` (writes benches/results/bench_periodic.json).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import median_time, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark.merge.engines.bounds import flush_bounds  # noqa: E402

SIZES = (30_000, 100_000, 300_000)
KEYS, SLOT, DELAY, PARTITIONS = 100, 60.0, 5.0, 4
AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "m": ("mean", "v")}


def frame(spark: Any, rows: int) -> Any:
    """``rows`` rows over 4 partitions; event times (seconds) shuffled within each partition."""
    df = spark.range(rows, numPartitions=PARTITIONS).selectExpr(
        f"pmod(hash(id, 1), {KEYS}) AS k",
        f"CAST(pmod(hash(id, 2), {rows * 10}) AS DOUBLE) / 100.0 AS t",
        "CAST(pmod(hash(id, 3), 100000) AS DOUBLE) / 100.0 AS v",
    )
    return df.cache()


def spark_groupby(df: Any) -> Any:
    from pyspark.sql import functions as F

    slot = (F.floor(F.col("t") / SLOT) * SLOT).cast("double").alias("slot_start")
    return df.groupBy("k", slot).agg(
        F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"), F.min("v").alias("lo"),
        F.max("v").alias("hi"), F.avg("v").alias("m"))


def noop(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def same_result(got: Any, want: Any) -> bool:
    a = got.toPandas().sort_values(["k", "slot_start"]).reset_index(drop=True)
    b = want.toPandas().sort_values(["k", "slot_start"]).reset_index(drop=True)
    if len(a) != len(b) or a["n"].tolist() != b["n"].tolist():
        return False
    return all(np.allclose(a[c], b[c]) for c in ("s", "lo", "hi", "m"))


def flush_bounds_seconds(rows: int) -> float:
    """The periodic bounds of one partition of ``rows`` shuffled float event times (numpy)."""
    et = np.random.default_rng(0).permutation(rows).astype(np.float64) / 10.0
    start = time.perf_counter()
    flush_bounds(et, "periodic", 0, DELAY, None)
    return time.perf_counter() - start


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    results: dict[str, Any] = {}
    for rows in SIZES:
        df = frame(spark, rows)
        df.count()
        partial = tl.local_merge(df, "k", "t", SLOT, AGGS, "periodic", delay=DELAY)
        merged = tl.merge_partials(partial, ["k", "slot_start"], AGGS)
        native = spark_groupby(df)
        seconds = {
            "local_merge": median_time(lambda: noop(partial), repeat=3),
            "local_merge_then_merge_partials": median_time(lambda: noop(merged), repeat=3),
            "spark_groupby": median_time(lambda: noop(native), repeat=3),
        }
        rates = {name: rows / sec for name, sec in seconds.items()}
        results[str(rows)] = {
            "seconds": seconds,
            "rows_per_s": rates,
            "ratio": rates["local_merge"] / rates["spark_groupby"],
            "ratio_with_merge_partials": (rates["local_merge_then_merge_partials"]
                                          / rates["spark_groupby"]),
            "partial_rows": partial.count(),
            "groups": native.count(),
            "equal_to_spark": same_result(merged, native),
            "flush_bounds_one_partition_s": flush_bounds_seconds(rows),
        }
        df.unpersist()
    spark.stop()
    header = (f"{'rows':>8} {'local_merge rows/s':>19} {'+merge_partials':>16} "
              f"{'spark groupBy rows/s':>21} {'ratio':>6} {'partials':>9} {'equal':>6}")
    print(header)
    for rows, r in results.items():
        rate = r["rows_per_s"]
        print(f"{int(rows):>8} {rate['local_merge']:>19,.0f} "
              f"{rate['local_merge_then_merge_partials']:>16,.0f} "
              f"{rate['spark_groupby']:>21,.0f} {r['ratio']:>6.2f} {r['partial_rows']:>9} "
              f"{str(r['equal_to_spark']):>6}")
    out = {"keys": KEYS, "slot_s": SLOT, "delay_s": DELAY, "partitions": PARTITIONS,
           "master": "local[2]", "aggs": {k: list(v) for k, v in AGGS.items()},
           "sizes": results}
    print(json.dumps(out, indent=1))
    print(write_json("bench_periodic", out))


if __name__ == "__main__":
    main()
