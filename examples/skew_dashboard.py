"""Watch a skewed stream on a live page, and a swap fix its placement while it runs.

A Structured Streaming query counts clicks per user with a keyed process function; one user
sends 40 % of the clicks. It starts on Spark's hash placement over 4 partitions, so the
partition holding the heavy user (and a quarter of the rest) does most of the work.
``tl.dashboard`` shows, after every micro-batch: rows and task time per partition, the
balance degree beside the keyed bound (the best any placement that keeps keys whole could
reach), what every candidate strategy would give, the hottest users and where they live,
late rows by key against partition watermark, and where the bottleneck is (with DS2's
parallelism). Half way through, the job asks for a swap to
``least_count``: the request and the swap (users moved, bytes, pause) appear on the page's
timeline, and the balance degree rises towards the bound.

Run: ``python examples/skew_dashboard.py [--batches 20] [--pause 1.5]`` (local Spark, no
servers; needs the ``[ui]`` extra) and open the printed address.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import trilink_spark as tl
from trilink_spark.advice import BottleneckAdvisor
from trilink_spark.keyed import KeyedContext

if __name__ != "__main__":  # imported (a test, a benchmark): ship ClickCount by value
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ClickCount(tl.KeyedWatermarkProcessFunction):
    """Each user's running click count, in a typed state column."""

    output_schema = "user string, clicks long"
    state_schema = "clicks long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("clicks", 0) + len(rows)
        ctx.set_state("clicks", n)
        return [(key, n)]


def clicks(batch: int, rows: int = 4000, users: int = 400, hot_share: float = 0.4,
           seed: int = 11) -> pd.DataFrame:
    """One batch of clicks: ``hot_share`` of them by the user ``u0000``, the rest spread over
    ``users`` others; event times a second apart per batch, slightly out of order."""
    rng = np.random.default_rng(seed + batch)
    user = np.where(rng.random(rows) < hot_share, 0, rng.integers(1, users + 1, rows))
    ts = batch * 1000 + np.sort(rng.integers(0, 1000, rows)) - rng.integers(0, 30, rows)
    return pd.DataFrame({"user": [f"u{u:04d}" for u in user], "ts": ts.astype(np.int64)})


class SkewedStream:
    """The example's query: a file source fed one parquet file per :meth:`push`, a keyed
    running count on ``strategy``'s placement, its state under ``work``."""

    def __init__(self, spark: Any, work: Path, partitions: int = 4,
                 strategy: str = "hash") -> None:
        (work / "in").mkdir(parents=True, exist_ok=True)
        self.work = work
        self.run = tl.keyed_foreach_batch(
            lambda out, batch_id: out.write.format("noop").mode("overwrite").save(),
            "user", "ts", ClickCount(), delay=20, state_path=str(work / "state"),
            num_partitions=partitions, strategy=strategy)
        source = (spark.readStream.schema("user string, ts long")
                  .option("maxFilesPerTrigger", 1).parquet(str(work / "in")))
        self.query = (source.writeStream.foreachBatch(self.run).queryName("clicks")
                      .option("checkpointLocation", str(work / "checkpoint")).start())
        self.pushed = 0

    def push(self, rows: int = 4000) -> None:
        """Write the next batch's file and wait until the query processed it."""
        clicks(self.pushed, rows).to_parquet(self.work / "in" / f"clicks-{self.pushed:05d}.parquet")
        self.pushed += 1
        self.query.processAllAvailable()

    def stop(self) -> None:
        self.query.stop()


def main(batches: int = 20, pause: float = 1.5) -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    stream = SkewedStream(spark, Path(tempfile.mkdtemp(prefix="trilink-dashboard-")))
    url = tl.dashboard(spark, runs={"clicks": stream.run}, advisors=[BottleneckAdvisor()])
    print(f"dashboard: {url}")
    try:
        for b in range(batches):
            if b == batches // 2:
                stream.run.request_swap("least_count", refit="none")
                print(f"batch {b}: swap to least_count requested")
            stream.push()
            time.sleep(pause)
        for report in stream.run.swaps:
            print(f"swap at batch {report.batch_id}: moved {report.moved_keys} of "
                  f"{report.keys_total} users ({report.moved_bytes} bytes) in "
                  f"{report.seconds:.2f} s")
    finally:
        stream.stop()
        url.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--pause", type=float, default=1.5,
                        help="seconds between batches, to watch the page")
    args = parser.parse_args()
    main(args.batches, args.pause)
    sys.exit(0)
