"""Local Merge's default on batch DataFrames: one partial row per key, slot and partition,
bounded by buffered groups (``max_groups``); streams keep the paper's quantity mode."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from conftest import greedy_group_bounds
from trilink_spark.merge.engines.bounds import flush_bounds
from trilink_spark.merge.engines.local import plan_merge


@pytest.mark.parametrize("seed", range(40))
def test_group_bounds_match_the_greedy_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    codes = rng.integers(0, int(rng.integers(1, 200)), n)
    if seed % 3 == 0:
        codes = np.sort(codes)  # sorted input too
    max_groups = int(rng.integers(1, 60))
    got = flush_bounds(np.zeros(n), "groups", 0, 0.0, None, codes, max_groups)
    assert got == greedy_group_bounds(codes.tolist(), max_groups)
    for start, end in zip([0, *got], got):  # invariant: never more groups than the bound
        assert len(set(codes[start:end].tolist())) <= max_groups


def test_group_bounds_need_codes() -> None:
    with pytest.raises(InvalidArgumentError, match="group code"):
        flush_bounds(np.zeros(3), "groups", 0, 0.0, None)


def _sensors(spark: Any, sensors: int, seconds: int, parts: int) -> Any:
    """One reading per sensor per second, arriving in time order, over ``parts`` partitions."""
    t = np.repeat(np.arange(seconds), sensors).astype(float)
    k = np.tile(np.arange(sensors), seconds)
    frame = pd.DataFrame({"sensor": k, "ts": t, "v": (k * 7 + t) % 13})
    return spark.createDataFrame(frame).repartition(parts, "sensor")


def test_defaults_merge_each_key_and_slot_of_a_partition_into_one_row(spark: Any) -> None:
    df = _sensors(spark, sensors=300, seconds=240, parts=4)  # 72,000 rows, 4 slots of 60 s
    aggs = [F.sum("v").alias("s"), F.count("*").alias("n")]
    partial = tl.local_merge(df, "sensor", "ts", 60.0, aggs)
    tagged = partial.withColumn("pid", F.spark_partition_id())
    groups = tagged.groupBy("pid", "sensor", "slot_start").count()
    assert groups.filter("count > 1").count() == 0  # one row per (partition, key, slot)
    assert partial.count() == 300 * 4
    merged = tl.merge_partials(partial, "sensor", aggs).orderBy("sensor")
    expected = df.groupBy("sensor").agg(*aggs).orderBy("sensor")
    assert merged.collect() == expected.collect()
    # the old default (10,000 rows per flush) splits slots across flushes
    old = tl.local_merge(df, "sensor", "ts", 60.0, aggs, mode="quantity")
    assert old.count() > partial.count()


def test_max_groups_bounds_buffered_groups_and_stays_exact(spark: Any) -> None:
    df = _sensors(spark, sensors=50, seconds=30, parts=2)
    aggs = {"s": ("sum", "v"), "n": ("count", None)}
    # max_groups bounds the Python engine's buffers (the Spark engine spills instead)
    bounded = tl.local_merge(df, "sensor", "ts", 10.0, aggs, max_groups=7, engine="python")
    whole = tl.local_merge(df, "sensor", "ts", 10.0, aggs, engine="python")
    assert bounded.count() > whole.count()
    got = tl.merge_partials(bounded, "sensor", aggs).orderBy("sensor").collect()
    assert got == tl.merge_partials(whole, "sensor", aggs).orderBy("sensor").collect()
    with pytest.raises(InvalidArgumentTypeError, match="max_groups"):
        tl.local_merge(df, "sensor", "ts", 10.0, aggs, max_groups=0)


def test_streams_keep_the_quantity_mode_and_batches_take_groups(spark: Any) -> None:
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
              .withColumn("k", F.col("value") % 3))
    _, plan = plan_merge(stream, "k", "timestamp", "10 seconds", {"n": ("count", None)})
    assert plan.mode == "quantity"
    batch = spark.range(10).withColumn("t", F.col("id").cast("double"))
    _, plan = plan_merge(batch, "id", "t", 5.0, {"n": ("count", None)})
    assert plan.mode == "groups"
    _, plan = plan_merge(batch, "id", "t", 5.0, {"n": ("count", None)}, "quantity")
    assert plan.mode == "quantity"
    with pytest.raises(InvalidArgumentError, match="auto"):
        plan_merge(batch, "id", "t", 5.0, {"n": ("count", None)}, "sometimes")
