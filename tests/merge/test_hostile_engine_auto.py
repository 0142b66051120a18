"""Hostile inputs through the default engine (``engine="auto"``) of local_merge and
global_merge: wherever the default takes Spark's JVM aggregation its rows equal the Python
engine's (null/NaN/-0.0 keys, NaN/inf values, decimal(38,18), longs beyond 2**53, null/NaN/inf
and timestamp event times, dotted and backticked names, empty frames, ANSI on and off), and
an overflow fails on both, naming ArithmeticOverflowError."""

from __future__ import annotations

import datetime
import math
from collections import Counter
from decimal import Decimal
from typing import Any, Callable

import pytest

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError
from trilink_spark.merge import explain_global_merge, explain_local_merge

ANSI = "spark.sql.ansi.enabled"


def _value(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isfinite(v):
            return round(v, 6) + 0.0  # float sums: Spark and Arrow add in other orders
    return v


def multiset(df: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple((k, _value(v)) for k, v in r.asDict().items()) for r in df.collect())


@pytest.fixture(params=["true", "false"], ids=["ansi", "no-ansi"])
def ansi(spark: Any, request: pytest.FixtureRequest) -> Any:
    spark.conf.set(ANSI, request.param)
    yield request.param
    spark.conf.unset(ANSI)


def local_both(df: Any, key: str, t: str, slot: Any, aggs: dict[str, Any],
               jvm: bool = True, **kw: Any) -> Counter[tuple[Any, ...]]:
    """local_merge's default and Python engines give the same rows; the default ran in the
    JVM when ``jvm``."""
    if jvm:
        assert explain_local_merge(df, key, t, slot, aggs, **kw).engine == "spark"
    got = multiset(tl.local_merge(df, key, t, slot, aggs, **kw))
    assert got == multiset(tl.local_merge(df, key, t, slot, aggs, engine="python", **kw))
    return got


def global_both(df: Any, key: str, aggs: dict[str, Any], jvm: bool = True,
                **kw: Any) -> Counter[tuple[Any, ...]]:
    if jvm:
        assert explain_global_merge(df, key, aggs, **kw).engine == "spark"
    got = multiset(tl.global_merge(df, key, aggs, **kw))
    assert got == multiset(tl.global_merge(df, key, aggs, engine="python", **kw))
    return got


def both_fail(make: Callable[[str], Any]) -> None:
    """Both engines fail the action, naming ArithmeticOverflowError."""
    for engine in ("auto", "python"):
        with pytest.raises(Exception) as caught:
            make(engine).collect()
        assert isinstance(caught.value, ArithmeticOverflowError) or \
            "ArithmeticOverflowError" in str(caught.value), (engine, caught.value)


AGGS = {"n": ("count", None), "nv": ("count", "v"), "s": ("sum", "v"), "m": ("mean", "v"),
        "lo": ("min", "v"), "hi": ("max", "v"), "si": ("sum", "i")}


def hostile_doubles(spark: Any) -> Any:
    nan, inf = math.nan, math.inf
    rows = [(None, 1.0, 1, 0.5), (nan, 2.0, 2, nan), (-0.0, 3.0, 3, inf), (0.0, 4.0, 4, -inf),
            (1.5, None, 5, 1.0), (1.5, nan, 6, 2.0), (1.5, inf, 7, 3.0), (1.5, -inf, 8, None),
            (nan, 1e300, 9, 1.0), (-0.0, -1e300, 2**53 + 1, -0.0)]
    return spark.createDataFrame(rows, "k double, t double, i bigint, v double").repartition(3)


def test_null_nan_and_signed_zero_keys_nan_inf_values(spark: Any, ansi: str) -> None:
    df = hostile_doubles(spark)
    got = local_both(df, "k", "t", 10.0, AGGS)
    assert {dict(r)["k"] for r in got} >= {None, "nan", 0.0, 1.5}
    global_both(df, "k", AGGS)
    global_both(df, "k", AGGS, event_time="t")


def test_decimal_38_18_sums_and_means(spark: Any, ansi: str) -> None:
    rows = [(1, 1, Decimal("1234567890123456.123456789012345678")),
            (1, 2, Decimal("0.000000000000000001")),
            (2, 3, Decimal("-1234567890123456.123456789012345678")),
            (2, 4, Decimal("1")), (3, 5, None), (None, 6, Decimal("-0.5"))]
    df = spark.createDataFrame(rows, "k long, t long, d decimal(38,18)").repartition(2)
    aggs = {"s": ("sum", "d"), "m": ("mean", "d"), "lo": ("min", "d"), "hi": ("max", "d"),
            "n": ("count", "d")}
    local_both(df, "k", "t", 10, aggs)
    got = global_both(df, "k", aggs)
    sums = {dict(r)["k"]: dict(r)["s"] for r in got}
    assert sums[1] == Decimal("1234567890123456.123456789012345679")
    assert sums[3] is None


def test_a_decimal_38_18_sum_beyond_38_digits_fails_on_both(spark: Any, ansi: str) -> None:
    big = Decimal("99999999999999999999.999999999999999999")
    df = spark.createDataFrame([(1, 1, big), (1, 2, big)], "k long, t long, d decimal(38,18)")
    aggs = {"s": ("sum", "d"), "m": ("mean", "d")}
    both_fail(lambda e: tl.local_merge(df.coalesce(1), "k", "t", 10, aggs, engine=e))
    both_fail(lambda e: tl.global_merge(df.coalesce(1), "k", aggs, engine=e))
    # a mean Spark's avg cannot hold at scale 22 (19 integer digits): fails on both
    mean = {"m": ("mean", "d")}
    wide = spark.createDataFrame([(1, 1, Decimal("12345678901234567890.5"))] * 2,
                                 "k long, t long, d decimal(38,18)")
    both_fail(lambda e: tl.global_merge(wide.repartition(2), "k", mean, engine=e))


def test_long_sums_beyond_2_53_exact_and_overflow_fails_on_both(spark: Any, ansi: str) -> None:
    exact = spark.createDataFrame([(2, 3, 2**53 + 1), (2, 4, 1), (2, 5, 2**62), (3, 6, None)],
                                  "k long, t long, i bigint").repartition(2)
    aggs = {"s": ("sum", "i"), "m": ("mean", "i")}
    local_both(exact, "k", "t", 10, aggs)
    got = global_both(exact, "k", aggs, jvm=ansi == "true")
    assert {dict(r)["k"]: dict(r)["s"] for r in got} == {2: 2**62 + 2**53 + 2, 3: None}
    over = spark.createDataFrame([(1, 1, 2**62), (1, 2, 2**62)], "k long, t long, i bigint")
    both_fail(lambda e: tl.local_merge(over.coalesce(1), "k", "t", 10, aggs, engine=e))
    both_fail(lambda e: tl.global_merge(over.coalesce(1), "k", aggs, engine=e))
    both_fail(lambda e: tl.global_merge(over.repartition(2), "k", aggs, engine=e))
    ints = spark.createDataFrame([(1, 1, 2**31 - 1)] * 3, "k long, t long, i int").coalesce(1)
    got = local_both(ints, "k", "t", 10, aggs)
    assert [dict(r)["s"] for r in got] == [3 * (2**31 - 1)]


def test_event_times_null_nan_inf_and_far(spark: Any) -> None:
    nan, inf = math.nan, math.inf
    rows = [(1, t, 1.0) for t in (inf, -inf, 1e300, -1e300, nan, None, 0.0, -0.0, 9.999)]
    df = spark.createDataFrame(rows, "k long, t double, v double").repartition(2)
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    local_both(df, "k", "t", 10.0, aggs)
    global_both(df, "k", aggs, event_time="t")


def test_timestamp_event_times_and_keys(spark: Any) -> None:
    ts = datetime.datetime
    rows = [(1, ts(2024, 1, 1, 0, 0, 1), 1.0), (1, ts(2024, 1, 1, 0, 0, 59), 2.0),
            (1, ts(2024, 1, 1, 0, 1, 0), 3.0), (2, None, 4.0),
            (2, ts(1969, 12, 31, 23, 59, 59, 999999), 5.0), (None, ts(1900, 1, 1), 6.0)]
    df = spark.createDataFrame(rows, "k long, t timestamp, v double").repartition(2)
    aggs = {"n": ("count", None), "s": ("sum", "v"), "first_t": ("min", "t"),
            "last_t": ("max", "t")}
    local_both(df, "k", "t", "1 minute", aggs)
    local_both(df, "k", "t", 60.0, aggs)
    global_both(df, "k", aggs, event_time="t")
    keyed = df.selectExpr("t as k", "cast(unix_timestamp(t) as double) as t", "v")
    local_both(keyed, "k", "t", 10.0, {"n": ("count", None), "s": ("sum", "v")})


def test_dotted_and_backticked_names(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, 2.0), (1, 2.0, 3.0), (None, 3.0, math.nan)],
                               "`a.b` long, `t``x` double, `v.w` double")
    aggs = {"s.x": ("sum", "v.w"), "n`y": ("count", None), "m.`z": ("mean", "v.w")}
    local_both(df, "a.b", "t`x", 10.0, aggs)
    global_both(df, "a.b", aggs)


def test_empty_frames(spark: Any, ansi: str) -> None:
    df = spark.createDataFrame([], "k long, t double, v double, i bigint")
    assert local_both(df, "k", "t", 10.0, AGGS) == Counter()
    assert global_both(df, "k", AGGS) == Counter()
    assert global_both(df, "k", AGGS, event_time="t") == Counter()


def test_other_value_types(spark: Any, ansi: str) -> None:
    ts = datetime.datetime
    rows = [(1, 1.0, ts(2024, 1, 1), "b", Decimal("1.5"), 1, 32767, 1.5),
            (1, 2.0, None, "a", None, None, -32768, math.nan),
            (2, 3.0, ts(1960, 1, 1), None, Decimal("-1"), 2**31 - 1, 1, None)]
    df = spark.createDataFrame(rows, "k long, t double, ts timestamp, s string, "
                               "d decimal(5,1), i int, h smallint, f float").repartition(2)
    aggs = {"a": ("min", "ts"), "b": ("max", "ts"), "c": ("min", "s"), "e": ("max", "d"),
            "dm": ("mean", "d"), "ds": ("sum", "d"), "im": ("mean", "i"), "is": ("sum", "i"),
            "hs": ("sum", "h"), "fs": ("sum", "f"), "fm": ("mean", "f"), "fl": ("min", "f"),
            "fh": ("max", "f")}
    local_both(df, "k", "t", 10.0, aggs)
    global_both(df, "k", aggs)
