"""Hostile review of the null key in keyed processing: what the hooks and the results get.

The null key is a key of its own (``null_policy="group"``): the per-key hooks and ``ctx.key``
get ``None``, an integer column's keys stay exact ints beside it (never the floats pandas
makes, which merged 2**53 with 2**53 + 1), a double column's NaN is a key apart from the null
key (as in Spark's ``groupBy``), timers of the null key order beside string keys, and
KeyedWindowAggregate keeps the null key's windows in streaming state. A restart with another
``null_policy`` is refused rather than silently ignored.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.keyed import read_state
from trilink_spark.keyed.semantics.process import EVENT_TIME_COL, KeyedRuntime
from trilink_spark.keyed.semantics.keys import NAN_KEY, NULL_KEY
from trilink_spark.keyed.durable.codec import decode_state, encode_state
from trilink_spark.keyed.run.task import runtime_frame
from trilink_spark.keyed.semantics.timers import TimerService
from conftest import RunningCount

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 2**53  # BIG and BIG + 1 are one float
KEYS: dict[str, list[Any]] = {
    "string": [None, "", "a"],
    "long": [None, 1, BIG, BIG + 1, -(2**63)],
    "double": [None, math.nan, -0.0, 1.5],
}


def label(key: Any) -> str:
    """A key as the oracle names it: NaN is 'nan' and -0.0 is 0.0 (one key in groupBy)."""
    if isinstance(key, float):
        return "nan" if key != key else repr(key + 0.0)
    return repr(key)


def shown(key: Any) -> str:
    """A key as a hook got it (-0.0 stays -0.0: a hook must get the key 0.0)."""
    return "nan" if isinstance(key, float) and key != key else repr(key)


class Recorder(tl.KeyedWatermarkProcessFunction):
    """Emits, per hook call, the key it got (as text, with its type) and a count: the key's
    running count of on-time rows, its late rows, a timer's time, the final count."""

    output_schema = "hook string, k string, type string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        ctx.register_timer(10**9)  # one time for every key: ordered beside the null key
        return [("on_time", shown(key), type(key).__name__, n),
                ("ctx", shown(ctx.key), type(ctx.key).__name__, n)]

    def process_late(self, key: Any, rows: Any, ctx: Any) -> Any:
        return [("late", shown(key), type(key).__name__, len(rows))]

    def on_timer(self, key: Any, timestamp: int, ctx: Any) -> Any:
        return [("timer", shown(key), type(key).__name__, timestamp)]

    def on_end(self, key: Any, ctx: Any) -> Any:
        return [("end", shown(key), type(key).__name__, ctx.get_state("n"))]


def rows_of(keys: list[Any], b: int) -> list[tuple[Any, float]]:
    """Per key two on-time rows and one late row (delay 10), batch ``b`` later in time."""
    base = 1000.0 * b
    return ([(k, base + 100.0) for k in keys] + [(k, base + 200.0) for k in keys]
            + [(k, base) for k in keys])


def expected_type(kind: str, key: Any) -> str:
    return "NoneType" if key is None else {"string": "str", "long": "int",
                                           "double": "float"}[kind]


def check_hooks(out: list[Any], kind: str, batches: int, ended: bool) -> None:
    keys = dict.fromkeys(label(k) for k in KEYS[kind])  # -0.0 and 0.0: one key
    by_hook: dict[str, dict[str, set[Any]]] = {}
    for hook, key, typ, n in out:
        by_hook.setdefault(hook, {}).setdefault(key, set()).add((typ, n))
    types = {label(k): expected_type(kind, k) for k in KEYS[kind]}
    on_time = {k: {(types[k], 2 * (b + 1)) for b in range(batches)} for k in keys}
    assert by_hook["on_time"] == on_time  # BIG and BIG + 1 apart, NaN apart from None
    assert by_hook["ctx"] == on_time
    assert by_hook["late"] == {k: {(types[k], 1)} for k in keys}
    if ended:
        assert by_hook["timer"] == {k: {(types[k], 10**9)} for k in keys}
        assert by_hook["end"] == {k: {(types[k], 2 * batches)} for k in keys}


# ---------------------------------------------------------------------- without Spark
def test_timers_of_the_null_and_nan_keys_order_beside_other_keys() -> None:
    timers = TimerService()
    for key in ("b", NULL_KEY, "a"):
        assert timers.register(key, 5)  # a str and a NaN at one time compared: TypeError
    assert timers.register(NULL_KEY, 3) and not timers.register(NULL_KEY, 5)
    assert timers.delete("a", 5) and timers.delete(NULL_KEY, 3)
    timers._check()
    assert list(timers.pop_due(5)) == [(NULL_KEY, 5), ("b", 5)]  # the null key first
    floats = TimerService()
    for key in (2.5, NAN_KEY, NULL_KEY, -1.0):
        floats.register(key, 7)
    assert floats.delete(-1.0, 7) and floats.delete(NULL_KEY, 7)  # NaN once broke the order
    floats._check()
    assert list(floats) == [(2.5, 7), (NAN_KEY, 7)]  # the NaN key last, as Spark sorts


@pytest.mark.parametrize("kind", ["long", "double"])
def test_the_runtime_keeps_keys_exact_across_batches(kind: str) -> None:
    arrow = {"long": pa.int64(), "double": pa.float64()}[kind]
    processor = Recorder()
    state = None
    out: list[Any] = []
    for b in (0, 1):
        keys, times = zip(*rows_of(KEYS[kind], b))
        table = pa.table({"k": pa.array(list(keys), arrow),
                          EVENT_TIME_COL: pa.array(list(times), pa.float64())})
        runtime = KeyedRuntime(processor, "k", 10.0, math.inf, state)
        for found in runtime.process(runtime_frame(table, "k")):
            out.extend(found or [])
        encoded = encode_state(runtime.snapshot(), arrow)
        stored = encoded.column("key").to_pylist()
        assert stored.count(None) == 1 and len(stored) == len({label(k) for k in KEYS[kind]})
        state = decode_state(encoded)  # what the next batch starts from
    for found in runtime.finish():
        out.extend(found or [])
    check_hooks(out, kind, 2, ended=True)
    if kind == "double":
        assert NAN_KEY in runtime.key_high and NULL_KEY in runtime.key_high
        assert sum(1 for k in encoded.column("key").to_pylist() if k != k) == 1  # NaN kept


def test_a_vectorised_processor_sees_the_runtime_keys_and_can_convert_them() -> None:
    seen: dict[str, Any] = {}

    class Keys(tl.KeyedWatermarkProcessFunction):
        def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
            raise NotImplementedError

        def process_rows(self, batch: Any, runtime: Any) -> Any:
            seen["keys"], seen["user"] = list(batch.keys), list(batch.user_keys)
            seen["marks"] = runtime.watermarks(batch.keys).watermark.tolist()

    table = pa.table({"k": pa.array([None, 1.0, math.nan, None]),
                      EVENT_TIME_COL: pa.array([5.0, 6.0, 7.0, 8.0])})
    KeyedRuntime(Keys(), "k", 1.0, math.inf).process(runtime_frame(table, "k"))
    assert seen["keys"][0] is NULL_KEY and seen["keys"][2] is NAN_KEY
    assert seen["user"][0] is None and seen["user"][1] == 1.0 and math.isnan(seen["user"][2])
    assert seen["marks"] == [7.0, 5.0, 6.0]  # the null key's and the NaN key's own


# ---------------------------------------------------------------------- keyed_process
@pytest.mark.parametrize("kind", ["string", "long", "double"])
def test_keyed_process_hooks_get_none_and_the_column_type(spark: Any, kind: str) -> None:
    df = spark.createDataFrame(rows_of(KEYS[kind], 0), f"k {kind}, t double")
    # one partition: the null key shares it with every other key (its column then holds a null)
    out = tl.keyed_process(df, "k", "t", Recorder(), delay=10.0, num_partitions=1).collect()
    check_hooks([tuple(r) for r in out], kind, 1, ended=True)


# ---------------------------------------------------------------------- keyed_foreach_batch
def make_run(tmp_path: Path, name: str, processor: Any, out: list[Any], **kw: Any) -> Any:
    return tl.keyed_foreach_batch(lambda df, b: out.extend(tuple(r) for r in df.collect()),
                                  "k", "t", processor, 10.0, str(tmp_path / name), **kw)


@pytest.mark.parametrize("kind, store", [("string", "rocksdb"), ("long", "rocksdb"),
                                         ("long", "files"), ("double", "rocksdb")])
def test_keyed_foreach_batch_hooks_and_state(spark: Any, tmp_path: Path, kind: str,
                                             store: str) -> None:
    out: list[Any] = []
    run = make_run(tmp_path, "state", Recorder(), out, num_partitions=1, state_store=store)
    for b in (0, 1):
        run(spark.createDataFrame(rows_of(KEYS[kind], b), f"k {kind}, t double"), b)
    check_hooks(out, kind, 2, ended=False)
    values = run.state_values()
    assert sorted(label(k) for k in values) == sorted({label(k) for k in KEYS[kind]})
    assert all(v == {"n": 4} for v in values.values())
    if kind == "long":
        assert set(values) == set(KEYS[kind]) and all(type(k) is int for k in values if k)
    stored = read_state(spark, str(tmp_path / "state")).select("key", "rows").collect()
    assert sorted((label(r["key"]), r["rows"]) for r in stored) \
        == sorted((k, 6) for k in {label(k) for k in KEYS[kind]})


@pytest.mark.parametrize("kind", ["string", "long", "double"])
def test_window_aggregate_streams_the_null_key(spark: Any, tmp_path: Path, kind: str) -> None:
    keys = KEYS[kind]
    out: list[Any] = []
    run = make_run(tmp_path, "windows", tl.KeyedWindowAggregate(10.0), out, num_partitions=1)
    sent: list[tuple[Any, float]] = []
    for b in range(3):  # one batch's key rows sit in window [10b, 10b + 10)
        batch = [(k, 10.0 * b + i % 10) for i, k in enumerate(keys * 2)]
        sent += batch
        run(spark.createDataFrame(batch, f"k {kind}, t double"), b)  # failed: pandas index
    # the oracle: windows whose end the key's watermark (its newest time - 10) passed
    frame = pd.DataFrame({"k": [label(k) for k, _ in sent], "t": [t for _, t in sent]})
    frame["s"] = (frame["t"] // 10) * 10
    high = frame.groupby("k")["t"].max() - 10.0
    counts = frame.groupby(["k", "s"]).size()
    expected = sorted(("None" if k in ("None", "nan") else k, s, int(n))
                      for (k, s), n in counts.items() if s + 10 <= high[k])
    got = sorted((label(r[0]) if r[0] is not None else "None", r[1], r[3]) for r in out)
    assert got == expected  # the NaN key's windows apart (its key is null at the sink)
    stored = read_state(spark, str(tmp_path / "windows")).select("key").collect()
    assert sorted(label(r["key"]) for r in stored) == sorted({label(k) for k in keys})


def test_a_restart_with_another_null_policy_is_refused(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(k, float(i)) for i, k in enumerate([None, "a", "b"] * 2)],
                               "k string, t double")
    out: list[Any] = []

    def start(**kw: Any) -> Any:
        return make_run(tmp_path, "state", RunningCount(), out, num_partitions=4,
                        takeover=True, **kw)

    run = start(null_policy="partition0")
    run(df, 0)
    assert run.owners()[None] == 0
    for other in ("group", "error"):  # ignored before: the null key stayed on partition 0
        with pytest.raises(InvalidArgumentError, match=f"null_policy='partition0'.*"
                                                       f"null_policy='{other}'"):
            start(null_policy=other)(df, 1)
    run = start()  # without the argument the state's policy stands
    run(df, 1)
    run = start(null_policy="partition0")
    run(df, 2)
    assert run.owners()[None] == 0
    run.request_swap(tl.HashPartitioner(4, null_policy="group"), refit="none")
    run(df, 3)
    assert run.swaps[-1].refused is None and run.owners()[None] == 42 % 4
    assert run.state_values()[None] == {"n": 8}
    run = start(null_policy="partition0")  # the last start's arguments: the swap stands
    run(df, 4)
    assert run.owners()[None] == 42 % 4 and run.state_values()[None] == {"n": 10}
    with pytest.raises(InvalidArgumentError, match="null_policy='error'"):
        start(null_policy="error")(df, 5)
