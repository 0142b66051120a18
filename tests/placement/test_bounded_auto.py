"""``strategy="auto"`` scores the table strategies bounded at ``spark.trilink.table.maxKeys``,
as ``key_by`` builds them by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import trilink_spark as tl

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


def test_auto_on_many_keys_scores_the_bounded_tables(spark: Any) -> None:
    """50,000 Zipf keys, entries bounded at 500: auto scores the bounded tables, picks a table
    strategy over hash (the heavy keys unbalance hash), refits it on every row
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
