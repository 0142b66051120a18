"""Hostile inputs to KeyedTester: keys and event times at the edges, internal column names, a
hook that raises, size and threads."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.columns import EVENT_TIME_COL, PARTITION_COL
from trilink_spark.errors import (InvalidArgumentError, InvalidArgumentTypeError,
                                  InvalidKeyTypeError, ReservedColumnError, TrilinkError)
from trilink_spark.testing import KeyedTester


class Count(tl.KeyedWatermarkProcessFunction):
    """Per key: rows on time and late; raises on a row whose ``t`` is -1."""

    output_schema = "n long, late long"
    state_schema = "n long, late long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
        if (rows["t"] == -1).any():
            raise RuntimeError("hook failed")
        return [(ctx.get_state("n"), ctx.get_state("late", 0))]

    def process_late(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("late", ctx.get_state("late", 0) + len(rows))


def make_tester(**kw: Any) -> KeyedTester:
    return KeyedTester(Count(), key="k", event_time="t", delay=2, **kw)


def stored(t: KeyedTester) -> dict[Any, int]:
    """Each stored key's rows (on time and late)."""
    state = t.state()
    return {k: int(r) for k, r in zip(state["key"], state["rows"])}


# ---------------------------------------------------------------------- keys
@pytest.mark.parametrize("keys", [
    ["a", None, "a", None],
    ["", "", "a", ""],
    ["x" * 1_000_000, "y", "x" * 1_000_000, "y"],
    ["😀", "😀a", "😀", "\u0000"],
    [b"\x00\xff", b"", b"\x00\xff", b"\x00"],
    [2**63 - 1, -(2**63), 2**63 - 1, 0],
    [True, False, True, True],
    [0.5, -0.0, 0.5, 1e300],
])
def test_edge_keys_are_each_their_own_key_with_every_row(keys: list[Any]) -> None:
    t = make_tester()
    t.run(pd.DataFrame({"k": keys, "t": [1, 2, 3, 4]}))
    expected = pd.Series(keys, dtype=object).value_counts(dropna=False)
    got = stored(t)
    assert sum(got.values()) == 4 and len(got) == len(expected)
    assert t.counters()["rows"] == 4


def test_null_and_nan_keys_of_a_float_column_are_one_null_key_as_spark_reads_pandas() -> None:
    t = make_tester()
    t.run(pd.DataFrame({"k": [1.0, math.nan, None, 1.0], "t": [1, 2, 3, 4]}))
    assert sorted(stored(t).values()) == [2, 2]


@pytest.mark.parametrize("keys, error, match", [
    ([{"a": 1}, {"a": 2}], InvalidKeyTypeError, "atomic key"),
    ([[1], [2]], InvalidKeyTypeError, "atomic key"),
    ([2**63, 1], InvalidArgumentTypeError, "uint64"),
    ([object(), object()], InvalidArgumentTypeError, "does not convert to Arrow"),
])
def test_keys_no_stream_can_hold_are_refused_typed(keys: list[Any], error: type,
                                                   match: str) -> None:
    t = make_tester()
    with pytest.raises(error, match=match):
        t.run(pd.DataFrame({"k": keys, "t": [1, 2]}))
    assert t.batches == 0 and t.state().empty


def test_a_null_key_under_the_error_policy_is_refused_and_commits_nothing() -> None:
    t = make_tester(null_policy="error")
    with pytest.raises(TrilinkError, match="null keys"):
        t.run(pd.DataFrame({"k": ["a", None], "t": [1, 2]}))
    assert t.batches == 0
    t.run(pd.DataFrame({"k": ["a"], "t": [1]}))
    assert stored(t) == {"a": 1}


# ---------------------------------------------------------------------- event times
@pytest.mark.parametrize("times", [
    [1.0, math.nan, 3.0, 4.0],
    [1, None, 3, 4],
    [1.0, math.inf, 3.0, 4.0],
    [-math.inf, 1.0, 3.0, 4.0],
    [1e300, 1.0, -1e300, 4.0],
    [5, 1, 4, 2],
    [3, 3, 3, 3],
])
def test_edge_event_times_keep_every_row(times: list[Any]) -> None:
    t = make_tester()
    t.run(pd.DataFrame({"k": ["a", "a", "b", "b"], "t": times}))
    assert sum(stored(t).values()) == 4
    assert t.counters()["rows"] == 4


def test_an_infinite_event_time_makes_later_rows_late_not_lost() -> None:
    t = make_tester()
    t.run(pd.DataFrame({"k": ["a", "a"], "t": [1.0, math.inf]}))
    t.run(pd.DataFrame({"k": ["a"], "t": [1e300]}))
    assert t.counters() == {"rows": 3, "late": 1, "late_partition": 1}


@pytest.mark.parametrize("times, error, match", [
    ([2**60, 1], InvalidArgumentError, "2\\*\\*53"),
    (["x", "y"], InvalidArgumentTypeError, "timestamp or a number"),
])
def test_event_times_no_stream_takes_are_refused_typed(times: list[Any], error: type,
                                                       match: str) -> None:
    t = make_tester()
    with pytest.raises(error, match=match):
        t.run(pd.DataFrame({"k": ["a", "b"], "t": times}))
    assert t.batches == 0


def test_empty_frames_before_and_after_rows() -> None:
    t = make_tester()
    out = t.run(pd.DataFrame({"k": pd.Series([], dtype=object),
                              "t": pd.Series([], dtype="int64")}))
    assert out.empty and list(out.columns) == ["n", "late"]
    t.run(pd.DataFrame({"k": ["a"], "t": [1]}))
    out = t.run(pd.DataFrame({"k": pd.Series([], dtype=object),
                              "t": pd.Series([], dtype="int64")}))
    assert out.empty and stored(t) == {"a": 1}
    t.finish()
    with pytest.raises(InvalidArgumentError, match="finish"):
        t.run(pd.DataFrame({"k": ["a"], "t": [1]}))


# ---------------------------------------------------------------------- column names
@pytest.mark.parametrize("name", [PARTITION_COL, EVENT_TIME_COL, "_tl_anything"])
def test_internal_column_names_are_refused(name: str) -> None:
    t = make_tester()
    with pytest.raises(ReservedColumnError, match="_tl_"):
        t.run(pd.DataFrame({"k": ["a"], "t": [1], name: [1]}))
    with pytest.raises(ReservedColumnError, match="_tl_"):
        KeyedTester(Count(), key=name, event_time="t", delay=2).run(
            pd.DataFrame({name: ["a"], "t": [1]}))
    assert t.batches == 0


def test_bad_frames_are_typed() -> None:
    t = make_tester()
    with pytest.raises(InvalidArgumentTypeError, match="pandas DataFrame"):
        t.run({"k": ["a"], "t": [1]})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="column names must be str"):
        t.run(pd.DataFrame({"k": ["a"], "t": [1], 3: [1]}))
    twice = pd.DataFrame([["a", 1, 2]], columns=["k", "t", "t"])
    with pytest.raises(InvalidArgumentError, match="more than once"):
        t.run(twice)
    with pytest.raises(TrilinkError, match="'t'"):
        t.run(pd.DataFrame({"k": ["a"]}))


# ---------------------------------------------------------------------- a hook that raises
def test_a_hook_that_raises_leaves_the_state_as_it_was() -> None:
    t = make_tester()
    t.run(pd.DataFrame({"k": ["a", "b"], "t": [5, 6]}))
    before, counters = t.state(), t.counters()
    with pytest.raises(RuntimeError, match="hook failed"):
        t.run(pd.DataFrame({"k": ["a", "c"], "t": [7, -1]}))
    assert t.state().equals(before) and t.counters() == counters and t.batches == 1
    t.run(pd.DataFrame({"k": ["a", "c"], "t": [7, 8]}))  # the batch again, fixed
    assert stored(t) == {"a": 2, "b": 1, "c": 1}


def test_a_first_batch_that_raises_fixes_no_schema() -> None:
    t = make_tester()
    with pytest.raises(RuntimeError, match="hook failed"):
        t.run(pd.DataFrame({"k": [1, 2], "t": [5, -1]}))
    # nothing was accepted: a first batch of other types is a first batch
    t.run(pd.DataFrame({"k": ["a", "b"], "t": [5.5, 1.5]}))
    assert stored(t) == {"a": 1, "b": 1}


def test_a_batch_that_raises_does_not_move_the_processing_clock() -> None:
    t = make_tester(state_ttl=10, state_ttl_time="processing")
    t.run(pd.DataFrame({"k": ["a"], "t": [1]}), processing_time=1000.0)
    with pytest.raises(RuntimeError, match="hook failed"):
        t.run(pd.DataFrame({"k": ["b"], "t": [-1]}), processing_time=2000.0)
    # the failed batch committed nothing: 'a' is 5 s old at this batch, within its TTL
    t.run(pd.DataFrame({"k": ["b"], "t": [2]}), processing_time=1005.0)
    assert set(stored(t)) == {"a", "b"}


# ---------------------------------------------------------------------- size and threads
def timed(rows: int) -> float:
    rng = np.random.default_rng(rows)
    frame = pd.DataFrame({"k": rng.integers(0, 50, rows), "t": rng.permutation(rows)})
    t = make_tester()
    start = time.perf_counter()
    t.run(frame)
    took = time.perf_counter() - start
    assert t.counters()["rows"] == rows
    return took


def test_rows_scale_linearly_in_one_batch_unsorted() -> None:
    timed(1_000)  # imports and first-call costs
    small, large = timed(10_000), timed(100_000)
    assert large < 30 * max(small, 0.05), (small, large)


def test_one_tester_from_four_threads_is_serialised_by_the_caller() -> None:
    """A caller's own lock around ``run`` still works beside the tester's (the tester's is
    taken inside the caller's, never the other way round): every row is kept."""
    t = make_tester()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def feed(n: int) -> None:
        try:
            for i in range(10):
                with lock:
                    t.run(pd.DataFrame({"k": [f"k{n}", "shared"], "t": [i, i]}))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=feed, args=(n,)) for n in range(4)]
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert not errors
    assert stored(t) == {"k0": 10, "k1": 10, "k2": 10, "k3": 10, "shared": 40}
    assert t.batches == 40


def test_one_tester_from_four_threads_keeps_every_row_or_refuses() -> None:
    t = make_tester()
    start = threading.Barrier(4)
    refused: list[BaseException] = []

    def feed(n: int) -> None:
        start.wait()
        try:
            for i in range(10):
                t.run(pd.DataFrame({"k": [f"k{n}", "shared"], "t": [i, i]}))
        except TrilinkError as err:  # a typed refusal of concurrent use would do
            refused.append(err)

    threads = [threading.Thread(target=feed, args=(n,)) for n in range(4)]
    [th.start() for th in threads]
    [th.join() for th in threads]
    kept = stored(t)
    assert refused or kept == {"k0": 10, "k1": 10, "k2": 10, "k3": 10, "shared": 40}
    assert sum(kept.values()) == 2 * t.batches
