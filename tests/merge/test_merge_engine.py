"""``local_merge(engine="spark")``: Spark's partial aggregation computes the partial rows the
Python engine computes (same schema, same rows per input partition, key and slot), with
Spark's semantics for null and NaN keys, non-finite event times and integral overflow; calls
it cannot run are refused by name, or left to the Python engine when the conf asked."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.merge import MERGE_ENGINES

AGGS = {"n": ("count", None), "nv": ("count", "v"), "s": ("sum", "v"), "si": ("sum", "i"),
        "m": ("mean", "i"), "lo": ("min", "v"), "hi": ("max", "v"), "ilo": ("min", "i"),
        "tag": ("max", "tag")}
FLOAT_SUMS = ("s", "m__sum")

TIME_TYPES = {"integral": "bigint", "fractional": "double", "timestamp": "timestamp"}


def _frame(seed: int, n: int, time_kind: str) -> pd.DataFrame:
    """Random rows in no order: null keys, null/NaN/inf values, null (and for doubles NaN
    and infinite) event times, negative times."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, int(rng.integers(1, 40)), n).astype(object)
    keys[rng.random(n) < 0.05] = None
    v = rng.normal(size=n) * 100
    v[rng.random(n) < 0.05] = np.nan
    v[rng.random(n) < 0.01] = np.inf
    v_obj = v.astype(object)
    v_obj[rng.random(n) < 0.05] = None
    i = rng.integers(-2**40, 2**40, n).astype(object)
    i[rng.random(n) < 0.05] = None
    if time_kind == "fractional":
        t: Any = rng.uniform(-500, 500, n)
        t[rng.random(n) < 0.04] = np.nan
        t[rng.random(n) < 0.02] = np.inf
        t = t.astype(object)
    elif time_kind == "integral":
        t = rng.integers(-500, 500, n).astype(object)
    else:
        start = datetime(2026, 1, 1, tzinfo=timezone.utc)
        t = np.array([start + timedelta(seconds=int(s)) for s in rng.integers(-500, 500, n)],
                     dtype=object)
    t[rng.random(n) < 0.05] = None
    return pd.DataFrame({"k": keys, "v": v_obj, "i": i, "t": t,
                         "tag": rng.choice(["a", "b", "é", ""], n)})


def _df(spark: Any, frame: pd.DataFrame, time_kind: str, partitions: int) -> Any:
    schema = f"k bigint, v double, i bigint, t {TIME_TYPES[time_kind]}, tag string"
    def plain(x: Any) -> Any:
        if isinstance(x, pd.Timestamp):
            return x.to_pydatetime()
        return None if x is pd.NaT else x

    rows = [tuple(plain(x) for x in r) for r in frame.itertuples(index=False)]
    return spark.createDataFrame(rows, schema).repartition(partitions)


def _rounded(row: Any) -> tuple[Any, ...]:
    """A partial row, float sums rounded (Spark and Arrow add in different orders)."""
    out = []
    for name, value in row.asDict().items():
        if name in FLOAT_SUMS and isinstance(value, float) and math.isfinite(value):
            value = round(value, 6)
        elif isinstance(value, float) and math.isnan(value):
            value = "nan"
        out.append((name, value))
    return tuple(out)


def check_same_partials(python: Any, spark_engine: Any) -> None:
    """Invariant: both engines give the same column types (Spark knows counts are never
    null, so only nullability may differ) and the same partial rows, one per
    (input partition, key, slot)."""
    assert spark_engine.schema.simpleString() == python.schema.simpleString()
    got = Counter(_rounded(r) for r in spark_engine.collect())
    want = Counter(_rounded(r) for r in python.collect())
    assert got == want


@pytest.mark.parametrize("time_kind", ["integral", "fractional", "timestamp"])
def test_spark_engine_gives_the_python_engines_partials(spark: Any, time_kind: str) -> None:
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        df = _df(spark, _frame(seed, int(rng.integers(1, 400)), time_kind), time_kind,
                 int(rng.integers(1, 5)))
        slot = "10 seconds" if time_kind == "timestamp" else float(rng.choice([7.0, 2.5]))
        python = tl.local_merge(df, "k", "t", slot, AGGS, engine="python")
        native = tl.local_merge(df, "k", "t", slot, AGGS, engine="spark")
        check_same_partials(python, native)
        merged = tl.merge_partials(native, "k", AGGS).collect()
        truth = df.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("i").alias("si"),
                                    F.max("tag").alias("tag")).collect()
        assert sorted((r.k is None, r.k or 0, r.n, r.si, r.tag) for r in merged) == \
            sorted((r.k is None, r.k or 0, r.n, r.si, r.tag) for r in truth)


def test_spark_engine_keeps_float_keys_and_plan_has_no_python(spark: Any) -> None:
    df = spark.createDataFrame(
        [(0.0, 1, 1.0), (-0.0, 2, 2.0), (float("nan"), 3, 3.0), (None, 4, 4.0),
         (float("nan"), 5, 5.0)], "k double, t bigint, v double").coalesce(1)
    out = tl.local_merge(df, "k", "t", 100, {"n": ("count", None), "s": ("sum", "v")},
                         engine="spark")
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert "ArrowEvalPython" not in plan and "MapInArrow" not in plan
    rows = {("nan" if r.k is not None and r.k != r.k else r.k): r.n for r in out.collect()}
    assert rows == {0.0: 2, "nan": 2, None: 1}  # Spark's keys: -0.0 is 0.0, NaN one key


def test_spark_engine_integral_overflow_fails_the_query_by_name(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 2**62), (1, 2, 2**62)], "k long, t long, i long")
    with pytest.raises(Exception, match="ArithmeticOverflowError: sum 's' of column 'i'"):
        tl.local_merge(df.coalesce(1), "k", "t", 10, {"s": ("sum", "i")},
                       engine="spark").collect()
    # beyond 64 bits only part way: the exact sum fits, so no error (Spark's own sum of
    # longs would overflow at the second row)
    fits = spark.createDataFrame([(1, 1, 2**62), (1, 2, 2**62), (1, 3, -2**62)],
                                 "k long, t long, i long").coalesce(1)
    got = tl.local_merge(fits, "k", "t", 10, {"s": ("sum", "i")}, engine="spark").collect()
    assert [r.s for r in got] == [2**62]


def test_spark_engine_refuses_what_it_cannot_run(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    aggs = {"n": ("count", None)}
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"mode": "quantity"}, aggs, "quantity mode"),
        ({"delay": 5.0}, aggs, "periodic mode"),
        ({"order_by": "t"}, aggs, "order_by"),
        ({}, {"f": ("first", "v")}, "aggregate 'f'")]
    for kwargs, chosen, why in cases:
        with pytest.raises(InvalidArgumentError, match=why):
            tl.local_merge(df, "k", "t", 10, chosen, engine="spark", **kwargs)
    with pytest.raises(InvalidArgumentError, match="engine must be one of 'auto', 'python', 'spark', got 'jvm'"):
        tl.local_merge(df, "k", "t", 10, aggs, engine="jvm")
    with pytest.raises(TypeError):
        tl.local_merge(df, "k", "t", 10, aggs, engine=1)  # type: ignore[arg-type]
    assert MERGE_ENGINES == ("auto", "python", "spark")


def test_spark_engine_refuses_a_stream(spark: Any) -> None:
    stream = spark.readStream.format("rate").load().selectExpr("value % 3 AS k",
                                                               "timestamp AS t")
    with pytest.raises(InvalidArgumentError, match="streaming DataFrame"):
        tl.local_merge(stream, "k", "t", "10 seconds", {"n": ("count", None)}, engine="spark")


def test_the_conf_picks_the_engine_and_falls_back_where_it_cannot_run(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0), (1, 2, 2.0)], "k long, t long, v double")
    key = "spark.trilink.mergeEngine"
    try:
        spark.conf.set(key, "spark")
        native = tl.local_merge(df, "k", "t", 10, {"n": ("count", None)})
        assert "MapInArrow" not in native._jdf.queryExecution().executedPlan().toString()
        first = tl.local_merge(df, "k", "t", 10, {"f": ("first", "v")})  # Python runs it
        assert sum(r.f is not None for r in first.collect()) >= 1
        spark.conf.set(key, "fast")
        with pytest.raises(InvalidArgumentError, match="spark.trilink.mergeEngine"):
            tl.local_merge(df, "k", "t", 10, {"n": ("count", None)})
    finally:
        spark.conf.unset(key)


@pytest.mark.connect
def test_spark_engine_on_any_session(spark: Any) -> None:
    df = spark.createDataFrame([(k % 3, t, float(t)) for k in range(9) for t in range(20)],
                               "k long, t long, v double").repartition(2)
    aggs = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v")}
    python = tl.local_merge(df, "k", "t", 10, aggs, engine="python")
    native = tl.local_merge(df, "k", "t", 10, aggs, engine="spark")
    assert native.schema.simpleString() == python.schema.simpleString()
    assert sorted(map(tuple, native.collect())) == sorted(map(tuple, python.collect()))
