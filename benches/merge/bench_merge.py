"""Seed 002 Figure 17: what Local Merge and Global Merge save on a keyed shuffle.

A low-voltage-detection-like workload: 10,000 sensors x 200 readings (2,000,000 rows), one per
second, almost all normal; per sensor and 100-second window, the number of readings and the
lowest voltage. Input partitions hold disjoint groups of sensors, as Kafka partitions keyed by
sensor would. Four ways, in one run:

(a) a stateful keyed pipeline with no pre-aggregation: ``keyed_process`` with
    ``KeyedWindowAggregate`` (every raw row crosses the keyed exchange);
(b) Spark's native ``groupBy(window, sensor).agg(count, min)`` (map-side partial aggregation);
(c) ``local_merge`` (quantity mode) in front of the same stateful pipeline, which then sums
    the partial counts and takes the min of the partial minima;
(d) ``global_merge`` into Redis (quantity mode, no exchange), with Redis round trips counted.

Shuffle bytes are Spark's shuffle-write metrics (REST API of the driver UI on 127.0.0.1).
Every variant's result is compared with (a)'s.

Run: ``python benches/merge/bench_merge.py`` (needs ``redis-server``; writes
benches/results/merge.json).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import run, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark.merge import RedisStore  # noqa: E402
from trilink_spark.placement import shuffle_exchanges  # noqa: E402
from trilink_spark.testing import redis_server  # noqa: E402

SENSORS, READINGS, WINDOW = 10_000, 200, 100


def session() -> Any:
    return tl.get_session("local[2]", shuffle_partitions=8, extra_conf={
        "spark.ui.enabled": "true", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.memory": "4g",
    })


def normalise(frame: pd.DataFrame, count: str, low: str) -> pd.DataFrame:
    out = frame.rename(columns={count: "n", low: "low"})[["sensor", "start", "n", "low"]]
    return out.sort_values(["sensor", "start"]).reset_index(drop=True)


def main() -> None:
    from pyspark.sql import functions as F

    spark = session()
    rows = SENSORS * READINGS
    df = (spark.range(rows, numPartitions=8)
          .selectExpr("id DIV 200 AS sensor", "id % 200 AS t",
                      "CAST(220 + (id * 7919 % 1000) / 100.0 - IF(id % 997 = 0, 40, 0) AS DOUBLE)"
                      " AS volts")
          .cache())
    df.count()
    out: dict[str, Any] = {"rows": rows, "sensors": SENSORS, "window_s": WINDOW}

    agg_a = tl.KeyedWindowAggregate(WINDOW, value="volts", aggs=("count", "min"))
    a, sec_a, bytes_a = run(spark, "fig17-a", lambda: tl.keyed_process(
        df, "sensor", "t", agg_a, delay=0, num_partitions=8).toPandas())
    a = normalise(a.rename(columns={"window_start": "start"}), "count", "min")

    b, sec_b, bytes_b = run(spark, "fig17-b", lambda: df.groupBy(
        (F.floor(F.col("t") / WINDOW) * WINDOW).alias("start"), "sensor").agg(
        F.count(F.lit(1)).alias("n"), F.min("volts").alias("low")).toPandas())
    b = normalise(b, "n", "low")

    aggs = {"n": ("count", None), "low": ("min", "volts")}
    # one keyed stage merges both partial columns, so the partials have one consumer
    agg_c = tl.KeyedWindowAggregate(WINDOW, aggs={"n": ("sum", "n"), "low": ("min", "low")})

    def local_then_keyed() -> pd.DataFrame:
        partial = tl.local_merge(df, "sensor", "t", WINDOW, aggs, quantity=10_000)
        # partial rows come in no set order: the keyed stage takes them in slot order
        return tl.keyed_process(partial, "sensor", "t", agg_c, delay=0, num_partitions=8,
                                order_by="slot_start").toPandas()

    c, sec_c, bytes_c = run(spark, "fig17-c", local_then_keyed)
    c = normalise(c.rename(columns={"window_start": "start"}), "n", "low")
    c["n"] = c["n"].astype("int64")

    with redis_server() as url:
        store = RedisStore(url, "fig17")
        keyed = df.withColumn("sensor_window",
                              F.concat_ws(":", "sensor", (F.floor(F.col("t") / WINDOW) * WINDOW)))
        d, sec_d, bytes_d = run(spark, "fig17-d", lambda: tl.global_merge(
            keyed, "sensor_window", aggs, store=store, batch_id=0).toPandas())
        round_trips = store.applied_flushes() + 2  # flushes, the key type, and the read
        d[["sensor", "start"]] = d["sensor_window"].str.split(":", expand=True).astype("int64")
        d = normalise(d, "n", "low")
    partial_plan = tl.local_merge(df, "sensor", "t", WINDOW, aggs, engine="python")  # no exchange
    equal = {name: bool((x["n"].to_numpy() == a["n"].to_numpy()).all()
                        and (abs(x["low"] - a["low"]) < 1e-9).all() and len(x) == len(a))
             for name, x in (("b", b), ("c", c), ("d", d))}
    out["variants"] = {
        "a_keyed_no_merge": {"seconds": sec_a, "shuffle_bytes": bytes_a},
        "b_spark_groupby": {"seconds": sec_b, "shuffle_bytes": bytes_b},
        "c_local_merge": {"seconds": sec_c, "shuffle_bytes": bytes_c,
                          "share_of_a": bytes_c / bytes_a},
        "d_global_merge_redis": {"seconds": sec_d, "shuffle_bytes": bytes_d,
                                 "redis_round_trips": round_trips,
                                 "round_trips_per_1000_rows": round_trips / rows * 1000},
    }
    out["equal_to_a"] = equal
    out["local_merge_exchanges"] = shuffle_exchanges(partial_plan)
    print(json.dumps(out, indent=1))
    df.unpersist()
    spark.stop()
    print(write_json("merge", out))


if __name__ == "__main__":
    main()
