"""Keyed process functions: runtime semantics, window aggregate against an oracle, Spark runs."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import types as T

import trilink_spark as tl
from trilink_spark.errors import MissingColumnError
from trilink_spark.keyed import KeyedContext
from trilink_spark import columns as tl_columns
from testkit.windows import window_oracle
from trilink_spark._internal.io.arrowio import write_table
from trilink_spark.keyed.semantics.process import EVENT_TIME_COL, KeyedRuntime
from trilink_spark.keyed.semantics.keys import PartitionState
from trilink_spark.keyed.durable.codec import decode_state, encode_state
from trilink_spark.state.store import STATE_KIND

from pyspark import cloudpickle  # noqa: E402

# processors defined here travel to Spark's Python workers by value (tests/ is not importable
# there); classes defined in a notebook or __main__ travel by value anyway
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("t", T.LongType()),
                       T.StructField("v", T.DoubleType())])


def frame(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    out = pd.DataFrame(rows, columns=["k", "t", "v"])
    out[EVENT_TIME_COL] = out["t"].astype(float)
    return out


def emitted(outs: list[Any]) -> pd.DataFrame:
    parts = [o for o in outs if isinstance(o, pd.DataFrame)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def stored(rt: KeyedRuntime) -> PartitionState:
    """The runtime's state as a task stores and reloads it (an Arrow state file)."""
    return decode_state(encode_state(rt.snapshot()))


def window_runtime(size: float, delay: float, idle: float = math.inf) -> KeyedRuntime:
    agg = tl.KeyedWindowAggregate(size, value="v", aggs=("count", "sum", "min", "max", "mean"))
    agg.bind(SCHEMA, "k", "t", "integral")
    return KeyedRuntime(agg, "k", delay, idle)


# ---------------------------------------------------------------------- runtime semantics
def test_a_keys_window_closes_on_its_own_watermark() -> None:
    rt = window_runtime(10, 1)
    out = emitted(rt.process(frame([("fast", 100, 1.0), ("slow", 1, 2.0), ("slow", 5, 3.0)])))
    assert out.empty  # slow's window [0, 10) waits for slow's own watermark
    out = emitted(rt.process(frame([("slow", 11, 4.0), ("slow", 2, 9.0)])))
    assert out[["k", "window_start", "count", "sum"]].values.tolist() == [["slow", 0, 2, 5.0]]
    assert rt.counters.late == 1  # slow's 2 arrived after 11 (watermark 10)
    assert rt.counters.late_partition == 4  # every slow row is late by fast's clock


def test_idle_key_follows_the_partition_watermark() -> None:
    rt = window_runtime(10, 1, idle=20)
    rt.process(frame([("quiet", 3, 1.0), ("busy", 4, 1.0)]))
    out = emitted(rt.process(frame([("busy", 15, 1.0)])))
    assert set(out["k"]) == {"busy"}  # quiet lags 12 < 20: not idle yet
    out = emitted(rt.process(frame([("busy", 30, 1.0)])))
    assert ("quiet", 0) in set(zip(out["k"], out["window_start"]))  # lag 27 > 20: closed
    assert rt.key_watermark("quiet") == pytest.approx(29)


def test_null_event_times_are_kept_out_of_windows() -> None:
    rt = window_runtime(10, 0)
    rows = frame([("a", 1, 1.0), ("a", 2, 2.0)])
    rows.loc[1, EVENT_TIME_COL] = float("nan")
    rt.process(rows)
    out = emitted(rt.finish())
    assert out["count"].tolist() == [1]


def test_snapshot_round_trip_keeps_everything() -> None:
    rt = window_runtime(10, 2)
    rt.process(frame([("a", 1, 1.0), ("b", 3, 2.0), ("a", 14, 5.0)]))
    again = KeyedRuntime(rt.processor, "k", 2, math.inf, stored(rt))
    assert again.key_high == rt.key_high and again.partition_high == rt.partition_high
    left = emitted(again.finish()).sort_values(["k", "window_start"]).reset_index(drop=True)
    right = emitted(rt.finish()).sort_values(["k", "window_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(left, right)


def test_idle_key_state_is_small() -> None:
    rt = window_runtime(10, 1, idle=5)
    keys = [f"sensor-{i:05d}" for i in range(10_000)]
    rt.process(frame([(k, 1, 1.0) for k in keys]))
    rt.process(frame([("clock", 100, 1.0)]))  # everyone else is idle now: windows close
    assert rt.processor.open_windows(rt) <= 1  # type: ignore[attr-defined]
    per_key = len(write_table(encode_state(rt.snapshot()), STATE_KIND)) / len(keys)
    assert per_key <= 200, per_key


class TimerEcho(tl.KeyedWatermarkProcessFunction):
    """Registers a timer 5 after every on-time row; emits timers and late rows."""

    output_schema = "k string, kind string, at double"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        for ts in rows[tl_columns.EVENT_TIME_COL]:
            ctx.register_timer(int(ts) + 5)
        return None

    def process_late(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        return [(key, "late", float(t)) for t in rows[tl_columns.EVENT_TIME_COL]]

    def on_timer(self, key: Any, timestamp: int, ctx: KeyedContext) -> Any:
        assert ctx.watermark >= timestamp
        return [(key, "timer", float(timestamp))]


def test_timers_fire_in_order_when_the_keys_watermark_passes() -> None:
    rt = KeyedRuntime(TimerEcho(), "k", 0, math.inf)
    outs = rt.process(frame([("a", 1, 0), ("a", 3, 0), ("b", 50, 0)]))
    assert emitted(outs).empty or list(emitted(outs)["kind"]) == []
    fired = [r for o in rt.process(frame([("a", 7, 0), ("a", 2, 0)])) if o for r in o]
    assert fired == [("a", "late", 2.0), ("a", "timer", 6.0)]  # 8 and 12 not yet due
    rest = [r for o in rt.finish() if o for r in o]
    assert rest == [("a", "timer", 8.0), ("a", "timer", 12.0), ("b", "timer", 55.0)]
    rt.timers._check()


# ---------------------------------------------------------------------- with Spark
def sensors(seed: int, sensors: int = 40, readings: int = 30, disorder: float = 0.0) -> pd.DataFrame:
    """Readings in order per sensor; three sources, one 4 s ahead; optional disorder."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(sensors):
        skew = 4 if s % 3 == 0 else 0
        for i in range(readings):
            rows.append((f"s{s:03d}", i * 1000 + skew * 1000 + int(rng.integers(0, 500)),
                         float(rng.normal(220, 5))))
    out = pd.DataFrame(rows, columns=["sensor", "t", "volts"])
    out["arrival"] = rng.permutation(len(out))
    out = out.sort_values("arrival")
    if disorder == 0.0:  # keep each sensor's readings in order of arrival
        out["t"] = out.groupby("sensor")["t"].transform(lambda s: np.sort(s.to_numpy()))
    return out.reset_index(drop=True)


def test_in_order_sensors_lose_nothing_and_match_the_oracle(spark: Any) -> None:
    rows = sensors(1)
    df = spark.createDataFrame(rows)
    agg = tl.KeyedWindowAggregate(5000, value="volts", aggs=("count", "sum"))
    got = tl.keyed_process(df, "sensor", "t", agg, delay=1000, order_by="arrival",
                           num_partitions=3).toPandas()
    want = window_oracle(rows, 5000, "volts")
    merged = want.merge(got, on=["sensor", "window_start"], suffixes=("", "_got"), how="outer")
    assert len(merged) == len(want) == len(got)
    assert (merged["count"] == merged["count_got"]).all()
    assert np.allclose(merged["sum"], merged["sum_got"])
    marked = tl.keyed_watermark(df, "sensor", "t", 1000, order_by="arrival")
    assert marked.filter("is_late").count() == 0
    assert marked.filter("is_late_partition").count() > 0


def test_out_of_order_rows_are_dropped_exactly_as_marked(spark: Any) -> None:
    rows = sensors(2, disorder=0.3)
    df = spark.createDataFrame(rows)
    late = (tl.keyed_watermark(df, "sensor", "t", 500, order_by="arrival")
            .filter("NOT is_late").toPandas())
    agg = tl.KeyedWindowAggregate(5000, value="volts", aggs=("count",))
    got = tl.keyed_process(df, "sensor", "t", agg, delay=500, order_by="arrival").toPandas()
    want = window_oracle(late, 5000, "volts")
    merged = want.merge(got, on=["sensor", "window_start"], how="outer", suffixes=("", "_got"))
    assert (merged["count"] == merged["count_got"]).all()
    assert got["count"].sum() < len(rows)


def test_generic_processor_and_timestamp_windows(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [("a", 1, 1), ("b", 2, 2), ("a", 12, 3), ("a", 5, 4)], "k string, t long, arr long"
    ).withColumn("ts", F.timestamp_seconds("t"))
    echoed = tl.keyed_process(df, "k", "ts", TimerEcho(), delay=0.0, order_by="arr").collect()
    kinds = sorted((r["k"], r["kind"]) for r in echoed)
    assert kinds.count(("a", "late")) == 1 and kinds.count(("a", "timer")) == 2
    windows = tl.keyed_process(df, "k", "ts", tl.KeyedWindowAggregate(10.0), delay=1.0,
                               order_by="arr").orderBy("k", "window_start").collect()
    assert [(r["k"], r["window_start"].second, r["count"]) for r in windows] == [
        ("a", 0, 1), ("a", 10, 1), ("b", 0, 1)]


def test_argument_errors(spark: Any) -> None:
    df = spark.createDataFrame([("a", 1, 1.0)], "k string, t long, v double")
    with pytest.raises(TypeError):
        tl.keyed_process(df, "k", "t", "count", delay=1)  # type: ignore[arg-type]
    with pytest.raises(MissingColumnError):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(5, value="nope", aggs=("sum",)), 1)
    with pytest.raises(ValueError):
        tl.KeyedWindowAggregate(5, aggs=("median",))
    with pytest.raises(ValueError):
        tl.KeyedWindowAggregate(5, aggs=("sum",))
    with pytest.raises(ValueError):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(0), delay=1)


def test_state_round_trips_timers_without_pickle() -> None:
    rt = KeyedRuntime(TimerEcho(), "k", 0, math.inf)
    rt.process(frame([("a", 1, 0)]))
    state = stored(rt)
    assert state.timers == [("a", 6)]
