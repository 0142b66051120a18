"""Where the time of the keyed pipelines goes: cProfile inside the Python workers, and the
JVM stages timed one by one.

Workload of ``bench_throughput.py`` (sensors x 200 readings, 100-second slots, count and min
of the voltage; 8 partitions, ``local[2]``):

- (a) ``keyed_process`` + ``KeyedWindowAggregate``, (c) pipeline (c) with each
  ``local_merge`` engine: every task of the keyed runtime and of ``local_merge`` runs under
  cProfile (its partition function wrapped in the driver before the job is planned); the
  tasks' profiles are summed and the top entries by own time reported.
- (d) ``global_merge`` to the driver: cProfile on the driver (it runs no Python worker).
- The JVM stages of (a), each the one before plus one step, written to Spark's ``noop`` sink:
  Spark's native windowed ``groupBy``; the keyed exchange alone; the exchange and the rows
  crossing into Python (an empty ``mapInArrow``); the whole of (a). Best of 2 after a warm-up.

Run: ``python benches/merge/profile_workers.py [--rows 2000000]``
(writes benches/results/profile.json).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import best_time, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
import trilink_spark.keyed.run.bounded as keyed_batch  # noqa: E402
import trilink_spark.keyed.run.prepare as keyed_prepare  # noqa: E402
import trilink_spark.merge.engines.local as local  # noqa: E402

WINDOW = 100
TOP = 12


def profiled(make: Callable[..., Any], where: str) -> Callable[..., Any]:
    """``make`` (a factory of partition functions) whose functions run under cProfile, each
    task writing its profile into ``where``."""

    def factory(*args: Any, **kwargs: Any) -> Any:
        fn = make(*args, **kwargs)

        def run(batches: Any) -> Any:
            profile = cProfile.Profile()
            profile.enable()
            out = list(fn(batches))
            profile.disable()
            profile.dump_stats(os.path.join(where, f"{uuid.uuid4().hex}.prof"))
            yield from out

        return run

    return factory


def top_entries(files: list[str], top: int = TOP) -> dict[str, Any]:
    """The summed profiles' top entries by own time: function, calls, own and cumulative
    seconds, and the total."""
    stats = pstats.Stats(*files, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}({name})", "calls": calls,
                     "own_s": round(own, 4), "cumulative_s": round(cum, 4)})
    rows.sort(key=lambda r: -r["own_s"])
    return {"tasks": len(files), "total_s": round(stats.total_tt, 3),  # type: ignore[attr-defined]
            "top": rows[:top]}


def best(fn: Callable[[], Any]) -> float:
    return round(best_time(fn), 3)


def main() -> None:
    from pyspark.sql import functions as F

    from trilink_spark.placement.key_by import place_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    spark = tl.get_session("local[2]", shuffle_partitions=8,
                           extra_conf={"spark.driver.memory": "6g"})
    df = (spark.range(args.rows, numPartitions=8)
          .selectExpr("id DIV 200 AS sensor", "id % 200 AS t",
                      "CAST(220 + (id * 7919 % 1000) / 100.0 - IF(id % 997 = 0, 40, 0) "
                      "AS DOUBLE) AS volts")
          .cache())
    df.count()
    aggs = {"n": ("count", None), "low": ("min", "volts")}
    kwa = tl.KeyedWindowAggregate(WINDOW, value="volts", aggs=("count", "min"))
    sums = tl.KeyedWindowAggregate(WINDOW, value="n", aggs=("sum",))

    def noop(frame: Any) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def pipeline_c(engine: str) -> None:
        extra: dict[str, Any] = {"engine": "spark"} if engine == "spark" else {
            "quantity": 10_000}
        partial = tl.local_merge(df, "sensor", "t", WINDOW, aggs, **extra)
        counted = tl.keyed_process(partial, "sensor", "t", sums, delay=0, num_partitions=8)
        lows = tl.merge_partials(partial, ["sensor", "slot_start"], aggs)
        noop(counted.join(lows.drop("n").withColumnRenamed("slot_start", "window_start"),
                          ["sensor", "window_start"]))

    out: dict[str, Any] = {"rows": args.rows, "partitions": 8, "cores": 2}
    originals = (keyed_batch.partition_function, local.arrow_merge_partition)
    jobs = {"a_keyed": lambda: noop(tl.keyed_process(df, "sensor", "t", kwa, delay=0,
                                                     num_partitions=8)),
            "c_pipeline_python": lambda: pipeline_c("python"),
            "c_pipeline_spark": lambda: pipeline_c("spark")}
    for name, job in jobs.items():
        where = tempfile.mkdtemp(prefix=f"profile-{name}-")
        keyed_batch.partition_function = profiled(originals[0], where)  # type: ignore[assignment]
        local.arrow_merge_partition = profiled(originals[1], where)  # type: ignore[assignment]
        try:
            job()
        finally:
            keyed_batch.partition_function, local.arrow_merge_partition = originals  # type: ignore[assignment]
        files = [os.path.join(where, f) for f in os.listdir(where)]
        out[name] = top_entries(files)
        shutil.rmtree(where, ignore_errors=True)
        print(name, out[name]["tasks"], "tasks", out[name]["total_s"], "s", flush=True)

    driver = cProfile.Profile()
    tl.global_merge(df, "sensor", aggs).count()  # warm-up
    driver.enable()
    tl.global_merge(df, "sensor", aggs).count()
    driver.disable()
    path = os.path.join(tempfile.mkdtemp(prefix="profile-d-"), "driver.prof")
    driver.dump_stats(path)
    out["d_global_merge_driver"] = top_entries([path])
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)

    def drop(batches: Any) -> Any:
        for batch in batches:
            yield batch.slice(0, 0)

    tagged, *_ = keyed_prepare.prepare(df, "sensor", "t", kwa, 0, None, None)
    placed = keyed_prepare.arrival_order(place_rows(tagged, "sensor", "hash", 8), None)
    slot = (F.floor(F.col("t") / WINDOW) * WINDOW).alias("start")
    out["stages_s"] = {
        "native_windowed_groupBy": best(lambda: noop(df.groupBy(slot, "sensor").agg(
            F.count(F.lit(1)).alias("n"), F.min("volts").alias("low")))),
        "keyed_exchange": best(lambda: noop(placed)),
        "keyed_exchange_into_python": best(lambda: noop(placed.mapInArrow(drop,
                                                                           placed.schema))),
        "keyed_process_whole": best(jobs["a_keyed"]),
    }
    print(out["stages_s"], flush=True)
    spark.stop()
    print(write_json("profile", out))


if __name__ == "__main__":
    main()
