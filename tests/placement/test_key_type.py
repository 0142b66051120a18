"""A table strategy carries its key type: the hash fallback of unknown keys agrees on every path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidKeyTypeError


def test_auto_hashes_every_integer_as_long_on_both_paths():
    p = tl.LeastCountPartitioner(7, history={10_000: 5})
    keys32 = pa.array(np.arange(200, dtype=np.int32))
    in_task = p.lookup(keys32)  # the fallback, as in a Spark task
    per_key = [p._fallback(int(k)) for k in range(200)]
    assert in_task.tolist() == per_key
    assert in_task.tolist() == tl.HashPartitioner(7, key_type="long").assign(
        np.arange(200)).tolist()


def test_a_bound_key_type_is_kept_and_stored():
    p = tl.LeastKeyPartitioner(5).fit([1, 2])
    p.bind_key_type("int")
    assert p.key_type == "int"
    back = tl.Partitioner.from_dict(p.to_dict())
    assert back.key_type == "int"
    keys = np.arange(100, 200, dtype=np.int64)
    assert back.lookup(keys).tolist() == tl.HashPartitioner(5, key_type="int").assign(
        keys.astype(np.int32)).tolist()
    with pytest.raises(InvalidKeyTypeError):
        back.bind_key_type("string")
    with pytest.raises(InvalidKeyTypeError):
        back.bind_key_type("long")  # long keys cannot be hashed as int
    back.bind_key_type("int")  # the same type again is fine


def test_shipped_table_agrees_with_key_by_for_an_int_column(spark):
    """In a task, partition() and assign() of unknown int keys agree with key_by's JVM placement."""
    from pyspark.sql import functions as F

    df = spark.range(400).select(F.col("id").cast("int").alias("k"))
    known = df.where("k < 50")
    strategy = tl.resolve_strategy(known, "k", "least_count", 6).partitioner  # 50 keys known
    assert strategy.key_type == "int"
    placed = tl.key_by(df, "k", strategy, fit="none").select("k", tl.PARTITION_COL).collect()
    jvm = {row["k"]: row[tl.PARTITION_COL] for row in placed}

    def in_task(rows):
        import numpy as np

        ks = [r["k"] for r in rows]
        per_key = [strategy.partition(k) for k in ks]
        vector = strategy.assign(np.asarray(ks, dtype=np.int32)).tolist()
        yield from zip(ks, per_key, vector)

    task = df.rdd.mapPartitions(in_task).collect()
    assert len(task) == 400
    for k, per_key, vector in task:
        assert per_key == vector == jvm[k], k


def test_table_keys_an_int_column_cannot_hold_never_duplicate_rows(spark):
    from pyspark.sql import functions as F

    p = tl.LeastKeyPartitioner(4).fit([2**32 + 5, 6, 5])
    df = spark.createDataFrame([(5,), (6,)], "k int")
    rows = tl.key_by(df, "k", p, fit="none").select(
        "k", F.spark_partition_id().alias("pid")).collect()
    assert sorted((r["k"], r["pid"]) for r in rows) == [(5, p.partition(5)), (6, p.partition(6))]


def test_an_int_strategy_refuses_a_long_column(spark):
    p = tl.LeastKeyPartitioner(4, key_type="int").fit([1])
    df = spark.createDataFrame([(1,)], "k long")
    with pytest.raises(InvalidKeyTypeError, match="bigint"):
        tl.key_by(df, "k", p, fit="none")
    with pytest.raises(InvalidKeyTypeError):
        tl.LeastKeyPartitioner(4).fit([2**40]).bind_key_type("int")


def test_a_strategy_in_use_keeps_its_fallback_after_key_by(spark):
    p = tl.LeastKeyPartitioner(4).fit([1])
    before = p.lookup([5, 7, 9]).tolist()
    tl.key_by(spark.createDataFrame([(5,)], "k int"), "k", p, fit="none").collect()
    assert p.key_type == "auto"
    assert p.lookup([5, 7, 9]).tolist() == before
