"""global_merge to the driver with Spark's own aggregates runs in the JVM; its result must be
the algebra's, value for value, on hostile input (null and NaN keys, -0.0, NaN and null
values, overflow)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError

AGGS = {"n": ("count", None), "nv": ("count", "v"), "s": ("sum", "v"), "lo": ("min", "v"),
        "hi": ("max", "v"), "m": ("mean", "v"), "si": ("sum", "i")}


def hostile(spark: Any, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    n = 3000
    keys = rng.choice([0.0, -0.0, 1.5, np.nan, 2.0, 3.0], n).astype(object)
    keys[rng.random(n) < 0.05] = None
    v = rng.normal(size=n).astype(object)
    v[rng.random(n) < 0.05] = np.nan
    v[rng.random(n) < 0.05] = None
    i = rng.integers(-1000, 1000, n).astype(object)
    i[rng.random(n) < 0.05] = None
    rows = [(None if a is None else float(a), None if b is None else float(b),
             None if c is None else int(c)) for a, b, c in zip(keys, v, i)]
    # from Python rows, NaN stays a value distinct from null (pandas would make it null)
    return spark.createDataFrame(rows, "k double, v double, i bigint").repartition(3)


def rows(df: Any) -> list[tuple[Any, ...]]:
    def norm(x: Any) -> Any:
        if x is None:
            return None
        return "nan" if np.isnan(x) else round(float(x), 9)

    def order(r: tuple[Any, ...]) -> tuple[int, float]:
        return (2, 0.0) if r[0] is None else (1, 0.0) if r[0] == "nan" else (0, r[0])

    return sorted((tuple(norm(x) for x in r) for r in df.collect()), key=order)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_native_merge_equals_the_algebra(spark: Any, seed: int) -> None:
    df = hostile(spark, seed).cache()
    native = tl.global_merge(df, "k", AGGS)
    # "first" is not a Spark-native merge: the whole call takes the algebra's path
    algebra = tl.global_merge(df, "k", {**AGGS, "f": ("first", "v")}).drop("f")
    assert native.schema == algebra.schema
    assert rows(native) == rows(algebra)
    # -0.0 and 0.0 are one key, nulls one group, NaN one group: 5 distinct keys + null
    assert len(native.toPandas()) == 6
    df.unpersist()


def test_an_integral_sum_that_overflows_is_the_typed_error_on_both_paths(spark: Any) -> None:
    big = spark.createDataFrame([(1, 2**62), (1, 2**62), (1, 2**62)], "k int, i bigint")
    with pytest.raises(ArithmeticOverflowError):
        tl.global_merge(big, "k", {"s": ("sum", "i")}).collect()
    with pytest.raises(Exception, match="ArithmeticOverflowError"):  # from a task
        tl.global_merge(big, "k", {"s": ("sum", "i"), "f": ("first", "i")}).collect()


def test_ansi_off_keeps_the_algebra_for_integral_sums(spark: Any) -> None:
    big = spark.createDataFrame([(1, 2**62), (1, 2**62), (1, 2**62)], "k int, i bigint")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:  # Spark would wrap around here; the algebra still refuses
        with pytest.raises(Exception, match="ArithmeticOverflowError"):
            tl.global_merge(big, "k", {"s": ("sum", "i")}).collect()
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")


def test_an_empty_frame_gives_an_empty_typed_result(spark: Any) -> None:
    empty = spark.createDataFrame([], "k string, v double")
    out = tl.global_merge(empty, "k", {"n": ("count", None), "m": ("mean", "v")})
    assert out.count() == 0
    assert [f.dataType.simpleString() for f in out.schema] == ["string", "bigint", "double"]
