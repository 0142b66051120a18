"""Per-row cost of the trilink operators beside Spark's own, at three sizes.

The workload of ``bench_merge.py`` (sensors x readings, 100-second slots, count and min of the
voltage), at 0.5M, 2M and 8M rows, on ``local[2]``. Each pair runs in the same session, one
after the other, several times; the fastest run of each counts:

- ``local_merge`` alone (its output written to Spark's ``noop`` sink) against Spark's native
  ``groupBy(key, slot).agg(count, min)`` on the same input, with each engine (``"python"``,
  the per-partition merge; ``"spark"``, Spark's partial aggregation);
- ``keyed_process`` with ``KeyedWindowAggregate`` against the same native windowed group-by,
  on its default engine (the Spark plan, no Python worker) and on the Python runtime;
- pipeline (c) of ``bench_merge.py`` (``local_merge``, then one keyed stage that sums the
  partial counts and takes the least of the partial minima) against (b), with each
  ``local_merge`` engine;
- ``global_merge`` to the driver against ``groupBy(key).agg(count, min)`` collected.

Also the floor every Python operator pays: the same rows through an empty ``mapInArrow``
(JVM -> Arrow -> Python and nothing back). Reported: seconds, the ratio to the native
operator, and rows/s per core (rows / seconds / 2).

Run: ``python benches/merge/bench_throughput.py [--sizes 500000,2000000,8000000]``
(writes benches/results/throughput.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import best_time, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402

WINDOW = 100
CORES = 2


def measure(spark: Any, rows: int, repeat: int, only: list[str]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = (spark.range(rows, numPartitions=8)
          .selectExpr("id DIV 200 AS sensor", "id % 200 AS t",
                      "CAST(220 + (id * 7919 % 1000) / 100.0 - IF(id % 997 = 0, 40, 0) "
                      "AS DOUBLE) AS volts")
          .cache())
    df.count()

    def noop(frame: Any) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def drop(batches: Any) -> Any:
        for batch in batches:
            yield batch.slice(0, 0)

    slot = (F.floor(F.col("t") / WINDOW) * WINDOW).alias("start")
    aggs = {"n": ("count", None), "low": ("min", "volts")}
    kwa = tl.KeyedWindowAggregate(WINDOW, value="volts", aggs=("count", "min"))
    # the keyed stage of (c) merges both partial columns: the partials have one consumer
    merged = tl.KeyedWindowAggregate(WINDOW, aggs={"n": ("sum", "n"), "low": ("min", "low")})

    def native_windows() -> None:
        noop(df.groupBy(slot, "sensor").agg(F.count(F.lit(1)).alias("n"),
                                            F.min("volts").alias("low")))

    def pipeline_c(engine: str) -> None:
        if engine == "spark":  # the groups mode: Spark's partial aggregation
            partial = tl.local_merge(df, "sensor", "t", WINDOW, aggs, engine="spark")
        else:
            partial = tl.local_merge(df, "sensor", "t", WINDOW, aggs, quantity=10_000,
                                     engine="python")
        # partial rows come in no set order: the keyed stage takes them in slot order
        noop(tl.keyed_process(partial, "sensor", "t", merged, delay=0, num_partitions=8,
                              order_by="slot_start"))

    pairs: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "local_merge": (lambda: noop(tl.local_merge(df, "sensor", "t", WINDOW, aggs,
                                                    quantity=10_000, engine="python")),
                        native_windows),
        "local_merge_default": (lambda: noop(tl.local_merge(df, "sensor", "t", WINDOW, aggs)),
                                native_windows),
        "local_merge_spark": (lambda: noop(tl.local_merge(df, "sensor", "t", WINDOW, aggs,
                                                          engine="spark")), native_windows),
        "keyed_process": (lambda: noop(tl.keyed_process(df, "sensor", "t", kwa, delay=0,
                                                        num_partitions=8)), native_windows),
        "keyed_process_python": (lambda: noop(tl.keyed_process(
            df, "sensor", "t", kwa, delay=0, num_partitions=8, engine="python")),
            native_windows),
        "pipeline_c_vs_b": (lambda: pipeline_c("python"), native_windows),
        "pipeline_c_spark_vs_b": (lambda: pipeline_c("spark"), native_windows),
        "global_merge_driver": (
            lambda: tl.global_merge(df, "sensor", aggs).count(),
            lambda: df.groupBy("sensor").agg(F.count(F.lit(1)).alias("n"),
                                             F.min("volts").alias("low")).toPandas()),
        "arrow_floor": (lambda: noop(df.mapInArrow(drop, df.schema)), native_windows),
    }
    out: dict[str, Any] = {"rows": rows}
    for name, (ours, native) in pairs.items():
        if only and name not in only:
            continue
        mine, theirs = best_time(ours, repeat), best_time(native, repeat)
        out[name] = {"seconds": round(mine, 3), "native_seconds": round(theirs, 3),
                     "ratio": round(mine / theirs, 2),
                     "rows_per_s_per_core": round(rows / mine / CORES),
                     "native_rows_per_s_per_core": round(rows / theirs / CORES)}
        print(rows, name, json.dumps(out[name]), flush=True)
    df.unpersist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500000,2000000,8000000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--name", default="throughput")
    parser.add_argument("--only", default="", help="comma-separated pair names (default all)")
    args = parser.parse_args()
    spark = tl.get_session("local[2]", shuffle_partitions=8,
                           extra_conf={"spark.driver.memory": "6g"})
    sizes = [int(s) for s in args.sizes.split(",")]
    result = {"cores": CORES, "window_s": WINDOW, "repeat": args.repeat,
              "sizes": [measure(spark, n, args.repeat, [p for p in args.only.split(",") if p])
                        for n in sizes]}
    spark.stop()
    print(write_json(args.name, result))


if __name__ == "__main__":
    main()
