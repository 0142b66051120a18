"""The per-key row codec: every row round-trips bit-exactly, alone or beside any others, and no
damaged value is ever read as data (no Spark)."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark.errors import InvalidArgumentTypeError, StateCorruptError
from trilink_spark.state.rows import TAG_FALLBACK, TAG_FAST, decode_rows, encode_rows, schema_id

WINDOW = pa.struct([("s", pa.float64()), ("count", pa.int64()), ("nn", pa.int64()),
                    ("sum", pa.float64()), ("min", pa.float64()), ("max", pa.float64())])
DECLARED = pa.struct([("score", pa.float64()), ("name", pa.string()),
                      ("at", pa.timestamp("us", tz="UTC"))])
UTC = dt.timezone.utc


def state_schema(values: pa.DataType = pa.string()) -> pa.Schema:
    """The state table of a keyed window aggregate, its key column removed."""
    return pa.schema([("high", pa.float64()), ("seen", pa.float64()), ("rows", pa.int64()),
                      ("timers", pa.list_(pa.int64())), ("values", values),
                      ("shared:windows", pa.list_(WINDOW))])


def window(s: float | None = 1.0, count: int | None = 2) -> dict[str, object]:
    return {"s": s, "count": count, "nn": 1, "sum": 3.5, "min": -1.0, "max": 9.0}


def state_table(values: pa.DataType = pa.string()) -> pa.Table:
    """Nulls at every level: top-level values, list elements, structs in a list, their fields."""
    if values == pa.string():
        vals: list[object] = ['{"a": 1}', None, "", '{"b": [1, 2]}', "ü€", None, "{}"]
    else:
        at = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
        vals = [{"score": 1.5, "name": "a", "at": at}, None,
                {"score": None, "name": None, "at": None}, {"score": 2.0, "name": "", "at": at},
                {"score": -0.0, "name": "ü€", "at": None}, None, {"score": 3.0, "name": "x",
                                                                "at": at}]
    return pa.table({
        "high": [1.0, None, float("nan"), -0.0, 5.0, float("inf"), 7.0],
        "seen": [0.5, 2.0, None, 4.0, None, 6.0, 7.5],
        "rows": [1, None, 3, 4, 5, 6, 7],
        "timers": [[10, 20], None, [], [None, 5], [1], [], [None]],
        "values": vals,
        "shared:windows": [[window(), window(2.0, None)], [], None, [None, window()],
                           [window(None, 1)], [window(), None, window(3.0, 9)], []],
    }, schema=state_schema(values))


def _as_bits(t: pa.DataType) -> pa.DataType:
    """``t`` with every float replaced by the integer of its width (to compare bit patterns)."""
    if pa.types.is_floating(t):
        return {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[t.bit_width]
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_as_bits(t.field(i).type))
                          for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_as_bits(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_as_bits(t.value_type)))
    return t


def bitwise(table: pa.Table) -> pa.Table:
    columns = [c.combine_chunks().view(_as_bits(c.type)) for c in table.columns]
    return pa.Table.from_arrays(columns, names=table.column_names)


def assert_same(got: pa.Table, want: pa.Table) -> None:
    """Same schema and same rows, floats compared bit for bit (NaN payloads, -0.0)."""
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows
    assert bitwise(got).equals(bitwise(want))


def round_trip(table: pa.Table) -> pa.Table:
    return decode_rows(encode_rows(table), table.schema)


@pytest.mark.parametrize("values", [pa.string(), DECLARED], ids=["json", "struct"])
def test_state_table_round_trips_with_nulls_at_every_level(values):
    table = state_table(values)
    encoded = encode_rows(table)
    assert len(encoded) == table.num_rows
    assert all(isinstance(v, bytes) and v[0] == TAG_FAST for v in encoded)
    assert_same(decode_rows(encoded, table.schema), table)
    assert decode_rows(encoded, table.schema).to_pylist()[3] == table.to_pylist()[3]


def test_nan_payloads_and_negative_zero_survive_bit_exactly():
    payload_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0123))[0]
    negative_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF0_0000_0000_0001))[0]
    doubles = [payload_nan, -0.0, negative_nan, 0.0, float("-inf")]
    table = pa.table({
        "d": doubles,
        "f": pa.array(np.array([np.nan, -0.0, 1.5, -np.inf, 0.0], dtype=np.float32)),
        "w": [[window(v, 1)] for v in doubles],
        "st": [{"score": v, "name": "n", "at": None} for v in doubles],
    }, schema=pa.schema([("d", pa.float64()), ("f", pa.float32()), ("w", pa.list_(WINDOW)),
                         ("st", DECLARED)]))
    back = round_trip(table)
    assert_same(back, table)
    bits = np.frombuffer(back.column("d").chunk(0).buffers()[1], dtype="<u8")
    assert bits.tolist() == np.array(doubles).view("<u8").tolist()
    assert bits[0] == 0x7FF8_0000_0000_0123 and bits[1] == 1 << 63
    window_s = back.column("w").chunk(0).values.field(0)
    assert np.frombuffer(window_s.buffers()[1], dtype="<u8")[:5].tolist() == bits.tolist()


def test_empty_and_null_lists():
    schema = pa.schema([("t", pa.list_(pa.int64())), ("w", pa.large_list(WINDOW)),
                        ("b", pa.list_(pa.bool_()))])
    table = pa.table({"t": [[], None, [], [1]], "w": [[], [], None, [None]],
                      "b": [[], [True, None, False], None, []]}, schema=schema)
    assert_same(round_trip(table), table)
    only_empty = table.slice(0, 1)
    assert_same(round_trip(only_empty), only_empty)


def test_empty_table_both_ways():
    schema = state_schema()
    empty = schema.empty_table()
    assert encode_rows(empty) == []
    assert encode_rows(pa.RecordBatch.from_pylist([], schema=schema)) == []
    back = decode_rows([], schema)
    assert back.schema == schema and back.num_rows == 0
    assert decode_rows([], pa.schema([("x", pa.list_(pa.string()))])).num_rows == 0


def test_struct_values_with_a_string_and_a_timestamp_field():
    at = dt.datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    table = pa.table({"values": [{"score": 1.0, "name": "alpha", "at": at},
                                 {"score": None, "name": "β", "at": None}, None,
                                 {"score": 2.5, "name": None, "at": at}]},
                     schema=pa.schema([("values", DECLARED)]))
    back = round_trip(table)
    assert_same(back, table)
    assert back.column("values").to_pylist()[0]["at"] == at


def test_record_batch_sliced_and_chunked_inputs():
    table = state_table()
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2, 3), table.slice(5)])
    assert chunked.column(0).num_chunks == 3
    assert encode_rows(chunked) == encode_rows(table)
    batch = table.to_batches()[0]
    assert encode_rows(batch) == encode_rows(table)
    assert_same(decode_rows(encode_rows(batch.slice(2, 4)), table.schema), table.slice(2, 4))


def test_rows_three_to_seven_decode_to_exactly_those_rows():
    table = pa.concat_tables([state_table(DECLARED)] * 2).combine_chunks()
    whole = encode_rows(table)
    part = encode_rows(table.slice(3, 5))
    assert part == whole[3:8]  # a row's value does not depend on its neighbours
    assert_same(decode_rows(part, table.schema), table.slice(3, 5))
    picked = decode_rows([whole[7], whole[3]], table.schema)
    assert_same(picked, table.take([7, 3]))


def test_fallback_round_trips_a_list_of_strings():
    schema = pa.schema([("tags", pa.list_(pa.string())), ("n", pa.int64()),
                        ("m", pa.map_(pa.string(), pa.int64()))])
    table = pa.table({"tags": [["a", None], None, [], ["ü"]], "n": [1, None, 3, 4],
                      "m": [[("k", 1)], None, [], [("x", None)]]}, schema=schema)
    encoded = encode_rows(table)
    assert all(v[0] == TAG_FALLBACK for v in encoded)
    assert decode_rows(encoded, schema).equals(table)
    assert decode_rows(encoded[1:3], schema).equals(table.slice(1, 2))
    with pytest.raises(StateCorruptError, match="value 1 is not a readable Arrow record batch"):
        decode_rows([encoded[0], encoded[1][:-8]], schema)


def test_fallback_round_trips_dictionaries_by_value():
    names = pa.dictionary(pa.int32(), pa.string())
    schema = pa.schema([("d", names), ("s", pa.struct([("x", names)]))])
    table = pa.table({"d": pa.array(["a", None, "b", "a"]).dictionary_encode(),
                      "s": pa.array([{"x": "q"}, None, {"x": None}, {"x": "r"}],
                                    pa.struct([("x", names)]))}, schema=schema)
    encoded = encode_rows(table)
    assert all(v[0] == TAG_FALLBACK for v in encoded)
    back = decode_rows(encoded[2:] + encoded[:2], schema)
    assert back.schema == schema  # the dictionaries made anew: the same values, not the indices
    assert back.to_pylist() == table.take([2, 3, 0, 1]).to_pylist()


def test_a_value_of_the_other_codec_is_refused():
    table = state_table()
    encoded = encode_rows(table)
    head = bytes([TAG_FALLBACK]) + schema_id(table.schema).to_bytes(4, "little")
    encoded[2] = head + table.to_batches()[0].slice(2, 1).serialize().to_pybytes()
    with pytest.raises(StateCorruptError, match="value 2 has the format tag 0x81, expected 0x01"):
        decode_rows(encoded, table.schema)


def test_no_columns_but_rows():
    table = pa.table({"x": [1, 2, 3]}).drop_columns(["x"])
    back = round_trip(table)
    assert back.num_rows == 3 and back.num_columns == 0


def test_schema_id_is_stable_and_ignores_metadata():
    schema = state_schema()
    sid = schema_id(schema)
    assert 0 <= sid < 2**32
    assert sid == zlib.crc32(schema.serialize())  # no metadata: the IPC bytes themselves
    tagged = pa.schema([f.with_metadata({"doc": "x"}) for f in schema]).with_metadata({"k": "v"})
    assert schema_id(tagged) == sid
    assert schema_id(state_schema(DECLARED)) != sid
    assert schema_id(pa.schema([("x", pa.int64())])) == schema_id(pa.schema([("x", pa.int64())]))
    with pytest.raises(InvalidArgumentTypeError):
        schema_id("not a schema")  # type: ignore[arg-type]


# ---------------------------------------------------------------- damaged values


def test_truncated_values_are_refused_with_their_index():
    table = state_table(DECLARED)
    encoded = encode_rows(table)
    value = encoded[3]
    for cut in range(len(value)):
        with pytest.raises(StateCorruptError, match="value 1 is"):
            decode_rows([encoded[0], value[:cut]], table.schema)
    with pytest.raises(StateCorruptError, match=f"value 0 is {len(value) + 1} bytes, but its "
                                                f"header describes {len(value)}"):
        decode_rows([value + b"\0"], table.schema)


def test_an_unknown_tag_is_refused():
    table = state_table()
    encoded = encode_rows(table)
    encoded[4] = bytes([0x02]) + encoded[4][1:]
    with pytest.raises(StateCorruptError, match="value 4 has the format tag 0x02, expected"):
        decode_rows(encoded, table.schema)


def test_a_fast_value_of_a_fallback_schema_is_refused():
    schema = pa.schema([("tags", pa.list_(pa.string()))])
    value = bytes([TAG_FAST]) + schema_id(schema).to_bytes(4, "little") + b"\0" * 8
    with pytest.raises(StateCorruptError, match="tag 0x01, expected 0x81 .the fallback"):
        decode_rows([value], schema)


def test_another_schema_is_refused():
    table = pa.table({"x": [1.0, 2.0]})
    encoded = encode_rows(table)
    same_layout = pa.schema([("x", pa.int64())])
    with pytest.raises(StateCorruptError, match="value 0 was written for schema id"):
        decode_rows(encoded, same_layout)
    with pytest.raises(StateCorruptError, match="schema id"):
        decode_rows(encode_rows(state_table()), state_schema(DECLARED))


def test_none_and_non_bytes_values():
    table = pa.table({"x": [1]})
    encoded = encode_rows(table)
    with pytest.raises(StateCorruptError, match="value 1 is None"):
        decode_rows([encoded[0], None], table.schema)  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentTypeError):
        decode_rows([encoded[0], 5], table.schema)  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentTypeError):
        encode_rows([1, 2])  # type: ignore[arg-type]


def test_a_runaway_count_is_refused_before_anything_is_allocated():
    schema = pa.schema([("t", pa.list_(pa.int64()))])
    value = bytearray(encode_rows(pa.table({"t": [[1, 2]]}, schema=schema))[0])
    value[5:9] = (2**32 - 1).to_bytes(4, "little")  # the list's element count
    with pytest.raises(StateCorruptError, match="header describes 34359738"):
        decode_rows([bytes(value)], schema)


def test_bad_utf8_and_bad_bool_bytes_are_refused():
    schema = pa.schema([("s", pa.string())])
    value = encode_rows(pa.table({"s": ["ab"]}, schema=schema))[0]
    with pytest.raises(StateCorruptError, match="valid table"):
        decode_rows([value[:-2] + b"\xff\xfe"], schema)
    flags = pa.schema([("b", pa.bool_())])
    value = bytearray(encode_rows(pa.table({"b": [True]}, schema=flags))[0])
    value[5] = 7
    with pytest.raises(StateCorruptError, match="not 0 or 1"):
        decode_rows([bytes(value)], flags)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_refused(junk):
    for schema in (state_schema(), pa.schema([("tags", pa.list_(pa.string()))])):
        with pytest.raises(StateCorruptError):
            decode_rows([junk], schema)


FAST_VALUE = encode_rows(state_table(DECLARED))[3]
FALLBACK_SCHEMA = pa.schema([("tags", pa.list_(pa.string())), ("n", pa.int64())])
FALLBACK_VALUE = encode_rows(pa.table({"tags": [["a", "bc"]], "n": [5]},
                                      schema=FALLBACK_SCHEMA))[0]


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.data())
def test_a_damaged_byte_is_refused_or_read_never_a_crash(data):
    fast = data.draw(st.booleans())
    value, schema = (FAST_VALUE, state_schema(DECLARED)) if fast else \
        (FALLBACK_VALUE, FALLBACK_SCHEMA)
    at = data.draw(st.integers(0, len(value) - 1))
    damaged = value[:at] + bytes([data.draw(st.integers(0, 255))]) + value[at + 1:]
    try:
        back = decode_rows([damaged], schema)
    except StateCorruptError:
        return
    assert back.num_rows == 1 and back.schema == schema  # a data byte: undetectable here


# ---------------------------------------------------------------- random tables


def _ints(bits: int, signed: bool) -> st.SearchStrategy[int]:
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed \
        else st.integers(0, 2**bits - 1)


DAY_MS = 86_400_000
LEAVES: list[tuple[pa.DataType, st.SearchStrategy[object]]] = [
    (pa.int8(), _ints(8, True)), (pa.int32(), _ints(32, True)), (pa.int64(), _ints(64, True)),
    (pa.uint16(), _ints(16, False)), (pa.uint64(), _ints(64, False)),
    (pa.float64(), st.floats(allow_nan=True)), (pa.float32(), st.floats(width=32)),
    (pa.bool_(), st.booleans()), (pa.date32(), st.integers(-10**6, 10**6)),
    (pa.date64(), st.integers(-10**5, 10**5).map(lambda d: d * DAY_MS)),
    (pa.timestamp("us", tz="UTC"), _ints(62, True)), (pa.timestamp("s"), _ints(40, True)),
    (pa.duration("ns"), _ints(64, True)), (pa.time64("us"), st.integers(0, DAY_MS * 1000 - 1)),
    (pa.time32("ms"), st.integers(0, DAY_MS - 1)),
    (pa.decimal128(12, 3), st.integers(-10**12 + 1, 10**12 - 1).map(
        lambda i: decimal.Decimal(i).scaleb(-3))),
    (pa.binary(3), st.binary(min_size=3, max_size=3)),
]
BYTES: list[tuple[pa.DataType, st.SearchStrategy[object]]] = [
    (pa.string(), st.text(max_size=8)), (pa.large_string(), st.text(max_size=8)),
    (pa.binary(), st.binary(max_size=8)), (pa.large_binary(), st.binary(max_size=8)),
]


def _nullable(values: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(st.none(), values)


def _struct(members: st.SearchStrategy[tuple[pa.DataType, st.SearchStrategy[object]]]
            ) -> st.SearchStrategy[tuple[pa.DataType, st.SearchStrategy[object]]]:
    def build(kids: list[tuple[pa.DataType, st.SearchStrategy[object]]]):
        names = [f"f{i}" for i in range(len(kids))]
        t = pa.struct([(n, k[0]) for n, k in zip(names, kids)])
        return t, st.fixed_dictionaries({n: _nullable(k[1]) for n, k in zip(names, kids)})
    return st.lists(members, min_size=1, max_size=3).map(build)


def _list(element: st.SearchStrategy[tuple[pa.DataType, st.SearchStrategy[object]]]
          ) -> st.SearchStrategy[tuple[pa.DataType, st.SearchStrategy[object]]]:
    def build(kid: tuple[pa.DataType, st.SearchStrategy[object]], large: bool):
        t = pa.large_list(kid[0]) if large else pa.list_(kid[0])
        return t, st.lists(_nullable(kid[1]), max_size=4)
    return st.builds(build, element, st.booleans())


LEAF = st.sampled_from(LEAVES)
ELEMENT = st.one_of(LEAF, _struct(LEAF), _struct(st.one_of(LEAF, _struct(LEAF))))
ROW_LEVEL = st.recursive(st.one_of(LEAF, st.sampled_from(BYTES), _list(ELEMENT)),
                         _struct, max_leaves=6)


@st.composite
def fast_tables(draw: st.DrawFn) -> pa.Table:
    columns = draw(st.lists(ROW_LEVEL, min_size=1, max_size=4))
    n = draw(st.integers(0, 9))
    arrays = [pa.array(draw(st.lists(_nullable(values), min_size=n, max_size=n)), t)
              for t, values in columns]
    table = pa.table(arrays, names=[f"c{i}" for i in range(len(arrays))])
    start = draw(st.integers(0, n))  # a slice: arrays with offsets
    return table.slice(start, draw(st.integers(0, n - start)))


@settings(derandomize=True, max_examples=300, deadline=None)
@given(fast_tables())
def test_random_fast_tables_round_trip(table):
    encoded = encode_rows(table)
    assert all(v[0] == TAG_FAST for v in encoded)
    assert_same(decode_rows(encoded, table.schema), table)
    if table.num_rows > 1:
        assert encode_rows(table.slice(1)) == encoded[1:]
        assert_same(decode_rows(encoded[::-1], table.schema), table.take(
            list(range(table.num_rows))[::-1]))


def test_columns_read_back_from_arrow_ipc_with_empty_buffers_round_trip() -> None:
    """Arrow IPC reads an empty data buffer back as a null one (address 0): a state table
    whose lists are all empty, read from a state file, encodes like any other."""
    from trilink_spark._internal.io.arrowio import read_table, write_table

    windows = pa.list_(pa.struct([("s", pa.float64()), ("n", pa.int64())]))
    table = pa.table({"timers": pa.array([[], []], pa.list_(pa.int64())),
                      "w": pa.array([[], []], windows), "s": pa.array(["", ""])})
    stored = read_table(write_table(table, "probe"), "probe", "probe")
    assert decode_rows(encode_rows(stored), table.schema).equals(table)
