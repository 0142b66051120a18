"""The driver of ``test_locality.py``: a keyed run fed by hand on a standalone cluster.

Usage: ``python locality_driver.py MASTER_URL WORK LOCALITY KILL_AFTER``. Runs
``keyed_foreach_batch`` with a running count per key on 4 partitions for ``BATCHES`` batches
with ``spark.trilink.state.locality=LOCALITY``. With ``KILL_AFTER`` > 0, after that batch it
kills (SIGKILL) the executor that ran partition 0, and the run goes on. Prints one JSON line:
per batch the tasks' sync kinds and executors and each partition's newest incremental snapshot
(``spark.trilink.state.snapshotInterval=2``), the runner's locality counts, whether the final
state equals the input's counts and whether every file a kept snapshot lists is there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.keyed.run.streaming import read_state_values
from trilink_spark.state.incremental import TABLES_DIR, read_record


def tables(store: Any) -> list[int | None]:
    """Each partition's newest incremental snapshot (None: none yet)."""
    out: list[int | None] = []
    for p in range(4):
        found = [v for v in store.listing(p)[0] if read_record(store, p, v) is not None]
        out.append(max(found, default=None))
    return out


def referenced_present(store: Any) -> bool:
    """Whether every file each remaining snapshot record lists is there with its size."""
    for p in range(4):
        for v in store.listing(p)[0]:
            record = read_record(store, p, v)
            for f in (record or {"files": []})["files"]:
                path = Path(store.partition_dir(p)) / TABLES_DIR / f["blob"]
                if not path.exists() or path.stat().st_size != f["size"]:
                    return False
    return True

class Count(tl.KeyedWatermarkProcessFunction):
    """Defined here, not imported: the executors unpickle it by value from ``__main__``."""

    output_schema = "k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(key, n)]

BATCHES = 8
KEYS = 2000
ROWS = 3000


def executor_pid(app: str, executor: str) -> int | None:
    """The pid of this application's executor JVM ``executor`` (from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv]
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in words:
            continue
        if app in words and executor in words and \
                words[words.index("--executor-id") + 1] == executor:
            return int(entry.name)
    return None


def main() -> None:
    master, work, locality, kill_after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    spark = (SparkSession.builder.master(master).appName("locality")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.trilink.state.locality", locality)
             .config("spark.trilink.state.snapshotInterval", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    app = spark.sparkContext.applicationId
    run = tl.keyed_foreach_batch(lambda df, b: df.write.format("noop").mode("overwrite").save(),
                                 "k", "t", Count(), 1000.0, os.path.join(work, "state"),
                                 num_partitions=4)
    truth: Counter[str] = Counter()
    batches = []
    killed = None
    for b in range(BATCHES):
        pdf = pd.DataFrame({"k": [f"k{(b * 7919 + i * 31) % KEYS}" for i in range(ROWS)],
                            "t": [float(b)] * ROWS})
        truth.update(pdf["k"])
        started = time.perf_counter()
        run(spark.createDataFrame(pdf).repartition(3), b)
        t = run.task_timings()
        batches.append({"batch": b, "seconds": round(time.perf_counter() - started, 3),
                        "sync": [str(s) for s in t["sync"]],
                        "executors": [str(e) for e in t["executor"]],
                        "tables": tables(run.store)})
        if kill_after and b == kill_after:
            victim = batches[-1]["executors"][0]
            pid = executor_pid(app, victim)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = victim
            time.sleep(2)
    # snapshots are written off the tasks, at the lowest priority: on a busy machine the last
    # ones land after the last batch, so they are waited for (bounded), not raced
    deadline = time.monotonic() + 120.0
    while None in tables(run.store) and time.monotonic() < deadline:
        time.sleep(0.5)
    final = {k: v["n"] for k, v in read_state_values(run.store).items()}
    print(json.dumps({"batches": batches, "locality": dict(run.locality), "killed": killed,
                      "exact": final == dict(truth), "keys": len(final),
                      "tables_final": tables(run.store),
                      "referenced_present": referenced_present(run.store)}))
    spark.stop()


if __name__ == "__main__":
    main()
