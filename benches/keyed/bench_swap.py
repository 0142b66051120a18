"""Online keyed-state swap (4 -> 8 partitions) against Spark's offline state repartition.

Running counts per key (``KEYS`` keys), state on 4 partitions, rescaled to 8. The same input
files feed every query, one file per micro-batch (``maxFilesPerTrigger=1``; each file is moved
into the source directory and the query drained with ``processAllAvailable``):

- file 0 seeds the state (one row per key, so every key has state), files 1.. are steady
  batches of ``ROWS`` rows on uniformly drawn keys;
- trilink: ``keyed_foreach_batch`` with a ``Count`` processor (``state_schema = "n long"``),
  ``strategy=tl.BlockPartitioner(4)`` (the placement for state that will rescale: 4,096
  blocks, a block table computed in the JVM); after the steady batches
  ``run.request_swap(num_partitions=8, mode="sync")`` (or ``mode="fluid",
  max_keys_per_batch=<a quarter of the keys to move>``, which moves whole blocks) and the next
  batches run while the query keeps going;
- trilink on ``num_partitions=4`` (Spark's hash placement) with the same sync swap, for
  reference: a minimal refit of a hash placement is a table of every key, which the driver
  plans and every later batch joins (see RESULTS.md);
- Spark: ``groupBy("k").count()`` in update mode with the RocksDB state store provider and
  ``spark.sql.shuffle.partitions=4`` (fixed in the checkpoint at the query's first start),
  sink a foreachBatch that writes to ``noop``. After the same steady batches: stop the query,
  ``spark._streamingCheckpointManager.repartition(checkpoint, 8)`` (Spark >= 4.2), restart on
  the same checkpoint and run one batch.

Batch seconds are the query's own ``durationMs.triggerExecution`` per batch (the wall time
around each ``processAllAvailable`` is in the JSON too). The median is over the steady batches
before the swap (the seed batch excluded). Pause of a swap batch = its seconds - the median;
the total pause of a fluid swap is the sum over its batches. Spark's total pause is the wall
time from ``query.stop()`` to the end of the first batch after the restart (stop + repartition
+ restart + that batch); its excess over a normal batch is that minus Spark's median batch.

Moved bytes vs the moved keys' state: ``SwapReport.moved_bytes`` (the Arrow IPC segments
written) is compared with the moved keys' rows in the state tables of the version before the
swap (``run.store.load_table(p, prev)``, filtered to exactly the keys of the swap's moves
table): (a) their share of the state file bytes (the version written as one state file, as
the file store keeps it; the local store keeps a snapshot and changelogs), file bytes x (moved
rows' Arrow nbytes / the table's Arrow nbytes), summed over source partitions; (b) their Arrow
nbytes; (c) their
size as one uncompressed Arrow IPC file per source partition.

Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benches/keyed/bench_swap.py``
(writes benches/results/swap.json; ``--keys N --rows R`` to change the key count and the
rows per steady batch; defaults 100,000 and 4,000, about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402
from trilink_spark.keyed import KeyedContext  # noqa: E402

KEYS = 100_000
ROWS = 4_000  # rows per steady batch
STEADY = 5  # steady batches before the swap (median batch)
AFTER = 2  # batches after the swap (or after a fluid swap completes)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class Count(tl.KeyedWatermarkProcessFunction):
    """Running count per key, in a typed state column (as tests/keyed/test_swaps.py)."""

    output_schema = "k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(key, n)]


def make_files(staging: Path, keys: int, batches: int, seed: int = 0) -> list[Path]:
    """File 0: every key once; then ``batches - 1`` files of ROWS uniformly drawn keys."""
    rng = np.random.default_rng(seed)
    staging.mkdir(parents=True)
    names = np.array([f"k{i:07d}" for i in range(keys)], dtype=object)
    files, t = [], 0
    for b in range(batches):
        picked = rng.permutation(keys) if b == 0 else rng.integers(0, keys, ROWS)
        frame = pd.DataFrame({"k": names[picked],
                              "t": np.arange(t, t + len(picked), dtype=np.int64)})
        t += len(picked)
        path = staging / f"part-{b:04d}.parquet"
        frame.to_parquet(path, index=False)
        files.append(path)
    return files


class Feed:
    """Moves one staged file into the source directory per micro-batch."""

    def __init__(self, files: list[Path], src: Path) -> None:
        self.files, self.src, self.next = files, src, 0
        src.mkdir(parents=True)

    def push(self) -> None:
        f = self.files[self.next]
        dest = self.src / f.name
        shutil.copyfile(f, dest)
        now = time.time()
        os.utime(dest, (now, now))
        self.next += 1


def stream(spark: Any, src: Path) -> Any:
    return (spark.readStream.schema("k string, t long").option("maxFilesPerTrigger", 1)
            .parquet(str(src)))


def step(query: Any, feed: Feed) -> float:
    feed.push()
    start = time.perf_counter()
    query.processAllAvailable()
    seconds = time.perf_counter() - start
    print(f"  batch {feed.next - 1}: {seconds:.2f} s", flush=True)
    return seconds


def batch_seconds(query: Any) -> dict[int, float]:
    return {int(p["batchId"]): p["durationMs"]["triggerExecution"] / 1000.0
            for p in query.recentProgress if p["numInputRows"]}


def moved_state(run: Any, report: Any) -> dict[str, Any]:
    """The moved keys' rows in the state version before the swap batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from trilink_spark._internal.io.arrowio import write_table
    from trilink_spark.state.store import KEY_FIELD, STATE_KIND

    plan = run.store.load_plan(report.batch_id)
    prev = int(plan["prev"])
    moves = run.store.load_moves(report.batch_id)
    share = nbytes = ipc = stored = 0
    rows = 0
    for source in sorted(set(moves.column("from").to_pylist())):
        keys = moves.filter(pc.equal(moves.column("from"), source)).column(KEY_FIELD)
        table = run.store.load_table(source, prev)
        table = pa.Table.from_batches(table.to_batches()).combine_chunks()
        # the version as one state file (with the local store it is a snapshot and changelogs)
        file_bytes = len(write_table(table, STATE_KIND))
        mine = table.filter(pc.is_in(table.column(KEY_FIELD), value_set=keys.combine_chunks()))
        rows += mine.num_rows
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, mine.schema) as w:
            w.write_table(mine)
        ipc += len(sink.getvalue())
        nbytes += mine.nbytes
        share += file_bytes * mine.nbytes / table.nbytes
        stored += file_bytes
    assert rows == moves.num_rows == report.moved_keys, (rows, moves.num_rows)
    return {"prev_version": prev, "moved_rows": rows, "stored_state_bytes_sources": stored,
            "share_of_stored_bytes": share, "arrow_nbytes": nbytes, "ipc_bytes": ipc,
            "segments": len({(a, b) for a, b in zip(moves.column("from").to_pylist(),
                                                     moves.column("to").to_pylist())})}


def run_ours(spark: Any, files: list[Path], work: Path, mode: str,
             max_keys: int | None = None, blocks: bool = True) -> dict[str, Any]:
    def sink(df: Any, b: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    placement: dict[str, Any] = ({"strategy": tl.BlockPartitioner(4)} if blocks
                                 else {"num_partitions": 4})
    run = tl.keyed_foreach_batch(sink, "k", "t", Count(), 10**12, str(work / "state"),
                                 **placement)
    feed = Feed(files, work / "in")
    query = (stream(spark, work / "in").writeStream.foreachBatch(run)
             .option("checkpointLocation", str(work / "ckpt")).start())
    walls: list[float] = []
    try:
        for _ in range(1 + STEADY):
            walls.append(step(query, feed))
        before = len(walls)
        if mode == "sync":
            run.request_swap(num_partitions=8, mode="sync")
        else:
            run.request_swap(num_partitions=8, mode="fluid", max_keys_per_batch=max_keys)
        moved_by_batch: dict[int, dict[str, Any]] = {}
        while not run.swaps or not run.swaps[-1].complete:
            walls.append(step(query, feed))
            for r in run.swaps:  # before a later batch prunes the swap's plan
                if r.batch_id not in moved_by_batch:
                    moved_by_batch[r.batch_id] = moved_state(run, r)
            assert len(walls) - before < 20, "fluid swap does not finish"
        for _ in range(AFTER):
            walls.append(step(query, feed))
        secs = batch_seconds(query)
    finally:
        query.stop()
    ids = sorted(secs)
    steady = [secs[i] for i in ids[1:1 + STEADY]]
    median = statistics.median(steady)
    swap_ids = [r.batch_id for r in run.swaps]
    swap_batches = []
    for r in run.swaps:
        moved = moved_by_batch[r.batch_id]
        s = secs[r.batch_id]
        swap_batches.append({
            "batch_id": r.batch_id, "batch_seconds": s, "report_seconds": r.seconds,
            "ratio_to_median": s / median, "pause_seconds": s - median,
            "limit_seconds": 1.5 * median + 1.0, "within_limit": s <= 1.5 * median + 1.0,
            "keys_total": r.keys_total, "moved_keys": r.moved_keys,
            "moved_bytes": r.moved_bytes, "moved_state": moved,
            "moved_bytes_over_share": r.moved_bytes / moved["share_of_stored_bytes"],
            "moved_bytes_over_arrow_nbytes": r.moved_bytes / moved["arrow_nbytes"],
            "moved_bytes_over_ipc": r.moved_bytes / moved["ipc_bytes"],
            "partitions": [r.partitions_before, r.partitions_after], "complete": r.complete,
        })
    after = [secs[i] for i in ids if i > swap_ids[-1]]
    total_moved = sum(b["moved_bytes"] for b in swap_batches)
    total_share = sum(b["moved_state"]["share_of_stored_bytes"] for b in swap_batches)
    return {
        "mode": mode, "max_keys_per_batch": max_keys, "batch_seconds": [secs[i] for i in ids],
        "wall_seconds": walls, "median_batch_seconds": median, "steady_batch_seconds": steady,
        "after_swap_batch_seconds": after, "swap_batches": swap_batches,
        "swap_batch_count": len(swap_batches),
        "moved_keys": sum(b["moved_keys"] for b in swap_batches),
        "moved_bytes": total_moved, "moved_state_share_bytes": total_share,
        "moved_bytes_over_share": total_moved / total_share,
        "total_pause_seconds": sum(b["pause_seconds"] for b in swap_batches),
        "max_batch_pause_seconds": max(b["pause_seconds"] for b in swap_batches),
        "final_partitions": len(set(run.owners().values())),
        "state_bytes_end": run.store.state_bytes(),
    }


def run_spark(spark: Any, files: list[Path], work: Path) -> dict[str, Any]:
    ckpt = str(work / "ckpt")
    feed = Feed(files, work / "in")

    def sink(df: Any, b: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    def start() -> Any:
        return (stream(spark, work / "in").groupBy("k").count().writeStream
                .outputMode("update").foreachBatch(sink)
                .option("checkpointLocation", ckpt).start())

    # fixed in the checkpoint at the first start: the provider and the state partitions
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    query = start()
    walls = [step(query, feed) for _ in range(1 + STEADY)]
    secs = batch_seconds(query)
    ids = sorted(secs)
    steady = [secs[i] for i in ids[1:1 + STEADY]]
    median = statistics.median(steady)
    partitions_before = [op.get("numShufflePartitions")
                         for op in query.lastProgress.get("stateOperators", [])]
    out: dict[str, Any] = {"batch_seconds": [secs[i] for i in ids], "wall_seconds": walls,
                           "median_batch_seconds": median, "steady_batch_seconds": steady,
                           "state_partitions_before": partitions_before}
    t0 = time.perf_counter()
    query.stop()
    t1 = time.perf_counter()
    out["stop_seconds"] = t1 - t0
    try:
        manager = spark._streamingCheckpointManager
        manager.repartition(ckpt, 8)
    except Exception as exc:  # reported, not hidden
        out["repartition"] = "not available"
        out["repartition_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
        return out
    t2 = time.perf_counter()
    out["repartition"] = "ok"
    out["repartition_seconds"] = t2 - t1
    spark.conf.set("spark.sql.shuffle.partitions", "8")  # the checkpoint decides; for clarity
    query = start()
    try:
        feed.push()
        query.processAllAvailable()
        t3 = time.perf_counter()
        secs2 = batch_seconds(query)
        after = [op.get("numShufflePartitions")
                 for op in (query.lastProgress or {}).get("stateOperators", [])]
    finally:
        query.stop()
        spark.conf.set("spark.sql.shuffle.partitions", "4")
    out.update({
        "restart_to_first_batch_seconds": t3 - t2,
        "first_batch_after_restart_seconds": [secs2[i] for i in sorted(secs2)],
        "state_partitions_after": after,
        "total_pause_seconds": t3 - t0,
        "pause_excess_seconds": t3 - t0 - median,
    })
    return out


def main() -> None:
    global ROWS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=KEYS)
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per steady batch")
    args = parser.parse_args()
    ROWS = args.rows
    spark = tl.get_session("local[2]", shuffle_partitions=4,
                           extra_conf={"spark.driver.memory": "3g"})
    root = Path(tempfile.mkdtemp(prefix="tl-swap-"))
    results: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        files = make_files(root / "staging", args.keys, 1 + STEADY + 8 + AFTER)
        results["ours_sync"] = run_ours(spark, files, root / "sync", "sync")
        print({k: v for k, v in results["ours_sync"].items() if not isinstance(v, list)},
              flush=True)
        to_move = results["ours_sync"]["moved_keys"]
        results["ours_fluid"] = run_ours(spark, files, root / "fluid", "fluid",
                                         max_keys=-(-to_move // 4))
        print({k: v for k, v in results["ours_fluid"].items() if not isinstance(v, list)},
              flush=True)
        results["ours_sync_hash"] = run_ours(spark, files, root / "sync-hash", "sync",
                                             blocks=False)
        print({k: v for k, v in results["ours_sync_hash"].items()
               if not isinstance(v, list)}, flush=True)
        results["spark"] = run_spark(spark, files, root / "spark")
        print(results["spark"], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sp = results["spark"]
    sync, fluid = results["ours_sync"], results["ours_fluid"]
    spark_pause = sp.get("total_pause_seconds")
    targets = {
        "sync_swap_batch_within_1_5x_median_plus_1s": all(
            b["within_limit"] for b in sync["swap_batches"]),
        "fluid_swap_batches_within_1_5x_median_plus_1s": all(
            b["within_limit"] for b in fluid["swap_batches"]),
        "moved_bytes_within_1pct_sync": abs(sync["moved_bytes_over_share"] - 1) <= 0.01,
        "moved_bytes_within_1pct_fluid": abs(fluid["moved_bytes_over_share"] - 1) <= 0.01,
        "sync_pause_below_spark_total": (None if spark_pause is None
                                         else sync["total_pause_seconds"] < spark_pause),
        "fluid_pause_below_spark_total": (None if spark_pause is None
                                          else fluid["total_pause_seconds"] < spark_pause),
        "sync_pause_below_spark_excess": (None if spark_pause is None
                                          else sync["total_pause_seconds"]
                                          < sp["pause_excess_seconds"]),
    }
    hashed = results["ours_sync_hash"]
    targets["reference_hash_sync_swap_batch_within_1_5x_median_plus_1s"] = all(
        b["within_limit"] for b in hashed["swap_batches"])
    targets["reference_hash_sync_pause_below_spark_total"] = (
        None if spark_pause is None else hashed["total_pause_seconds"] < spark_pause)
    import pyspark

    print(write_json("swap", {
        "keys": args.keys, "rows_per_steady_batch": ROWS, "argv": sys.argv[1:], "steady_batches": STEADY,
        "partitions": [4, 8], "pyspark": pyspark.__version__,
        "bench_seconds": time.perf_counter() - started, "targets": targets, **results}))
    print(targets)
    spark.stop()


if __name__ == "__main__":
    main()
