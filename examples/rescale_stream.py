"""Rescale a stateful stream while it runs: 4 -> 6 -> 3 partitions, state moved exactly once.

A Structured Streaming query counts events per user with a keyed process function whose
state (one running count per user) lives in a trilink-spark state path. Between micro-batches
the job asks for a different partition count; at the next batch boundary only the users whose
partition changes move, with their state, and the query never stops. At the end every user's
stored count equals the number of events it sent.

Run: ``python examples/rescale_stream.py`` (local Spark, no servers).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import trilink_spark as tl
from trilink_spark.keyed import KeyedContext


class RunningCount(tl.KeyedWatermarkProcessFunction):
    """Each user's running count, in a typed state column."""

    output_schema = "user string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(key, n)]


def events(batch: int, rows: int = 2000, users: int = 300, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed + batch)
    weights = 1.0 / np.arange(1, users + 1) ** 1.0  # a few heavy users
    user = rng.choice(users, size=rows, p=weights / weights.sum())
    return pd.DataFrame({"user": [f"u{u:04d}" for u in user],
                         "ts": np.arange(batch * rows, (batch + 1) * rows, dtype=np.int64)})


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    work = Path(tempfile.mkdtemp(prefix="trilink-rescale-"))
    (work / "in").mkdir()
    run = tl.keyed_foreach_batch(lambda out, batch_id: out.write.format("noop")
                                 .mode("overwrite").save(),
                                 "user", "ts", RunningCount(), delay=10**9,
                                 state_path=str(work / "state"), num_partitions=4)
    stream = (spark.readStream.schema("user string, ts long").option("maxFilesPerTrigger", 1)
              .parquet(str(work / "in")))
    query = (stream.writeStream.foreachBatch(run)
             .option("checkpointLocation", str(work / "checkpoint")).start())
    sent = pd.Series(dtype="int64")
    try:
        for batch in range(6):
            if batch == 2:
                run.request_swap(num_partitions=6)  # at the next batch boundary
            if batch == 4:
                run.request_swap(num_partitions=3)
            frame = events(batch)
            frame.to_parquet(work / "in" / f"events-{batch}.parquet")
            query.processAllAvailable()
            sent = sent.add(frame["user"].value_counts(), fill_value=0)
    finally:
        query.stop()
    for report in run.swaps:
        print(f"batch {report.batch_id}: {report.partitions_before} -> "
              f"{report.partitions_after} partitions, moved {report.moved_keys} of "
              f"{report.keys_total} users ({report.moved_bytes} bytes)")
    owners = run.owners()  # refuses a user stored in two partitions
    stored = {user: values["n"] for user, values in run.state_values().items()}
    exact = stored == {k: int(v) for k, v in sent.items()}
    print(f"users {len(owners)} partitions {sorted(set(owners.values()))} "
          f"query restarted: no, counts exact: {exact}")


if __name__ == "__main__":
    main()
    sys.exit(0)
