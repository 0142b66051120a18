"""Sums and means of decimals through every merge path equal Spark's ``groupBy().agg`` in value
and in type: ``avg`` of a decimal(p, s) is a decimal(min(38, p + 4), min(38, s + 4)), computed
from the exact sum and rounded half up as Spark rounds it (never through a double), and ``sum``,
``min``, ``max`` keep Spark's types. The data cancel (10**19 + 1e-18 - 10**19, spread over
partitions), hold nulls and an all-null key, and round at a half."""

from __future__ import annotations

import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError
from trilink_spark.merge import Combine, RedisStore
from trilink_spark.merge.algebra.kernels import decimal_means
from trilink_spark.placement import keyed_by_source
from testkit.frames import rows

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = Decimal("10000000000000000000")  # 10**19: 20 digits before the point of decimal(38,18)
TINY = Decimal("0.000000000000000001")


def _rows38() -> list[tuple[Any, ...]]:
    """Key 1 cancels across partitions, key 2 has only nulls, key 3 mixes, key 4 averages to
    -3.125e-20: half up at scale 22 is -3.13e-20 (half even would give -3.12e-20)."""
    out: list[tuple[Any, ...]] = [(1, 1.0, BIG), (2, 2.0, None), (3, 3.0, TINY),
                                  (1, 4.0, Decimal("1.000000000000000001")), (2, 5.0, None),
                                  (3, 6.0, Decimal(2)), (1, 7.0, -BIG), (3, 8.0, None),
                                  (3, 9.0, Decimal("-0.5")), (4, 10.0, -TINY)]
    out += [(4, 11.0 + i, Decimal(0)) for i in range(31)]
    return out


def _rows10() -> list[tuple[Any, ...]]:
    """decimal(10,2): 6.35 / 3 is 2.116667; 0.01 / 32 = 0.0003125 rounds half up to 0.000313."""
    out: list[tuple[Any, ...]] = [(1, 1.0, Decimal("1.10")), (1, 2.0, Decimal("2.25")),
                                  (1, 3.0, Decimal("3.00")), (2, 4.0, None),
                                  (3, 5.0, Decimal("0.01")), (3, 6.0, None)]
    out += [(3, 7.0 + i, Decimal("0.00")) for i in range(31)]
    out += [(4, 40.0, Decimal("-99999999.99")), (4, 41.0, Decimal("-0.01"))]
    return out


DATA = {"decimal(38,18)": _rows38, "decimal(10,2)": _rows10}


def _frame(spark: Any, ddl: str) -> Any:
    data = DATA[ddl]()
    return spark.createDataFrame(spark.sparkContext.parallelize(data, 3),
                                 f"k int, t double, d {ddl}")


def _exprs() -> list[Any]:
    return [F.avg("d").alias("m"), F.sum("d").alias("s"), F.min("d").alias("lo"),
            F.max("d").alias("hi"), F.count("d").alias("n")]


def _merged(kind: str) -> Callable[[Any], Any]:
    """How each path computes the aggregates of ``_exprs`` from the frame."""
    def local(engine: str, **kw: Any) -> Callable[[Any], Any]:
        return lambda df: tl.merge_partials(
            tl.local_merge(df, "k", "t", 1000.0, _exprs(), engine=engine, **kw), "k", _exprs())

    def with_first(df: Any) -> Any:
        first = F.first("d", ignorenulls=True).alias("f")
        return tl.global_merge(df, "k", [*_exprs(), first], event_time="t").drop("f")

    def with_combine(df: Any) -> Any:
        aggs = [*_exprs(), ("tmax", Combine(np.max, "double"), "t")]
        partials = tl.local_merge(df, "k", "t", 1000.0, aggs)
        return tl.merge_partials(partials, "k", aggs).drop("tmax")

    return {
        "python": local("python"),
        "python-quantity": local("python", mode="quantity", quantity=2),
        "spark": local("spark"),
        "global-driver": lambda df: tl.global_merge(df, "k", _exprs()),
        "global-driver-algebra": with_first,
        "merge-with-a-combine": with_combine,
    }[kind]


PATHS = ("python", "python-quantity", "spark", "global-driver", "global-driver-algebra",
         "merge-with-a-combine")


@pytest.mark.parametrize("ddl", sorted(DATA))
@pytest.mark.parametrize("path", PATHS)
def test_every_merge_path_gives_groupbys_values_and_types(spark: Any, ddl: str,
                                                          path: str) -> None:
    df = _frame(spark, ddl)
    want = df.groupBy("k").agg(*_exprs())
    got = _merged(path)(df)
    assert got.schema.simpleString() == want.schema.simpleString()
    assert rows(got) == rows(want)


def test_the_expected_values_are_sparks(spark: Any) -> None:
    """The cases the data were built for (so the comparison above can fail)."""
    avg38 = {r.k: r.m for r in _frame(spark, "decimal(38,18)").groupBy("k")
             .agg(F.avg("d").alias("m")).collect()}
    assert avg38[1] == Decimal("0.3333333333333333336667")  # not 0.0 (doubles cancel)
    assert avg38[2] is None
    assert avg38[4] == Decimal("-0.0000000000000000000313")
    avg10 = {r.k: r.m for r in _frame(spark, "decimal(10,2)").groupBy("k")
             .agg(F.avg("d").alias("m")).collect()}
    assert avg10[1] == Decimal("2.116667") and avg10[3] == Decimal("0.000313")


def test_ansi_off_takes_the_algebra_and_still_equals_groupby(spark: Any) -> None:
    df = _frame(spark, "decimal(38,18)")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        want = df.groupBy("k").agg(*_exprs())
        got = tl.global_merge(df, "k", _exprs())
        assert got.schema.simpleString() == want.schema.simpleString()
        assert rows(got) == rows(want)
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")


@pytest.mark.parametrize("unscaled, count, mean", [
    # 1.4925...e-38: rounding at 39 places first (to 1.5e-38) would give 2e-38
    (1, 67, "1E-38"),
    # ...19968|4999...: rounding to 38 significant digits first would end in ...969
    (743077054738470222641870766959493577, 73, "0.01017913773614342770742288721862319968"),
    # ...29111|49...: rounding to 39 significant digits first would end in ...112
    (31524521220066826793758846902297877327, 87, "0.36235081862145777923860743565859629111"),
])
def test_the_mean_is_rounded_once_at_scale_38(spark: Any, unscaled: int, count: int,
                                              mean: str) -> None:
    """decimal(38,36) sums over counts that no rounding before scale 38 leaves alone: Spark's
    avg truncates at 39 places and then rounds half up once, which is what the merges do."""
    data = [(1, float(i), Decimal(f"{unscaled}E-36") if i == 0 else Decimal(0))
            for i in range(count)]
    df = spark.createDataFrame(spark.sparkContext.parallelize(data, 2),
                               "k int, t double, d decimal(38,36)")
    want = df.groupBy("k").agg(F.avg("d").alias("m"))
    assert want.collect()[0].m == Decimal(mean)
    for engine in ("python", "spark"):
        got = tl.merge_partials(tl.local_merge(df, "k", "t", 1000.0, [F.avg("d").alias("m")],
                                               engine=engine), "k", [F.avg("d").alias("m")])
        assert got.schema.simpleString() == want.schema.simpleString()
        assert rows(got) == rows(want), engine


def test_a_mean_keeps_the_inputs_precision_through_the_partials(spark: Any) -> None:
    """decimal(30,2) and decimal(38,2) both sum to decimal(38,2): the partial's field metadata
    keeps 30, so merge_partials gives avg's decimal(34,6); without it, decimal(38,6)."""
    df = spark.createDataFrame([(1, 1.0, Decimal("1.25")), (1, 2.0, Decimal("2.50"))],
                               "k int, t double, d decimal(30,2)")
    exprs = [F.avg("d").alias("m")]
    want = df.groupBy("k").agg(*exprs)
    assert want.schema["m"].dataType.simpleString() == "decimal(34,6)"
    for engine in ("python", "spark"):
        partials = tl.local_merge(df, "k", "t", 10.0, exprs, engine=engine)
        assert partials.schema["m__sum"].dataType.simpleString() == "decimal(38,2)"
        got = tl.merge_partials(partials, "k", exprs)
        assert got.schema.simpleString() == want.schema.simpleString(), engine
        assert rows(got) == rows(want)
        bare = partials.select(*[F.col(c).alias(c, metadata={}) for c in partials.columns])
        widest = tl.merge_partials(bare, "k", exprs)
        assert widest.schema["m"].dataType.simpleString() == "decimal(38,6)"
        assert widest.collect()[0].m == Decimal("1.875000")


def test_a_mean_beyond_its_type_fails_as_ansi_mode_fails(spark: Any) -> None:
    """avg of decimal(38,18) is a decimal(38,22): 16 digits before the point. 10**17 does not
    fit: Spark's groupBy fails (ANSI mode, its default), and so does every merge, naming
    ArithmeticOverflowError."""
    df = spark.createDataFrame([(1, 1.0, Decimal(10**17)), (2, 2.0, Decimal(1))],
                               "k int, t double, d decimal(38,18)")
    exprs = [F.avg("d").alias("m")]
    with pytest.raises(Exception, match="NUMERIC_VALUE_OUT_OF_RANGE"):
        df.groupBy("k").agg(*exprs).collect()
    with pytest.raises(ArithmeticOverflowError):
        tl.global_merge(df, "k", exprs)
    with pytest.raises(ArithmeticOverflowError, match="mean 'm'"):
        tl.global_merge(df, "k", [*exprs, F.first("d", ignorenulls=True)], event_time="t")
    for engine in ("python", "spark"):
        merged = tl.merge_partials(tl.local_merge(df, "k", "t", 10.0, exprs, engine=engine),
                                   "k", exprs)
        with pytest.raises(Exception, match="ArithmeticOverflowError"):
            merged.collect()


def test_a_decimal_sum_beyond_38_digits_is_named_in_the_python_engine(spark: Any) -> None:
    big = Decimal("9" * 38)
    df = spark.createDataFrame([(1, 1.0, big), (1, 2.0, big)], "k int, t double, d decimal(38,0)")
    for aggs in ({"s": ("sum", "d")}, {"m": ("mean", "d")}):
        with pytest.raises(Exception, match="ArithmeticOverflowError"):
            tl.local_merge(df.coalesce(1), "k", "t", 10.0, aggs, engine="python").collect()


@pytest.mark.parametrize("apply_on", ["tasks", "driver"])
def test_the_redis_store_keeps_decimal_sums_and_means_exact(
        spark: Any, redis_server: Any, apply_on: str) -> None:
    df = _frame(spark, "decimal(38,18)")
    want = df.groupBy("k").agg(*_exprs())
    store = RedisStore(redis_server.url, f"t:decimal-means:{apply_on}")
    store.clear()
    try:
        for _ in range(2):  # a rerun of the batch changes nothing
            got = tl.global_merge(df, "k", _exprs(), store=store, batch_id=5, quantity=2,
                                  apply_on=apply_on)
            assert got is not None
            assert got.schema.simpleString() == want.schema.simpleString()
            assert rows(got) == rows(want)
    finally:
        store.clear()


@pytest.mark.parametrize("ddl", sorted(DATA))
def test_keyed_agg_gives_groupbys_decimals_on_every_plan(spark: Any, ddl: str) -> None:
    """Spark's combine, exact placement, and a keyed_by_source frame (aggregated per input
    partition: Arrow's decimal mean kept the input's scale and its sum wraps on overflow)."""
    df = _frame(spark, ddl)
    exprs = [F.avg("d").alias("m"), F.sum("d").alias("s"), F.count("*").alias("n")]
    want = df.groupBy("k").agg(*exprs)
    declared = keyed_by_source(df.repartition(2, "k"), "k")
    for got in (tl.keyed_agg(df, "k", *exprs, strategy="hash", num_partitions=2),
                tl.keyed_agg(df, "k", *exprs, strategy="hash", num_partitions=2,
                             combine="never"),
                tl.keyed_agg(declared, "k", *exprs)):
        assert got.schema.simpleString() == want.schema.simpleString()
        assert rows(got) == rows(want)


def test_a_keyed_by_source_decimal_sum_beyond_38_digits_fails(spark: Any) -> None:
    big = Decimal("9" * 38)
    df = spark.createDataFrame([(1, big), (1, big)], "k int, d decimal(38,0)").coalesce(1)
    with pytest.raises(Exception, match="ArithmeticOverflowError"):
        tl.keyed_agg(keyed_by_source(df, "k"), "k", F.sum("d")).collect()


def test_decimal_means_rounds_half_away_from_zero_and_refuses_39_digits() -> None:
    sums = pd.Series([Decimal("-0.01"), Decimal("0.01"), None, Decimal("5.00")], dtype=object)
    counts = pd.Series([32, 32, 0, 0])
    assert decimal_means(sums, counts, "m").tolist() == [Decimal("-0.000313"),
                                                         Decimal("0.000313"), None, None]
    over = pd.Series([Decimal("9" * 38)], dtype=object)  # scale 0 -> 4: 42 digits
    with pytest.raises(ArithmeticOverflowError, match="'m'"):
        decimal_means(over, pd.Series([1]), "mean 'm'")
