"""User columns never collide with internal ones: a reserved name is refused, never replaced."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import ReservedColumnError
from trilink_spark.placement import ahead_key_by


class Count(tl.KeyedWatermarkProcessFunction):
    output_schema = "k string, n long"

    def process_on_time(self, key, rows, ctx):
        return [(key, len(rows))]


@pytest.mark.parametrize("name", [tl.PARTITION_COL, "_tl_pos", "_tl_event_time",
                                  "_tl_table_key", "_tl_anything"])
def test_every_keyed_api_refuses_a_reserved_column_name(spark, name):
    df = spark.createDataFrame([("a", 1, 10.0)], f"k string, `{name}` int, t double")
    calls = [
        lambda: tl.key_by(df, "k", "hash", 2),
        lambda: tl.keyed_agg(df, "k", F.count("*")),
        lambda: tl.keyed_apply(df, "k", lambda pdf: pdf, df.schema),
        lambda: tl.keyed_watermark(df, "k", "t", 1.0),
        lambda: tl.keyed_process(df, "k", "t", Count(), 1.0),
        lambda: ahead_key_by(df, "k", "hash", 2),
    ]
    for call in calls:
        with pytest.raises(ReservedColumnError, match=name):
            call()


@pytest.mark.connect
def test_a_reserved_key_column_is_refused_too(spark):
    df = spark.createDataFrame([("a", 1)], f"`{tl.PARTITION_COL}` string, v int")
    with pytest.raises(ReservedColumnError):
        tl.key_by(df, tl.PARTITION_COL, "hash", 2)
    assert isinstance(ReservedColumnError("x"), ValueError)
