"""key_by over far more partitions than the data fills: cost against the partition count.

``key_by(df, "k", "hash", 10_000)`` then ``count()``, at four input sizes, in one run:

- ``key_by`` (``compact="auto"``, the default): one task per non-empty partition when at most
  half of the partitions hold rows;
- ``key_by(compact="never")``: one task per partition, as before;
- Spark's own ``df.repartition(10_000, "k")``, the baseline a user would write.

Reports seconds per (placement + count), the tasks of the last stage and the ratios. At
1,000,000 rows every partition holds rows, so nothing is compacted and the figure shows the
cost of the job that looks for empty partitions.

Run: ``python benches/placement/bench_many_partitions.py`` (writes
benches/results/many_partitions.json).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark._internal.spark.compat import num_partitions  # noqa: E402

N = 10_000
SIZES = (100, 1_000, 4_000, 1_000_000)


def timed(make) -> tuple[float, int]:
    start = time.perf_counter()
    df = make()
    df.count()
    return time.perf_counter() - start, num_partitions(df)


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    warm = spark.range(1000).selectExpr("cast(id as string) k")
    warm.repartition(200, "k").count()
    rows = []
    for size in SIZES:
        df = spark.range(size).selectExpr("cast(id as string) k", "id v").cache()
        df.count()
        ours, ours_tasks = timed(lambda: tl.key_by(df, "k", "hash", N))
        never, never_tasks = timed(lambda: tl.key_by(df, "k", "hash", N, compact="never"))
        spark_s, spark_tasks = timed(lambda: df.repartition(N, "k"))
        df.unpersist()
        row = {
            "rows": size,
            "num_partitions": N,
            "key_by_s": round(ours, 3),
            "key_by_tasks": ours_tasks,
            "key_by_never_s": round(never, 3),
            "key_by_never_tasks": never_tasks,
            "spark_repartition_s": round(spark_s, 3),
            "spark_repartition_tasks": spark_tasks,
            "ratio_vs_spark": round(ours / spark_s, 3),
            "ratio_vs_never": round(ours / never, 3),
        }
        rows.append(row)
        print(row, flush=True)
    path = write_json("many_partitions", {"rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
