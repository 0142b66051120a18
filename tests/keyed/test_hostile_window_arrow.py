"""Hostile input for ``KeyedWindowAggregate._accumulate`` (Arrow's hash aggregation over key
codes and window starts) against a row-by-row model of what the pandas group-by before it
computed: null and NaN keys one null key, NaN and null values no value, -0.0 the window 0.0,
windows merged across batches. No Spark job."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import types as T

import trilink_spark as tl
from testkit.windows import (SIZE, assert_same_windows, emitted_windows, hostile_window_frames,
                             window_model)
from trilink_spark.keyed.semantics.process import EVENT_TIME_COL, KeyedRuntime

NAN, INF = float("nan"), float("inf")
AGGS = ("count", "sum", "min", "max", "mean")


def _run(frames: list[pd.DataFrame], key_type: Any = T.StringType(),
         value_type: Any = T.DoubleType()) -> pd.DataFrame:
    schema = T.StructType([T.StructField("k", key_type), T.StructField("t", T.DoubleType()),
                           T.StructField("v", value_type)])
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=AGGS)
    agg.bind(schema, "k", "t", "fractional")
    rt = KeyedRuntime(agg, "k", 1e308, math.inf)  # nothing is late
    outs: list[Any] = []
    for frame in frames:
        frame = frame.copy()
        frame[EVENT_TIME_COL] = frame["t"]
        outs.extend(rt.process(frame))
    outs.extend(rt.finish())
    assert agg.open_windows(rt) == 0
    got = [o for o in outs if isinstance(o, pd.DataFrame)]
    return pd.concat(got, ignore_index=True) if got else pd.DataFrame(columns=["k", *AGGS])


def test_a_negative_zero_event_time_is_the_window_zero() -> None:
    frames = [pd.DataFrame({"k": ["a", "a", "a", "b"], "t": [-0.0, 0.0, 5.0, -0.0],
                            "v": [1.0, 2.0, 3.0, 4.0]}),
              pd.DataFrame({"k": ["b", "a"], "t": [0.0, -0.0], "v": [5.0, 6.0]})]
    got = _run(frames)
    assert_same_windows(emitted_windows(got), window_model(frames))
    assert sorted(zip(got["k"], got["count"])) == [("a", 4), ("b", 2)]
    assert [math.copysign(1.0, s) for s in got["window_start"]] == [1.0, 1.0]


def test_nan_and_null_values_are_no_value_and_rows_still_count() -> None:
    frames = [pd.DataFrame({"k": ["a", "a", "b", "b", "c"], "t": [1.0, 2.0, 3.0, 4.0, 5.0],
                            "v": [NAN, 2.0, NAN, None, INF]})]
    got = emitted_windows(_run(frames))
    assert_same_windows(got, window_model(frames))
    assert got[("b", 0.0)] == (2, None, None, None, None)
    assert got[("c", 0.0)] == (1, INF, INF, INF, INF)


def test_null_and_nan_keys_and_null_integer_values() -> None:
    frames = [pd.DataFrame({"k": [1.0, None, NAN, NAN, -0.0, 0.0],
                            "t": [1.0, 2.0, 3.0, 14.0, 4.0, 5.0],
                            "v": pd.array([1, None, 3, 4, 5, 2**53 + 1], dtype="Int64")})]
    got = _run(frames, T.DoubleType(), T.LongType())
    assert_same_windows(emitted_windows(got), window_model(frames))


def test_infinite_and_huge_event_times_have_their_own_windows() -> None:
    # +inf last: a row at +inf makes the key's later rows late
    frames = [pd.DataFrame({"k": ["a"] * 5, "t": [-1e300, 1e300, 1e300, 2.0**60, INF],
                            "v": [1.0, 2.0, 3.0, 4.0, 5.0]})]
    got = emitted_windows(_run(frames))
    assert_same_windows(got, window_model(frames))
    assert got[("a", 1e300)][0] == 2 and got[("a", INF)][0] == 1


@pytest.mark.parametrize("seed", range(6))
def test_random_hostile_batches_equal_the_model(seed: int) -> None:
    frames = hostile_window_frames(seed)
    assert_same_windows(emitted_windows(_run(frames)), window_model(frames))


def test_inf_minus_inf_stays_nan_whatever_the_batches() -> None:
    """A window summing +inf and -inf has a NaN sum, in one batch or split over two (the
    merge with the open windows once skipped that NaN as "no value": -2.5 here)."""
    rows = pd.DataFrame({"k": ["a"] * 4, "t": [1.0, 2.0, 3.0, 4.0],
                         "v": [-2.5, -INF, INF, None]})
    for frames in ([rows], [rows.iloc[:1], rows.iloc[1:]], [rows.iloc[:2], rows.iloc[2:]]):
        got = emitted_windows(_run(frames))
        assert got == {("a", 0.0): (4, None, -INF, INF, None)}  # NaN: the output's no value
        assert_same_windows(got, window_model(frames))
