"""A key column named like a window output column is refused before the job runs."""

from __future__ import annotations

import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError


@pytest.mark.parametrize("key", ["window_start", "window_end", "count", "sum"])
def test_key_named_like_an_output_column_is_refused(spark, key):
    df = spark.createDataFrame([("a", 1.0, 1.0)], f"`{key}` string, t double, v double")
    agg = tl.KeyedWindowAggregate(10.0, value="v", aggs=("count", "sum"))
    with pytest.raises(InvalidArgumentError, match="output column"):
        tl.keyed_process(df, key, "t", agg, delay=1.0)
