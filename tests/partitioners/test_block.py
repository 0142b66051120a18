"""BlockPartitioner: Spark's hash into blocks, a table from block to partition, row for row as Spark."""

from __future__ import annotations

import json
import pickle
import time

import numpy as np
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError, NullKeyError
from trilink_spark.partitioners import CANDIDATES, strategy_names
from trilink_spark.placement import physical_plan, shuffle_exchanges
from trilink_spark.switching import validate_update
from trilink_spark.partitioners import BlockPartitioner, OverlayPartitioner
from trilink_spark.partitioners.core.base import resolve_strategy_name, strategy_class
from trilink_spark.partitioners.core.block import MAX_BLOCKS, range_table
from trilink_spark.partitioners.choosing.catalogue import build, candidate_of, default_candidates
from trilink_spark.partitioners.core.spark_hash import hash_int_array, hash_long_array

N = 7


def test_block_is_pmod_of_sparks_hash_and_the_table_maps_it():
    keys = np.arange(-500, 500, dtype=np.int64)
    p = BlockPartitioner(N, num_blocks=64)
    blocks = np.mod(hash_long_array(keys).astype(np.int64), 64)
    assert p.blocks(keys).tolist() == blocks.tolist()
    assert p.assign(keys).tolist() == range_table(N, 64)[blocks].tolist()
    assert [p.block_of(int(k)) for k in keys[:50]] == blocks[:50].tolist()
    assert [p.partition(int(k)) for k in keys] == p.assign(keys).tolist()
    # 32-bit arrays hash as Spark int, as HashPartitioner does; key_type pins it
    ints = keys.astype(np.int32)
    int_blocks = np.mod(hash_int_array(ints).astype(np.int64), 64)
    assert p.blocks(ints).tolist() == int_blocks.tolist()
    assert BlockPartitioner(N, 64, key_type="int").blocks(keys.tolist()).tolist() == \
        int_blocks.tolist()


def test_default_table_is_a_range_table_and_every_partition_gets_blocks():
    p = BlockPartitioner(N)
    assert p.num_blocks == 4096
    table = p.table
    assert table.dtype == np.int32 and table.tolist() == sorted(table.tolist())
    assert np.bincount(table, minlength=N).min() >= 4096 // N
    for pid in range(N):
        assert (table[p.blocks_of_partition(pid)] == pid).all()
    assert sum(len(p.blocks_of_partition(pid)) for pid in range(N)) == 4096
    assert BlockPartitioner(3, 3).table.tolist() == [0, 1, 2]


def test_table_is_read_only_and_with_table_leaves_the_original_alone():
    p = BlockPartitioner(2, num_blocks=4)
    with pytest.raises(ValueError):
        p.table[0] = 1
    q = p.with_table([1, 1, 0, 0])
    assert p.table.tolist() == [0, 0, 1, 1] and q.table.tolist() == [1, 1, 0, 0]
    wider = p.with_table([3, 2, 1, 0], num_partitions=4)
    assert wider.num_partitions == 4 and wider.num_blocks == 4
    keys = [f"k{i}" for i in range(200)]
    assert (q.assign(keys) == 1 - p.assign(keys)).all()


@pytest.mark.parametrize("keys", [
    [f"user-{i}é" for i in range(300)],
    [bytes([i % 7, i % 251, 255]) for i in range(300)],
    list(range(-10**12, 10**12, 10**10)),
])
def test_assign_partition_and_blocks_agree_for_every_key_kind(keys):
    p = BlockPartitioner(N, num_blocks=97)
    ids = p.assign(keys)
    assert ids.dtype == np.int32 and 0 <= ids.min() and ids.max() < N
    assert [p(k) for k in keys] == ids.tolist()
    assert p.table[p.blocks(keys)].tolist() == ids.tolist()


def test_nulls_follow_the_null_policy():
    with pytest.raises(NullKeyError, match="null_policy='error'"):
        BlockPartitioner(N, null_policy="error").assign(["a", None])
    grouped = BlockPartitioner(N)  # the default: the null key on pmod(42, n), never a block
    assert grouped.assign(["a", None]).tolist()[1] == 42 % N
    assert grouped.blocks(["a", None]).tolist()[1] == -1
    p = BlockPartitioner(N, null_policy="partition0")
    assert p.assign(["a", None]).tolist()[1] == 0
    assert p.blocks(["a", None]).tolist()[1] == -1
    with pytest.raises(NullKeyError, match="no block"):
        p.block_of(None)


def test_round_trips_through_json_pickle_and_the_registry():
    p = BlockPartitioner(N, 64, table=np.arange(64) % N, key_type="string",
                         null_policy="partition0")
    data = json.loads(p.to_json())
    assert data["strategy"] == "block" and data["table"] == (np.arange(64) % N).tolist()
    assert data["num_blocks"] == 64 and data["key_type"] == "string"
    restored = tl.Partitioner.from_dict(data)
    assert isinstance(restored, BlockPartitioner) and restored == p
    keys = [f"k{i}" for i in range(500)]
    assert restored.assign(keys).tolist() == p.assign(keys).tolist()
    assert pickle.loads(pickle.dumps(p)).assign(keys).tolist() == p.assign(keys).tolist()
    assert strategy_class("block") is BlockPartitioner
    assert resolve_strategy_name("Block") == "block" and "block" in strategy_names()
    # the table is what a rebalance learns: fresh() goes back to the range table
    assert p.fresh().table.tolist() == range_table(N, 64).tolist()
    assert p.fresh().key_type == "string"


@pytest.mark.parametrize("bad", [
    {"table": [0, 1]},
    {"table": [0, 1, 2, 7]},
    {"table": [0, 1, 2, -1]},
    {"num_blocks": 0},
    {"num_blocks": 3},
    {"num_blocks": MAX_BLOCKS + 1},
    {"key_type": "float"},
])
def test_bad_arguments_raise_value_errors(bad):
    args = {"num_blocks": 4, **bad}
    with pytest.raises(InvalidArgumentError):
        BlockPartitioner(4, **args)


@pytest.mark.parametrize("bad", [
    {"table": [0.0, 1.0, 2.0, 3.0]},
    {"table": [True, False, True, False]},
    {"table": "0123"},
    {"table": {0: 1}},
    {"num_blocks": 4.0},
    {"num_blocks": True},
])
def test_bad_types_raise_type_errors(bad):
    args = {"num_blocks": 4, **bad}
    with pytest.raises(InvalidArgumentTypeError):
        BlockPartitioner(4, **args)


def test_fewer_blocks_than_partitions_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match=r"num_blocks \(4096\) must be >= num_partitions"):
        BlockPartitioner(5000)
    assert BlockPartitioner(5000, num_blocks=5000).num_blocks == 5000
    with pytest.raises(InvalidArgumentError, match=r"in \[0, 2\)"):
        BlockPartitioner(2, 4).blocks_of_partition(2)
    with pytest.raises(InvalidArgumentError):
        tl.Partitioner.from_dict({"strategy": "block", "num_partitions": 2, "table": [0, 5]})


def test_the_catalogue_offers_it_by_name_but_never_by_default():
    p = build("block", 5, key_type="long")
    assert isinstance(p, BlockPartitioner) and p.key_type == "long"
    assert build("block", 6000).num_blocks == 6000
    assert candidate_of(p) == "block"
    assert "block" in CANDIDATES
    for kind in ("int", "long", "string", "binary", None):
        assert "block" not in default_candidates(kind)
        assert "block" not in default_candidates(kind, sequence=True, weights=True)
    assert default_candidates("string", names=["hash", "block"]) == ["hash", "block"]
    scores = tl.evaluate_strategies({k: 1 + k % 5 for k in range(300)}, 4,
                                    strategies=["hash", "block"])
    assert [s.name for s in scores] == ["hash", "block"]
    assert "block" not in [s.name for s in tl.evaluate_strategies({1: 1, 2: 2}, 2)]
    assert validate_update({"strategy": "block"})


# ---------------------------------------------------------------------- Spark
@pytest.fixture(scope="module")
def frame(spark):
    rows = [(i % 997 - 300, (i * 7919) % 100003 * 2**33 - 2**40, f"k{i % 523}é🙂",
             bytes([i % 11, 255, i % 7])) for i in range(3000)]
    return spark.createDataFrame(rows, "ik int, lk long, sk string, bk binary")


def _rows(placed, key):
    rows = placed.select(key, tl.PARTITION_COL, F.spark_partition_id().alias("sp")).collect()
    keys = [bytes(r[key]) if isinstance(r[key], (bytearray, memoryview)) else r[key]
            for r in rows]
    return rows, keys


@pytest.mark.parametrize("key,kt", [("ik", "int"), ("lk", "long"), ("sk", "string"),
                                    ("bk", "binary")])
def test_key_by_places_every_row_where_assign_says(frame, key, kt):
    rng = np.random.default_rng(3)
    for p in (BlockPartitioner(N, key_type=kt),
              BlockPartitioner(N, 4096, rng.integers(0, N, 4096), key_type=kt)):
        placed = tl.key_by(frame, key, p)
        assert shuffle_exchanges(placed) == 1
        rows, keys = _rows(placed, key)
        assert all(r["sp"] == r[tl.PARTITION_COL] for r in rows)
        assert [r["sp"] for r in rows] == p.assign(keys).tolist()


def test_auto_key_type_follows_the_column_like_spark(frame):
    p = BlockPartitioner(N)
    rows, keys = _rows(tl.key_by(frame, "ik", p), "ik")
    # an int column reaches Python as 32-bit ints: hashed as Spark int, as in the JVM
    assert [r["sp"] for r in rows] == p.assign(np.array(keys, dtype=np.int32)).tolist()


@pytest.mark.connect
def test_key_by_by_name_binds_the_column_type(frame):
    placed = tl.key_by(frame, "ik", "block", 5)
    assert shuffle_exchanges(placed) == 1
    rows, keys = _rows(placed, "ik")
    expected = BlockPartitioner(5, key_type="int").assign(keys)
    assert [r["sp"] for r in rows] == expected.tolist()
    resolved = tl.resolve_strategy(frame, "sk", "block", 6)
    assert isinstance(resolved.partitioner, BlockPartitioner)
    assert resolved.partitioner.key_type == "string"


@pytest.mark.connect
def test_the_table_literal_is_folded_and_plans_fast(frame):
    p = BlockPartitioner(N, 4096, np.random.default_rng(0).integers(0, N, 4096))
    start = time.perf_counter()
    placed = tl.key_by(frame, "sk", p)
    plan = physical_plan(placed)
    seconds = time.perf_counter() - start
    assert "split(" not in plan  # folded into one constant array, not split per row
    assert seconds < 10.0, seconds


@pytest.mark.connect
def test_an_overlay_on_blocks_places_rows_too(frame):
    base = BlockPartitioner(N, key_type="string")
    keys = [r["sk"] for r in frame.select("sk").distinct().limit(40).collect()]
    p = OverlayPartitioner(base, {k: i % 9 for i, k in enumerate(keys)}, num_partitions=9)
    placed = tl.key_by(frame, "sk", p)
    assert shuffle_exchanges(placed) == 1
    rows, got = _rows(placed, "sk")
    assert [r["sp"] for r in rows] == p.assign(got).tolist()
