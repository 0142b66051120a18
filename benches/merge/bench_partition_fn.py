"""Local Merge's partition function alone: Arrow batches aggregated as they arrive
(``ArrowMerge``) against the whole-partition pandas pass it replaces, in one process.

No Spark job: the partition functions are called on the Arrow batches a task would receive
(10,000 rows each, Spark's default), so the figure is the operator's own work per row without
the JVM-to-Python transfer (``bench_throughput.py`` measures the whole job). Workload of §7:
sensors x readings in time order, 100-second slots, count and min of the voltage; "dense" has
200 readings per sensor per slot, "sparse" one reading per (sensor, slot) in most groups.
Three sizes show the cost is linear. Best of 3 runs each.

Run: ``python benches/merge/bench_partition_fn.py [--sizes 250000,1000000,4000000]``
(writes benches/results/partition_fn.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from trilink_spark.columns import ET_COL  # noqa: E402
from trilink_spark.merge.engines.local import plan_merge  # noqa: E402


def _batches(rows: int, dense: bool, seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    if dense:  # 200 readings per sensor per 100-s slot, one per half second
        sensors = max(1, rows // 200)
        t = np.repeat(np.arange(200) * 0.5, sensors)[:rows]
        k = np.tile(np.arange(sensors), 200)[:rows]
    else:  # one reading per sensor per slot
        k = rng.integers(0, rows // 4 + 1, rows)
        t = np.sort(rng.uniform(0, 400.0, rows))
    table = pa.table({"sensor": k, "volts": rng.normal(size=rows), ET_COL: t})
    return table.to_batches(max_chunksize=10_000)


def _best(fn: Any, batches: list[Any], repeat: int) -> tuple[float, int, int]:
    """Best seconds, partial rows out and the rows they count (their ``n``)."""
    best, out, counted = float("inf"), 0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        tables = list(fn(iter(batches)))
        best = min(best, time.perf_counter() - start)
        out = sum(b.num_rows for b in tables)
        counted = sum(int(b.column("n").to_numpy().sum()) for b in tables)
    return best, out, counted


def main() -> None:
    from pyspark.sql import SparkSession

    from trilink_spark.merge.engines.arrow_engine import arrow_merge_partition
    from trilink_spark.merge.engines.pandas_engine import merge_partition

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250000,1000000,4000000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    df = spark.createDataFrame(pd.DataFrame({"sensor": [0], "ts": [0.0], "volts": [0.0]}))
    _, plan = plan_merge(df, "sensor", "ts", 100.0,
                         {"n": ("count", None), "lo": ("min", "volts")})
    spark.stop()
    results = []
    for dense in (True, False):
        for rows in [int(s) for s in args.sizes.split(",")]:
            batches = _batches(rows, dense)
            pandas_s, pandas_out, pandas_n = _best(merge_partition(plan), batches,
                                                   args.repeat)
            arrow_s, arrow_out, arrow_n = _best(arrow_merge_partition(plan), batches,
                                                args.repeat)
            if pandas_n != rows or arrow_n != rows:  # every row counted once by both
                raise SystemExit(f"rows counted: pandas {pandas_n}, arrow {arrow_n} of {rows}")
            # past max_groups groups a partition flushes several times: the pandas pass cuts
            # at the row, the Arrow path before a batch, so their partial rows may differ
            entry = {"workload": "dense" if dense else "sparse", "rows": rows,
                     "partial_rows": arrow_out, "pandas_partial_rows": pandas_out,
                     "pandas_seconds": round(pandas_s, 4),
                     "arrow_seconds": round(arrow_s, 4),
                     "speedup": round(pandas_s / arrow_s, 2),
                     "arrow_rows_per_s": round(rows / arrow_s),
                     "pandas_rows_per_s": round(rows / pandas_s)}
            print(entry, flush=True)
            results.append(entry)
    write_json("partition_fn", {"benchmark": "local_merge partition function",
                                "command": "python benches/merge/bench_partition_fn.py",
                                "results": results})


if __name__ == "__main__":
    main()
