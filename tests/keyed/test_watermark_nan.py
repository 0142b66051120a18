"""A NaN event time never moves a key's watermark (Spark orders NaN above every number)."""

from __future__ import annotations

import math

import trilink_spark as tl


def test_nan_event_time_does_not_make_later_rows_late(spark):
    rows = [("a", 1.0, 0), ("a", float("nan"), 1), ("a", 2.0, 2), ("a", 3.0, 3), ("a", 1.5, 4),
            ("b", None, 0), ("b", 5.0, 1)]
    df = spark.createDataFrame(rows, "k string, t double, arrival long").coalesce(1)
    out = {(r["k"], r["arrival"]): r for r in
           tl.keyed_watermark(df, "k", "t", 1.0, order_by="arrival").collect()}
    assert out[("a", 1)]["is_late"] is None  # the NaN row: no verdict
    assert out[("a", 2)]["is_late"] is False
    assert out[("a", 3)]["is_late"] is False
    assert out[("a", 2)]["key_watermark"] == 0.0  # from t = 1.0 only, NaN ignored
    assert out[("a", 4)]["is_late"] is True  # 1.5 < 3.0 - 1.0: late by its own key
    assert out[("b", 0)]["is_late"] is None
    assert out[("b", 1)]["key_watermark"] is None  # a null time moves nothing either
    assert not any(v is not None and math.isnan(v)
                   for v in (r["key_watermark"] for r in out.values()))
