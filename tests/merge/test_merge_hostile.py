"""Hostile inputs to Local Merge and Global Merge (driver store): event times that are null,
NaN or infinite, Spark's result types and exact long sums, and typed argument errors."""

from __future__ import annotations

import decimal
import math
from typing import Any

import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError, InvalidArgumentError
from trilink_spark.errors import InvalidArgumentTypeError, InvalidKeyTypeError, ReservedColumnError


def norm(rows: Any) -> list[tuple[Any, ...]]:
    """Rows as sortable tuples, NaN made comparable."""
    return sorted((tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r)
                   for r in rows), key=repr)


AGGS = {"n": ("count", None), "si": ("sum", "i"), "sv": ("sum", "v"), "sd": ("sum", "d"),
        "lo": ("min", "v"), "hi": ("max", "v"), "m": ("mean", "i"), "hd": ("max", "d"),
        "li": ("min", "i")}
COLS = ["k", *AGGS]


def truth(df: Any) -> Any:
    return df.groupBy("k").agg(
        F.count(F.lit(1)).alias("n"), F.sum("i").alias("si"), F.sum("v").alias("sv"),
        F.sum("d").alias("sd"), F.min("v").alias("lo"), F.max("v").alias("hi"),
        F.avg("i").alias("m"), F.max("d").alias("hd"), F.min("i").alias("li"))


def hostile_frame(spark: Any) -> Any:
    rows = [(1, 0.0, 2**53 + 1, 1.5, decimal.Decimal("1.25")),
            (1, float("nan"), 2**53, float("nan"), None),
            (2, None, 5, float("inf"), decimal.Decimal("2.50")),
            (None, float("inf"), 7, 1.0, None),
            (2, 1e300, None, None, decimal.Decimal("-1.00")),
            (3, float("-inf"), 1, -0.0, None),
            (3, 12.0, -(2**62), float("-inf"), None),
            (4, None, None, float("nan"), None)]
    return spark.createDataFrame(
        rows, "k long, t double, i long, v double, d decimal(10,2)").repartition(2)


def test_rows_without_a_finite_event_time_are_kept_in_a_null_slot(spark: Any) -> None:
    df = hostile_frame(spark)
    partial = tl.local_merge(df, "k", "t", 10.0, AGGS, quantity=2)
    slots = partial.select("k", "slot_start", "t", "n").toPandas()
    assert int(slots["n"].sum()) == df.count()  # no row is dropped
    untimed = slots[slots["slot_start"].isna()]
    assert untimed["t"].isna().all() and int(untimed["n"].sum()) == 5
    assert norm(tl.merge_partials(partial, "k", AGGS).select(COLS).collect()) \
        == norm(truth(df).select(COLS).collect())
    merged = tl.global_merge(df, "k", AGGS, event_time="t")
    assert merged is not None
    assert norm(merged.select(COLS).collect()) == norm(truth(df).select(COLS).collect())
    periodic = tl.global_merge(df, "k", AGGS, mode="periodic", event_time="t", delay=5.0)
    assert periodic is not None
    assert norm(periodic.select(COLS).collect()) == norm(truth(df).select(COLS).collect())


def test_integral_event_times_with_nulls_keep_every_row(spark: Any) -> None:
    df = spark.createDataFrame([(1, None, 1), (1, 5, 2), (2, None, 3)], "k long, t long, i long")
    aggs = {"n": ("count", None), "si": ("sum", "i")}
    got = tl.merge_partials(tl.local_merge(df, "k", "t", 10, aggs), "k", aggs)
    assert sorted(tuple(r) for r in got.collect()) == [(1, 2, 3), (2, 1, 3)]


def test_result_types_and_long_sums_follow_spark(spark: Any) -> None:
    df = hostile_frame(spark)
    want = truth(df).select(COLS)
    via_partials = tl.merge_partials(tl.local_merge(df, "k", "t", 10.0, AGGS), "k", AGGS)
    driver = tl.global_merge(df, "k", AGGS)
    assert driver is not None
    for got in (via_partials.select(COLS), driver.select(COLS)):
        assert got.schema.simpleString() == want.schema.simpleString()
        assert norm(got.collect()) == norm(want.collect())
    sums = dict(driver.select("k", "si").collect())
    assert sums[1] == 2**54 + 1  # beyond 2**53: exact, a bigint


def test_long_sum_overflow_is_a_typed_error(spark: Any) -> None:
    df = spark.createDataFrame([(1, 2**62), (1, 2**62)], "k long, i long").coalesce(1)
    aggs = {"si": ("sum", "i")}
    with pytest.raises(ArithmeticOverflowError, match="overflows bigint"):
        tl.global_merge(df, "k", aggs)
    split = spark.createDataFrame(  # one row per partition: the driver's merge overflows
        spark.sparkContext.parallelize([(1, 2**62), (1, 2**62)], 2), "k long, i long")
    with pytest.raises(tl.TrilinkError, match="overflows bigint"):  # merged on the driver
        tl.global_merge(split, "k", aggs)


def test_bad_arguments_are_trilink_errors_before_any_job(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0, "a")], "k long, t long, v double, s string")
    nested = df.select(F.struct("k").alias("k"), F.array("k").alias("a"), "t", "v")
    for key in ("k", "a"):
        with pytest.raises(InvalidKeyTypeError, match=key):
            tl.local_merge(nested, key, "t", 10, {"n": ("count", None)})
        with pytest.raises(InvalidKeyTypeError):
            tl.global_merge(nested, key, {"n": ("count", None)})
    for name in ("k", "t", "slot_start"):
        with pytest.raises(InvalidArgumentError, match=name):
            tl.local_merge(df, "k", "t", 10, {name: ("sum", "v")})
    for name in ("k", "slot_start"):
        with pytest.raises(InvalidArgumentError, match=name):
            tl.global_merge(df, "k", {name: ("sum", "v")})
    with pytest.raises(InvalidArgumentError, match="'t'"):
        tl.global_merge(df, "k", {"t": ("sum", "v")}, event_time="t")
    for func in ("sum", "mean"):
        with pytest.raises(InvalidArgumentTypeError, match="'s' is string"):
            tl.local_merge(df, "k", "t", 10, {"x": (func, "s")})
        with pytest.raises(InvalidArgumentTypeError, match="'s' is string"):
            tl.global_merge(df, "k", {"x": (func, "s")})
    reserved = df.withColumnRenamed("v", tl.PARTITION_COL)
    with pytest.raises(ReservedColumnError):
        tl.local_merge(reserved, "k", "t", 10, {"n": ("count", None)})
    with pytest.raises(ReservedColumnError):
        tl.global_merge(reserved, "k", {"n": ("count", None)})
    with pytest.raises(ReservedColumnError):
        tl.global_merge(df, "k", {"_tl_x": ("sum", "v")})
