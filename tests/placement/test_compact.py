"""key_by on far more partitions than the data fills: one task per non-empty partition.

Spark runs a task for every partition, empty or not; ``key_by(..., 10_000)`` over 100 rows
used to run 10,000 tasks per action (about 25 s each on 2 cores).
"""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.placement import shuffle_exchanges
from conftest import partition_layout
from trilink_spark.placement.key_by import COMPACT_ABOVE, with_partition_id


@pytest.fixture(scope="module")
def small(spark):
    return spark.range(100).selectExpr("cast(id as string) k", "id v")




@pytest.mark.parametrize("strategy", ["hash", "least_count", "modulo_int"])
def test_empty_partitions_get_no_task_above_the_threshold(spark, small, strategy):
    df = small if strategy != "modulo_int" else small.selectExpr("cast(k as int) k", "v")
    name = "modulo" if strategy == "modulo_int" else strategy
    n = 10_000
    placed = tl.key_by(df, "k", name, n)
    rows, by_task = partition_layout(placed)
    # nothing lost, nothing doubled
    assert sorted(r["v"] for r in rows) == list(range(100))
    used = {r[tl.PARTITION_COL] for r in rows}
    # one Spark partition per non-empty strategy partition, each holding exactly one
    assert placed.rdd.getNumPartitions() == len(used) <= 100
    assert all(len(pids) == 1 for pids in by_task.values())
    assert sorted(next(iter(p)) for p in by_task.values()) == sorted(used)
    # dense, in ascending order of the strategy partition
    order = [next(iter(by_task[sp])) for sp in sorted(by_task)]
    assert order == sorted(order)
    # the strategy's own placement is unchanged
    # the strategy's own placement, computed without a shuffle (10,000 tasks otherwise)
    strategy = tl.resolve_strategy(df, "k", name, n).partitioner
    fitted = with_partition_id(df, "k", strategy).select("k", tl.PARTITION_COL)
    assert sorted(map(tuple, fitted.collect())) == sorted(
        (r["k"], r[tl.PARTITION_COL]) for r in rows)
    assert all(0 <= p < n for p in used)
    # partition_balance reports the strategy's partitions, empty ones included
    report = tl.partition_balance(placed)
    assert report.num_partitions == n
    assert report.total == 100
    assert Counter(r[tl.PARTITION_COL] for r in rows) == {
        i: int(c) for i, c in enumerate(report.loads) if c}


def test_compact_never_keeps_spark_partition_equal_to_strategy_partition(spark, small):
    placed = tl.key_by(small, "k", "hash", 40, compact="never")
    assert placed.rdd.getNumPartitions() == 40
    rows, by_task = partition_layout(placed)
    assert all(pids == {sp} for sp, pids in by_task.items())


def test_below_the_threshold_auto_is_exact_placement(spark, small):
    n = 64
    assert n <= COMPACT_ABOVE
    placed = tl.key_by(small, "k", "hash", n)
    assert placed.rdd.getNumPartitions() == n
    _, by_task = partition_layout(placed)
    assert all(pids == {sp} for sp, pids in by_task.items())


def test_compact_always_at_small_counts(spark, small):
    three = small.where("v < 3")
    placed = tl.key_by(three, "k", "hash", 16, compact="always")
    rows, by_task = partition_layout(placed)
    used = {r[tl.PARTITION_COL] for r in rows}
    assert placed.rdd.getNumPartitions() == len(used) < 16
    assert sorted(r["v"] for r in rows) == [0, 1, 2]
    assert tl.partition_balance(placed).num_partitions == 16


def test_mostly_full_partitions_are_not_compacted(spark):
    df = spark.range(50_000).selectExpr("cast(id as string) k", "id v")
    n = COMPACT_ABOVE + 1
    placed = tl.key_by(df, "k", "hash", n)  # every partition holds rows: nothing to save
    assert placed.rdd.getNumPartitions() == n


def test_compaction_setting_from_the_session_conf(spark, small):
    spark.conf.set("spark.trilink.compactPartitions", "never")
    try:
        placed = tl.key_by(small, "k", "hash", COMPACT_ABOVE + 1)
        assert placed.rdd.getNumPartitions() == COMPACT_ABOVE + 1
    finally:
        spark.conf.unset("spark.trilink.compactPartitions")


@pytest.mark.parametrize("bad", ["sometimes", "", 3, True])
def test_bad_compact_values_are_refused(spark, small, bad):
    error, words = ((InvalidArgumentError, "compact must be one of") if isinstance(bad, str)
                    else (InvalidArgumentTypeError, "compact must be a str, one of"))
    with pytest.raises(error, match=f"{words} 'auto', 'always', 'never', got"):
        tl.key_by(small, "k", "hash", 8, compact=bad)


def test_keyed_agg_over_many_partitions_keeps_one_exchange(spark, small):
    out = tl.keyed_agg(small, "k", F.sum("v").alias("s"), strategy="hash",
                       num_partitions=COMPACT_ABOVE + 1, combine="never")
    assert shuffle_exchanges(out) == 1


@pytest.mark.connect
def test_compaction_on_either_session_kind(spark):
    from trilink_spark._internal.spark.compat import num_partitions

    df = spark.range(100).selectExpr("cast(id as string) k", "id v")
    placed = tl.key_by(df, "k", "hash", 10_000)
    rows = placed.select("v", tl.PARTITION_COL).collect()
    assert sorted(r["v"] for r in rows) == list(range(100))
    assert num_partitions(placed) == len({r[tl.PARTITION_COL] for r in rows})
    report = tl.partition_balance(placed)
    assert (report.num_partitions, report.total) == (10_000, 100)
