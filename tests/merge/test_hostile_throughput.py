"""Hostile pass on the throughput commit (slots and positions computed in the partition, the
native driver merge): results must equal Spark's expressions and the previous behaviour."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import trilink_spark as tl
from trilink_spark.columns import ET_COL, ORDER_COL, POS_COL, SLOT_COL
from trilink_spark.merge.engines.local import plan_merge
from trilink_spark.merge.engines.pandas_engine import source_rows
from trilink_spark.merge.engines.stream import _buffered_partition, encode_tail
from trilink_spark.state.store import KeyedStateStore


def test_slots_of_fractional_times_are_sparks_pmod(spark: Any) -> None:
    from pyspark.sql import functions as F

    times = [0.1, 0.5, 2.9, -0.1, 1e-20, 7.3, -0.0, 1e300, -1e300]
    df = spark.createDataFrame([("a", t) for t in times], "k string, t double")
    _, plan = plan_merge(df, "k", "t", 3.0, {"n": ("count", None)})
    rows = pd.DataFrame({"k": ["a"] * len(times), ET_COL: times})
    got = source_rows(rows, plan)[SLOT_COL].tolist()
    spark_slots = [r[0] for r in df.select(
        (F.col("t") - F.pmod(F.col("t"), F.lit(3.0))).alias("s")).collect()]
    assert [(s, math.copysign(1.0, s)) for s in got] == \
        [(s, math.copysign(1.0, s)) for s in spark_slots]


def test_fractional_times_of_one_slot_are_one_group(spark: Any) -> None:
    df = spark.createDataFrame([("a", 0.1), ("a", 0.5)], "k string, t double").coalesce(1)
    out = tl.local_merge(df, "k", "t", 3.0, {"n": ("count", None)}).collect()
    assert [(r["slot_start"], r["n"]) for r in out] == [(0.0, 2)]


def test_native_mean_of_decimals_is_sparks_decimal_avg(spark: Any) -> None:
    """Spark's avg of a decimal(10,2) is a decimal(14,6) rounded half up: 2.116667, not the
    double 2.1166666666666667; the native path and the algebra's give it alike."""
    df = spark.createDataFrame([(1, Decimal("1.10")), (1, Decimal("2.25")),
                                (1, Decimal("3.00"))], "k int, d decimal(10,2)")
    native = tl.global_merge(df, "k", {"m": ("mean", "d")})
    assert native.schema["m"].dataType.simpleString() == "decimal(14,6)"
    assert native.collect()[0]["m"] == Decimal("2.116667")
    both = tl.global_merge(df, "k", {"m": ("mean", "d"), "f": ("first", "d")})
    assert both.schema["m"].dataType.simpleString() == "decimal(14,6)"
    assert both.collect()[0]["m"] == Decimal("2.116667")


def test_a_tail_written_with_the_sort_column_still_merges(spark: Any, tmp_path: Any) -> None:
    """The previous version carried order_by's column (ORDER_COL) into the stored tail."""
    df = spark.createDataFrame([("a", 1.0, 1)], "k string, t double, o int")
    _, plan = plan_merge(df, "k", "t", 10.0, {"n": ("count", None)}, "quantity",
                         quantity=100, order_by="o")
    store = KeyedStateStore(str(tmp_path / "state"))
    old_tail = pd.DataFrame({"k": ["a"], POS_COL: np.array([0], dtype=np.int64),
                             ET_COL: [1.0], SLOT_COL: [0.0], ORDER_COL: [5]})
    store.save(0, 0, encode_tail(old_tail))
    batch = pa.RecordBatch.from_pandas(pd.DataFrame({"k": ["a"], ET_COL: [2.0]}),
                                       preserve_index=False)
    list(_buffered_partition(plan, store, 1)(iter([batch])))
    held = store.load_before(0, 2)
    assert held is not None

