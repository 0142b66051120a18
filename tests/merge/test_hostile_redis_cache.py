"""Hostile pass on the cached Redis clients and the one-trip counting flush: a redis-server
restarted between batches (its data and scripts gone) must not fail the next batch, and a
replayed flush id must add nothing."""

from __future__ import annotations

from typing import Any

import trilink_spark as tl
from trilink_spark.merge import RedisStore


def counts(out: Any) -> dict[Any, int]:
    return {r["k"]: r["n"] for r in out.collect()}


def test_a_restarted_server_is_reconnected_and_scripts_reloaded(spark: Any, own_redis: Any) -> None:
    df = spark.createDataFrame([(i % 3, i) for i in range(30)], "k int, v bigint").coalesce(2)
    store = RedisStore(own_redis.url, "t:restart", socket_timeout=2.0)
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    first = tl.global_merge(df, "k", aggs, store=store, batch_id=0)
    assert first is not None and counts(first) == {0: 10, 1: 10, 2: 10}
    own_redis.stop()
    own_redis.start()  # nothing persisted: the keys, markers and scripts are gone
    again = tl.global_merge(df, "k", aggs, store=store, batch_id=1)
    assert again is not None and counts(again) == {0: 10, 1: 10, 2: 10}
    # the same batch id replayed adds nothing, on the one-trip path too
    replay = tl.global_merge(df, "k", aggs, store=store, batch_id=1)
    assert replay is not None and counts(replay) == {0: 10, 1: 10, 2: 10}
