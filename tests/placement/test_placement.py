"""key_by / keyed_agg / keyed_apply: one shuffle, exact placement, same results as groupBy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.partitioners import choose_best
from trilink_spark.placement import shuffle_exchanges

N = 5


@pytest.fixture(scope="module")
def frames(spark):
    rows = [(i % 37, (i * 7919) % 1000, f"k{i % 23}é", bytes([i % 11, 255])) for i in range(600)]
    ints = spark.createDataFrame(rows, "ik int, v long, sk string, bk binary")
    longs = ints.select(F.col("ik").cast("long").alias("lk"), "v")
    return ints, longs


def _check_exact(placed, key, p):
    assert shuffle_exchanges(placed) == 1
    rows = placed.select(key, tl.PARTITION_COL, F.spark_partition_id().alias("sp")).collect()
    for r in rows:
        assert r[tl.PARTITION_COL] == r["sp"]
    keys = [r[key] for r in rows]
    keys = [bytes(k) if isinstance(k, (bytearray, memoryview)) else k for k in keys]
    if placed.schema[key].dataType.simpleString() == "int":
        keys = np.array(keys, dtype=np.int32)  # what an Arrow batch of an int column holds
    expected = p.lookup(keys) if p.is_stateful else p.assign(keys)
    assert [r["sp"] for r in rows] == expected.tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda kt: tl.HashPartitioner(N, key_type=kt),
        lambda kt: tl.LeastKeyPartitioner(N),
        lambda kt: tl.LeastCountPartitioner(N),
        lambda kt: tl.WeightPartitioner([10, 30, 0, 40, 20], key_type=kt),
        lambda kt: tl.WeightPartitioner([10, 30, 0, 40, 20], mode="random"),
    ],
    ids=["hash", "least_key", "least_count", "weight", "weight_random"],
)
@pytest.mark.parametrize("key,kt", [("ik", "int"), ("sk", "string"), ("bk", "binary")])
def test_every_row_lands_where_the_strategy_says(frames, make, key, kt):
    ints, _ = frames
    p = make(kt)
    _check_exact(tl.key_by(ints, key, p), key, p)


@pytest.mark.connect
def test_modulo_and_long_keys(frames):
    ints, longs = frames
    _check_exact(tl.key_by(ints, "ik", tl.ModuloPartitioner(N)), "ik", tl.ModuloPartitioner(N))
    _check_exact(tl.key_by(longs, "lk", "hash", N), "lk", tl.HashPartitioner(N, key_type="long"))


@pytest.mark.connect
def test_hash_equals_sparks_own_repartition(frames):
    ints, _ = frames
    ours = tl.key_by(ints, "ik", "hash", N).select("ik", F.spark_partition_id().alias("p"))
    theirs = ints.repartition(N, "ik").select("ik", F.spark_partition_id().alias("p"))
    assert sorted(map(tuple, ours.distinct().collect())) == sorted(map(tuple, theirs.distinct().collect()))


def test_table_strategy_is_fitted_in_place_and_sticky(frames, spark):
    ints, _ = frames
    p = tl.LeastCountPartitioner(N)
    tl.key_by(ints, "ik", p)
    first = p.assignments
    assert len(first) == 37
    more = spark.createDataFrame([(i, 0) for i in range(30, 60)], "ik int, v long")
    tl.key_by(more, "ik", p)
    assert all(p.assignments[k] == v for k, v in first.items())
    assert len(p) == 60


def test_fit_none_sends_unknown_keys_to_hash(frames):
    ints, _ = frames
    p = tl.LeastKeyPartitioner(N).fit([0, 1, 2])
    placed = tl.key_by(ints, "ik", p, fit="none")
    _check_exact(placed, "ik", p)
    assert len(p) == 3


def test_auto_chooses_and_reports(frames):
    ints, _ = frames
    res = tl.resolve_strategy(ints, "ik", "auto", N, sample_rate=0.5, min_sample=1)
    assert {s.name for s in res.scores} == {"hash", "modulo", "least_key", "least_count"}
    best = choose_best(res.scores)
    assert res.partitioner.strategy_name == best.partitioner.strategy_name
    placed = tl.key_by(ints, "ik", "auto", N)
    assert shuffle_exchanges(placed) == 1
    assert tl.partition_balance(placed).total == 600


def test_keyed_agg_equals_group_by_without_a_second_exchange(frames):
    ints, _ = frames
    exprs = [F.sum("v").alias("s"), F.count("*").alias("c"), F.max("sk").alias("m")]
    expected = sorted(map(tuple, ints.groupBy("ik").agg(*exprs).collect()))
    for strategy in ("hash", "modulo", "least_key", "least_count", "auto"):
        out = tl.keyed_agg(ints, "ik", *exprs, strategy=strategy, num_partitions=N)
        assert out.columns == ["ik", "s", "c", "m"]
        assert shuffle_exchanges(out) == 1
        assert sorted(map(tuple, out.collect())) == expected


@pytest.mark.connect
def test_keyed_agg_string_keys_via_transform(frames):
    ints, _ = frames
    out = ints.transform(lambda d: tl.keyed_agg(d, "sk", F.sum("v").alias("s"), strategy="least_key", num_partitions=3))
    assert sorted(map(tuple, out.collect())) == sorted(map(tuple, ints.groupBy("sk").agg(F.sum("v").alias("s")).collect()))


@pytest.mark.connect
def test_keyed_apply_equals_apply_in_pandas(frames):
    ints, _ = frames

    def top(pdf: pd.DataFrame) -> pd.DataFrame:
        return pdf.nlargest(2, "v")[["ik", "v"]]

    def with_key(key, pdf):
        return pd.DataFrame({"ik": [key[0]], "n": [len(pdf)]})

    expected = sorted(map(tuple, ints.groupBy("ik").applyInPandas(top, "ik int, v long").collect()))
    out = tl.keyed_apply(ints, "ik", top, "ik int, v long", strategy="least_count", num_partitions=N)
    assert shuffle_exchanges(out) == 1
    assert sorted(map(tuple, out.collect())) == expected
    keyed = tl.keyed_apply(ints, "ik", with_key, "ik int, n long", strategy="hash", num_partitions=N)
    exp2 = sorted(map(tuple, ints.groupBy("ik").applyInPandas(with_key, "ik int, n long").collect()))
    assert sorted(map(tuple, keyed.collect())) == exp2


@pytest.mark.connect
def test_null_keys_partition0(spark):
    df = spark.createDataFrame([(None, 1), (3, 2), (None, 3)], "k int, v int")
    placed = tl.key_by(df, "k", "least_key", 3, null_policy="partition0")
    rows = placed.select("k", F.spark_partition_id().alias("p")).collect()
    assert all(r["p"] == 0 for r in rows if r["k"] is None)
    agg = tl.keyed_agg(df, "k", F.sum("v").alias("s"), strategy="hash", num_partitions=3, null_policy="partition0")
    assert sorted(map(tuple, agg.collect()), key=str) == sorted(map(tuple, df.groupBy("k").agg(F.sum("v").alias("s")).collect()), key=str)


@pytest.mark.connect
def test_spark_conf_defaults(spark):
    df = spark.createDataFrame([(None, 1), (3, 2)], "k int, v int")
    spark.conf.set("spark.trilink.nullPolicy", "partition0")
    try:
        placed = tl.key_by(df, "k", "hash", 2)
        assert placed.count() == 2
    finally:
        spark.conf.unset("spark.trilink.nullPolicy")
