"""Tagged Arrow IPC bytes for stored tables: exact round trips, and every kind of bad bytes is
refused with a StateCorruptError that names it, without running anything."""

from __future__ import annotations

import datetime
import decimal
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from trilink_spark._internal.io.arrowio import FORMAT_KEY, FORMAT_VERSION, VERSION_KEY, read_table
from trilink_spark._internal.io.arrowio import write_table

KIND = "test-kind"
WHERE = "state file /state/partition=00003/000000000007.state"


def sample_table() -> pa.Table:
    return pa.table({
        "i": pa.array([2**63 - 1, None, -(2**63), 0], pa.int64()),
        "u": pa.array([2**64 - 1, 0, None, 1], pa.uint64()),
        "f": pa.array([float("nan"), None, float("inf"), -0.0], pa.float64()),
        "s": pa.array(["a", None, "", "é\x00z"], pa.string()),
        "b": pa.array([b"\x00", None, b"", b"\xff" * 3], pa.binary()),
        "d": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-99999999999999999999.99"),
                       decimal.Decimal("0.00")], pa.decimal128(22, 2)),
        "t": pa.array([0, None, 2**63 - 1, -(2**63)], pa.timestamp("us", tz="Europe/Paris")),
        "day": pa.array([datetime.date(1, 1, 1), None, datetime.date(9999, 12, 31),
                         datetime.date(1970, 1, 1)], pa.date32()),
        "ok": pa.array([True, None, False, True], pa.bool_()),
        "l": pa.array([[1, None], None, [], [3]], pa.list_(pa.int32())),
        "n": pa.array([None] * 4, pa.null()),
    }).replace_schema_metadata({b"pandas": b"{}", b"owner": b"\x00\xffbinary"})


def same(a: pa.Table, b: pa.Table) -> None:
    """Equal schemas (metadata included) and equal values, NaN equal to NaN."""
    assert a.schema.equals(b.schema, check_metadata=True)
    assert a.num_rows == b.num_rows
    for name in a.column_names:
        left, right = a.column(name), b.column(name)
        if pa.types.is_timestamp(left.type):  # any int64, beyond Python's datetime range too
            left, right = left.cast(pa.int64()), right.cast(pa.int64())
        assert [repr(v) for v in left.to_pylist()] == [repr(v) for v in right.to_pylist()], name


def test_round_trip_is_exact_metadata_included() -> None:
    table = sample_table()
    data = write_table(table, KIND)
    back = read_table(data, KIND, WHERE)
    same(back, table)
    assert back.column("f").null_count == 1  # NaN stays a value, distinct from null
    # the tag is in the bytes, not in what is read back
    tagged = pa.ipc.open_file(pa.py_buffer(data)).schema.metadata
    assert tagged[FORMAT_KEY] == KIND.encode() and tagged[VERSION_KEY] == b"2"
    assert b"trilink.checksum" in tagged
    assert FORMAT_KEY not in (back.schema.metadata or {})


def test_empty_table_round_trips_with_its_schema() -> None:
    table = sample_table().slice(0, 0)
    back = read_table(write_table(table, KIND), KIND, WHERE)
    assert back.num_rows == 0
    assert back.schema.equals(table.schema, check_metadata=True)
    no_columns = pa.table({})
    back = read_table(write_table(no_columns, KIND), KIND, WHERE)
    assert back.num_rows == 0 and back.num_columns == 0
    assert back.schema.metadata is None  # no metadata in, none out (the tag is removed)
    rows_only = pa.table({"x": [1, 2, 3]}).select([])  # rows, but no columns
    back = read_table(write_table(rows_only, KIND), KIND, WHERE)
    assert (back.num_rows, back.num_columns) == (3, 0)


def test_chunked_and_sliced_tables_round_trip() -> None:
    table = pa.concat_tables([sample_table(), sample_table().slice(1, 2)])
    assert table.column("i").num_chunks == 2
    same(read_table(write_table(table.slice(1, 4), KIND), KIND, WHERE), table.slice(1, 4))


def test_same_table_gives_same_bytes() -> None:
    assert write_table(sample_table(), KIND) == write_table(sample_table(), KIND)


def test_reads_bytearray_and_memoryview() -> None:
    data = write_table(sample_table(), KIND)
    for form in (bytearray(data), memoryview(data)):
        same(read_table(form, KIND, WHERE), sample_table())


class Bomb:
    """Unpickling this creates a marker file: proof that code from stored bytes ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_stored_pickle_is_not_unpickled(tmp_path: Path) -> None:
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Bomb(control)))  # the bomb works when unpickled ...
    assert control.exists()
    marker = tmp_path / "marker"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(Bomb(marker), protocol=protocol)
        with pytest.raises(StateCorruptError, match=WHERE) as err:
            read_table(data, KIND, WHERE)  # ... and is never unpickled here
        if protocol >= 2:
            assert "a Python pickle" in str(err.value) and "never unpickles" in str(err.value)
    assert not marker.exists()


def test_every_truncation_is_refused() -> None:
    data = write_table(sample_table(), KIND)
    for cut in range(len(data)):
        with pytest.raises(StateCorruptError, match=WHERE):
            read_table(data[:cut], KIND, WHERE)
    with pytest.raises(StateCorruptError, match="empty"):
        read_table(b"", KIND, WHERE)
    with pytest.raises(StateCorruptError, match="truncated Arrow IPC file"):
        read_table(data[: len(data) // 2], KIND, WHERE)


def test_a_cut_at_a_batch_boundary_is_refused() -> None:
    # why the file format: an IPC *stream* cut after a batch reads as a valid, shorter table
    batches = pa.concat_tables([sample_table()] * 3).combine_chunks().to_batches(max_chunksize=4)
    assert len(batches) == 3
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        writer.write_batch(batches[0])
        boundary = sink.tell()
        writer.write_batch(batches[1])
    shorter = pa.ipc.open_stream(sink.getvalue().to_pybytes()[:boundary]).read_all()
    assert shorter.num_rows == 4  # silently lost rows
    # the tagged file of the same batches refuses every cut, batch boundaries included
    data = write_table(pa.Table.from_batches(batches), KIND)
    for cut in range(0, len(data)):
        with pytest.raises(StateCorruptError):
            read_table(data[:cut], KIND, WHERE)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(StateCorruptError, match=WHERE):
        read_table(data, KIND, WHERE)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_bytes_raise_or_read_a_valid_table(data: st.DataObject) -> None:
    good = bytearray(write_table(sample_table(), KIND))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(good) - 1))
        good[at] = data.draw(st.integers(0, 255))
    try:
        table = read_table(bytes(good), KIND, WHERE)
    except StateCorruptError as err:
        assert str(err).startswith(WHERE)
        return
    # what is read despite the damage is the table as written (the damage hit nothing read)
    same(table, sample_table())


def test_ipc_stream_is_refused() -> None:
    sink = pa.BufferOutputStream()
    table = sample_table()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(StateCorruptError, match="an Arrow IPC stream"):
        read_table(sink.getvalue().to_pybytes(), KIND, WHERE)


def foreign_file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def test_untagged_arrow_file_is_refused() -> None:
    data = foreign_file(pa.table({"x": [1, 2], "y": ["a", "b"]}))
    with pytest.raises(StateCorruptError, match=r"without trilink's trilink.format tag.*'x'"):
        read_table(data, KIND, WHERE)


def test_other_kind_and_other_version_are_refused() -> None:
    other = write_table(sample_table(), "keyed-state")
    with pytest.raises(StateCorruptError, match="'keyed-state' table, not a 'test-kind'"):
        read_table(other, KIND, WHERE)
    table = pa.table({"x": [1]})
    newer = table.replace_schema_metadata({FORMAT_KEY: KIND.encode(), VERSION_KEY: b"3"})
    with pytest.raises(StateCorruptError, match="version '3'.*reads versions 1 and 2"):
        read_table(foreign_file(newer), KIND, WHERE)
    unversioned = table.replace_schema_metadata({FORMAT_KEY: KIND.encode()})
    with pytest.raises(StateCorruptError, match="no version"):
        read_table(foreign_file(unversioned), KIND, WHERE)
    odd = table.replace_schema_metadata({FORMAT_KEY: b"\xff" * 500, VERSION_KEY: b"1"})
    with pytest.raises(StateCorruptError, match=r"\.\.\.'"):  # a long foreign tag is cut
        read_table(foreign_file(odd), KIND, WHERE)
    assert FORMAT_VERSION == 2


def test_other_formats_are_named() -> None:
    parquet_like = b"PAR1" + b"\x00" * 20 + b"PAR1"
    with pytest.raises(StateCorruptError, match="not an Arrow IPC file .*50415231"):
        read_table(parquet_like, KIND, WHERE)
    with pytest.raises(StateCorruptError, match="corrupt Arrow IPC file"):
        read_table(b"ARROW1\x00\x00" + b"\x00" * 16 + b"ARROW1", KIND, WHERE)


def test_argument_errors() -> None:
    table = pa.table({"x": [1]})
    for kind in ("", "Upper", "has space", "-dash-first", "x" * 65):
        with pytest.raises(InvalidArgumentError):
            write_table(table, kind)
        with pytest.raises(InvalidArgumentError):
            read_table(b"", kind, WHERE)
    with pytest.raises(InvalidArgumentTypeError):
        write_table(table, b"kind")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        write_table(table.to_batches()[0], KIND)
    with pytest.raises(InvalidArgumentTypeError):
        read_table(None, KIND, WHERE)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        read_table("ARROW1", KIND, WHERE)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        read_table(b"", KIND, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="trilink.format"):
        write_table(table.replace_schema_metadata({FORMAT_KEY: b"x"}), KIND)
    # a table read back (tag removed) can be written again
    again = read_table(write_table(table, KIND), KIND, WHERE)
    assert read_table(write_table(again, "other"), "other", WHERE).equals(table)


# ------------------------------------------------------------------ generated tables
SCALARS: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "float32": (pa.float32(), st.floats(width=32)),
    "string": (pa.string(), st.text()),
    "binary": (pa.binary(), st.binary()),
    "bool": (pa.bool_(), st.booleans()),
    "decimal": (pa.decimal128(38, 9), st.decimals(min_value=-(10**28) + 1, max_value=10**28 - 1,
                                                  places=9, allow_nan=False)),
    "timestamp": (pa.timestamp("us", tz="UTC"), st.integers(-(2**63), 2**63 - 1)),
    "date": (pa.date32(), st.dates()),
}


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    names = draw(st.lists(st.sampled_from(sorted(SCALARS)), max_size=6))
    rows = draw(st.integers(0, 12))
    columns = {}
    for i, name in enumerate(names):
        arrow_type, values = SCALARS[name]
        column = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        columns[f"{name}_{i}"] = pa.array(column, arrow_type)
    table = pa.table(columns) if columns else pa.table({})
    if draw(st.booleans()):
        table = table.replace_schema_metadata({b"note": draw(st.binary(max_size=20))})
    return table


@settings(max_examples=200, deadline=None)
@given(tables(), st.sampled_from(["merge-tail", "keyed-state", "a.b_c-1"]))
def test_generated_tables_round_trip_exactly(table: pa.Table, kind: str) -> None:
    back = read_table(write_table(table, kind), kind, WHERE)
    same(back, table)
