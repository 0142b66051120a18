"""Global Merge into Redis: exact results, exactly once under task retries and replays."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import StoreUnavailableError
from trilink_spark.merge import Combine, RedisStore
from conftest import assert_same_aggregates as same

cloudpickle.register_pickle_by_value(sys.modules[__name__])

AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "m": ("mean", "v")}


def frame(spark: Any, seed: int = 0, n: int = 8000) -> Any:
    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame({"k": rng.integers(0, 60, n), "t": rng.integers(0, 900, n),
                        "v": rng.normal(size=n)})
    pdf.loc[rng.random(n) < 0.1, "v"] = np.nan
    pdf.loc[pdf["k"] == 5, "v"] = np.nan
    return spark.createDataFrame(pdf).repartition(3).cache()


def truth(df: Any) -> pd.DataFrame:
    return (df.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"),
                                F.min("v").alias("lo"), F.max("v").alias("hi"),
                                F.avg("v").alias("m")).orderBy("k").toPandas())


class FailOnce(RedisStore):
    """Fails the first attempt of partition 0 right after its first flush was applied."""

    def apply(self, deltas: pd.DataFrame, key: str, specs: Any, marker: str) -> bool:
        from pyspark import TaskContext

        done = super().apply(deltas, key, specs, marker)
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected task failure after a flush was applied")
        return done


def test_global_merge_into_redis_equals_group_by(spark: Any, redis_server: Any) -> None:
    df = frame(spark)
    store = RedisStore(redis_server.url, "t:exact")
    got = tl.global_merge(df, "k", AGGS, store=store, quantity=1000)
    assert got is not None
    same(got.toPandas(), truth(df))
    assert store.applied_flushes() <= df.count() / 1000 + 3  # one per 1,000 rows, plus tails
    same(store.read(spark).toPandas(), truth(df))  # key and aggregates kept with the store
    store.clear()
    df.unpersist()


def test_replayed_batch_never_counts_twice(spark: Any, redis_server: Any) -> None:
    df = frame(spark, 1)
    store = RedisStore(redis_server.url, "t:replay")
    tl.global_merge(df, "k", AGGS, store=store, batch_id=11, read=False)
    flushes = store.applied_flushes()
    got = tl.global_merge(df, "k", AGGS, store=store, batch_id=11)
    assert store.applied_flushes() == flushes
    assert got is not None
    same(got.toPandas(), truth(df))
    store.clear()
    df.unpersist()


def test_retried_task_never_counts_twice(spark: Any, redis_server: Any) -> None:
    df = frame(spark, 2)
    store = FailOnce(redis_server.url, "t:retry")
    got = tl.global_merge(df, "k", AGGS, store=store, batch_id=3, quantity=500)
    assert got is not None
    same(got.toPandas(), truth(df))
    store.clear()
    df.unpersist()


def test_unreachable_redis_is_a_clear_error_and_a_retry_completes(
    spark: Any, own_redis: Any
) -> None:
    df = frame(spark, 3)
    url = own_redis.url
    own_redis.stop()
    store = RedisStore(url, "t:down", socket_timeout=0.5)
    with pytest.raises(StoreUnavailableError, match="unreachable"):
        tl.global_merge(df, "k", AGGS, store=store, batch_id=1)
    own_redis.start()
    got = tl.global_merge(df, "k", AGGS, store=store, batch_id=1)
    assert got is not None
    same(got.toPandas(), truth(df))
    df.unpersist()


def test_combines_are_refused_before_any_task(spark: Any, redis_server: Any) -> None:
    df = spark.createDataFrame([(1, 1, 3)], "k long, t long, v long")
    store = RedisStore(redis_server.url, "t:combine")
    with pytest.raises(ValueError, match="Combine"):
        tl.global_merge(df, "k", {"x": (Combine(np.bitwise_or.reduce, "bigint"), "v")},
                        store=store)
    assert store.applied_flushes() == 0
