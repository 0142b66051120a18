"""OverlayPartitioner: explicit partitions for a few keys, the base strategy for the rest."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import InvalidKeyTypeError, NullKeyError, UnknownStrategyError
from trilink_spark.partitioners import strategy_names
from trilink_spark.placement import shuffle_exchanges
from trilink_spark.partitioners import BlockPartitioner, OverlayPartitioner
from trilink_spark.partitioners.core.base import resolve_strategy_name, strategy_class

N = 6


def _expected(base, overrides, keys):
    table = isinstance(base, tl.TablePartitioner) and base.is_stateful
    placed = base.lookup(keys) if table else base.assign(keys)
    return [overrides.get(k, int(p)) for k, p in zip(keys, placed.tolist())]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(-50, 250), st.integers(0, N + 1), max_size=40),
    st.lists(st.integers(-60, 260), min_size=1, max_size=120),
)
def test_overrides_win_and_the_base_places_the_rest(overrides, keys):
    base = tl.HashPartitioner(N)
    p = OverlayPartitioner(base, overrides, num_partitions=N + 2)
    assert p.assign(keys).tolist() == _expected(base, overrides, keys)
    assert [p.partition(k) for k in keys] == _expected(base, overrides, keys)
    assert p.assign(np.array(keys, dtype=np.int64)).tolist() == _expected(base, overrides, keys)


@pytest.mark.parametrize("keys", [
    [f"s{i}" for i in range(100)],
    [bytes([i, 255 - i]) for i in range(100)],
])
def test_string_and_binary_keys(keys):
    base = BlockPartitioner(N, num_blocks=32)
    overrides = {k: i % N for i, k in enumerate(keys[::3])}
    p = OverlayPartitioner(base, overrides)
    assert p.assign(keys).tolist() == _expected(base, overrides, keys)
    assert [p(k) for k in keys] == _expected(base, overrides, keys)


def test_a_table_base_is_looked_up_never_taught_by_placing():
    base = tl.LeastCountPartitioner(N, history={k: 10 + k for k in range(20)})
    p = OverlayPartitioner(base, {1: 5, 25: 5})
    keys = list(range(40))
    assert p.assign(keys).tolist() == _expected(base, {1: 5, 25: 5}, keys)
    assert p.partition(30) == int(base.lookup([30])[0])
    assert len(base) == 20  # unknown keys got the hash fallback, the table is unchanged
    p.fit({k: 1 for k in range(0, 30)})  # fit teaches the base the keys not overridden
    assert len(base) == 29 and 25 not in base and 24 in base
    assert p.is_stateful


def test_nulls_follow_the_null_policy():
    base = tl.HashPartitioner(N, null_policy="partition0")
    p = OverlayPartitioner(base, {"a": 3})
    assert p.null_policy == "partition0"
    assert p.assign(["a", None, "b"]).tolist() == [3, 0, base.partition("b")]
    with pytest.raises(NullKeyError):
        OverlayPartitioner(tl.HashPartitioner(N, null_policy="error"), {"a": 3}).assign(
            ["a", None])
    grouped = OverlayPartitioner(tl.HashPartitioner(N), {"a": 3}, num_partitions=N + 1)
    assert grouped.assign(["a", None]).tolist() == [3, 42 % (N + 1)]  # the overlay's n
    with pytest.raises(InvalidArgumentError, match="null"):
        OverlayPartitioner(base, {None: 1})


def test_round_trip_through_json_and_pickle():
    base = BlockPartitioner(N, 16, table=np.arange(16) % N, key_type="string")
    p = OverlayPartitioner(base, {"a": 7, "b": 0}, num_partitions=8)
    data = json.loads(p.to_json())
    assert data["strategy"] == "overlay" and data["base"]["strategy"] == "block"
    restored = tl.Partitioner.from_dict(data)
    assert isinstance(restored, OverlayPartitioner) and restored == p
    keys = [f"k{i}" for i in range(200)] + ["a", "b"]
    assert restored.assign(keys).tolist() == p.assign(keys).tolist()
    assert pickle.loads(pickle.dumps(p)).assign(keys).tolist() == p.assign(keys).tolist()
    binary = OverlayPartitioner(tl.HashPartitioner(N), {b"\x00\xff": 2})
    assert tl.Partitioner.from_json(binary.to_json()).partition(b"\x00\xff") == 2
    table = OverlayPartitioner(tl.LeastKeyPartitioner(N).fit(["x", "y"]), {"z": 1})
    assert tl.Partitioner.from_json(table.to_json()).assign(["x", "y", "z"]).tolist() == \
        table.assign(["x", "y", "z"]).tolist()


def test_it_cannot_be_asked_for_by_name():
    assert strategy_class("overlay") is OverlayPartitioner
    assert "overlay" not in strategy_names()
    with pytest.raises(UnknownStrategyError):
        resolve_strategy_name("overlay")


def test_properties_and_defaults():
    base = tl.HashPartitioner(N)
    p = OverlayPartitioner(base, {"a": 1})
    assert p.base is base and p.num_partitions == N and len(p) == 1
    overrides = p.overrides
    overrides["b"] = 2  # a copy
    assert p.overrides == {"a": 1}
    assert OverlayPartitioner(base, {}).assign(["a", "b"]).tolist() == base.assign(["a", "b"]).tolist()


@pytest.mark.parametrize("args,error,match", [
    (({"a": N},), InvalidArgumentError, "outside"),
    (({"a": -1},), InvalidArgumentError, "outside"),
    (({"a": 1}, N - 1), InvalidArgumentError, "below the base"),
    (({"a": 1}, 0), InvalidArgumentError, ">= 1"),
    (({"a": 1.0},), InvalidArgumentTypeError, "ints"),
    (({"a": True},), InvalidArgumentTypeError, "ints"),
    (({"a": 1, 2: 1},), InvalidKeyTypeError, "one kind"),
    (({1.5: 1},), InvalidKeyTypeError, "float"),
    (([("a", 1)],), InvalidArgumentTypeError, "mapping"),
])
def test_bad_arguments_raise_typed_errors(args, error, match):
    with pytest.raises(error, match=match):
        OverlayPartitioner(tl.HashPartitioner(N), *args)


def test_keys_must_be_of_the_base_kind():
    with pytest.raises(InvalidKeyTypeError, match="string keys but the base"):
        OverlayPartitioner(tl.HashPartitioner(N, key_type="long"), {"a": 1})
    with pytest.raises(InvalidKeyTypeError, match="32 bits|'int' key type"):
        OverlayPartitioner(tl.HashPartitioner(N, key_type="int"), {2**40: 1})
    p = OverlayPartitioner(tl.HashPartitioner(N), {"a": 1})
    with pytest.raises(InvalidKeyTypeError, match="overrides hold string"):
        p.assign([1, 2])
    with pytest.raises(InvalidArgumentTypeError, match="Partitioner"):
        OverlayPartitioner("hash", {})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="itself an overlay"):
        OverlayPartitioner(p, {"b": 2})
    with pytest.raises(InvalidArgumentError):
        tl.Partitioner.from_dict({"strategy": "overlay", "num_partitions": N,
                                  "base": tl.HashPartitioner(N).to_dict(),
                                  "overrides": [["a", 1], ["a", 2]]})
    with pytest.raises(InvalidArgumentError):
        tl.Partitioner.from_dict({"strategy": "overlay", "base": {"strategy": "hash"},
                                  "overrides": "nope"})


# ---------------------------------------------------------------------- Spark
@pytest.fixture(scope="module")
def frame(spark):
    rows = [(i % 401 - 100, f"k{i % 353}é", bytes([i % 13, 200])) for i in range(2000)]
    return spark.createDataFrame(rows, "ik int, sk string, bk binary")


def _check(frame, key, p):
    placed = tl.key_by(frame, key, p)
    assert shuffle_exchanges(placed) == 1
    rows = placed.select(key, F.spark_partition_id().alias("sp")).collect()
    keys = [bytes(r[key]) if isinstance(r[key], (bytearray, memoryview)) else r[key]
            for r in rows]
    if key == "ik":
        keys = np.array(keys, dtype=np.int32)
    assert [r["sp"] for r in rows] == p.assign(keys).tolist()
    return keys


@pytest.mark.parametrize("key,kt", [("ik", "int"), ("sk", "string"), ("bk", "binary")])
def test_spark_places_rows_as_assign_over_a_stateless_base(frame, key, kt):
    distinct = [r[key] for r in frame.select(key).distinct().orderBy(key).limit(60).collect()]
    distinct = [bytes(k) if isinstance(k, (bytearray, memoryview)) else k for k in distinct]
    overrides = {k: (i * 5) % (N + 1) for i, k in enumerate(distinct)}
    for base in (tl.HashPartitioner(N, key_type=kt), BlockPartitioner(N, key_type=kt)):
        _check(frame, key, OverlayPartitioner(base, overrides, num_partitions=N + 1))


@pytest.mark.parametrize("key", ["ik", "sk"])
def test_spark_places_rows_as_assign_over_a_table_base(frame, key):
    distinct = sorted(r[key] for r in frame.select(key).distinct().collect())
    base = tl.LeastCountPartitioner(N, history={k: 1 + i % 7 for i, k in enumerate(distinct[:150])})
    p = OverlayPartitioner(base, {k: 0 for k in distinct[100:200]})
    _check(frame, key, p)
    assert len(base) == 150  # the table was read, not taught


def test_an_empty_unbound_table_base_says_what_is_missing(frame):
    p = OverlayPartitioner(tl.LeastKeyPartitioner(N), {})
    with pytest.raises(InvalidArgumentError, match="key_type"):
        p.spark_column(F.col("ik"))
    bound = OverlayPartitioner(tl.LeastKeyPartitioner(N, key_type="int"), {})
    _check(frame, "ik", bound)
