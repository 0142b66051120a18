"""Bounded keyed windows on frames already placed by the key, against Spark's own plans.

20,000 keys, rows in time order per key, 4 partitions, ``local[2]``. Two inputs:

- **placed**: ``df.repartition(4, "k").sortWithinPartitions("t")``: each key's rows in one
  input partition, as a ``key_by`` output or a table written by key leaves them;
- **unplaced**: ``df.repartition(4)``: rows spread round robin, so every plan needs an exchange.

Three plans over the same input, each written to Spark's ``noop`` sink:

- ``groupBy``: ``df.groupBy("k", floor(t / 300)).agg(count, sum)`` (no lateness at all);
- ``spark_sql``: the same semantics as ``keyed_process`` as a user writes it in Spark SQL: a
  running max of ``t`` per key over the earlier rows in arrival order
  (``Window.partitionBy("k").orderBy(monotonically_increasing_id())``), rows later than that
  max minus 10 dropped, then the ``groupBy``;
- ``trilink``: ``tl.keyed_process(df, "k", "t", KeyedWindowAggregate(300, ...), delay=10)``.

Reported per size and input: best of ``--repeat`` wall times, the shuffle exchanges of each
plan, and the ratios trilink / spark_sql and trilink / groupBy. The trilink and spark_sql
outputs are checked to hold the same windows (count and sum per window), once per size.

Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benches/keyed/bench_placed_windows.py``
(writes ``benches/results/placed_windows.json``; ``--rows 2000000,8000000`` by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT))
from common import write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402
from trilink_spark.placement import shuffle_exchanges  # noqa: E402

KEYS = 20_000
PARTITIONS = 4
WINDOW = 300.0
DELAY = 10.0


def source(spark: Any, rows: int) -> Any:
    """``rows`` rows over :data:`KEYS` keys; ``t`` grows with the row id, with jitter of up to
    30 units, so some rows arrive later than the delay allows."""
    from pyspark.sql import functions as F

    base = spark.range(rows, numPartitions=PARTITIONS)
    return base.select(
        (F.col("id") % KEYS).alias("k"),
        (F.floor(F.col("id") / KEYS) * 5.0 + F.rand(7) * 30.0).alias("t"),
        (F.col("id") % 100).cast("double").alias("v"))


def group_by(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy("k", F.floor(F.col("t") / WINDOW).alias("w")).agg(
        F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))


def spark_sql(df: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    pos = df.withColumn("pos", F.monotonically_increasing_id())
    earlier = (Window.partitionBy("k").orderBy("pos")
               .rowsBetween(Window.unboundedPreceding, -1))
    marked = pos.withColumn("wm", F.max("t").over(earlier) - F.lit(DELAY))
    on_time = marked.where(F.col("wm").isNull() | (F.col("t") >= F.col("wm")))
    return group_by(on_time)


def trilink(df: Any) -> Any:
    agg = tl.KeyedWindowAggregate(size=WINDOW, value="v", aggs=("count", "sum"))
    return tl.keyed_process(df, "k", "t", agg, delay=DELAY, num_partitions=PARTITIONS)


PLANS = {"groupBy": group_by, "spark_sql": spark_sql, "trilink": trilink}


def best_of(plan: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plan.write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - start)
    return min(times)


def same_windows(spark: Any, ours: Any, theirs: Any) -> bool:
    """Whether both plans give the same (key, window, count, sum) rows."""
    from pyspark.sql import functions as F

    a = ours.select(F.col("k"), F.floor(F.col("window_start") / WINDOW).alias("w"),
                    F.col("count").alias("n"), F.col("sum").alias("s"))
    b = theirs.select("k", "w", "n", "s")
    return bool(a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="2000000,8000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="placed_windows")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.rows.split(",") if x.strip()]
    spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS,
                           extra_conf={"spark.driver.memory": "6g",
                                       "spark.ui.enabled": "false"})
    out: dict[str, Any] = {"keys": KEYS, "partitions": PARTITIONS, "window": WINDOW,
                           "delay": DELAY, "repeat": args.repeat, "sizes": {}}
    for rows in sizes:
        src = source(spark, rows)
        path = f"/tmp/tl-placed-windows-{rows}"
        src.write.mode("overwrite").parquet(path)
        data = spark.read.parquet(path)
        inputs = {"placed": data.repartition(PARTITIONS, "k").sortWithinPartitions("t"),
                  "unplaced": data.repartition(PARTITIONS)}
        size_out: dict[str, Any] = {}
        for name, df in inputs.items():
            plans = {p: fn(df) for p, fn in PLANS.items()}
            row = {p: {"seconds": best_of(plan, args.repeat),
                       "exchanges": shuffle_exchanges(plan)} for p, plan in plans.items()}
            row["trilink_vs_spark_sql"] = row["trilink"]["seconds"] / row["spark_sql"]["seconds"]
            row["trilink_vs_group_by"] = row["trilink"]["seconds"] / row["groupBy"]["seconds"]
            row["same_windows"] = same_windows(spark, plans["trilink"], plans["spark_sql"])
            size_out[name] = row
            print(f"{rows:>9} {name:>9}: " + "  ".join(
                f"{p} {row[p]['seconds']:.2f} s ({row[p]['exchanges']} exch)" for p in PLANS)
                + f"  ours/sql {row['trilink_vs_spark_sql']:.2f}"
                f"  ours/groupBy {row['trilink_vs_group_by']:.2f}"
                f"  same {row['same_windows']}", flush=True)
        out["sizes"][str(rows)] = size_out
    print(write_json(args.out, out))


if __name__ == "__main__":
    main()
