"""Hostile pass on decimals (and the sums beside them) through the merges and per-partition
``keyed_agg``: scale 0, decimal(38,38), negatives, nulls and all-null keys, an empty frame,
every local_merge mode, ANSI mode on and off; a sum that overflows only when the partials are
merged must fail naming the aggregate (never null, never wrapped), as the README promises."""

from __future__ import annotations

import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.placement import keyed_by_source
from testkit.frames import rows

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HALF = Decimal(6 * 10**37)  # two of them leave decimal(38,0)


@pytest.fixture(params=["true", "false"], ids=["ansi", "no-ansi"])
def ansi(spark: Any, request: Any) -> Any:
    spark.conf.set("spark.sql.ansi.enabled", request.param)
    try:
        yield request.param
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")


MERGED_OVERFLOWS = {  # (input type, value, aggregate): partials fit, their merge does not
    "bigint sum": ("bigint", 2**62, ("s", "sum")),
    "decimal sum": ("decimal(38,0)", HALF, ("s", "sum")),
    "decimal mean": ("decimal(38,0)", HALF, ("m", "mean")),
}


@pytest.mark.parametrize("case", sorted(MERGED_OVERFLOWS))
def test_merge_partials_fails_naming_a_sum_that_overflows_only_when_merged(
        spark: Any, ansi: str, case: str) -> None:
    """One partial row per input row (quantity 1), each fitting; their merge does not.
    Spark's groupBy fails (ANSI) or gives null (not ANSI): the merge gave null or a wrapped
    bigint without ANSI, and Spark's unnamed error with it."""
    ddl, value, (name, func) = MERGED_OVERFLOWS[case]
    df = spark.createDataFrame([(1, 1.0, value), (1, 2.0, value)], f"k int, t double, v {ddl}")
    aggs = {name: (func, "v")}
    partials = tl.local_merge(df.coalesce(1), "k", "t", 10.0, aggs, mode="quantity",
                              quantity=1)
    assert len(partials.collect()) == 2
    with pytest.raises(Exception, match=f"ArithmeticOverflowError.*{func} '{name}'"):
        tl.merge_partials(partials, "k", aggs).collect()


def test_a_spark_engine_partial_beyond_its_type_is_named_in_ansi_mode(spark: Any,
                                                                      ansi: str) -> None:
    df = spark.createDataFrame([(1, 1.0, HALF), (1, 2.0, HALF)],
                               "k int, t double, v decimal(38,0)").coalesce(1)
    with pytest.raises(Exception, match="ArithmeticOverflowError.*sum 's'"):
        tl.local_merge(df, "k", "t", 10.0, {"s": ("sum", "v")}, engine="spark").collect()


def _source(df: Any) -> Any:
    return keyed_by_source(df.coalesce(1), "k")


def test_keyed_by_source_first_and_last_of_decimals_equal_groupby(spark: Any) -> None:
    """Arrow has no first/last of decimals: the task failed with ArrowNotImplementedError."""
    df = spark.createDataFrame(
        [(1, None), (1, Decimal("-1.50")), (1, Decimal("2.25")), (1, None), (2, None),
         (3, Decimal("0.01"))], "k int, d decimal(10,2)").coalesce(1)
    exprs = [F.first("d").alias("f"), F.first("d", ignorenulls=True).alias("fi"),
             F.last("d").alias("l"), F.last("d", ignorenulls=True).alias("li"),
             F.first_value("d").alias("fv"), F.sum("d").alias("s")]
    want = df.groupBy("k").agg(*exprs)
    got = tl.keyed_agg(_source(df), "k", *exprs)
    assert got.schema.simpleString() == want.schema.simpleString()
    assert rows(got) == rows(want)
    assert rows(got)[0] == (1, None, Decimal("-1.50"), None, Decimal("2.25"), None,
                            Decimal("0.75"))


def test_keyed_by_source_integral_sums_are_exact_or_fail(spark: Any) -> None:
    """Arrow's sum wraps around past 64 bits: 2**62 * 2 gave -2**63."""
    fits = spark.createDataFrame([(1, 2**62), (1, 2**61), (1, 3), (2, None), (3, -(2**63))],
                                 "k int, b bigint")
    total = F.sum("b").alias("s")
    got = tl.keyed_agg(_source(fits), "k", total)
    assert got.schema.simpleString() == fits.groupBy("k").agg(total).schema.simpleString()
    assert rows(got) == rows(fits.groupBy("k").agg(total))
    assert rows(got)[0] == (1, 2**62 + 2**61 + 3)  # beyond doubles, exact
    over = spark.createDataFrame([(1, 2**62), (1, 2**62)], "k int, b bigint")
    with pytest.raises(Exception, match="ArithmeticOverflowError.*'s'"):
        tl.keyed_agg(_source(over), "k", total).collect()
    low = spark.createDataFrame([(1, -(2**63)), (1, -1)], "k int, b bigint")
    with pytest.raises(Exception, match="ArithmeticOverflowError"):
        tl.keyed_agg(_source(low), "k", F.sum("b")).collect()


def _rows(ddl: str) -> list[tuple[Any, ...]]:
    """Negatives, a null, an all-null key, a half to round, values at the type's edge."""
    if ddl == "decimal(10,0)":
        values = [Decimal(-9999999999), Decimal(3), None, Decimal(-2), Decimal(9999999999)]
        tiny = Decimal(1)
    else:  # decimal(38,38): sums stay below 1
        values = [Decimal("-0.99999999999999999999999999999999999999"),
                  Decimal("0.5"), None, Decimal("-0.25"),
                  Decimal("0.99999999999999999999999999999999999999")]
        tiny = Decimal("1E-38")
    out: list[tuple[Any, ...]] = [(1, float(i), v) for i, v in enumerate(values)]
    out += [(2, 10.0, None), (2, 11.0, None), (3, 12.0, tiny)]
    out += [(3, 13.0 + i, Decimal(0)) for i in range(7)]  # 1/8 at scale + 4: 0.125 units
    return out


PATHS: dict[str, Callable[[Any, list[Any]], Any]] = {
    "groups": lambda df, e: tl.merge_partials(tl.local_merge(df, "k", "t", 4.0, e), "k", e),
    "quantity": lambda df, e: tl.merge_partials(
        tl.local_merge(df, "k", "t", 4.0, e, quantity=2), "k", e),
    "periodic": lambda df, e: tl.merge_partials(
        tl.local_merge(df, "k", "t", 4.0, e, delay=3.0), "k", e),
    "order_by": lambda df, e: tl.merge_partials(
        tl.local_merge(df, "k", "t", 4.0, e, order_by="t"), "k", e),
    "spark engine": lambda df, e: tl.merge_partials(
        tl.local_merge(df, "k", "t", 4.0, e, engine="spark"), "k", e),
    "global driver": lambda df, e: tl.global_merge(df, "k", e),
    "keyed never": lambda df, e: tl.keyed_agg(df, "k", *e, strategy="hash",
                                              num_partitions=2, combine="never"),
    "keyed_by_source": lambda df, e: tl.keyed_agg(_source(df), "k", *e),
}


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("ddl", ["decimal(10,0)", "decimal(38,38)"])
def test_scale_0_and_38_give_groupbys_values_and_types_on_every_path(
        spark: Any, ddl: str, partitions: int) -> None:
    df = spark.createDataFrame(spark.sparkContext.parallelize(_rows(ddl), partitions),
                               f"k int, t double, d {ddl}")
    exprs = [F.avg("d").alias("m"), F.sum("d").alias("s"), F.min("d").alias("lo"),
             F.count("d").alias("n")]
    want = df.groupBy("k").agg(*exprs)
    expected = rows(want)
    # key 3: one unit over 8 values, 0.125 units: 0.1250 at scale 4, 0 at scale 38
    assert expected[2][1] == (Decimal("0.1250") if ddl == "decimal(10,0)" else Decimal(0))
    for path, run in PATHS.items():
        got = run(df, exprs)
        assert got.schema.simpleString() == want.schema.simpleString(), path
        assert rows(got) == expected, path


def test_an_empty_decimal_frame_gives_groupbys_empty_typed_result(spark: Any) -> None:
    df = spark.createDataFrame([], "k int, t double, d decimal(38,10)")
    exprs = [F.avg("d").alias("m"), F.sum("d").alias("s")]
    want = df.groupBy("k").agg(*exprs)
    for path, run in PATHS.items():
        got = run(df, exprs)
        assert got.schema.simpleString() == want.schema.simpleString(), path
        assert got.collect() == [], path
