"""A streaming Local Merge's buffered tail is stored as tagged Arrow IPC, never as a pickle: exact
round trips, empty tails, and stored bytes that are not a tail fail loudly without running code."""

from __future__ import annotations

import datetime
import decimal
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trilink_spark.errors import InvalidArgumentTypeError, StateCorruptError
from trilink_spark.merge import local_merge_foreach_batch
from trilink_spark._internal.io.arrowio import write_table
from trilink_spark.columns import ET_COL, POS_COL, PUNCT_COL, SLOT_COL
from trilink_spark.merge.engines.pandas_engine import arrow_to_pandas
from trilink_spark.merge.engines.stream import TAIL_KIND, decode_tail, encode_tail

AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v")}
WHERE = "merge tail of partition 0 (newest state before batch 1) in state path /x"

# The Arrow types Spark hands a mapInArrow partition (keys and values), as arrow_to_pandas reads
# them: nullable Int64/Float64/boolean, object str/bytes/Decimal/date, tz-aware timestamps.
SPARK_TYPES: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    "bigint": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "double": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "float": (pa.float32(), st.floats(width=32, allow_nan=True)),
    "boolean": (pa.bool_(), st.booleans()),
    "string": (pa.string(), st.text(max_size=8)),
    "binary": (pa.binary(), st.binary(max_size=8)),
    "decimal(38,18)": (pa.decimal128(38, 18),
                       st.decimals(min_value=-(10**19) + 1, max_value=10**19 - 1, places=18,
                                   allow_nan=False)),
    "decimal(10,2)": (pa.decimal128(10, 2),
                      st.decimals(min_value=-(10**7) + 1, max_value=10**7 - 1, places=2,
                                  allow_nan=False)),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999)),
    "date": (pa.date32(), st.dates()),
}


@st.composite
def partition_rows(draw: st.DrawFn) -> pd.DataFrame:
    """A partition's rows as _buffered_partition holds them: arrow_to_pandas of Spark's batch,
    plus the internal position, event-time and slot columns."""
    n = draw(st.integers(0, 12))
    kinds = draw(st.lists(st.sampled_from(sorted(SPARK_TYPES)), min_size=1, max_size=5))
    columns: dict[str, Any] = {}
    for i, kind in enumerate(kinds):
        arrow_type, values = SPARK_TYPES[kind]
        columns[f"c{i}"] = pa.array(draw(st.lists(st.none() | values, min_size=n, max_size=n)),
                                    arrow_type)
    times = st.none() | st.floats(allow_nan=False, allow_infinity=False)
    columns[ET_COL] = pa.array(draw(st.lists(times, min_size=n, max_size=n)), pa.float64())
    columns[SLOT_COL] = pa.array(draw(st.lists(times, min_size=n, max_size=n)), pa.float64())
    if draw(st.booleans()):
        columns[PUNCT_COL] = pa.array(draw(st.lists(st.none() | st.booleans(), min_size=n,
                                                    max_size=n)), pa.bool_())
    frame = arrow_to_pandas(pa.table(columns))
    positions = st.integers(-(2**63), 2**63 - 1)
    frame[POS_COL] = np.array(draw(st.lists(positions, min_size=n, max_size=n)), dtype=np.int64)
    return frame


def assert_exact(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Same columns, dtypes and values; NaN and null told apart in nullable float columns."""
    want = want.reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got.dtypes) == list(want.dtypes)
    for name in want.columns:
        values = want[name].array
        if isinstance(values, pd.arrays.FloatingArray):
            got_values = got[name].array
            assert isinstance(got_values, pd.arrays.FloatingArray)
            assert (got_values._mask == values._mask).all(), name
            assert np.array_equal(np.isnan(got_values._data[~values._mask]),
                                  np.isnan(values._data[~values._mask])), name
        elif values.dtype == object:  # Decimal scale, bytes vs str, date vs datetime
            assert [repr(v) for v in got[name]] == [repr(v) for v in want[name]], name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partition_rows(), st.integers(0, 12))
def test_tail_round_trip_is_exact(rows: pd.DataFrame, cut: int) -> None:
    tail = rows.iloc[min(cut, len(rows)):]  # a tail: a slice of the partition's RangeIndex
    assert_exact(decode_tail(encode_tail(tail), WHERE), tail)


def test_tail_round_trip_keeps_extremes_nan_and_null() -> None:
    table = pa.table({
        "k": pa.array([2**63 - 1, None, -(2**63)], pa.int64()),
        "v": pa.array([float("nan"), None, -0.0], pa.float64()),
        "d": pa.array([decimal.Decimal("1.500000000000000000"), None,
                       decimal.Decimal("-99999999999999999999.000000000000000001")],
                      pa.decimal128(38, 18)),
        "day": pa.array([datetime.date(1, 1, 1), None, datetime.date(9999, 12, 31)]),
        ET_COL: pa.array([1.0, None, float("inf")]), SLOT_COL: pa.array([0.0, None, 0.0]),
    })
    rows = arrow_to_pandas(table)
    rows[POS_COL] = np.array([2**63 - 1, -(2**63), 0], dtype=np.int64)
    back = decode_tail(encode_tail(rows), WHERE)
    assert_exact(back, rows)
    assert back["k"].tolist()[::2] == [2**63 - 1, -(2**63)]
    assert np.isnan(back["v"].array._data[0]) and not back["v"].array._mask[0]  # NaN, a value
    assert back["v"].array._mask[1]  # null
    assert back["d"][2] == decimal.Decimal("-99999999999999999999.000000000000000001")
    assert back[POS_COL].dtype == np.int64 and back[POS_COL][0] == 2**63 - 1


def test_empty_tail_round_trips_with_its_columns() -> None:
    rows = arrow_to_pandas(pa.table({"k": pa.array(["a"]), "v": pa.array([1.5]),
                                     ET_COL: pa.array([1.0]), SLOT_COL: pa.array([0.0])}))
    rows[POS_COL] = np.array([7], dtype=np.int64)
    empty = rows.iloc[1:]
    back = decode_tail(encode_tail(empty), WHERE)
    assert len(back) == 0 and list(back.columns) == list(rows.columns)
    assert_exact(back, empty)
    # a partition that had no rows at all has a tail with no columns: that round-trips too
    pd.testing.assert_frame_equal(decode_tail(encode_tail(pd.DataFrame()), WHERE), pd.DataFrame())


def test_tail_bytes_depend_on_the_rows_only() -> None:
    rows = arrow_to_pandas(pa.table({"k": pa.array([1, 2, 3]), ET_COL: pa.array([1.0, 2, 3]),
                                     SLOT_COL: pa.array([0.0, 0, 0])}))
    rows[POS_COL] = np.arange(3, dtype=np.int64)
    # the index is positional: a tail sliced at row 1 and the same rows renumbered are one tail
    assert encode_tail(rows.iloc[1:]) == encode_tail(rows.iloc[1:].reset_index(drop=True))
    assert decode_tail(encode_tail(rows.iloc[1:]), WHERE).index.equals(pd.RangeIndex(2))
    with pytest.raises(InvalidArgumentTypeError, match="RangeIndex"):  # never dropped silently
        encode_tail(rows.set_index(["k", POS_COL]))


class Bomb:
    """Unpickling this creates a marker file: proof that stored bytes ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def bad_tails(tmp_path: Path) -> dict[str, tuple[bytes, str]]:
    """Bytes that are not a merge tail, and what the error must say."""
    rows = arrow_to_pandas(pa.table({"k": pa.array([1, 2]), ET_COL: pa.array([1.0, 2]),
                                     SLOT_COL: pa.array([0.0, 0])}))
    rows[POS_COL] = np.arange(2, dtype=np.int64)
    good = encode_tail(rows)
    sink = pa.BufferOutputStream()
    foreign = pa.table({"x": [1, 2]})
    with pa.ipc.new_file(sink, foreign.schema) as writer:
        writer.write_table(foreign)
    return {
        "pickle": (pickle.dumps(Bomb(tmp_path / "marker")), "a Python pickle"),
        "pickled frame": (pickle.dumps(rows), "a Python pickle"),
        "truncated": (good[:-20], "truncated Arrow IPC file"),
        "cut in the body": (good[:len(good) // 2], "truncated Arrow IPC file"),
        "random": (bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)),
                   "not an Arrow IPC file"),
        "empty": (b"", "empty"),
        "foreign arrow": (sink.getvalue().to_pybytes(), "without trilink's trilink.format tag"),
        "other kind": (write_table(pa.Table.from_pandas(rows, preserve_index=False),
                                   "keyed-state"), "'keyed-state' table, not a 'merge-tail'"),
        "no internal columns": (write_table(foreign, TAIL_KIND), "lacks the internal column"),
        "rows without columns": (write_table(pa.table({"x": [1, 2]}).select([]), TAIL_KIND),
                                 "2 rows without columns"),
        "bad pandas metadata": (write_table(pa.Table.from_pandas(rows, preserve_index=False)
                                            .replace_schema_metadata({b"pandas": b"{oops"}),
                                            TAIL_KIND), "does not convert to pandas"),
    }


def test_bad_tail_bytes_raise_state_corrupt_naming_what_they_are(tmp_path: Path) -> None:
    for name, (data, what) in bad_tails(tmp_path).items():
        with pytest.raises(StateCorruptError) as err:
            decode_tail(data, WHERE)
        message = str(err.value)
        assert message.startswith(WHERE), (name, message)
        assert what in message, (name, message)
    assert not (tmp_path / "marker").exists()


def test_buffered_counts_stored_rows_and_refuses_what_is_not_a_tail(tmp_path: Path) -> None:
    run = local_merge_foreach_batch(lambda df, b: None, "k", "t", 10, AGGS,
                                    str(tmp_path / "state"))
    rows = arrow_to_pandas(pa.table({"k": pa.array([1, 2, 3]), ET_COL: pa.array([1.0, 2, 3]),
                                     SLOT_COL: pa.array([0.0, 0, 0])}))
    rows[POS_COL] = np.arange(3, dtype=np.int64)
    assert run.buffered() == 0  # nothing stored
    run.store.save(0, 4, encode_tail(rows))
    run.store.save(1, 4, encode_tail(rows.iloc[3:]))  # an empty tail is stored, and counts 0
    run.store.save(2, 4, encode_tail(pd.DataFrame()))
    assert run.buffered() == 3
    marker = tmp_path / "marker"
    run.store.save(3, 4, pickle.dumps(Bomb(marker)))
    with pytest.raises(StateCorruptError, match="merge tail of partition 3 .*a Python pickle"):
        run.buffered()
    assert not marker.exists()


# ------------------------------------------------------------------ through Spark
def frame(n: int, start: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(start)
    return pd.DataFrame({"k": rng.integers(0, 5, n), "t": np.arange(start, start + n),
                         "v": rng.normal(size=n)})


def test_stream_tail_is_not_unpickled(spark: Any, tmp_path: Path) -> None:
    run = local_merge_foreach_batch(lambda df, b: df.collect(), "k", "t", 10, AGGS,
                                    str(tmp_path / "state"), quantity=40)
    run(spark.createDataFrame(frame(100)).coalesce(1), 0)
    assert run.buffered() == 20
    marker = tmp_path / "marker"
    run.store.save(0, 0, pickle.dumps(Bomb(marker)))  # a pickle where the tail should be
    with pytest.raises(Exception, match=r"(?s)StateCorruptError.*merge tail of partition 0 "
                                        r"\(newest state before batch 1\).*a Python pickle"):
        run(spark.createDataFrame(frame(100, 100)).coalesce(1), 1)
    with pytest.raises(StateCorruptError, match="partition 0 .*never unpickles"):
        run.flush_remaining()
    with pytest.raises(StateCorruptError, match="partition 0"):
        run.buffered()
    assert not marker.exists()  # neither the executor nor the driver ran it


@pytest.mark.parametrize("bad", ["truncated", "foreign arrow", "other kind", "random"])
def test_stream_refuses_a_bad_tail_and_never_starts_empty(spark: Any, tmp_path: Path,
                                                          bad: str) -> None:
    emitted: list[int] = []
    run = local_merge_foreach_batch(lambda df, b: emitted.append(df.count()), "k", "t", 10,
                                    AGGS, str(tmp_path / "state"), quantity=40)
    run(spark.createDataFrame(frame(100)).coalesce(1), 0)
    data, what = bad_tails(tmp_path)[bad]
    run.store.save(0, 0, data)
    with pytest.raises(Exception, match=r"(?s)StateCorruptError.*partition 0.*" + re.escape(what)):
        run(spark.createDataFrame(frame(100, 100)).coalesce(1), 1)
    assert len(emitted) == 1  # batch 1 produced nothing from an empty start
    assert run.store.versions(0) == [0]


def test_empty_tail_is_stored_and_differs_from_no_tail(spark: Any, tmp_path: Path) -> None:
    pdf = frame(30).assign(mark=False)
    pdf.loc[29, "mark"] = True  # the last row ends a flush: nothing stays buffered
    emitted: list[pd.DataFrame] = []
    run = local_merge_foreach_batch(lambda df, b: emitted.append(df.toPandas()), "k", "t", 10,
                                    AGGS, str(tmp_path / "state"), mode="punctuation",
                                    punctuation="mark")
    run(spark.createDataFrame(pdf).coalesce(1), 0)
    stored = run.store.latest(0)
    assert stored is not None  # an empty tail is stored, not "no tail"
    tail = decode_tail(stored, WHERE)
    assert len(tail) == 0 and {"k", "v", POS_COL, ET_COL, SLOT_COL} <= set(tail.columns)
    assert run.buffered() == 0 and emitted[0]["n"].sum() == 30
    more = frame(30, 30).assign(mark=False)
    run(spark.createDataFrame(more).coalesce(1), 1)
    assert run.buffered() == 30
    assert run.flush_remaining()["n"].sum() == 30


def test_tail_of_another_query_is_refused(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    first = local_merge_foreach_batch(lambda df, b: df.collect(), "k", "t", 10, AGGS, path,
                                      quantity=40)
    first(spark.createDataFrame(frame(100)).coalesce(1), 0)
    other_aggs = {"n": ("count", None), "w": ("max", "w")}
    second = local_merge_foreach_batch(lambda df, b: df.collect(), "k", "t", 10, other_aggs,
                                       path, quantity=40)
    rows = frame(100, 100).rename(columns={"v": "w"})
    with pytest.raises(Exception, match=r"(?s)StateCorruptError.*another query's buffers"):
        second(spark.createDataFrame(rows).coalesce(1), 1)
