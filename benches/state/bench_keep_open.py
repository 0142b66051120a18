"""Local copies held open between batches against opened and closed by every task.

``keyed_foreach_batch`` with a running count per key (long ids) on 4 partitions, K keys
loaded (one row each, in batches of at most 1M), then steady batches of 20,000 rows on 20,000
random keys. Two runners get the same batches, one with ``spark.trilink.state.keepOpen=true``
(the default: a task leaves its copy open in its Python worker; the next task of the
partition there takes it as it is, another process has it closed on request), one with
``false`` (each task opens its copy, waits for RocksDB's compaction and closes it). They run
alternately, batch by batch, so both see the same machine.

Reported per K and variant: the median wall time of a steady batch (the driver's call,
plan to commit), the median of the tasks' ``upkeep_ms`` (the copy's upkeep: a snapshot's
start, the flush, the compaction wait, the close), and the share of tasks whose process time
it is.

Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benches/state/bench_keep_open.py``
(writes benches/results/keep_open.json; ``--keys 10000,100000,1000000 --batches 12`` by
default, about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import long_count, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

LOAD_CHUNK = 1_000_000
ROWS = 20_000


def run_size(spark: Any, keys: int, batches: int, work: Path) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for keep in ("true", "false"):
        spark.conf.set("spark.trilink.state.localDir", str(work / keep / "local"))
        spark.conf.set("spark.trilink.state.keepOpen", keep)
        runs[keep] = tl.keyed_foreach_batch(
            lambda df, b: df.write.format("noop").mode("overwrite").save(), "k", "t", long_count(),
            10**15, str(work / keep / "state"), num_partitions=4)
    frames = [spark.range(s, min(keys, s + LOAD_CHUNK)).selectExpr("id AS k", "id AS t")
              for s in range(0, keys, LOAD_CHUNK)]
    walls: dict[str, list[float]] = {"true": [], "false": []}
    upkeep: dict[str, list[float]] = {"true": [], "false": []}
    share: dict[str, list[float]] = {"true": [], "false": []}
    for b in range(len(frames) + batches):
        if b < len(frames):
            df = frames[b]
        else:
            df = spark.range(0, ROWS).selectExpr(
                f"CAST(rand({b}) * {keys} AS BIGINT) AS k", f"id + {keys + b * ROWS} AS t")
        for keep in (("true", "false") if b % 2 else ("false", "true")):
            spark.conf.set("spark.trilink.state.localDir", str(work / keep / "local"))
            spark.conf.set("spark.trilink.state.keepOpen", keep)
            started = time.perf_counter()
            runs[keep](df, b)
            wall = time.perf_counter() - started
            if b >= len(frames):
                timings = runs[keep].task_timings()
                walls[keep].append(wall)
                upkeep[keep].extend(timings["upkeep_ms"].tolist())
                total = timings["process_ms"] + timings["upkeep_ms"]
                share[keep].append(float(timings["upkeep_ms"].sum() / max(total.sum(), 1e-9)))
    out = {}
    for keep in ("true", "false"):
        out[f"keep_open={keep}"] = {
            "median_batch_s": statistics.median(walls[keep]), "batch_s": walls[keep],
            "median_upkeep_ms": statistics.median(upkeep[keep]),
            "upkeep_share": statistics.median(share[keep])}
    out["batch_ratio_keep_over_close"] = (out["keep_open=true"]["median_batch_s"]
                                          / out["keep_open=false"]["median_batch_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", default="10000,100000,1000000")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--out", default="keep_open")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-keep-open")
             .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, Any] = {"sizes": {}}
    try:
        for keys in [int(k) for k in args.keys.split(",") if k.strip()]:
            work = Path(tempfile.mkdtemp(prefix="keep-open-"))
            try:
                found = run_size(spark, keys, args.batches, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results["sizes"][str(keys)] = found
            for name in ("keep_open=true", "keep_open=false"):
                v = found[name]
                print(f"K={keys:>9,} {name:16s} median batch {v['median_batch_s']:.3f} s, "
                      f"median upkeep {v['median_upkeep_ms']:.1f} ms/task "
                      f"({v['upkeep_share']:.1%} of task time)", flush=True)
            print(f"K={keys:>9,} keep/close {found['batch_ratio_keep_over_close']:.3f}",
                  flush=True)
    finally:
        spark.stop()
    print(write_json(args.out, results))


if __name__ == "__main__":
    main()
