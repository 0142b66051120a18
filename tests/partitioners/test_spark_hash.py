"""The Murmur3 port must equal Spark's hash() bit for bit."""

from __future__ import annotations

import struct

import mmh3
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark.partitioners import spark_hash as sh

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
