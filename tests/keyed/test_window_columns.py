"""KeyedWindowAggregate keeps its open windows as numpy columns (KeyedColumns): in its task
work and in stored state, the stored layout unchanged, and state stored by the DataFrame
form of earlier versions taken over."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import types as T

import trilink_spark as tl
from trilink_spark.errors import StateCorruptError
from trilink_spark.keyed.durable.codec import decode_state, encode_state
from trilink_spark.keyed.semantics.keys import NAN_KEY, NULL_KEY, PartitionState, object_array
from trilink_spark.keyed.semantics.process import EVENT_TIME_COL, KeyedRuntime
from trilink_spark.keyed.semantics.tables import KeyedColumns
from trilink_spark.state.store import KEY_FIELD

from testkit.windows import (SIZE, assert_same_windows, emitted_windows, hostile_window_frames,
                             window_model)

NAN, INF = float("nan"), float("inf")
AGGS = ("count", "sum", "min", "max", "mean")
SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("t", T.DoubleType()),
                       T.StructField("v", T.DoubleType())])


def _agg() -> tl.KeyedWindowAggregate:
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=AGGS)
    agg.bind(SCHEMA, "k", "t", "fractional")
    return agg


def _as_frame(table: KeyedColumns) -> pd.DataFrame:
    """The same open windows in the DataFrame form earlier versions stored."""
    cols = dict(table.columns)
    starts = cols.pop("s")
    index = pd.MultiIndex.from_arrays([pd.Index(table.keys, dtype=object), starts],
                                      names=["k", "s"])
    return pd.DataFrame(cols, index=index)


def _stored(rt: KeyedRuntime) -> pa.Table:
    return encode_state(rt.snapshot(), pa.string())


def _run_stored(frames: list[pd.DataFrame],
                old_form: bool = False) -> tuple[pd.DataFrame, list[Any]]:
    """The frames batch by batch, the state encoded and decoded between batches (a new
    runtime each time, as a task resumes); ``old_form``: stored as a DataFrame each time."""
    agg = _agg()
    state: PartitionState | None = None
    outs: list[Any] = []
    forms: list[Any] = []
    for i, frame in enumerate(frames + [None]):  # type: ignore[list-item]
        rt = KeyedRuntime(agg, "k", 1e308, math.inf, state=state)
        forms.append(type(rt.shared.get("windows")))
        if frame is None:
            outs.extend(rt.finish())
            break
        frame = frame.copy()
        frame[EVENT_TIME_COL] = frame["t"]
        outs.extend(rt.process(frame))
        snap = rt.snapshot()
        if old_form and isinstance(snap.shared.get("windows"), KeyedColumns):
            snap.shared["windows"] = _as_frame(snap.shared["windows"])
        state = decode_state(encode_state(snap, pa.string()), f"batch {i}")
    got = [o for o in outs if isinstance(o, pd.DataFrame)]
    return (pd.concat(got, ignore_index=True) if got else pd.DataFrame(columns=["k", *AGGS]),
            forms)


def _frames(seed: int) -> list[pd.DataFrame]:
    return hostile_window_frames(seed, batches=(2, 6), long_key=50)


@pytest.mark.parametrize("seed", range(8))
def test_windows_stored_between_batches_equal_the_model(seed: int) -> None:
    frames = _frames(seed)
    got, forms = _run_stored(frames)
    assert_same_windows(emitted_windows(got), window_model(frames))
    # every resumed runtime found its open windows as columns, never as a DataFrame
    assert pd.DataFrame not in forms
    assert KeyedColumns in forms[1:] or not any(len(f) for f in frames)


@pytest.mark.parametrize("seed", range(4))
def test_state_stored_as_a_dataframe_is_taken_over(seed: int) -> None:
    """State written in the DataFrame form (earlier versions) resumes, with the same
    results; the aggregate stores its own form from then on."""
    frames = _frames(100 + seed)
    got, forms = _run_stored(frames, old_form=True)
    assert_same_windows(emitted_windows(got), window_model(frames))
    assert KeyedColumns not in forms
    rt = KeyedRuntime(_agg(), "k", 1e308, math.inf)
    frame = frames[0].assign(**{EVENT_TIME_COL: frames[0]["t"]})
    rt.process(frame)
    if isinstance(rt.shared.get("windows"), KeyedColumns):
        rt.shared["windows"] = _as_frame(rt.shared["windows"])
    resumed = KeyedRuntime(_agg(), "k", 1e308, math.inf, state=decode_state(_stored(rt)))
    assert isinstance(resumed.shared["windows"], pd.DataFrame)
    resumed.process(frames[1].assign(**{EVENT_TIME_COL: frames[1]["t"]}))
    meta = json.loads(_stored(resumed).schema.metadata[b"trilink.shared_tables"])
    assert meta["windows"] == {"levels": ["k", "s"], "form": "columns"}


def test_both_forms_store_the_same_column() -> None:
    frame = pd.DataFrame({"k": ["a", None, "b", "a", None], "t": [1.0, 2.0, 13.0, 15.0, 3.0],
                          "v": [1.0, NAN, INF, None, -2.0]})
    rt = KeyedRuntime(_agg(), "k", 1e308, math.inf)
    rt.process(frame.assign(**{EVENT_TIME_COL: frame["t"]}))
    table = rt.shared["windows"]
    assert isinstance(table, KeyedColumns) and len(table) == 4
    columns = _stored(rt)
    rt.shared["windows"] = _as_frame(table)
    frames = _stored(rt)
    assert columns.column(KEY_FIELD).equals(frames.column(KEY_FIELD))
    assert columns.column("shared:windows").equals(frames.column("shared:windows"))
    assert columns.column("shared:windows").type.value_type.names[:3] == ["s", "count", "nn"]


def test_keyed_columns_take_drop_and_refuse() -> None:
    keys = object_array(["a", NULL_KEY, NAN_KEY, "a", float("nan")])
    table = KeyedColumns(keys, {"s": np.array([0.0, 1.0, 2.0, 3.0, 4.0])}, ("k", "s"))
    assert len(table.without_keys([NULL_KEY])) == 3  # every NaN is the null key
    assert table.without_keys([NAN_KEY]).keys.tolist().count(NAN_KEY) == 0
    assert table.without_keys(["zzz"]) is table
    order, starts = table.concat(table).groups("s")
    assert len(starts) == 5 and sorted(order.tolist()) == list(range(10))
    with pytest.raises(StateCorruptError, match="holds 2 values for 5 keys"):
        KeyedColumns(keys, {"s": np.zeros(2)})
    with pytest.raises(StateCorruptError, match="do not combine"):
        table.concat(KeyedColumns(keys, {"x": np.zeros(5)}))


def test_a_corrupt_columnar_table_entry_is_refused() -> None:
    rt = KeyedRuntime(_agg(), "k", 1e308, math.inf)
    rt.process(pd.DataFrame({"k": ["a"], "t": [1.0], "v": [1.0], EVENT_TIME_COL: [1.0]}))
    stored = _stored(rt)
    meta = dict(stored.schema.metadata)
    for entry in ({"windows": {"levels": ["k", "start"], "form": "columns"}},
                  {"windows": {"levels": "k", "form": "columns"}}, {"windows": 3}):
        meta[b"trilink.shared_tables"] = json.dumps(entry).encode()
        with pytest.raises(StateCorruptError, match="keyed table|shared table"):
            decode_state(stored.replace_schema_metadata(meta), "p0")


def test_stored_windows_without_their_accumulators_are_refused() -> None:
    """A stored table whose fields are not the aggregate's (damaged, or written by another
    processor under the same name) is refused with a typed error, before any arithmetic."""
    rt = KeyedRuntime(_agg(), "k", 1e308, math.inf)
    rt.process(pd.DataFrame({"k": ["a"], "t": [1.0], "v": [1.0], EVENT_TIME_COL: [1.0]}))
    table = rt.shared["windows"]
    broken = {
        "missing": {k: v for k, v in table.columns.items() if k != "min"},
        "text": {**table.columns, "sum": np.array(["x"], dtype=object)},
    }
    for name, columns in broken.items():
        state = rt.snapshot()
        state.shared["windows"] = KeyedColumns(table.keys, columns, table.levels)
        stored = decode_state(encode_state(state, pa.string()))
        resumed = KeyedRuntime(_agg(), "k", 1e308, math.inf, state=stored)
        frame = pd.DataFrame({"k": ["a"], "t": [2.0], "v": [2.0], EVENT_TIME_COL: [2.0]})
        with pytest.raises(StateCorruptError, match="lack numeric columns"):
            resumed.process(frame)
        with pytest.raises(StateCorruptError, match="lack numeric columns"):
            list(KeyedRuntime(_agg(), "k", 1e308, math.inf, state=decode_state(
                encode_state(state, pa.string()))).finish())
    old = rt.snapshot()
    old.shared["windows"] = {"not": "a table"}
    with pytest.raises(StateCorruptError, match="not a keyed table"):
        list(KeyedRuntime(_agg(), "k", 1e308, math.inf, state=old).finish())
