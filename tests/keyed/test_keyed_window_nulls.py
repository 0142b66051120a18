"""KeyedWindowAggregate keeps rows whose key is NaN or null, as Spark's groupBy does."""

from __future__ import annotations

from typing import Any

import pandas as pd
from pyspark.sql import functions as F

import trilink_spark as tl


def _counts(frame: pd.DataFrame, key: str) -> list[tuple[Any, ...]]:
    rows = [(None if pd.isna(k) and not isinstance(k, float) else k, float(s), int(n))
            for k, s, n in zip(frame[key], frame["window_start"], frame["count"])]
    return sorted((repr(k), s, n) for k, s, n in rows)


def _truth(df: Any, key: str) -> pd.DataFrame:
    start = F.floor(F.col("t") / 10) * 10
    return (df.groupBy(key, start.cast("double").alias("window_start")).count().toPandas())


def test_window_aggregate_keeps_nan_and_null_double_keys(spark: Any) -> None:
    rows = [(1.0, 1.0), (float("nan"), 2.0), (float("nan"), 3.0), (None, 4.0), (None, 15.0),
            (2.0, 12.0), (float("nan"), 14.0)]
    df = spark.createDataFrame(rows, "k double, t double")
    spark.conf.set("spark.trilink.nullPolicy", "partition0")
    try:
        got = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(10.0), delay=100.0,
                               strategy="hash", num_partitions=2).toPandas()
    finally:
        spark.conf.unset("spark.trilink.nullPolicy")
    assert int(got["count"].sum()) == len(rows)
    assert _counts(got, "k") == _counts(_truth(df, "k"), "k")


def test_window_aggregate_keeps_null_string_keys_under_partition0(spark: Any) -> None:
    rows = [("a", 1.0), (None, 2.0), (None, 3.0), ("", 4.0), ("b", 15.0), (None, 16.0)]
    df = spark.createDataFrame(rows, "k string, t double")
    spark.conf.set("spark.trilink.nullPolicy", "partition0")
    try:
        got = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(10.0), delay=100.0,
                               strategy="hash", num_partitions=3).toPandas()
    finally:
        spark.conf.unset("spark.trilink.nullPolicy")
    assert int(got["count"].sum()) == len(rows)
    assert _counts(got, "k") == _counts(_truth(df, "k"), "k")
