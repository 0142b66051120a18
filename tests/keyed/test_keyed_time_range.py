"""Integral event times beyond 2**53 are refused rather than rounded; nested keys are refused."""

from __future__ import annotations

import pytest
from pyspark.sql.utils import CapturedException

import trilink_spark as tl
from trilink_spark.errors import InvalidKeyTypeError


class Count(tl.KeyedWatermarkProcessFunction):
    output_schema = "k string, n long"

    def process_on_time(self, key, rows, ctx):
        return [(key, len(rows))]


def test_nanosecond_epochs_are_refused_not_rounded(spark):
    base = 1_700_000_000_000_000_000  # a nanosecond epoch: far beyond 2**53
    df = spark.createDataFrame([("a", base), ("a", base + 1)], "k string, t long")
    with pytest.raises(CapturedException, match="InvalidArgumentError.*2\\*\\*53"):
        tl.keyed_watermark(df, "k", "t", 0).collect()
    with pytest.raises(CapturedException, match="InvalidArgumentError"):
        tl.keyed_process(df, "k", "t", Count(), 0).collect()


def test_times_up_to_2_53_stay_exact(spark):
    top = 2**53
    df = spark.createDataFrame([("a", top - 2, 0), ("a", top - 3, 1), ("a", top, 2)],
                               "k string, t long, arrival long").coalesce(1)
    marked = {r["arrival"]: r for r in
              tl.keyed_watermark(df, "k", "t", 0, order_by="arrival").collect()}
    assert marked[1]["is_late"] is True  # one unit below: exactly late
    assert marked[2]["key_watermark"] == top - 2


def test_nested_keys_are_refused_with_a_typed_error(spark):
    df = spark.createDataFrame([((1, "x"), 1.0)], "k struct<a:int,b:string>, t double")
    with pytest.raises(InvalidKeyTypeError, match="struct"):
        tl.keyed_process(df, "k", "t", Count(), 1.0)
    arr = spark.createDataFrame([([1], 1.0)], "k array<int>, t double")
    with pytest.raises(InvalidKeyTypeError, match="array"):
        tl.keyed_process(arr, "k", "t", Count(), 1.0)
