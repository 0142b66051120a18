"""Local Merge and Global Merge take Spark's own aggregate forms: Column expressions and the
``{column: "func"}`` dict, named as Spark names them, and refuse what cannot merge exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.merge.algebra.expressions import parse_aggs

pytestmark = pytest.mark.connect


def _frame(spark: Any, seed: int = 0, n: int = 400) -> Any:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=n)
    v[rng.random(n) < 0.2] = np.nan  # nulls (Arrow turns NaN of a float64 frame into null)
    w = rng.integers(-5, 5, n).astype(float)
    w[rng.random(n) < 0.1] = np.nan
    frame = pd.DataFrame({"k": rng.choice(list("abcdefg"), n), "t": rng.permutation(n) * 1.0,
                          "v": v, "w": pd.array(np.where(np.isnan(w), None, w), "Int64")})
    return spark.createDataFrame(frame, "k string, t double, v double, w bigint").repartition(3)


def _rows(df: Any) -> list[tuple[Any, ...]]:
    out = []
    for row in df.orderBy("k").collect():
        out.append(tuple(round(x, 9) if isinstance(x, float) else x for x in row))
    return out


COLUMN_AGGS = [
    lambda: F.sum("v"), lambda: F.sum("w").alias("sw"), lambda: F.count("*"),
    lambda: F.count("v"), lambda: F.avg("v"), lambda: F.mean("w").alias("mean_w"),
    lambda: F.min("v"), lambda: F.max(F.col("w")), lambda: F.count(F.lit(1)).alias("rows"),
]


def test_column_aggregates_merge_to_what_groupby_gives_with_spark_names(spark: Any) -> None:
    df = _frame(spark)
    cols = [make() for make in COLUMN_AGGS]
    expected = df.groupBy("k").agg(*cols)
    partial = tl.local_merge(df, "k", "t", 50.0, cols)
    merged = tl.merge_partials(partial, "k", cols)
    assert merged.columns == expected.columns  # Spark's own output names
    assert _rows(merged) == _rows(expected)


def test_spark_dict_form_merges_to_what_groupby_gives(spark: Any) -> None:
    df = _frame(spark, seed=1)
    aggs = {"v": "sum", "w": "avg", "*": "count"}
    expected = df.groupBy("k").agg(aggs)
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 30.0, aggs), "k", aggs)
    assert sorted(merged.columns) == sorted(expected.columns)
    assert _rows(merged.select(*expected.columns)) == _rows(expected)
    for name, func in [("v", "max"), ("w", "min"), ("v", "mean"), ("v", "count")]:
        one = {name: func}
        got = tl.merge_partials(tl.local_merge(df, "k", "t", 30.0, one), "k", one)
        assert _rows(got) == _rows(df.groupBy("k").agg(one)), one


def test_first_and_last_with_ignorenulls_follow_event_time(spark: Any) -> None:
    frame = pd.DataFrame({"k": ["a"] * 4, "t": [3.0, 1.0, 2.0, 4.0],
                          "v": [30.0, None, 20.0, None]})
    df = spark.createDataFrame(frame, "k string, t double, v double")
    cols = [F.first("v", ignorenulls=True), F.last("v", True).alias("lv")]
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 100.0, cols), "k", cols)
    assert merged.columns == ["k", "first(v)", "lv"]
    assert merged.collect()[0][1:] == (20.0, 30.0)


def test_global_merge_takes_column_aggregates(spark: Any) -> None:
    df = _frame(spark, seed=2)
    cols = [F.sum("v").alias("s"), F.count("*")]
    got = tl.global_merge(df, "k", cols)
    assert got is not None
    assert _rows(got.select("k", "s", "count(1)")) == _rows(df.groupBy("k").agg(*cols))


@pytest.mark.parametrize("make, name", [
    (lambda: F.collect_list("v"), "collect_list"),
    (lambda: F.percentile_approx("v", 0.5), "percentile_approx"),
    (lambda: F.stddev("v").alias("sd"), "stddev"),
    (lambda: F.approx_count_distinct("v"), "approx_count_distinct"),
])
def test_aggregates_that_cannot_merge_exactly_are_refused_by_name(spark: Any, make: Any,
                                                                 name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name) as err:
        parse_aggs([make()], ["k", "v"])
    assert "keyed_agg" in str(err.value)


def test_count_distinct_is_refused(spark: Any) -> None:
    df = _frame(spark)
    for col in (F.count_distinct("v"), F.count_distinct("v").alias("n")):
        with pytest.raises(InvalidArgumentError, match="(?i)distinct"):
            tl.local_merge(df, "k", "t", 10.0, [col])


@pytest.mark.parametrize("make, match", [
    (lambda: F.sum(F.col("v") * 2), "withColumn"),
    (lambda: F.sum("nope"), "not a column"),
    (lambda: F.first("v"), "ignorenulls=True"),
    (lambda: F.col("v"), "aggregate function"),
    (lambda: F.sum("v").cast("double"), "does not know"),
])
def test_what_is_not_a_plain_aggregate_of_a_column_is_refused(spark: Any, make: Any,
                                                             match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        parse_aggs([make()], ["k", "v"])


def test_dict_form_errors_name_the_entry() -> None:
    with pytest.raises(InvalidArgumentError, match="collect_list"):
        parse_aggs({"v": "collect_list"}, ["v"])
    with pytest.raises(InvalidArgumentError, match="not in"):
        parse_aggs({"x": "sum"}, ["v"])
    with pytest.raises(InvalidArgumentError, match="only count"):
        parse_aggs({"*": "sum"}, ["v"])
    with pytest.raises(InvalidArgumentTypeError):
        parse_aggs({"v": "sum", "w": ("sum", "w")}, ["v", "w"])


def test_tuple_form_still_works_and_count_of_a_column_skips_nulls(spark: Any) -> None:
    df = _frame(spark, seed=3)
    aggs = {"n": ("count", None), "nv": ("count", "v"), "s": ("sum", "v")}
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 40.0, aggs), "k", aggs)
    expected = df.groupBy("k").agg(F.count("*").alias("n"), F.count("v").alias("nv"),
                                   F.sum("v").alias("s"))
    assert _rows(merged) == _rows(expected)
