"""The rules the runners and KeyedTester share, each one function: the delay and idle timeout
in event-time units, the columns that reach the hooks, a batch's processing time, and the
rows read_state makes of stored state."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import MissingColumnError
from trilink_spark.keyed.durable.manifest import processing_time_after
from trilink_spark.keyed.records.state_reader import STATE_COLUMNS, state_rows
from trilink_spark.keyed.run.prepare import carried_columns, units
from trilink_spark.testing import KeyedTester


class Reads(tl.KeyedWatermarkProcessFunction):
    """Reads the columns it is given (None: all); emits each batch's column names."""

    output_schema = "k string, columns string"

    def __init__(self, wanted: Any = None) -> None:
        self.wanted = wanted

    def input_columns(self) -> Any:
        return self.wanted() if callable(self.wanted) else self.wanted

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        return [(key, ",".join(rows.columns))]


# ---------------------------------------------------------------------- units
def test_the_idle_timeout_defaults_to_four_delays_and_never_for_a_zero_delay() -> None:
    assert units("10 seconds", None, "timestamp") == (10_000_000.0, 40_000_000.0)
    assert units(timedelta(milliseconds=3), None, "timestamp") == (3_000.0, 12_000.0)
    assert units(2.5, None, "fractional") == (2.5, 10.0)
    assert units(0, None, "integral") == (0.0, math.inf)
    assert units("0 seconds", None, "timestamp") == (0.0, math.inf)


def test_an_idle_timeout_given_is_converted_and_inf_is_never() -> None:
    assert units(5, 7, "integral") == (5.0, 7.0)
    assert units(5, math.inf, "integral") == (5.0, math.inf)
    assert units(0, 3, "integral") == (0.0, 3.0)
    assert units("1 second", "1 minute", "timestamp") == (1_000_000.0, 60_000_000.0)


def test_units_refuse_what_delay_in_units_refuses() -> None:
    with pytest.raises(InvalidArgumentError, match="delay must be finite and >= 0"):
        units(-1, None, "integral")
    with pytest.raises(InvalidArgumentError, match="idle_timeout must be finite and >= 0"):
        units(1, -2, "integral")
    with pytest.raises(InvalidArgumentTypeError):
        units("10 seconds", None, "integral")


# ---------------------------------------------------------------------- carried columns
def test_all_columns_are_carried_when_the_processor_names_none() -> None:
    frame = pd.DataFrame(columns=["t", "k", "v"])
    assert carried_columns(Reads(), frame, "k", None) == ["t", "k", "v"]
    schema = pa.schema([("k", pa.string()), ("t", pa.int64())])
    assert carried_columns(Reads(), schema, "k", "t") == ["k", "t"]


def test_the_key_the_listed_columns_and_order_by_are_carried_once_each() -> None:
    frame = pd.DataFrame(columns=["k", "t", "v", "w", "o"])
    assert carried_columns(Reads(["w", "v"]), frame, "k", "o") == ["k", "w", "v", "o"]
    assert carried_columns(Reads(["k", "o", "v"]), frame, "k", "o") == ["k", "o", "v"]
    assert carried_columns(Reads([]), frame, "k", None) == ["k"]


def test_input_columns_is_read_once_so_a_generator_works() -> None:
    def columns() -> Iterator[str]:
        yield "v"

    frame = pd.DataFrame(columns=["k", "t", "v"])
    assert carried_columns(Reads(columns), frame, "k", None) == ["k", "v"]
    tester = KeyedTester(Reads(columns), key="k", event_time="t", delay=0)
    out = tester.run(pd.DataFrame({"k": ["a"], "t": [1], "v": [2], "x": [3]}))
    assert out["columns"].tolist() == ["k,v,_tl_event_time"]


def test_input_columns_that_are_not_names_or_not_there_are_refused() -> None:
    frame = pd.DataFrame(columns=["k", "t", "v"])
    for bad in ("v", 3, ["v", 1]):
        with pytest.raises(InvalidArgumentTypeError, match="must return a list of column names"):
            carried_columns(Reads(bad), frame, "k", None)
    with pytest.raises(MissingColumnError, match="input column 'x'"):
        carried_columns(Reads(["x"]), frame, "k", None)


# ---------------------------------------------------------------------- processing time
def test_a_batch_time_is_whole_ms_and_never_below_an_earlier_one() -> None:
    assert processing_time_after(1500.9) == 1500.0
    assert processing_time_after(-0.5) == -1.0
    assert processing_time_after(1200.0, [1500.0, 900.0]) == 1500.0
    assert processing_time_after(2000.4, [1500.0]) == 2000.0
    assert processing_time_after(1500.0, iter([1500.0])) == 1500.0


# ---------------------------------------------------------------------- state rows
def stored(keys: Any, values: Any, **extra: Any) -> pa.Table:
    n = len(keys)
    return pa.table({"key": keys, **extra, "high": [10.0, -math.inf, 3.0][:n],
                     "seen": [10.0, 4.0, math.inf][:n], "rows": pa.array([2, 1, 0][:n], pa.int32()),
                     "values": values})


def test_state_rows_null_the_watermark_and_last_seen_a_key_has_not() -> None:
    table = stored(["a", "b", "c"], pa.nulls(3))
    out = state_rows(table, 2.0)
    assert out.column_names == list(STATE_COLUMNS)
    assert out.column("watermark").to_pylist() == [8.0, None, 1.0]
    assert out.column("last_seen").to_pylist() == [10.0, 4.0, None]
    assert out.column("rows").type == pa.int64()
    assert out.column("partition").to_pylist() == [0, 0, 0]
    assert out.column("block").to_pylist() == [None] * 3


def test_state_rows_keep_the_stored_partition_and_the_blocks_given() -> None:
    table = stored(["a", "b"], pa.nulls(2), partition=pa.array([3, 1], pa.int32()))
    out = state_rows(table, 0.0, pa.array([7, None], pa.int32()))
    assert out.column("partition").to_pylist() == [3, 1]
    assert out.column("block").to_pylist() == [7, None]


def test_a_value_named_like_a_column_before_it_is_renamed_until_free() -> None:
    values = pa.array([{"key": 1, "state_key": 2, "n": 3}] * 2)
    out = state_rows(stored(["a", "b"], values), 0.0)
    assert out.column_names == [*STATE_COLUMNS, "state_key", "state_state_key", "n"]
    assert out.slice(0, 1).to_pylist()[0]["state_state_key"] == 2


def test_values_without_a_schema_stay_json_text_and_no_key_type_is_a_string() -> None:
    out = state_rows(stored(["a"], pa.array(['{"n": 1}'])), 0.0)
    assert out.column("values").to_pylist() == ['{"n": 1}']
    empty = pa.table({"key": pa.nulls(0), "high": pa.array([], pa.float64()),
                      "seen": pa.array([], pa.float64()), "rows": pa.array([], pa.int32()),
                      "values": pa.nulls(0)})
    out = state_rows(empty, 1.0)
    assert out.num_rows == 0 and out.schema.field("key").type == pa.string()
    assert out.column_names == list(STATE_COLUMNS)
