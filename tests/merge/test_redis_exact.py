"""RedisStore: a flush applies wholly or not at all, and keys and values round-trip exactly
(checked against the driver store and Spark's groupBy().agg())."""

from __future__ import annotations

import datetime
import decimal
import math
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.merge import RedisStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def norm(rows: Any, approx: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows as sortable tuples: NaN comparable; the ``approx`` fields (double sums, whose
    last bit depends on the order of the additions) to 12 significant digits."""
    def value(name: str, v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        if name in approx and isinstance(v, float) and math.isfinite(v):
            return float(f"{v:.12g}")
        return v

    return sorted((tuple(value(n, v) for n, v in r.asDict().items()) for r in rows), key=repr)


def test_redis_flush_with_inf_is_all_or_nothing_and_follows_spark(
    spark: Any, redis_server: Any
) -> None:
    rows = [(f"k{i}", float(i)) for i in range(20)]
    rows[10] = ("k10", float("inf"))
    rows += [("k11", float("nan")), ("k12", float("-inf")), ("k12", float("inf"))]
    df = spark.createDataFrame(rows, "k string, v double").coalesce(1)
    aggs = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
            "m": ("mean", "v")}
    want = norm(df.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"),
                                    F.min("v").alias("lo"), F.max("v").alias("hi"),
                                    F.avg("v").alias("m")).collect())
    store = RedisStore(redis_server.url, "t:inf")
    store.clear()
    try:
        for _ in range(2):  # a rerun of the batch changes nothing
            got = tl.global_merge(df, "k", aggs, store=store, batch_id=7)
            assert got is not None
            assert norm(got.collect()) == want
        driver = tl.global_merge(df, "k", aggs)
        assert driver is not None and norm(driver.collect()) == want
    finally:
        store.clear()


def test_redis_flush_that_fails_leaves_nothing_and_a_rerun_applies_it(
    spark: Any, redis_server: Any
) -> None:
    df = spark.createDataFrame([("a", 2**62), ("b", 1), ("a", 2**62)], "k string, v long")
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    store = RedisStore(redis_server.url, "t:overflow")
    store.clear()
    try:
        try:
            tl.global_merge(df.coalesce(1), "k", aggs, store=store, batch_id=3, quantity=1)
        except Exception as err:  # noqa: BLE001 - the task's ArithmeticOverflowError
            assert "ArithmeticOverflowError" in str(err)
        else:
            raise AssertionError("an overflowing sum must fail")
        assert store.applied_flushes() == 2  # the first two flushes, not the failed one
        got = store.read(spark)
        assert norm(got.collect()) == [("a", 1, 2**62), ("b", 1, 1)]
    finally:
        store.clear()


KEY_TYPES: dict[str, Any] = {
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=True, allow_infinity=True),
    "string": st.sampled_from(["", "nan", "None", "null", "a:b", "é🙂", "k" * 300]),
    "binary": st.binary(max_size=8),
    "boolean": st.booleans(),
    "decimal(20,4)": st.decimals(min_value=-(10**15), max_value=10**15, places=4,
                                 allow_nan=False, allow_infinity=False),
    "timestamp": st.datetimes(min_value=datetime.datetime(1900, 1, 1),
                              max_value=datetime.datetime(2200, 1, 1),
                              timezones=st.just(datetime.timezone.utc)),
}


@st.composite
def frames(draw: Any) -> tuple[str, list[tuple[Any, ...]]]:
    key_type = draw(st.sampled_from(sorted(KEY_TYPES)))
    keys = st.one_of(st.none(), KEY_TYPES[key_type])
    pool = draw(st.lists(keys, min_size=1, max_size=4))
    row = st.tuples(st.sampled_from(pool),
                    st.one_of(st.none(), st.integers(-(2**62), 2**62)),
                    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
                    st.one_of(st.none(), st.text(max_size=5)),
                    st.one_of(st.none(), st.decimals(min_value=-10**6, max_value=10**6,
                                                     places=3, allow_nan=False)))
    return key_type, draw(st.lists(row, min_size=1, max_size=8))


AGGS = {"n": ("count", None), "si": ("sum", "i"), "hi": ("max", "i"), "sv": ("sum", "v"),
        "lo": ("min", "v"), "f": ("first", "v"), "l": ("last", "s"), "sd": ("sum", "d"),
        "ms": ("min", "s"), "m": ("mean", "i")}
COLS = ["k", "n", "si", "hi", "sv", "lo", "sd", "ms", "m"]


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=frames())
def test_redis_round_trips_every_key_and_value_exactly(
    spark: Any, redis_server: Any, data: tuple[str, list[tuple[Any, ...]]]
) -> None:
    key_type, rows = data
    df = spark.createDataFrame(
        rows, f"k {key_type}, i long, v double, s string, d decimal(12,3)").repartition(2)
    want = df.groupBy("k").agg(
        F.count(F.lit(1)).alias("n"), F.sum("i").alias("si"), F.max("i").alias("hi"),
        F.sum("v").alias("sv"), F.min("v").alias("lo"), F.sum("d").alias("sd"),
        F.min("s").alias("ms"), F.avg("i").alias("m"))
    store = RedisStore(redis_server.url, "t:exact-types")
    store.clear()
    try:
        got = tl.global_merge(df, "k", AGGS, store=store, batch_id=1, quantity=3)
        driver = tl.global_merge(df, "k", AGGS, quantity=3)
        assert got is not None and driver is not None
        assert got.schema == driver.schema
        assert got.select(COLS).schema.simpleString() == want.schema.simpleString()
        inexact = ("sv", "m")
        assert norm(got.collect(), inexact) == norm(driver.collect(), inexact)
        assert norm(got.select(COLS).collect(), inexact) == norm(want.collect(), inexact)
    finally:
        store.clear()
