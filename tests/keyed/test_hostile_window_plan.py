"""Hostile input for bounded ``KeyedWindowAggregate`` on both engines, and for its state.

``engine="python"`` (the keyed runtime) is the oracle of ``engine="spark"``: rows bit for bit and
the same late count, which is also ``keyed_watermark``'s. Each case here is input that broke, or
could break, the two apart: key and value types, event times at the edges of what a double holds,
column names Spark's parser splits, a task failing on its first attempt; then what must be refused
when the call is made (names Spark would find ambiguous, values that are no numbers, window bounds
beyond a long), and a stream's stored configuration, which the single-value form keeps as it was
before the mapping form came, so state written by earlier versions restarts.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType

import trilink_spark as tl
from trilink_spark.columns import quoted
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the flaky UDF ships to tasks

AGGS = ("count", "sum", "min", "max", "mean")
#: Two value columns, one of them also counted and averaged (the mapping form).
MAPPED = {"n": ("count", None), "total": ("sum", "v"), "low": ("min", "w"),
          "seen": ("count", "w"), "avg": ("mean", "w"), "high": ("max", "v")}


def _canon(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows comparable bit for bit: floats by their hex (``-0.0`` apart from ``0.0``), NaN and
    null alike (Arrow writes a NaN result as null)."""
    def value(x: Any) -> Any:
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return ("null",)
        if isinstance(x, float):
            return ("f", x.hex())
        return ("v", repr(x))

    return sorted(tuple(value(x) for x in row) for row in rows)


def _both(df: Any, key: str, time: str, make: Any, **kw: Any) -> list[tuple[Any, ...]]:
    """Both engines' rows of one call (collected, not through pandas: dates, binary and
    far timestamps come back as Python values); asserts they are the same rows, with the
    same schema, and returns them."""
    outs = {}
    for engine in ("spark", "python"):
        out = tl.keyed_process(df, key, time, make(), engine=engine, **kw)
        outs[engine] = (out.schema.simpleString(), _canon([tuple(r) for r in out.collect()]))
    assert outs["spark"] == outs["python"]
    return outs["spark"][1]


def _late(df: Any, key: str, time: str, count: str, **kw: Any) -> tuple[int, int, int]:
    """Late rows by the Spark plan, by the runtime and by ``keyed_watermark``."""
    known = df.where(F.col(quoted(time)).isNotNull() & ~F.isnan(quoted(time))).count()
    got = []
    for engine in ("spark", "python"):
        out = tl.keyed_process(df, key, time, tl.KeyedWindowAggregate(5.0), engine=engine, **kw)
        got.append(known - int(out.agg(F.sum(count)).first()[0] or 0))
    marked = tl.keyed_watermark(df, key, time, delay=kw["delay"], order_by=kw.get("order_by"))
    return got[0], got[1], marked.where("is_late").count()


# ---------------------------------------------------------------------------- what held
@pytest.mark.parametrize("ktype,keys", [
    ("bigint", [-2**63, 2**63 - 1, 2**53 + 1, 2**53, 0, None]),
    ("double", [float("nan"), -0.0, 0.0, None, float("inf"), -float("inf")]),
    ("string", ["", None, "x" * 1_000_000, "\U0001F600", "a"]),
    ("binary", [b"", None, b"\x00\xff", b"a"]),
    ("boolean", [True, False, None]),
    ("decimal(38,18)", [Decimal("1.10"), Decimal("-0"), None,
                        Decimal("99999999999999999999.123456789012345678")]),
    ("date", [dt.date(1970, 1, 1), dt.date(1, 1, 1), dt.date(9999, 12, 31), None]),
    ("timestamp_ntz", [dt.datetime(1970, 1, 1), dt.datetime(1, 1, 1, 0, 0, 0, 1), None]),
])
def test_key_types_give_the_runtimes_rows(spark: Any, ktype: str, keys: list[Any]) -> None:
    rows = [(k, float(i), float(i)) for i, k in enumerate(keys * 3)]
    df = spark.createDataFrame(rows, f"k {ktype}, t double, v double")
    got = _both(df, "k", "t", lambda: tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS),
                delay=1.0)
    assert sum(int(r[3][1]) for r in got) == len(rows)  # every row in a window


@pytest.mark.connect
def test_odd_event_times_and_late_counts(spark: Any) -> None:
    odd = [None, float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 5.0, 5.0, 3.0, 1.0,
           2.0**60, 1e308, -1e308, 0.0, -0.0]
    rows = [(i % 3, t, float(i), float(-i)) for i, t in enumerate(odd * 3)]
    df = spark.createDataFrame(rows, "k bigint, t double, v double, w double").coalesce(1)
    for size in (0.75, 1e-300, 1e300):
        _both(df, "k", "t", lambda: tl.KeyedWindowAggregate(size, aggs=MAPPED), delay=1.0)
    for delay in (0.0, 1e300):
        spark_late, python_late, marked = _late(df, "k", "t", "count", delay=delay)
        assert spark_late == python_late == marked > 0


@pytest.mark.parametrize("strategy", ["hash", "least_count"])
@pytest.mark.parametrize("delay", [1.0, 1e300])
def test_both_layouts_judge_odd_times_alike(spark: Any, strategy: str, delay: float) -> None:
    """The plan groups by the key alone on rows Spark laid out by its hash, and by the
    placement's partition too on any other layout; NaN times are made null once, the NaN
    guards left out where no NaN can come. Either way the runtime's rows, and no exchange but
    the placement's."""
    from trilink_spark.placement import physical_plan, shuffle_exchanges

    odd = [float("nan"), float("inf"), -float("inf"), None, 7.0, 1.0, 9.0, 2.0, 8.5, -0.0]
    rows = [(i % 4 if i % 9 else None, t, float(i) if i % 5 else float("nan"), i)
            for i, t in enumerate(odd * 4)]
    df = spark.createDataFrame(rows, "k bigint, t double, v double, n bigint")
    agg = {"c": ("count", None), "s": ("sum", "v"), "m": ("max", "n"), "a": ("mean", "n")}
    kw = {"delay": delay, "strategy": strategy, "num_partitions": 3}
    got = _both(df, "k", "t", lambda: tl.KeyedWindowAggregate(2.0, aggs=agg), **kw)
    assert got
    out = tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(2.0, aggs=agg), **kw)
    assert shuffle_exchanges(out) == 1
    # the window's sort: by the key and arrival alone on Spark's hash layout
    sort = next(line for line in physical_plan(out).splitlines() if " Sort [" in line)
    assert ("_tl_partition" in sort) == (strategy != "hash"), sort
    ints = df.withColumn("t", F.col("n") % 7)  # an integral time: no NaN guard at all
    _both(ints, "k", "t", lambda: tl.KeyedWindowAggregate(3, aggs=agg), **kw)
    # refused either way: by the placement's fit on the driver or by its column, or by the
    # plan's own check where the plan reads no placement column
    with pytest.raises(Exception, match="has null keys"):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(2.0), delay=delay,
                         strategy=strategy, num_partitions=3, null_policy="error").collect()


def test_values_at_the_edges_of_a_double(spark: Any) -> None:
    longs = [2**53 + 1, 2**53 + 3, 2**62, -2**63, 2**63 - 1, 1, 3, None]
    rows = [(i % 2, float(i % 4), v) for i, v in enumerate(longs * 2)]
    _both(spark.createDataFrame(rows, "k bigint, t double, v bigint"), "k", "t",
          lambda: tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS), delay=1.0)
    rng = np.random.default_rng(3)
    wide = [Decimal(int(d)).scaleb(-18) * 10**11 for d in rng.integers(-10**18, 10**18, 60)]
    rows = [(i % 3, float(i % 7), v) for i, v in enumerate(wide + [None])]
    _both(spark.createDataFrame(rows, "k bigint, t double, v decimal(38,18)"), "k", "t",
          lambda: tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS), delay=1.0)
    # signed zeros in one window: min and max keep the first of equals on both engines
    zeros = [(1, 1.0, -0.0), (1, 2.0, 0.0), (2, 1.0, 0.0), (2, 2.0, -0.0), (3, 1.0, -0.0)]
    _both(spark.createDataFrame(zeros, "k bigint, t double, v double"), "k", "t",
          lambda: tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS), delay=1.0)


@pytest.mark.connect
def test_odd_column_names_everywhere(spark: Any) -> None:
    rng = np.random.default_rng(5)
    n = 120
    rows = list(zip(rng.integers(0, 4, n).tolist(),
                    (np.arange(n) + rng.integers(-4, 4, n)).astype(float).tolist(),
                    rng.normal(size=n).tolist(), rng.integers(0, 30, n).tolist(),
                    rng.normal(size=n).tolist()))
    for names in (["user.id", "t`s", "amount eur", "o.r`d er", "país"],
                  ["v0", "late", "k", "s", "count"]):
        key, time, value, order, other = names
        ddl = ", ".join(f"{quoted(c)} {t}" for c, t in
                        zip(names, ["bigint", "double", "double", "bigint", "double"]))
        df = spark.createDataFrame(rows, ddl).coalesce(2)
        mapped = {"n": ("count", None), "x.y": ("sum", value), "`z": ("max", other),
                  time: ("mean", value), order: ("count", other)}
        _both(df, key, time, lambda: tl.KeyedWindowAggregate(5.0, aggs=mapped), delay=1.0,
              order_by=order)


def _flaky(x: float) -> float:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0 and context.partitionId() == 0:
        raise RuntimeError("injected failure of a first attempt")
    return x


def test_a_task_failing_on_its_first_attempt(spark: Any) -> None:
    """The session allows two attempts (local[2,2]): a failure before the exchange and one
    after it give the rows of a run without failures."""
    rng = np.random.default_rng(7)
    n = 1000
    rows = list(zip(rng.integers(0, 30, n).tolist(),
                    (np.arange(n) // 2 + rng.integers(-9, 9, n)).astype(float).tolist(),
                    rng.normal(size=n).tolist()))
    df = spark.createDataFrame(rows, "k bigint, t double, v double").repartition(3).cache()
    flaky = F.udf(_flaky, DoubleType())
    agg = tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS)
    clean = tl.keyed_process(df, "k", "t", agg, delay=1.0, num_partitions=4, engine="spark")
    want = _canon([tuple(r) for r in clean.collect()])
    before = tl.keyed_process(df.withColumn("v", flaky("v")), "k", "t", agg, delay=1.0,
                              num_partitions=4, engine="spark")
    after = clean.withColumn("sum", flaky("sum"))
    assert _canon([tuple(r) for r in before.collect()]) == want
    assert _canon([tuple(r) for r in after.collect()]) == want
    df.unpersist()


# ------------------------------------------------------------------ refused at the call
@pytest.mark.connect
@pytest.mark.parametrize("key,aggs", [
    ("k", {"Window_Start": ("sum", "v")}),
    ("k", {"K": ("sum", "v")}),
    ("k", {"n": ("count", None), "N": ("sum", "v")}),
    ("Count", ("count",)),
])
def test_output_names_spark_would_find_ambiguous_are_refused(spark: Any, key: str,
                                                             aggs: Any) -> None:
    """Spark resolves names without case: an output column named like another one apart
    from case gives a frame none of whose two columns can be selected."""
    df = spark.createDataFrame([(1, 1.0, 2.0)], f"{quoted(key)} bigint, t double, v double")
    for engine in ("spark", "python"):
        with pytest.raises(InvalidArgumentError, match="case"):
            tl.keyed_process(df, key, "t", tl.KeyedWindowAggregate(5.0, aggs=aggs), delay=1.0,
                             engine=engine)


@pytest.mark.parametrize("vtype,value", [
    ("date", dt.date(2020, 1, 1)), ("timestamp", dt.datetime(2020, 1, 1)),
    ("binary", b"ab"), ("array<double>", [1.0])])
def test_values_that_are_no_numbers_are_refused_at_the_call(spark: Any, vtype: str,
                                                            value: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, value)], f"k bigint, t double, v {vtype}")
    with pytest.raises(InvalidArgumentTypeError, match=f"value column 'v' is {vtype}"):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS),
                         delay=1.0)


def test_strings_run_in_python_and_one_that_is_no_number_is_named(spark: Any) -> None:
    numeric = spark.createDataFrame([(1, 1.0, "1.5"), (1, 2.0, "2"), (1, 3.0, None)],
                                    "k bigint, t double, v string")
    agg = tl.KeyedWindowAggregate(5.0, value="v", aggs=AGGS)
    assert tl.keyed.explain_keyed_process(numeric, "k", agg).engine == "python"
    row = tl.keyed_process(numeric, "k", "t", agg, delay=1.0).first()
    assert (row["count"], row["sum"], row["max"]) == (3, 3.5, 2.0)
    junk = spark.createDataFrame([(1, 1.0, "abc")], "k bigint, t double, v string")
    with pytest.raises(Exception, match="InvalidArgumentError: value column 'v' holds 'abc'"):
        tl.keyed_process(junk, "k", "t", agg, delay=1.0).collect()


@pytest.mark.connect
def test_integral_window_bounds_beyond_a_long_are_refused(spark: Any) -> None:
    """A window of 2**63 units ends beyond a long: the runtime wrapped it to -2**63, the
    plan saturated it at 2**63 - 1 (and failed the cast beyond): refused when called."""
    df = spark.createDataFrame([(1, 5, 1.0), (2, -5, 2.0)], "k bigint, t bigint, v double")
    for size in (2**63, 2**64, 1e300):
        for engine in ("spark", "python"):
            with pytest.raises(InvalidArgumentError, match="2\\*\\*53"):
                tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(size, value="v"),
                                 delay=1, engine=engine)
    got = _both(df, "k", "t", lambda: tl.KeyedWindowAggregate(2**53, value="v"), delay=1)
    assert [r[1:3] for r in got] == [(("v", "0"), ("v", repr(2**53))),
                                     (("v", repr(-2**53)), ("v", "0"))]


@pytest.mark.xfail(strict=True, reason="eventtime.from_units builds nanosecond timestamps "
                   "(pandas' range ends in 2262): the runtime fails where the plan gives rows")
def test_timestamp_window_ending_after_2262(spark: Any) -> None:
    df = spark.createDataFrame([(1, dt.datetime(2255, 6, 1), 1.0)],
                               "k bigint, t timestamp, v double")
    _both(df, "k", "t", lambda: tl.KeyedWindowAggregate("20000 days", value="v"),
          delay="1 second")


@pytest.mark.xfail(strict=True, reason="eventtime.event_time_whole takes abs(-2**63), an "
                   "ARITHMETIC_OVERFLOW, before its typed refusal of times beyond 2**53")
def test_event_time_of_minus_2_63_is_refused_by_name(spark: Any) -> None:
    df = spark.createDataFrame([(1, -2**63, 1.0)], "k bigint, t bigint, v double")
    with pytest.raises(Exception, match="InvalidArgumentError: event time column 't'"):
        tl.keyed_process(df, "k", "t", tl.KeyedWindowAggregate(7, value="v"), delay=1,
                         engine="spark").collect()


# ------------------------------------------------------------------------ streams
SIZE, DELAY = 10, 2
SCHEMA = "sensor string, t long, v double, w double"


def _readings(start: int, stop: int) -> pd.DataFrame:
    rows = [(f"s{s}", t, float(s + t), None if (s + t) % 4 == 0 else float(t - s))
            for t in range(start, stop) for s in range(6)]
    return pd.DataFrame(rows, columns=["sensor", "t", "v", "w"])


def _closed(rows: pd.DataFrame) -> pd.DataFrame:
    """The windows of ``rows`` (none late: every sensor's clock advances) that every sensor's
    own watermark has passed, with the aggregates of :data:`MAPPED`."""
    high = rows.groupby("sensor")["t"].max() - DELAY
    g = rows.assign(window_start=rows["t"] // SIZE * SIZE).groupby(["sensor", "window_start"])
    out = pd.DataFrame({"n": g.size(), "total": g["v"].sum(), "low": g["w"].min(),
                        "seen": g["w"].count(), "avg": g["w"].mean(),
                        "high": g["v"].max()}).reset_index()
    done = out[out["window_start"] + SIZE <= out["sensor"].map(high)]
    return done.sort_values(["sensor", "window_start"]).reset_index(drop=True)


def _stream(path: Path, sink: list[pd.DataFrame], agg: Any, **kw: Any) -> Any:
    return tl.keyed_foreach_batch(lambda df, b: sink.append(df.toPandas()), "sensor", "t", agg,
                                  DELAY, str(path), num_partitions=3, **kw)


def _emitted(sink: list[pd.DataFrame], columns: list[str]) -> list[list[Any]]:
    out = pd.concat(sink, ignore_index=True).sort_values(["sensor", "window_start"])
    return out[columns].values.tolist()


def test_single_value_form_keeps_the_configuration_it_stored(spark: Any,
                                                             tmp_path: Path) -> None:
    """A stream's manifest holds the processor's configuration, and a restart with another
    one is refused. The single-value form's must be the one versions before the mapping form
    stored (its state layout is), so their state restarts: simulated by writing that
    configuration into the manifest, then restarting with the same arguments."""
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    earlier = {"aggs": ["count", "sum"], "key_column": "sensor",
               "output_schema": "`sensor` string, window_start bigint, window_end bigint, "
                                "`count` bigint, `sum` double",
               "size": SIZE, "size_units": float(SIZE), "time_kind": "integral", "value": "v"}
    parts = [_readings(0, 9), _readings(9, 20), _readings(20, 33)]
    sink: list[pd.DataFrame] = []
    run = _stream(tmp_path / "state", sink, agg)
    run(spark.createDataFrame(parts[0], SCHEMA), 0)
    run(spark.createDataFrame(parts[1], SCHEMA), 1)
    assert agg.state_config() == earlier
    manifest = run.store.read_manifest()
    run.store.write_manifest({**manifest, "config": {**manifest["config"],
                                                     "processor_config": earlier}})
    again = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    _stream(tmp_path / "state", sink, again, takeover=True)(
        spark.createDataFrame(parts[2], SCHEMA), 2)
    want = _closed(pd.concat(parts))
    assert _emitted(sink, ["sensor", "window_start", "count", "sum"]) == \
        want[["sensor", "window_start", "n", "total"]].values.tolist()
    counted = tl.KeyedWindowAggregate(SIZE)  # no value: its configuration has none either
    counted.bind(spark.createDataFrame(parts[0], SCHEMA).schema, "sensor", "t", "integral")
    assert "values" not in counted.state_config()


def test_mapping_form_in_a_stream_restarts_and_refuses_a_changed_column(
        spark: Any, tmp_path: Path) -> None:
    parts = [_readings(0, 7), _readings(7, 18), _readings(18, 33), _readings(33, 41)]
    columns = ["sensor", "window_start", *MAPPED]
    sink: list[pd.DataFrame] = []
    run = _stream(tmp_path / "state", sink, tl.KeyedWindowAggregate(SIZE, aggs=MAPPED))
    for batch_id, part in enumerate(parts[:2]):
        run(spark.createDataFrame(part, SCHEMA), batch_id)
    restarted = _stream(tmp_path / "state", sink, tl.KeyedWindowAggregate(SIZE, aggs=MAPPED),
                        takeover=True)
    for batch_id, part in enumerate(parts[2:], start=2):
        restarted(spark.createDataFrame(part, SCHEMA), batch_id)
    assert _emitted(sink, columns) == _closed(pd.concat(parts))[columns].values.tolist()
    # the stored accumulators are per value column: another column is another state
    changed = {**MAPPED, "total": ("sum", "w"), "high": ("max", "w")}
    with pytest.raises(InvalidArgumentError, match="another configuration"):
        _stream(tmp_path / "state", [], tl.KeyedWindowAggregate(SIZE, aggs=changed),
                takeover=True)(spark.createDataFrame(_readings(41, 42), SCHEMA), 4)
    shutil.rmtree(tmp_path / "state")
