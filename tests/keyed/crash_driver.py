"""A streaming driver for the crash tests: a keyed count over a file stream, which kills its
own process with SIGKILL at a named step of a named batch (``none``: it runs to the end).

Usage: ``python crash_driver.py WORK KILL_STEP KILL_BATCH [SWAP_AT [PARTITIONS]]``. KILL_STEP is ``sink``
(the batch's output is written, its state not committed), ``commit`` (the state committed,
Spark's own commit not) or ``none``. SWAP_AT: after that batch, request a rescale to 5
partitions (a swap at the next batch). PARTITIONS: the ``num_partitions`` it starts with (default 3;
another value at a restart swaps to it).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession

import trilink_spark as tl

WORK, STEP, AT, SWAP_AT, PARTITIONS = "", "none", -1, -1, 3  # set by main() from argv


class Count(tl.KeyedWatermarkProcessFunction):
    output_schema = "k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(key, n)]


def die(step: str, batch_id: int) -> None:
    if step == STEP and batch_id == AT:
        os.kill(os.getpid(), signal.SIGKILL)


def sink(df: Any, batch_id: int) -> None:
    rows = df.toPandas()
    tmp = os.path.join(WORK, "out", f".b{batch_id}.parquet")
    rows.to_parquet(tmp)
    os.replace(tmp, os.path.join(WORK, "out", f"b{batch_id}.parquet"))  # idempotent
    die("sink", batch_id)


def main() -> None:
    global WORK, STEP, AT, SWAP_AT, PARTITIONS
    WORK, STEP, AT = sys.argv[1], sys.argv[2], int(sys.argv[3])
    SWAP_AT = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    PARTITIONS = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    spark = (SparkSession.builder.master("local[2]").appName("crash-driver")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.trilink.state.localDir", os.path.join(WORK, "local"))
             .config("spark.trilink.state.snapshotInterval", "3")
             .getOrCreate())
    os.makedirs(os.path.join(WORK, "out"), exist_ok=True)
    run = tl.keyed_foreach_batch(sink, "k", "t", Count(), 1000.0,
                                 os.path.join(WORK, "state"), num_partitions=PARTITIONS,
                                 strategy=tl.BlockPartitioner(3))

    def batch(df: Any, batch_id: int) -> None:
        run(df, batch_id)
        if batch_id == SWAP_AT:
            run.request_swap(num_partitions=5)
        die("commit", batch_id)

    query = (spark.readStream.schema("k string, t double").option("maxFilesPerTrigger", 1)
             .parquet(os.path.join(WORK, "in")).writeStream.foreachBatch(batch)
             .option("checkpointLocation", os.path.join(WORK, "ckpt")).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
