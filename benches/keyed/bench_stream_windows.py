"""Windows on a stream: ``keyed_foreach_batch`` + ``KeyedWindowAggregate`` against Spark's own.

One file stream, five queries computing the same per-key tumbling windows (10 s, ``count`` and
``min`` of ``v``) with the same watermark delay (5 s), each into the same sink (a
``foreachBatch`` collecting the emitted windows to the driver):

- **ours**: ``tl.keyed_foreach_batch(sink, "key", "ts", KeyedWindowAggregate("10 seconds",
  value="v", aggs=("count", "min")), delay="5 seconds", ...)`` in ``foreachBatch``; each key's
  windows close on its own watermark; the package's executor-local state store;
- **spark_hdfs**: ``withWatermark("ts", "5 seconds").groupBy("key", window("ts", "10
  seconds")).agg(count, min)``, append mode, Spark's default state store provider
  (HDFSBackedStateStoreProvider);
- **spark_rocksdb**: the same query on Spark's RocksDBStateStoreProvider;
- **tws**: ``groupBy("key").transformWithStateInPandas`` (event time) with one ``MapState``
  per key (window start -> count, min) and an event-time timer at each window's end that
  emits the window and removes it; RocksDB (tWS needs it);
- **apiws**: ``groupBy("key").applyInPandasWithState`` (``EventTimeTimeout``, append) keeping
  the key's open windows in its state (three arrays, as bytes: PySpark's worker cannot read a
  state schema with an array column) and emitting those whose end the
  watermark reached; its timeout (the earliest open end) closes the windows of keys without
  rows; Spark's default state store provider.

Workload: 5,000 keys, a stream of 200 s of event time cut into ``--files`` parquet files
(default 20, one per trigger: ``maxFilesPerTrigger=1``, ``availableNow``), so a batch grows
with the size. Rows arrive in clock order, key drawn at random; event time = clock + a jitter
of up to 0.2 s, and 1 % of the rows 0-2 s behind their clock: slight disorder, always under the
delay, so no query has a late row (checked: every query's windows hold every row).

Closing the last windows: with ``availableNow`` the last watermark never passes the last
windows' ends, so Spark's append mode would keep them. A final file (the end marker) holds
one row per key one hour after the data: every key's watermark, and the global one, then
passes every data window (Spark closes them in the no-data batch that follows). The
marker's own windows stay open in every query and are left out of the comparison: it compares
the windows of the data rows, all of which every query must emit.

Check: each query's emitted data windows (key, start, count, min) are compared with those of
an exact pandas group-by of the input (and so with one another); a window emitted twice, a row
dropped or late, a marker window emitted, or a query whose offset log records another state
store provider than intended fails the check. Each query runs twice per size, in the
order A B C D E then E D C B A (the first run pays the JVM's warm-up); both runs are
reported, the best, and each baseline's best over ours. Time: from ``start()`` to the end of
``awaitTermination()``, the input files written before. Ours also keeps each batch's
``run.batch_profile()`` (driver planning, the job, the commit; the slowest task's sync, state
read, hooks, state write and upkeep) and reports their medians over the steady batches.

Run: ``python benches/keyed/bench_stream_windows.py [--sizes 400000 2000000 8000000]
[--files 20] [--variants ours,spark_hdfs,spark_rocksdb,tws,apiws]`` (writes
benches/results/stream_windows.json). Run it on a machine with nothing else running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

KEYS = 5_000
SIZES = (400_000, 2_000_000, 8_000_000)
FILES = 20
PARTITIONS = 4
SPAN_S = 200.0  # event time the data spans
BASE_S = 1_700_000_003  # the stream's first second (not on a window boundary)
WINDOW_S = 10
DELAY_S = 5
JITTER_S = 0.2  # every row: up to this much ahead of its clock
BEHIND_S = 2.0  # the disordered rows: up to this much behind it
BEHIND_SHARE = 0.01
MARKER_S = BASE_S + 3600  # the end marker's event time: past every data window + delay
WINDOW_US = WINDOW_S * 1_000_000
MARKER_START_US = (MARKER_S * 1_000_000 // WINDOW_US) * WINDOW_US
SCHEMA = "key long, ts timestamp, v double"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
VARIANTS = ("ours", "spark_hdfs", "spark_rocksdb", "tws", "apiws")
PROVIDERS = {"ours": None, "spark_hdfs": HDFS, "spark_rocksdb": ROCKSDB, "tws": ROCKSDB,
             "apiws": HDFS}


# ------------------------------------------------------------------ the input
def stream_rows(rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` readings in arrival order: key at random, event time (microseconds since the
    epoch) its clock plus up to ``JITTER_S``, ``BEHIND_SHARE`` of them up to ``BEHIND_S``
    behind instead."""
    rng = np.random.default_rng(seed)
    clock = BASE_S + np.arange(rows) * (SPAN_S / rows)
    jitter = rng.random(rows) * JITTER_S
    behind = rng.random(rows) < BEHIND_SHARE
    jitter[behind] = -rng.random(int(behind.sum())) * BEHIND_S
    return pd.DataFrame({
        "key": rng.integers(0, KEYS, rows),
        "ts": np.rint((clock + jitter) * 1e6).astype(np.int64),
        "v": np.round(rng.random(rows) * 1000.0, 3),
    })


def write_files(frame: pd.DataFrame, src: Path, files: int) -> None:
    """``files`` parquet files of consecutive rows, then the end marker (one row per key at
    ``MARKER_S``); modification times one second apart, in order, so the file source takes
    them in that order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src.mkdir(parents=True)
    marker = pd.DataFrame({"key": np.arange(KEYS, dtype=np.int64),
                           "ts": np.full(KEYS, MARKER_S * 1_000_000, dtype=np.int64),
                           "v": np.zeros(KEYS)})
    bounds = np.linspace(0, len(frame), files + 1).astype(int)
    parts = [frame.iloc[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])] + [marker]
    stamp = time.time() - len(parts) - 10
    for i, part in enumerate(parts):
        table = pa.table({
            "key": pa.array(part["key"].to_numpy(), pa.int64()),
            "ts": pa.array(part["ts"].to_numpy(), pa.timestamp("us", tz="UTC")),
            "v": pa.array(part["v"].to_numpy(), pa.float64()),
        })
        path = src / f"part-{i:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (stamp + i, stamp + i))


def oracle(frame: pd.DataFrame) -> pd.DataFrame:
    """The data windows, exactly: ``key, start`` (microseconds), ``count``, ``min``."""
    start = (frame["ts"].to_numpy() // WINDOW_US) * WINDOW_US
    got = frame.assign(start=start).groupby(["key", "start"])["v"].agg(["count", "min"])
    return normalise(got.reset_index())


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"key": frame["key"].to_numpy(dtype=np.int64),
                        "start": frame["start"].to_numpy(dtype=np.int64),
                        "count": frame["count"].to_numpy(dtype=np.int64),
                        "min": frame["min"].to_numpy(dtype=np.float64)})
    return out.sort_values(["key", "start"], kind="stable").reset_index(drop=True)


def read_stream(spark: Any, src: Path) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))


class Collect:
    """The shared sink: every batch's windows to the driver (one small Spark job each)."""

    def __init__(self) -> None:
        self.parts: list[pd.DataFrame] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        part = df.select(F.col("key"), F.unix_micros("window_start").alias("start"),
                         F.col("count"), F.col("min")).toPandas()
        self.parts.append(part)

    def windows(self) -> pd.DataFrame:
        parts = [p for p in self.parts if len(p)]
        if not parts:
            return normalise(pd.DataFrame({"key": [], "start": [], "count": [], "min": []}))
        return normalise(pd.concat(parts, ignore_index=True))


# ------------------------------------------------------------------ the queries
def spark_windows(spark: Any, src: Path) -> Any:
    from pyspark.sql import functions as F

    return (read_stream(spark, src).withWatermark("ts", f"{DELAY_S} seconds")
            .groupBy("key", F.window("ts", f"{WINDOW_S} seconds"))
            .agg(F.count(F.lit(1)).alias("count"), F.min("v").alias("min"))
            .select("key", F.col("window.start").alias("window_start"), "count", "min"))


def fold(starts: np.ndarray, counts: np.ndarray, mins: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows (start ms, count, min) with equal starts merged: one ``np.unique``, no pandas
    (the per-key functions of tWS and applyInPandasWithState run once per key and batch)."""
    uniq, inverse = np.unique(starts, return_inverse=True)
    total = np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64)
    low = np.full(len(uniq), np.inf)
    np.minimum.at(low, inverse, mins)
    return uniq, total, low


def key_windows(frames: Iterator[pd.DataFrame]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key's rows of a batch as windows (start ms, count, min)."""
    parts = [f for f in frames if len(f)]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    size_ms = WINDOW_S * 1000
    ms = frame["ts"].to_numpy(dtype="datetime64[ms]").astype(np.int64)
    return fold((ms // size_ms) * size_ms, np.ones(len(ms), np.int64),
                frame["v"].to_numpy(dtype=np.float64))


def window_frame(key: Any, starts: np.ndarray, counts: np.ndarray, mins: np.ndarray
                 ) -> pd.DataFrame:
    return pd.DataFrame({"key": np.full(len(starts), key, dtype=np.int64),
                         "window_start": pd.to_datetime(starts, unit="ms"),
                         "count": counts, "min": mins})


def window_processor() -> Any:
    """tWS: a ``MapState`` of the key's open windows (start ms -> count, min) and an
    event-time timer at each window's end, which emits the window and removes it."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    size_ms = WINDOW_S * 1000

    class Windows(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.windows = handle.getMapState("windows", "start long", "count long, min double")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            starts, counts, mins = key_windows(rows)
            for start, count, low in zip(starts.tolist(), counts.tolist(), mins.tolist()):
                old = self.windows.getValue((start,))
                if old is None:
                    self.handle.registerTimer(start + size_ms)
                    new = (count, low)
                else:
                    new = (old[0] + count, min(old[1], low))
                self.windows.updateValue((start,), new)
            yield from ()

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[Any]:
            start = expiredTimerInfo.getExpiryTimeInMs() - size_ms
            value = self.windows.getValue((start,))
            self.windows.removeKey((start,))
            if value is not None:
                yield window_frame(key[0], np.array([start]), np.array([value[0]]),
                                   np.array([value[1]], dtype=np.float64))

        def close(self) -> None:
            pass

    return Windows()


def apiws_function(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """``applyInPandasWithState``: the key's open windows in its state (starts, counts, mins
    as bytes); emits those whose end the watermark reached, times out at the earliest open
    end (so a key without rows still has its windows closed)."""
    size_ms = WINDOW_S * 1000
    if state.exists:
        raw = state.get
        starts = np.frombuffer(raw[0], dtype=np.int64)
        counts = np.frombuffer(raw[1], dtype=np.int64)
        mins = np.frombuffer(raw[2], dtype=np.float64)
    else:
        starts, counts, mins = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    if not state.hasTimedOut:
        new = key_windows(frames)
        if len(new[0]):
            starts, counts, mins = fold(np.concatenate([starts, new[0]]),
                                        np.concatenate([counts, new[1]]),
                                        np.concatenate([mins, new[2]]))
    done = starts + size_ms <= state.getCurrentWatermarkMs()
    left = ~done
    if left.any():
        state.update((starts[left].tobytes(), counts[left].tobytes(), mins[left].tobytes()))
        state.setTimeoutTimestamp(int(starts[left].min()) + size_ms)
    else:
        state.remove()
    if done.any():
        yield window_frame(key[0], starts[done], counts[done], mins[done])


OUTPUT = "key long, window_start timestamp, count long, min double"


def build(variant: str, spark: Any, src: Path, work: Path,
          sink: Collect) -> tuple[Any, Callable[[], dict[str, Any]]]:
    """The variant's query, started, and what reads its counters once it ended."""
    if variant == "ours":
        agg = tl.KeyedWindowAggregate(f"{WINDOW_S} seconds", value="v", aggs=("count", "min"))
        run = tl.keyed_foreach_batch(sink, "key", "ts", agg, f"{DELAY_S} seconds",
                                     str(work / "state"), num_partitions=PARTITIONS)
        profiles: list[dict[str, Any]] = []

        def profiled(df: Any, batch_id: int) -> None:
            run(df, batch_id)
            profiles.append(run.batch_profile())

        query = (read_stream(spark, src).writeStream.foreachBatch(profiled)
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .trigger(availableNow=True).start())

        def ours_counters() -> dict[str, Any]:
            counters = run.counters()
            return {"late": int(counters["late"]),
                    "late_partition": int(counters["late_partition"]),
                    "profile": profile_summary(profiles), "profiles": profiles}

        return query, ours_counters
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[variant])
    if variant in ("spark_hdfs", "spark_rocksdb"):
        stream = spark_windows(spark, src)
        mode = "append"
    elif variant == "tws":
        stream = (read_stream(spark, src).withWatermark("ts", f"{DELAY_S} seconds")
                  .groupBy("key").transformWithStateInPandas(
                      statefulProcessor=window_processor(), outputStructType=OUTPUT,
                      outputMode="Append", timeMode="EventTime"))
        mode = "append"
    elif variant == "apiws":
        from pyspark.sql.streaming.state import GroupStateTimeout

        stream = (read_stream(spark, src).withWatermark("ts", f"{DELAY_S} seconds")
                  .groupBy("key").applyInPandasWithState(
                      apiws_function, OUTPUT,
                      "starts binary, counts binary, mins binary",
                      "append", GroupStateTimeout.EventTimeTimeout))
        mode = "append"
    else:
        raise SystemExit(f"unknown variant {variant!r}; choose from {VARIANTS}")
    query = (stream.writeStream.outputMode(mode).foreachBatch(sink)
             .option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())

    def spark_counters() -> dict[str, Any]:
        dropped = sum(int(op.get("numRowsDroppedByWatermark", 0))
                      for p in query.recentProgress for op in p.get("stateOperators", []))
        return {"late": dropped}

    return query, spark_counters


def profile_summary(profiles: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each ``batch_profile`` field over the batches after the first two
    (JVM and Python workers warm), in milliseconds."""
    steady = profiles[2:] or profiles
    fields = [k for k in (steady[0] if steady else {}) if k != "batch"]
    return {k: round(float(np.median([p[k] for p in steady])), 1) for k in fields}


def short_name(provider: str | None) -> str | None:
    return None if provider is None else provider.rsplit(".", 1)[-1]


def recorded_provider(checkpoint: Path) -> str | None:
    """The state store provider the query's offset log recorded at its first batch, the one
    its stateful operator ran on (None: no log, or none recorded)."""
    import json

    first = checkpoint / "offsets" / "0"
    if not first.exists():
        return None
    for line in first.read_text().splitlines()[1:]:
        try:
            conf = json.loads(line).get("conf", {})
        except (ValueError, AttributeError):
            continue
        found = conf.get("spark.sql.streaming.stateStore.providerClass")
        if found:
            return str(found).rsplit(".", 1)[-1]
    return None


def run_variant(variant: str, spark: Any, src: Path, root: Path,
                want: pd.DataFrame, rows: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=root))
    sink = Collect()
    query = None
    try:
        start = time.perf_counter()
        query, counters = build(variant, spark, src, work, sink)
        query.awaitTermination()
        seconds = time.perf_counter() - start
        batches = len(query.recentProgress)
        extra = {**counters(), "provider": None if variant == "ours"  # no Spark state
                 else recorded_provider(work / "checkpoint")}
    finally:
        if query is not None and query.isActive:
            query.stop()
        shutil.rmtree(work, ignore_errors=True)
    got = sink.windows()
    data = got[got["start"] < MARKER_START_US].reset_index(drop=True)
    duplicated = int(data.duplicated(["key", "start"]).sum())
    equal = (len(data) == len(want) and duplicated == 0
             and all(np.array_equal(data[c].to_numpy(), want[c].to_numpy())
                     for c in ("key", "start", "count", "min")))
    return {"seconds": seconds, "batches": batches, "windows": len(data),
            "rows_in_windows": int(data["count"].sum()), "rows": rows,
            "marker_windows_emitted": int(len(got) - len(data)),
            "duplicate_windows": duplicated, "equal_to_exact": bool(equal), **extra}


def remove_late(roots: list[Path], tries: int = 10) -> None:
    """Remove the temporary directories again: the local store's snapshot writers (separate,
    low-priority processes) may finish after a query ended and write into its state path."""
    for _ in range(tries):
        time.sleep(2.0)
        left = [r for r in roots if r.exists()]
        if not left:
            return
        for r in left:
            shutil.rmtree(r, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--files", type=int, default=FILES)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    # PySpark's applyInPandasWithState worker concatenates empty frames (a pandas
    # FutureWarning per batch); the workers inherit this
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS,
                           extra_conf={"spark.driver.memory": "4g",
                                       "spark.sql.session.timeZone": "UTC"})
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    roots: list[Path] = []
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix="tl-stream-windows-"))
        roots.append(root)
        try:
            frame = stream_rows(size)
            write_files(frame, root / "in", args.files)
            want = oracle(frame)
            del frame
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for variant in [*variants, *reversed(variants)]:
                got = run_variant(variant, spark, root / "in", root, want, size)
                runs[variant].append(got)
                print(f"{size:>9,} rows  {variant:<14} {got['seconds']:8.2f} s  "
                      f"equal={got['equal_to_exact']} late={got['late']}", flush=True)
                if "profile" in got:
                    print(f"{'':>25}per-batch medians (ms): {got['profile']}", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        best = {v: min(r["seconds"] for r in runs[v]) for v in variants}
        checks = {v: all(r["equal_to_exact"] and r["rows_in_windows"] == size
                         and r["marker_windows_emitted"] == 0 and r["late"] == 0
                         and r["provider"] == short_name(PROVIDERS[v]) for r in runs[v])
                  for v in variants}
        row = {
            "rows": size, "keys": KEYS, "files": args.files + 1, "windows": len(want),
            "runs": runs, "best_seconds": best,
            "best_rows_per_s": {v: size / s for v, s in best.items()},
            "over_ours": ({v: best[v] / best["ours"] for v in variants if v != "ours"}
                          if "ours" in best else {}),
            "check": {"per_variant": checks, "all_equal": all(checks.values()),
                      "rule": "data windows (start before the end marker's) equal to an "
                              "exact pandas group-by, every row in a window, none twice, no "
                              "late row, and the state store provider the query recorded "
                              "is the one intended"},
        }
        results.append(row)
        print({"rows": size, "best": {v: round(s, 2) for v, s in best.items()},
               "over_ours": {v: round(r, 2) for v, r in row["over_ours"].items()},
               "all_equal": row["check"]["all_equal"]}, flush=True)
    spark.stop()
    remove_late(roots)
    print(write_json("stream_windows", {
        "keys": KEYS, "files_per_size": args.files, "end_marker_file": True,
        "window_s": WINDOW_S, "delay_s": DELAY_S, "span_s": SPAN_S, "jitter_s": JITTER_S,
        "behind_s": BEHIND_S, "behind_share": BEHIND_SHARE, "partitions": PARTITIONS,
        "providers": {v: short_name(p) or "trilink local store"
                      for v, p in PROVIDERS.items() if v in variants},
        "order": "A B C D E then E D C B A; best of the two runs",
        "note": "local[2], 2 cores, nothing else running for final figures",
        "rows": results}))


if __name__ == "__main__":
    main()
