"""``strategy="auto"`` scores its candidates on at most about twice ``max_keys`` sampled keys:
the heaviest exactly, a uniform share of the light ones scaled up, never every key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.errors import NullKeyError
from trilink_spark.placement.fit import key_counts, sampled_counts

LIMIT = 500


def zipf_frame(spark: Any, keys: int, rows: int, ddl: str = "bigint", nulls: int = 0,
               seed: int = 3) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, keys + 1) ** 1.1
    picked = rng.choice(keys, size=rows, p=weights / weights.sum())
    values: list[Any] = [int(v) if ddl != "string" else f"k{v}" for v in picked]
    frame = pd.DataFrame({"k": pd.Series(values + [None] * nulls, dtype=object)})
    counts = frame["k"].value_counts()
    return spark.createDataFrame(frame, f"k {ddl}"), counts


@pytest.mark.parametrize("ddl", ["bigint", "string"])
def test_sampled_counts_keep_the_heaviest_exactly_and_a_share_of_the_rest(
        spark: Any, ddl: str) -> None:
    df, counts = zipf_frame(spark, 20_000, 60_000, ddl, nulls=7)
    table, rows, exact = sampled_counts(df, "k", 1.0, 0, "group", LIMIT)
    assert not exact and rows == 60_007
    assert table.num_rows <= 2.3 * LIMIT  # never every key: ~15,000 distinct
    got = dict(zip(table.column("k").to_pylist(), table.column("count").to_pylist()))
    assert got.pop(None) == 7  # the null key, exact, last
    assert table.column("k").to_pylist()[-1] is None
    heaviest = counts.sort_values(ascending=False, kind="stable")
    top = heaviest.index[: LIMIT // 2]
    for k in top:  # far above the cut: exact
        assert got[k] == counts[k]
    light = [k for k in got if counts[k] < heaviest.iloc[LIMIT - 1]]
    assert light, "no light key was sampled"
    steps = {got[k] // counts[k] for k in light}
    assert len(steps) == 1 and steps.pop() > 1  # scaled by one step
    assert abs(sum(got.values()) - 60_000) / 60_000 < 0.1  # the scaled sum is about right


def test_sampled_counts_count_every_key_below_the_limit(spark: Any) -> None:
    df, counts = zipf_frame(spark, 300, 5_000)
    table, rows, exact = sampled_counts(df, "k", 1.0, 0, "group", LIMIT)
    assert exact and rows == 5_000
    assert table.equals(key_counts(df, "k", 1.0, 0, "group"))
    with pytest.raises(NullKeyError):
        sampled_counts(zipf_frame(spark, 20_000, 30_000, nulls=1)[0], "k", 1.0, 0, "error",
                       LIMIT)


def test_auto_on_many_keys_scores_the_bounded_tables_on_a_bounded_sample(
        spark: Any) -> None:
    """50,000 Zipf keys, entries bounded at 500: auto scores on a bounded sample of keys,
    picks a table strategy over hash (the heavy keys unbalance hash), refits it on every row
    (fit="full") as a bounded table, and places every row of a key on one partition."""
    df, counts = zipf_frame(spark, 50_000, 200_000)
    spark.conf.set("spark.trilink.table.maxKeys", str(LIMIT))
    try:
        chosen = tl.resolve_strategy(df, "k", "auto", 8, sample_rate=0.5, seed=1)
        p = chosen.partitioner
        placed = tl.key_by(df, "k", p, 8, fit="none")
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")
    names = {s.name: s for s in chosen.scores}
    assert names["least_count"].bounded and names["least_count"].partitioner.max_keys == LIMIT
    assert names["least_count"].balance_degree > names["hash"].balance_degree
    assert p.strategy_name in ("least_count", "least_key") and p.bounded and len(p) <= LIMIT
    from pyspark.sql import functions as F

    per = placed.groupBy(F.spark_partition_id().alias("p"), "k").count() \
        .groupBy("k").agg(F.countDistinct("p").alias("n")).where("n > 1").count()
    assert per == 0
    loads = placed.groupBy(F.spark_partition_id()).count().toPandas()["count"]
    hash_loads = df.repartition(8, "k").groupBy(F.spark_partition_id()).count() \
        .toPandas()["count"]
    assert loads.min() / loads.max() >= hash_loads.min() / hash_loads.max()
