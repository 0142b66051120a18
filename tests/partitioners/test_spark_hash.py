"""The Murmur3 port must equal Spark's hash() bit for bit."""

from __future__ import annotations

import struct

import mmh3
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark.partitioners.core import spark_hash as sh

TEXTS = [
    "", "a", "ab", "abc", "abcd", "abcde", "abcdefghijklm", "héllo wörld", "日本語", "🙂",
    "ÿ", "ß", "a\x00b", " ", "Ω≈ç√∫", "x" * 37,
]
BYTES = [b"", b"\x00", b"\xff", b"\x80\x7f", b"\xff\x80\x01", b"\x01\x02\x03\x04\xfe", bytes(range(256))]
INTS = [0, 1, -1, 42, 2**31 - 1, -(2**31), 123456789]
LONGS = [0, 1, -1, 2**40, 2**63 - 1, -(2**63), -123456789012]


def test_strings_match_spark(spark):
    df = spark.createDataFrame([(t,) for t in TEXTS], "s string")
    got = {r["s"]: r["h"] for r in df.selectExpr("s", "hash(s) AS h").collect()}
    for text in TEXTS:
        assert sh.hash_string(text) == got[text], text
    vec = sh.hash_binary_array(pa.array(TEXTS))
    assert vec.tolist() == [got[t] for t in TEXTS]


def test_binary_matches_spark(spark):
    df = spark.createDataFrame([(b,) for b in BYTES], "b binary")
    rows = df.selectExpr("b", "hash(b) AS h").collect()
    for row in rows:
        assert sh.hash_bytes(bytes(row["b"])) == row["h"]
    assert sh.hash_binary_array(pa.array(BYTES)).tolist() == [r["h"] for r in rows]


def test_ints_and_longs_match_spark(spark):
    ints = spark.createDataFrame([(i,) for i in INTS], "i int").selectExpr("hash(i) AS h")
    assert [sh.hash_int(i) for i in INTS] == [r["h"] for r in ints.collect()]
    assert sh.hash_int_array(np.array(INTS, dtype=np.int32)).tolist() == [r["h"] for r in ints.collect()]
    longs = spark.createDataFrame([(v,) for v in LONGS], "l long").selectExpr("hash(l) AS h")
    expected = [r["h"] for r in longs.collect()]
    assert [sh.hash_long(v) for v in LONGS] == expected
    assert sh.hash_long_array(np.array(LONGS, dtype=np.int64)).tolist() == expected
    shorts = spark.sql("SELECT hash(CAST(7 AS SMALLINT)) AS a, hash(CAST(7 AS TINYINT)) AS b").first()
    assert shorts["a"] == shorts["b"] == sh.hash_int(7)


def test_long_equals_reference_murmur3_but_strings_do_not():
    for v in LONGS:
        assert sh.hash_long(v) == mmh3.hash(struct.pack("<q", v), 42)
    # a trailing partial block is where Spark and reference Murmur3 part ways
    assert sh.hash_bytes(b"abcde") != mmh3.hash(b"abcde", 42)
    assert sh.hash_bytes(b"abcd") == mmh3.hash(b"abcd", 42)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=30))
def test_vectorised_strings_equal_scalar(texts):
    assert sh.hash_binary_array(pa.array(texts, pa.string())).tolist() == [
        sh.hash_string(t) for t in texts
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30))
def test_vectorised_bytes_equal_scalar(blobs):
    assert sh.hash_binary_array(pa.array(blobs, pa.binary())).tolist() == [
        sh.hash_bytes(b) for b in blobs
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_vectorised_longs_equal_scalar(values):
    arr = np.array(values, dtype=np.int64)
    assert sh.hash_long_array(arr).tolist() == [sh.hash_long(v) for v in values]


def test_sliced_arrow_array_uses_its_offset():
    arr = pa.array(["zz", "abc", "héllo"]).slice(1)
    assert sh.hash_binary_array(arr).tolist() == [sh.hash_string("abc"), sh.hash_string("héllo")]


def reference_hash_bytes(data: bytes, seed: int = 42) -> int:
    """Spark's ``hashUnsafeBytes`` written out one block at a time (the oracle)."""
    def mix(h1: int, k1: int) -> int:
        k1 = (k1 * 0xCC9E2D51) & 0xFFFFFFFF
        k1 = ((k1 << 15) | (k1 >> 17)) & 0xFFFFFFFF
        h1 ^= (k1 * 0x1B873593) & 0xFFFFFFFF
        h1 = ((h1 << 13) | (h1 >> 19)) & 0xFFFFFFFF
        return (h1 * 5 + 0xE6546B64) & 0xFFFFFFFF

    aligned = len(data) - len(data) % 4
    h1 = seed
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = mix(h1, word)
    for byte in data[aligned:]:
        h1 = mix(h1, (byte - 256 if byte > 127 else byte) & 0xFFFFFFFF)
    h1 ^= len(data)
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h1 = ((h1 ^ (h1 >> shift)) * factor) & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=4 * sh.LONG_BLOCKS - 8, max_size=4 * sh.LONG_BLOCKS + 70),
                max_size=12), st.lists(st.binary(max_size=12), max_size=12),
       st.randoms(use_true_random=False))
def test_keys_on_both_sides_of_the_long_key_bound_equal_the_oracle(longish, short, rnd):
    # keys of up to LONG_BLOCKS blocks are mixed in numpy passes, longer ones in C
    blobs = longish + short
    rnd.shuffle(blobs)
    want = [reference_hash_bytes(b) for b in blobs]
    assert [sh.hash_bytes(b) for b in blobs] == want
    assert sh.hash_binary_array(pa.array(blobs, pa.binary())).tolist() == want
    assert sh.hash_binary_array(pa.array(blobs, pa.large_binary())).tolist() == want


def test_a_megabyte_key_among_short_ones_matches_spark(spark):
    texts = ["a", "x" * (1 << 20) + "yz", "", "é" * 300, "k" * 257, "k" * 256]
    df = spark.createDataFrame([(t,) for t in texts], "s string")
    want = [r["h"] for r in df.selectExpr("hash(s) AS h").collect()]
    assert sh.hash_binary_array(pa.array(texts)).tolist() == want
    assert [sh.hash_string(t) for t in texts] == want
    assert reference_hash_bytes(texts[1].encode()) == want[1]
    # the same keys after a slice: offsets into a shared data buffer
    assert sh.hash_binary_array(pa.array(["zz", *texts]).slice(1)).tolist() == want


def test_pmod_is_non_negative():
    assert sh.pmod(np.array([-7, 7, 0], dtype=np.int32), 4).tolist() == [1, 3, 0]


def _edge_texts() -> list[str]:
    """Strings of 4*64-1 .. 4*65+1 UTF-8 bytes (the long-key bound) in 1-, 2- and 4-byte
    characters, so the bound falls mid-character too, with a multibyte tail."""
    out = []
    for size in (*range(4 * sh.LONG_BLOCKS - 1, 4 * sh.LONG_BLOCKS + 4), 4 * sh.LONG_BLOCKS + 4,
                 4 * sh.LONG_BLOCKS + 5):
        out.append("k" * size)
        out.append("é" * (size // 2) + "a" * (size % 2))
        out.append("🙂" * (size // 4) + "ß" * ((size % 4) // 2) + "z" * (size % 2))
    return out


def _edge_blobs() -> list[bytes]:
    """Binary keys at the long-key bound whose tails (and blocks) hold bytes >= 0x80."""
    return [bytes((0xFF - i) % 256 for i in range(size))
            for size in range(4 * sh.LONG_BLOCKS - 1, 4 * sh.LONG_BLOCKS + 6)] + [
        b"\x80" * (1 << 20) + b"\xff\xfe\x81", b"", b"\x7f\x80\xff"]


def test_keys_at_the_long_key_bound_match_spark_hash_and_repartition(spark):
    # hash() and the partition repartition(n, col) picks, for strings and binary on both sides
    # of LONG_BLOCKS, a 1 MB binary key with a high-byte tail, nulls and empty values mixed in
    from pyspark.sql import functions as F

    import trilink_spark as tl

    n = 7
    for values, ddl, typ in ((_edge_texts() + ["", None, "x" * (1 << 20) + "🙂"], "k string",
                              pa.string()),
                             (_edge_blobs() + [None], "k binary", pa.binary())):
        df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], f"i int, {ddl}")
        rows = sorted(df.repartition(n, "k").select(
            "i", F.hash("k").alias("h"), F.spark_partition_id().alias("p")).collect())
        want_h = [r["h"] for r in rows]
        want_p = [r["p"] for r in rows]
        arr = pa.array(values, typ)
        got = sh.hash_binary_array(arr)
        valid = [v is not None for v in values]
        assert [g for g, ok in zip(got.tolist(), valid) if ok] == [
            h for h, ok in zip(want_h, valid) if ok]
        scalar = [sh.hash_string(v) if isinstance(v, str) else sh.hash_bytes(v)
                  for v in values if v is not None]
        assert scalar == [h for h, ok in zip(want_h, valid) if ok]
        part = tl.HashPartitioner(n, null_policy="group")
        assert part.assign(arr).tolist() == want_p
        assert [part.partition(v) for v in values] == want_p
        # a slice (non-zero offset into shared buffers), large types
        assert part.assign(arr.slice(3)).tolist() == want_p[3:]
        large = pa.large_string() if typ == pa.string() else pa.large_binary()
        assert part.assign(arr.cast(large)).tolist() == want_p


def test_nulls_hash_as_the_empty_value_even_when_their_slot_spans_bytes():
    # a fixed-size binary's null slot is as wide as the others, and an Arrow producer may leave
    # bytes under a null of a variable-size array: neither is hashed
    empty = sh.hash_bytes(b"")
    fixed = pa.array([b"\xff" * 300, None, b"\x80\x81\x82" * 100], pa.binary(300))
    assert sh.hash_binary_array(fixed).tolist() == [
        sh.hash_bytes(b"\xff" * 300), empty, sh.hash_bytes(b"\x80\x81\x82" * 100)]
    assert sh.hash_binary_array(fixed.slice(1)).tolist()[0] == empty
    validity = pa.py_buffer(bytes([0b101]))
    offsets = pa.py_buffer(np.array([0, 3, 303, 305], np.int32).tobytes())
    spanning = pa.Array.from_buffers(pa.binary(), 3, [validity, offsets,
                                                      pa.py_buffer(b"abc" + b"z" * 302)])
    assert spanning.to_pylist() == [b"abc", None, b"zz"]
    assert sh.hash_binary_array(spanning).tolist() == [sh.hash_bytes(b"abc"), empty,
                                                       sh.hash_bytes(b"zz")]
