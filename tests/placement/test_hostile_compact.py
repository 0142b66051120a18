"""Hostile inputs for ``key_by(..., compact=...)`` and ``partition_balance`` on its frames.

Each test names what it protects: no row is ever dropped or doubled, every Spark partition of
a compacted frame holds one strategy partition's rows, and odd inputs give a correct result or
a typed :class:`~trilink_spark.TrilinkError`.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import NullKeyError, ReservedColumnError
from conftest import partition_layout
from trilink_spark.columns import COMPACTED_META, NUM_PARTITIONS_META




# ---------------------------------------------------------------------- empty input
@pytest.mark.parametrize("n,compact", [(1025, None), (8, "always")])
def test_an_empty_frame_compacts_to_one_empty_partition(spark: Any, n: int,
                                                        compact: str | None) -> None:
    empty = spark.range(0).selectExpr("cast(id as string) k", "id v")
    placed = tl.key_by(empty, "k", "hash", n, compact=compact)  # used to raise
    assert placed.rdd.getNumPartitions() == 1
    assert placed.collect() == []
    report = tl.partition_balance(placed)
    assert (report.num_partitions, report.total) == (n, 0)


# ---------------------------------------------------------------------- null keys
def test_null_keys_refused_by_the_compaction_job_raise_null_key_error(spark: Any) -> None:
    nulls = spark.createDataFrame([(None, 1), ("a", 2)], "k string, v long")
    with pytest.raises(NullKeyError, match="spark.trilink.nullPolicy.*'partition0'"):
        tl.key_by(nulls, "k", "hash", 10_000, null_policy="error")
    grouped = tl.key_by(nulls, "k", "hash", 10_000)  # the default: a group of its own
    rows, _ = partition_layout(grouped)
    assert {r[tl.PARTITION_COL] for r in rows if r["k"] is None} == {42}


def test_null_keys_on_partition0_are_compacted_with_every_row(spark: Any) -> None:
    nulls = spark.createDataFrame([(None, 1), ("a", 2), (None, 3)], "k string, v long")
    placed = tl.key_by(nulls, "k", "least_count", 64, null_policy="partition0",
                       fit="none", compact="always")
    rows, by_task = partition_layout(placed)
    assert sorted(r["v"] for r in rows) == [1, 2, 3]
    assert {r[tl.PARTITION_COL] for r in rows if r["k"] is None} == {0}
    assert placed.rdd.getNumPartitions() == len(by_task) <= 2
    assert all(len(p) == 1 for p in by_task.values())


# ---------------------------------------------------------------------- odd key types
ODD_KEYS = [
    ("k int", [(0,), (-(2**31),), (2**31 - 1,), (7,)], "modulo"),
    ("k long", [(-(2**63),), (2**63 - 1,), (0,), (-1,)], "least_count"),
    ("k binary", [(b"",), (b"\x00",), (b"\xff" * 64,), (None,)], "least_key"),
    ("k double", [(float("nan"),), (-0.0,), (0.0,), (1e300,)], "hash"),
    ("k string", [("",), ("\U0001f600",), ("x" * 100_000,), (None,)], "hash"),
]


@pytest.mark.parametrize("schema,keys,strategy", ODD_KEYS)
def test_odd_keys_are_compacted_without_losing_or_moving_a_row(
        spark: Any, schema: str, keys: list[tuple[Any]], strategy: str) -> None:
    df = spark.createDataFrame([(*k, i) for i, k in enumerate(keys)], f"{schema}, v long")
    kw: dict[str, Any] = {"null_policy": "partition0"}
    if strategy in ("least_count", "least_key"):
        kw["fit"] = "none"
    placed = tl.key_by(df, "k", strategy, 64, compact="always", **kw)
    rows, by_task = partition_layout(placed)
    assert sorted(r["v"] for r in rows) == list(range(len(keys)))
    assert all(len(p) == 1 for p in by_task.values())
    assert placed.rdd.getNumPartitions() == len(by_task)
    exact = tl.key_by(df, "k", strategy, 64, compact="never", **kw)
    assert sorted((r["v"], r[tl.PARTITION_COL]) for r in exact.collect()) == sorted(
        (r["v"], r[tl.PARTITION_COL]) for r in rows)


@pytest.mark.parametrize("make", ["block", "overlay"])
def test_block_and_overlay_placements_compact_exactly(spark: Any, make: str) -> None:
    df = spark.range(30).selectExpr("cast(id as string) k", "id v")
    strategy: tl.Partitioner = (tl.BlockPartitioner(64) if make == "block" else
                                tl.OverlayPartitioner(tl.HashPartitioner(64),
                                                      {"1": 5, "2": 63}))
    placed = tl.key_by(df, "k", strategy, compact="always")
    rows, by_task = partition_layout(placed)
    assert sorted(r["v"] for r in rows) == list(range(30))
    assert all(len(p) == 1 for p in by_task.values())
    assert placed.rdd.getNumPartitions() == len(by_task) < 64
    if make == "overlay":
        got = {r["k"]: r[tl.PARTITION_COL] for r in rows}
        assert (got["1"], got["2"]) == (5, 63)
    report = tl.partition_balance(placed)
    assert report.num_partitions == 64 and report.total == 30


# ---------------------------------------------------------------------- a changing input
def test_rows_on_partitions_empty_when_key_by_looked_are_never_dropped(spark: Any) -> None:
    """Compaction finds the non-empty partitions when key_by is called; an input that yields
    other keys at the action (here a nondeterministic key; in practice a table appended to
    meanwhile) used to lose every row outside those partitions to an inner join."""
    draw = F.udf(lambda v: str(random.randrange(10**9)), "string").asNondeterministic()
    df = spark.range(40).select(draw(F.col("id")).alias("k"), F.col("id").alias("v"))
    placed = tl.key_by(df, "k", "hash", 100_000, compact="always")
    rows = placed.select("v", tl.PARTITION_COL).collect()
    assert sorted(r["v"] for r in rows) == list(range(40))
    assert all(0 <= r[tl.PARTITION_COL] < 100_000 for r in rows)


# ---------------------------------------------------------------------- streaming
def test_a_streaming_frame_is_never_compacted_and_runs_no_job(spark: Any) -> None:
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
              .selectExpr("cast(value as string) k", "value v"))
    sc = spark.sparkContext
    sc.setJobGroup("tl-hostile-compact-stream", "no job expected")
    try:
        placed = tl.key_by(stream, "k", "hash", 10_000, compact="always")
    finally:
        sc.setJobGroup("", "")
    assert placed.isStreaming
    assert list(sc.statusTracker().getJobIdsForGroup("tl-hostile-compact-stream")) == []


# ---------------------------------------------------------------------- downstream
def test_a_compacted_frame_feeds_keyed_agg_and_key_by_with_exact_results(spark: Any) -> None:
    df = spark.range(300).selectExpr("cast(id % 37 as string) k", "id v")
    placed = tl.key_by(df, "k", "hash", 256, compact="always")
    assert placed.rdd.getNumPartitions() <= 37
    with pytest.raises(ReservedColumnError):
        tl.key_by(placed, "k", "hash", 256)  # its partition column is reserved
    plain = placed.drop(tl.PARTITION_COL)
    sums = tl.keyed_agg(plain, "k", F.sum("v").alias("s"), strategy="hash",
                        num_partitions=8)
    want = {str(k): sum(v for v in range(300) if v % 37 == k) for k in range(37)}
    assert {r["k"]: r["s"] for r in sums.collect()} == want
    again = tl.key_by(plain, "k", "least_count", 512, compact="always")
    assert Counter(r["k"] for r in again.collect()) == Counter(
        str(v % 37) for v in range(300))


# ---------------------------------------------------------------------- metadata
def _forged(spark: Any, values: list[Any], meta: dict[str, Any]) -> Any:
    frame = spark.createDataFrame([(v,) for v in values], "p int")
    return frame.select(F.col("p").alias(tl.PARTITION_COL, metadata=meta)).repartition(2)


@pytest.mark.parametrize("values", [
    list(range(20)),          # ids beyond the recorded count
    [-3, -2, -1, 0, 1, 2],    # negative ids (used to wrap around silently)
    [None, 1, 1],             # nulls
])
def test_partition_balance_of_forged_metadata_counts_spark_partitions(
        spark: Any, values: list[Any]) -> None:
    forged = _forged(spark, values, {NUM_PARTITIONS_META: 5, COMPACTED_META: True})
    report = tl.partition_balance(forged)
    assert report.total == len(values)
    assert report.num_partitions == forged.rdd.getNumPartitions()


def test_partition_balance_ignores_an_absurd_recorded_partition_count(spark: Any) -> None:
    forged = _forged(spark, [0, 1, 2], {NUM_PARTITIONS_META: 10**12, COMPACTED_META: True})
    report = tl.partition_balance(forged)  # used to allocate a 10**12-entry array
    assert (report.num_partitions, report.total) == (forged.rdd.getNumPartitions(), 3)


def test_partition_balance_of_a_repartitioned_exact_frame_counts_its_partitions(
        spark: Any) -> None:
    df = spark.range(100).selectExpr("cast(id as string) k", "id v")
    placed = tl.key_by(df, "k", "hash", 8, compact="never")
    assert tl.partition_balance(placed).num_partitions == 8
    report = tl.partition_balance(placed.coalesce(2))
    assert (report.num_partitions, report.total) == (2, 100)


def test_partition_balance_of_a_compacted_frame_with_metadata_stripped(spark: Any) -> None:
    df = spark.range(100).selectExpr("cast(id as string) k", "id v")
    placed = tl.key_by(df, "k", "hash", 1024, compact="always")
    stripped = placed.select(*[F.col(c).alias(c, metadata={}) for c in placed.columns])
    report = tl.partition_balance(stripped)  # what Spark holds: the compacted partitions
    assert report.num_partitions == placed.rdd.getNumPartitions() < 1024
    assert report.total == 100 and report.loads.min() > 0


@pytest.mark.connect
def test_an_empty_frame_compacts_on_either_session_kind(spark: Any) -> None:
    from trilink_spark._internal.spark.compat import num_partitions

    empty = spark.range(0).selectExpr("cast(id as string) k", "id v")
    placed = tl.key_by(empty, "k", "hash", 10_000)
    assert placed.collect() == [] and num_partitions(placed) <= 1  # Connect counts 0
    report = tl.partition_balance(placed)
    assert (report.num_partitions, report.total) == (10_000, 0)
