"""key_by's driver cost per micro-batch: planning a batch with an unchanged strategy.

A stream places every micro-batch with the same strategy object. This measures what that
costs on the driver, per batch: ``key_by(batch, "k", strategy, fit="none", compact="never")``
until the placed frame's schema is known (the plan built and analysed; no Spark job), for a
fitted ``LeastKeyPartitioner(8)`` whose table holds 100 and 100,000 string keys, on a fresh
1,000-row batch frame each time, in one run:

- ``cached``: key_by as it is (the table frame and the expressions kept between batches,
  :mod:`trilink_spark.placement.plans`);
- ``uncached``: the same code with the cache switched off (``PLAN_CACHE.disabled()``): every
  batch builds the expressions and turns the table into a broadcast DataFrame again, the
  baseline the cache replaces;
- ``changed``: the cache on, but one new key placed before every batch (the table's version
  changes, as under ``fit="full"`` when a batch brings a new key): the cost of a miss;
- ``spark``: Spark's own ``batch.repartition(8, "k")``, the floor (it places nothing itself;
  on Connect followed by ``select("*")``, so that its schema too is one round trip).

Each variant runs ``--batches`` times after ``--warmup`` untimed batches, interleaved batch by
batch so that drift hits all alike; reported: median and p95 ms, Py4J calls per batch (classic
session only) and the ratios uncached/cached and cached/spark. ``--job`` also times the whole
batch with a small job (``groupBy(partition, k).count().collect()``; Spark's
``repartition(8, k).groupBy(k).count().collect()``).

Run: ``PYSPARK_PYTHON=.venv/bin/python python benches/placement/bench_key_by_driver.py``
(writes benches/results/key_by_driver.json). Options: ``--keys 100,100000``,
``--batches 20``, ``--warmup 3``, ``--rows 1000``, ``--job``, ``--connect`` (a local Spark
Connect session instead of a classic one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark.placement.plans import PLAN_CACHE  # noqa: E402

PARTITIONS = 8


class Py4JCounter:
    """Counts the Py4J commands the driver sends (classic sessions; 0 on Connect)."""

    def __init__(self) -> None:
        self.calls = 0
        try:
            import py4j.clientserver as cs
            import py4j.java_gateway as jg
        except ImportError:  # pragma: no cover - Connect-only installs
            return
        for cls in (cs.ClientServerConnection, jg.GatewayConnection):
            original = cls.send_command

            def send(conn: Any, command: str, *args: Any, _orig: Any = original,
                     **kwargs: Any) -> Any:
                self.calls += 1
                return _orig(conn, command, *args, **kwargs)

            cls.send_command = send


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(ms: list[float], calls: list[int]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(ms), 2), "p95_ms": round(percentile(ms, 0.95), 2),
            "min_ms": round(min(ms), 2), "py4j_calls": statistics.median(calls) if calls else 0}


def run_size(spark: Any, counter: Py4JCounter, keys: int, args: argparse.Namespace
             ) -> dict[str, Any]:
    from pyspark.sql import functions as F

    strategy = tl.LeastKeyPartitioner(PARTITIONS).fit([f"c{i}" for i in range(keys)])
    grown = strategy.copy()  # gets one new key before each of its batches
    step = {"n": 0}

    def batch() -> Any:
        step["n"] += 1
        start = step["n"] * args.rows
        return spark.range(start, start + args.rows).selectExpr(
            f"concat('c', cast(id % {keys} as string)) as k", "id as v")

    def cached(df: Any) -> Any:
        return tl.key_by(df, "k", strategy, fit="none", compact="never")

    def uncached(df: Any) -> Any:
        with PLAN_CACHE.disabled():
            return tl.key_by(df, "k", strategy, fit="none", compact="never")

    def changed(df: Any) -> Any:
        grown.partition(f"new{step['n']}")  # a new key: the table's version changes
        return tl.key_by(df, "k", grown, fit="none", compact="never")

    def floor(df: Any) -> Any:
        placed = df.repartition(PARTITIONS, "k")
        # Connect keeps the batch's schema through repartition: ask the server, as key_by does
        return placed.select("*") if args.connect else placed

    variants: dict[str, Callable[[Any], Any]] = {
        "cached": cached, "uncached": uncached, "changed": changed, "spark": floor}
    times: dict[str, list[float]] = {name: [] for name in variants}
    calls: dict[str, list[int]] = {name: [] for name in variants}
    for i in range(args.warmup + args.batches):
        names = list(variants)
        names = names[i % len(names):] + names[:i % len(names)]  # rotate the order
        for name in names:
            df = batch()
            df.schema  # the batch's own analysis is not key_by's
            before = counter.calls
            started = time.perf_counter()
            variants[name](df).schema
            elapsed = (time.perf_counter() - started) * 1000.0
            if i >= args.warmup:
                times[name].append(elapsed)
                calls[name].append(counter.calls - before)
    row: dict[str, Any] = {"keys": keys, "rows": args.rows, "partitions": PARTITIONS,
                           "batches": args.batches}
    for name in variants:
        row[name] = summary(times[name], calls[name])
    row["ratio_uncached_over_cached"] = round(
        row["uncached"]["median_ms"] / row["cached"]["median_ms"], 2)
    row["ratio_cached_over_spark"] = round(
        row["cached"]["median_ms"] / row["spark"]["median_ms"], 2)
    if args.job:
        jobs: dict[str, list[float]] = {"cached": [], "uncached": [], "spark": []}

        def ours(placer: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return lambda df: placer(df).groupBy(tl.PARTITION_COL, "k").count().collect()

        job_variants = {"cached": ours(cached), "uncached": ours(uncached),
                        "spark": lambda df: floor(df).groupBy("k").agg(
                            F.count(F.lit(1))).collect()}
        for i in range(1 + args.job_batches):
            for name, fn in job_variants.items():
                df = batch()
                started = time.perf_counter()
                fn(df)
                if i:
                    jobs[name].append((time.perf_counter() - started) * 1000.0)
        row["job"] = {name: summary(ms, []) for name, ms in jobs.items()}
        row["job"]["ratio_cached_over_spark"] = round(
            row["job"]["cached"]["median_ms"] / row["job"]["spark"]["median_ms"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="100,100000", help="table sizes, comma-separated")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--job", action="store_true", help="also time a small job per batch")
    parser.add_argument("--job-batches", type=int, default=10)
    parser.add_argument("--connect", action="store_true", help="a local Spark Connect session")
    args = parser.parse_args()
    if args.connect:
        spark = tl.get_session(remote="local[2]", shuffle_partitions=PARTITIONS)
    else:
        spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS)
    counter = Py4JCounter()
    rows = []
    for keys in (int(k) for k in args.keys.split(",")):
        row = run_size(spark, counter, keys, args)
        rows.append(row)
        print(row, flush=True)
    path = write_json("key_by_driver", {
        "session": "connect" if args.connect else "classic",
        "load_average": list(os.getloadavg()),
        "rows": rows,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
