"""keyed_agg overhead against plain groupBy, and skew: per-task run time under Hash vs the choice.

1. Overhead, 5,000,000 rows, uniform keys, in one run (median of 5 after a warm-up): plain
   ``groupBy(k).agg(sum)`` (map-side combine, then a hash shuffle of partial results) and Spark's
   own exact placement ``repartition(8, k).groupBy(k).agg(sum)`` (every row shuffled, as exact
   placement requires) against ``keyed_agg`` (hash and modulo), for (a) 5,000,000 distinct
   auto-increment keys and (b) 10,000 keys x 500 rows.
2. Skew: 1,000,000 rows with Zipf s=1.1 keys over 2,000 keys, 8 partitions, a CPU-heavy
   ``keyed_apply`` (cost proportional to a key's rows). Per-task ``executorRunTime`` from Spark's
   task metrics (REST API of the driver UI on 127.0.0.1): max/mean, Hash against ``auto``.

3. ``combine="auto"``: the overhead table includes ``keyed_agg(..., combine="auto")`` (Spark's
   map-side combine for ``sum``); with ``combine="never"`` the exact placement as before. On
   the Zipf keys of (2), ``percentile_approx`` and ``collect_list`` + a Python UDF over the
   list (no bounded partial buffer, so ``"auto"`` places exactly): the slowest task of the
   aggregating stage, plain ``groupBy`` against ``keyed_agg``.

Run: ``python benches/placement/bench_spark.py`` (writes benches/results/spark.json;
``python benches/placement/bench_spark.py combine`` runs (1) and (3) only, into
benches/results/spark_combine.json).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import median_time, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark.partitioners import keyed_bound  # noqa: E402
from trilink_spark.placement import explain_keyed_agg  # noqa: E402
from trilink_spark.partitioners.choosing.scenarios import make_scenario, scenario_frame  # noqa: E402

ROWS = 5_000_000
SKEW_PARTITIONS = 8


def session():
    # the UI stays on here: the skew benchmark reads task metrics from its REST API
    return tl.get_session(
        "local[2]",
        shuffle_partitions=8,
        extra_conf={
            "spark.ui.enabled": "true",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "4g",
        },
    )


def noop(df) -> None:
    df.write.format("noop").mode("overwrite").save()


def overhead(spark) -> dict:
    from pyspark.sql import functions as F

    out = {}
    cases = {
        "distinct_keys_5M": spark.range(ROWS).select(F.col("id").alias("k"), (F.col("id") * 3).alias("v")),
        "keys_10k_x500": spark.range(ROWS).select((F.col("id") % 10_000).alias("k"), (F.col("id") * 3).alias("v")),
    }
    for label, df in cases.items():
        df = df.cache()
        df.count()
        base = median_time(lambda: noop(df.groupBy("k").agg(F.sum("v").alias("s"))))
        placed_base = median_time(
            lambda: noop(df.repartition(8, "k").groupBy("k").agg(F.sum("v").alias("s")))
        )
        row = {"groupBy_s": base, "repartition_groupBy_s": placed_base}
        combined = median_time(
            lambda: noop(tl.keyed_agg(df, "k", F.sum("v").alias("s"), strategy="hash",
                                      num_partitions=8, combine="auto")))
        row["keyed_agg_auto_s"] = combined
        row["ratio_auto"] = combined / base
        for strategy in ("hash", "modulo"):  # exact placement, every row shuffled
            ours = median_time(
                lambda: noop(tl.keyed_agg(df, "k", F.sum("v").alias("s"), strategy=strategy,
                                          num_partitions=8, combine="never"))
            )
            row[f"keyed_agg_{strategy}_s"] = ours
            row[f"ratio_{strategy}"] = ours / base
            row[f"ratio_{strategy}_vs_spark_placement"] = ours / placed_base
        out[label] = row
        print(label, {k: round(v, 3) for k, v in row.items()})
        df.unpersist()
    return out


def _task_times(spark, description: str) -> list[float]:
    """Task run times of the last stage of the jobs labelled ``description``."""
    stages = _stage_task_times(spark, description)
    return stages[max(stages)]


def heavy(pdf: pd.DataFrame) -> pd.DataFrame:
    v = pdf["v"].to_numpy(dtype=np.float64)
    acc = 0.0
    for _ in range(30):  # CPU work proportional to the key's rows
        acc += float(np.sort(v * 1.0001).sum())
    return pd.DataFrame({"k": [int(pdf["k"].iloc[0])], "n": [len(pdf)], "acc": [acc]})


def skew(spark) -> dict:
    from pyspark.sql import functions as F

    sc_data = make_scenario("zipf", 1_000_000, 2_000, zipf_s=1.1, seed=0)
    df = scenario_frame(spark, sc_data, "k").withColumn("v", F.rand(1)).cache()
    df.count()
    schema = "k long, n long, acc double"
    out = {"keyed_bound": keyed_bound(sc_data.counts, SKEW_PARTITIONS)}
    for strategy in ("hash", "auto"):
        resolved = tl.resolve_strategy(df, "k", strategy, SKEW_PARTITIONS, sample_rate=0.05)
        desc = f"skew-{strategy}"
        spark.sparkContext.setJobDescription(desc)
        result = tl.keyed_apply(df, "k", heavy, schema, strategy=resolved.partitioner, fit="none")
        noop(result)
        spark.sparkContext.setJobDescription(None)
        times = _task_times(spark, desc)
        rows = tl.partition_balance(tl.key_by(df, "k", resolved.partitioner, fit="none"))
        out[strategy] = {
            "chosen": resolved.partitioner.strategy_name,
            "task_time_max_over_mean": max(times) / (sum(times) / len(times)),
            "task_times_s": times,
            "rows_balance_degree": rows.balance_degree,
            "rows_max_over_mean": rows.max_load / rows.mean_load,
        }
        print(strategy, resolved.partitioner.strategy_name, round(out[strategy]["task_time_max_over_mean"], 3),
              "rows balance", round(rows.balance_degree, 3))
    df.unpersist()
    return out


def _stage_task_times(spark, description: str) -> dict:
    """Task run times of every stage of the jobs labelled ``description``: {stage: [s]}."""
    sc = spark.sparkContext
    base = sc.uiWebUrl.replace("localhost", "127.0.0.1")
    app = sc.applicationId

    def get(path: str):
        with urllib.request.urlopen(f"{base}/api/v1/applications/{app}/{path}", timeout=30) as r:
            return json.loads(r.read())

    jobs = [j for j in get("jobs") if j.get("description") == description]
    out = {}
    for stage in sorted(s for j in jobs for s in j["stageIds"]):
        attempts = get(f"stages/{stage}")
        if not attempts or attempts[0].get("status") == "SKIPPED":
            continue
        tasks = get(f"stages/{stage}/{attempts[0]['attemptId']}/taskList?length=10000")
        out[stage] = [t["taskMetrics"]["executorRunTime"] / 1000.0 for t in tasks]
    return out


def skew_combine(spark) -> dict:
    """Zipf s = 1.1 keys, aggregates with no bounded partial buffer: plain groupBy (Spark's
    hash placement) against keyed_agg's choice (exact placement, strategy auto). The slowest
    task of the aggregating stage (the last stage of the job) decides the job's time."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    sc_data = make_scenario("zipf", 1_000_000, 2_000, zipf_s=1.1, seed=0)
    df = scenario_frame(spark, sc_data, "k").withColumn("v", F.rand(1)).cache()
    df.count()

    @F.udf(DoubleType())
    def spread(values):  # CPU work proportional to the key's list
        ordered = sorted(values)
        return float(sum(ordered[i] - ordered[i - 1] for i in range(1, len(ordered))))

    cases = {
        "percentile_approx": lambda d: (F.percentile_approx("v", 0.5, 100000).alias("p"),),
        "collect_list_udf": lambda d: (F.collect_list("v").alias("l"),),
    }
    out = {}
    for label, make in cases.items():
        exprs = make(df)
        plan = explain_keyed_agg(df, "k", *exprs)
        row = {"combine": plan.combine, "reason": plan.reason}
        for route in ("groupBy", "keyed_agg"):
            desc = f"combine-{label}-{route}"
            spark.sparkContext.setJobDescription(desc)
            if route == "groupBy":
                result = df.groupBy("k").agg(*exprs)
            else:
                result = tl.keyed_agg(df, "k", *exprs, num_partitions=SKEW_PARTITIONS,
                                      sample_rate=0.05)
            if label == "collect_list_udf":
                result = result.select("k", spread("l").alias("spread"))
            started = __import__("time").perf_counter()
            noop(result)
            wall = __import__("time").perf_counter() - started
            spark.sparkContext.setJobDescription(None)
            stages = _stage_task_times(spark, desc)
            last = stages[max(stages)]
            row[route] = {"wall_s": wall, "slowest_task_s": max(last),
                          "mean_task_s": sum(last) / len(last), "tasks": len(last)}
        row["slowest_task_ratio"] = row["keyed_agg"]["slowest_task_s"] / row["groupBy"]["slowest_task_s"]
        row["exact_beats_groupBy_on_slowest_task"] = row["slowest_task_ratio"] < 1.0
        out[label] = row
        print(label, row)
    df.unpersist()
    return out


def main() -> dict:
    spark = session()
    only = sys.argv[1:]
    if only == ["combine"]:  # the combine="auto" figures only (see RESULTS.md section 4)
        payload = {"overhead": overhead(spark), "skew_combine": skew_combine(spark),
                   "command": "python benches/placement/bench_spark.py combine"}
        write_json("spark_combine", payload)
        spark.stop()
        return payload
    payload = {"overhead": overhead(spark), "skew": skew(spark),
               "skew_combine": skew_combine(spark),
               "command": "python benches/placement/bench_spark.py"}
    write_json("spark", payload)
    spark.stop()
    return payload


if __name__ == "__main__":
    main()
