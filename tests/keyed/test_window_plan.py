"""Bounded KeyedWindowAggregate planned in Spark gives the Python runtime's rows exactly.

A seeded property test over random inputs (disorder, ties, idle keys, null, NaN and -0.0
keys, null, NaN and infinite event times and values, arrival by ``order_by`` or input
order, several strategies and partition counts): after each case, both engines give the
same rows, bit for bit, and the same late count, which is also ``keyed_watermark``'s; then
which calls take which engine, and why.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.keyed.run.window_plan import explain_keyed_process
from trilink_spark.placement import keyed_by_source, physical_plan, shuffle_exchanges

AGGS = ("count", "sum", "min", "max", "mean")


def _keys(rng: np.random.Generator, n: int, kind: str) -> list[Any]:
    base = rng.integers(0, 6, n)
    if kind == "long":
        return [None if rng.random() < 0.05 else int(k) - 2 for k in base]
    if kind == "double":
        pool = [0.0, -0.0, 1.5, float("nan"), None, -3.0]
        return [pool[int(k)] for k in base]
    return [None if rng.random() < 0.05 else ("" if k == 0 else f"k{k}") for k in base]


def _times(rng: np.random.Generator, n: int) -> list[Any]:
    # a clock per row that mostly advances, with disorder, ties and a few odd values
    t = np.cumsum(rng.integers(0, 3, n)).astype(float) + rng.normal(0, 4, n).round()
    out: list[Any] = t.tolist()
    for i in rng.choice(n, size=max(1, n // 25), replace=False).tolist():
        out[i] = [None, float("nan"), float("inf"), -float("inf"), out[i]][int(rng.integers(5))]
    return out


def _values(rng: np.random.Generator, n: int) -> list[Any]:
    v = (rng.normal(0, 1e3, n) * 10.0 ** rng.integers(-3, 6, n)).tolist()
    for i in rng.choice(n, size=max(1, n // 20), replace=False).tolist():
        v[i] = [None, float("nan"), float("inf"), -float("inf"), -0.0][int(rng.integers(5))]
    return v


def _case(spark: Any, seed: int) -> tuple[Any, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    kind = ["long", "double", "string"][seed % 3]
    times = _times(rng, n)
    frame = pd.DataFrame({"k": _keys(rng, n, kind), "t": times, "v": _values(rng, n),
                          "o": rng.integers(0, 40, n).tolist(),
                          "w": [None if x < 0 else int(x) for x in rng.integers(-3, 50, n)]})
    if seed % 5 == 0:
        frame.loc[frame.index[:: 7], "o"] = None
    ktype = {"long": "bigint", "double": "double", "string": "string"}[kind]
    df = spark.createDataFrame(frame.astype(object).where(frame.notna(), None)
                               if kind != "double" else frame,
                               f"k {ktype}, t double, v double, o bigint, w bigint",
                               ).repartition(int(rng.integers(1, 4))).cache()
    df.count()  # one arrival order for every run below (a round-robin shuffle's is not fixed)
    args = {
        "delay": float(rng.choice([0.0, 1.0, 3.0, 10.0, 1e300])),
        "order_by": "o" if seed % 4 == 1 else None,
        "num_partitions": int(rng.integers(1, 5)),
        # table strategies take int, long, string and binary keys
        "strategy": "hash" if kind == "double" else ["hash", "least_count", "block",
                                                      "auto"][seed % 4],
        # small timeouts make keys idle inside the run
        "idle_timeout": float(rng.choice([0.5, 2.0, math.inf])) if seed % 3 else None,
    }
    return df, args


def _canon(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    def value(x: Any) -> Any:
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return ("null",)
        if isinstance(x, float):
            return ("f", x.hex())  # bit for bit, -0.0 apart from 0.0
        if isinstance(x, pd.Timestamp):
            return ("ts", x.value)
        return ("v", repr(x))

    return sorted(tuple(value(x) for x in row) for row in frame.itertuples(index=False))


#: Aggregates of two columns (the mapping form), the first of them the count of rows.
MAPPED = {"n": ("count", None), "total": ("sum", "v"), "low": ("min", "w"),
          "seen": ("count", "w"), "avg": ("mean", "w"), "high": ("max", "v")}


def _agg(size: float, mapped: bool) -> Any:
    if mapped:
        return tl.KeyedWindowAggregate(size, aggs=MAPPED)
    return tl.KeyedWindowAggregate(size, value="v", aggs=AGGS)


def _run(df: Any, engine: str, size: float, args: dict[str, Any], mapped: bool = False
         ) -> pd.DataFrame:
    out = tl.keyed_process(df, "k", "t", _agg(size, mapped), engine=engine, **args)
    return out.toPandas()


def _known_rows(df: Any) -> int:
    return int(df.where(F.col("t").isNotNull() & ~F.isnan("t")).count())


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.connect) if s < 4 else s
                                  for s in range(24)])
def test_spark_plan_gives_the_runtimes_rows_and_late_counts(spark: Any, seed: int) -> None:
    df, args = _case(spark, seed)
    size = [5.0, 10.0, 0.75][seed % 3]
    mapped = seed % 2 == 1
    spark_rows = _run(df, "spark", size, args, mapped)
    python_rows = _run(df, "python", size, args, mapped)
    names = list(MAPPED) if mapped else list(AGGS)
    count = "n" if mapped else "count"
    # invariants of each result, then equality
    for rows in (spark_rows, python_rows):
        assert list(rows.columns) == ["k", "window_start", "window_end", *names]
        assert (rows[count] >= 1).all()
        if mapped:
            assert (rows["seen"] <= rows["n"]).all()
        ends = rows["window_end"].to_numpy(dtype=float)
        starts = rows["window_start"].to_numpy(dtype=float)
        finite = np.isfinite(starts)
        assert np.allclose(ends[finite] - starts[finite], size)
    assert _canon(spark_rows) == _canon(python_rows)
    late_spark = _known_rows(df) - int(spark_rows[count].sum())
    late_python = _known_rows(df) - int(python_rows[count].sum())
    marked = tl.keyed_watermark(df, "k", "t", delay=args["delay"], order_by=args["order_by"])
    assert late_spark == late_python == marked.where("is_late").count()
    df.unpersist()


@pytest.mark.parametrize("kind", ["timestamp", "integral", "decimal"])
def test_time_and_value_types_match(spark: Any, kind: str) -> None:
    rng = np.random.default_rng(11)
    n = 300
    t = (np.arange(n) + rng.integers(-5, 5, n)).tolist()
    v = rng.integers(-10**6, 10**6, n).tolist()
    k = rng.integers(0, 7, n).tolist()
    if kind == "timestamp":
        df = spark.createDataFrame(list(zip(k, t, v)), "k bigint, t bigint, v bigint") \
            .withColumn("t", F.timestamp_seconds("t"))
        size: Any = "7 seconds"
        delay: Any = "3 seconds"
    elif kind == "integral":
        df = spark.createDataFrame(list(zip(k, t, v)), "k bigint, t bigint, v bigint")
        size, delay = 7, 3
    else:
        df = spark.createDataFrame([(a, float(b), Decimal(c) / 100) for a, b, c in
                                    zip(k, t, v)], "k bigint, t double, v decimal(12,2)")
        size, delay = 7.0, 3.0
    agg = tl.KeyedWindowAggregate(size, value="v", aggs=AGGS)
    got = tl.keyed_process(df, "k", "t", agg, delay=delay, engine="spark")
    want = tl.keyed_process(df, "k", "t", agg, delay=delay, engine="python")
    assert got.schema.simpleString() == want.schema.simpleString()
    assert _canon(got.toPandas()) == _canon(want.toPandas())


def test_plan_has_one_exchange_and_no_python(spark: Any) -> None:
    df = spark.range(1000).selectExpr("id % 13 AS k", "id AS t", "CAST(id AS DOUBLE) AS v")
    out = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(10.0, value="v",
                                                                  aggs=("count", "min")),
                           delay=2.0, strategy="least_count", num_partitions=3)
    plan = physical_plan(out)
    assert "Python" not in plan and "ArrowEval" not in plan, plan
    assert shuffle_exchanges(out) == 1
    # partition i holds the keys the strategy placed on i, as on the Python runtime
    placed = {r["k"]: r["p"] for r in tl.key_by(df, "k", "least_count", 3)
              .select("k", F.col(tl.PARTITION_COL).alias("p")).distinct().collect()}
    got = out.select("k", F.spark_partition_id().alias("p")).distinct().collect()
    assert got and all(placed[r["k"]] == r["p"] for r in got)


def test_null_policy_error_fails_on_the_spark_plan_too(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0), (None, 2.0)], "k bigint, t double")
    out = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(10.0), delay=0.0,
                           null_policy="error")
    with pytest.raises(Exception, match="NullKeyError"):
        out.collect()


class _Sub(tl.KeyedWindowAggregate):
    pass


@pytest.mark.connect
def test_which_engine_and_why(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, 2.0, "x")], "k bigint, t double, v double, s string")
    agg = tl.KeyedWindowAggregate(10.0, value="v")
    assert explain_keyed_process(df, "k", agg).engine == "spark"
    sub = explain_keyed_process(df, "k", _Sub(10.0))
    assert sub.engine == "python" and "_Sub" in sub.reason
    text = explain_keyed_process(df, "k", tl.KeyedWindowAggregate(10.0, value="s",
                                                                  aggs=("max",)))
    assert text.engine == "python" and "'s' of type string" in text.reason
    source = explain_keyed_process(keyed_by_source(df, "k"), "k", agg)
    assert source.engine == "python" and "keyed_by_source" in source.reason
    assert explain_keyed_process(df, "k", agg, engine="python").engine == "python"
    with pytest.raises(InvalidArgumentError, match="_Sub"):
        explain_keyed_process(df, "k", _Sub(10.0), engine="spark")
    with pytest.raises(InvalidArgumentError, match="'auto', 'spark', 'python', got 'jvm'"):
        explain_keyed_process(df, "k", agg, engine="jvm")
    with pytest.raises(InvalidArgumentTypeError):
        explain_keyed_process(df, "k", agg, engine=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        explain_keyed_process(df, "k", object())  # type: ignore[arg-type]


def test_conf_forces_the_python_runtime(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0)], "k bigint, t double")
    agg = tl.KeyedWindowAggregate(10.0)
    spark.conf.set("spark.trilink.keyedEngine", "python")
    try:
        plan = explain_keyed_process(df, "k", agg)
        assert plan.engine == "python" and "keyedEngine" in plan.reason
        out = tl.keyed_process(df, "k", "t", agg, delay=0.0)
        assert "Python" in physical_plan(out) or "MapInArrow" in physical_plan(out)
        # an explicit engine wins over the conf
        assert explain_keyed_process(df, "k", agg, engine="spark").engine == "spark"
        spark.conf.set("spark.trilink.keyedEngine", "fast")
        with pytest.raises(InvalidArgumentError, match="spark.trilink.keyedEngine"):
            tl.keyed_process(df, "k", "t", agg, delay=0.0)
    finally:
        spark.conf.unset("spark.trilink.keyedEngine")


def test_mapping_form_is_refused_where_wrong(spark: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="not both"):
        tl.KeyedWindowAggregate(1.0, value="v", aggs={"n": ("count", None)})
    with pytest.raises(InvalidArgumentError, match="median"):
        tl.KeyedWindowAggregate(1.0, aggs={"m": ("median", "v")})
    with pytest.raises(InvalidArgumentError, match="needs a column"):
        tl.KeyedWindowAggregate(1.0, aggs={"s": ("sum", None)})
    with pytest.raises(InvalidArgumentTypeError, match="name: \\(func, column\\)"):
        tl.KeyedWindowAggregate(1.0, aggs={"s": "sum"})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="twice"):
        tl.KeyedWindowAggregate(1.0, value="v", aggs=("sum", "sum"))
    df = spark.createDataFrame([(1, 1.0, 2.0)], "k bigint, t double, v double")
    with pytest.raises(InvalidArgumentError, match="window bound"):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(
            1.0, aggs={"window_end": ("max", "v")}), delay=0.0)
    with pytest.raises(Exception, match="nope"):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(
            1.0, aggs={"x": ("max", "nope")}), delay=0.0)


def test_empty_input(spark: Any) -> None:
    df = spark.createDataFrame([], "k bigint, t double, v double")
    agg = tl.KeyedWindowAggregate(10.0, value="v", aggs=AGGS)
    assert tl.keyed_process(df, "k", "t", agg, delay=1.0).count() == 0


def test_mapping_form_merges_open_windows_across_batches() -> None:
    """The runtime's merge of open windows with later batches (a stream's path), two value
    columns: any split of the rows into batches gives the one-batch windows."""
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    from trilink_spark.columns import EVENT_TIME_COL
    from trilink_spark.keyed import KeyedRuntime

    schema = StructType([StructField("k", LongType()), StructField("t", DoubleType()),
                         StructField("v", DoubleType()), StructField("w", LongType())])
    rng = np.random.default_rng(5)
    n = 600
    v = rng.normal(0, 10, n)
    v[rng.choice(n, 30, replace=False)] = np.nan
    v[:2] = [np.inf, -np.inf]  # one window whose sum is inf - inf: NaN, not "no value"
    frame = pd.DataFrame({"k": rng.integers(0, 9, n), EVENT_TIME_COL: np.sort(
        rng.uniform(0, 100, n)), "v": v, "w": pd.array(
        [None if x < 0 else x for x in rng.integers(-2, 9, n)], dtype="Int64")})
    frame["k"] = frame["k"].where((np.arange(n) % 50 != 0) & (np.arange(n) != 1), 0)

    def windows(pieces: int) -> pd.DataFrame:
        agg = tl.KeyedWindowAggregate(7.0, aggs=MAPPED)
        agg.bind(schema, "k", "t", "fractional")
        runtime = KeyedRuntime(agg, "k", delay=1e9, idle_timeout=math.inf)
        outs: list[Any] = []
        for part in np.array_split(np.arange(n), pieces):
            outs += runtime.process(frame.iloc[part].reset_index(drop=True))
            assert agg.open_windows(runtime) > 0  # nothing closes before the end
        outs += runtime.finish()
        got = pd.concat([o for o in outs if isinstance(o, pd.DataFrame)], ignore_index=True)
        assert int(got["n"].sum()) == n
        return got.sort_values(["k", "window_start"]).reset_index(drop=True)

    one = windows(1)
    assert one["total"].isna().any()  # the inf - inf window
    exact = [c for c in one.columns if c != "total"]
    for pieces in (2, 5, 17):
        split = windows(pieces)
        assert _canon(split[exact]) == _canon(one[exact])
        # sums may differ in the last bits: the split adds the pieces' partial sums
        assert np.allclose(split["total"], one["total"], equal_nan=True, rtol=1e-12)
