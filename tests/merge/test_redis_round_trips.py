"""RedisStore round trips: one per flush for adding aggregates, a cached client per process,
scripts without a NOSCRIPT trip; counted with Redis's own ``INFO`` counters."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import redis

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, StoreUnavailableError
from trilink_spark.merge import RedisStore
from trilink_spark.merge.stores import redis_store
from trilink_spark.merge.algebra.expressions import parse_aggs


def counters(client: Any) -> dict[str, int]:
    """Read events (the YSB runner's round trips), scripts run and connections so far."""
    stats = client.info("stats")
    commands = client.info("commandstats")
    return {"reads": int(stats["total_reads_processed"]),
            "scripts": sum(int(commands.get(f"cmdstat_{c}", {}).get("calls", 0))
                           for c in ("eval", "evalsha")),
            "connections": int(stats["total_connections_received"])}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What happened in between, less the monitor's own two INFO calls."""
    return {k: after[k] - before[k] - (2 if k == "reads" else 0) for k in before}


def counting_store(url: str, prefix: str) -> tuple[Any, Any]:
    """A cleared store of counts per string key, with its types (as global_merge sets them)."""
    specs = parse_aggs({"n": ("count", None)}, ["k"])
    store = RedisStore(url, prefix)
    store.clear()
    store.bind_schema(pa.schema([("k", pa.string()), ("n", pa.int64())]))
    store.set_meta("k", "string", specs)
    return store, specs


def deltas(keys: list[str], counts: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"k": keys, "n": pd.Series(counts, dtype="int64")})


@pytest.fixture()
def monitor(redis_server: Any) -> Any:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def test_counting_flushes_cost_one_round_trip_and_apply_once(redis_server: Any,
                                                             monitor: Any) -> None:
    redis_store.drop_cached_clients()
    store, specs = counting_store(redis_server.url, "t:trips")
    try:
        assert store.apply(deltas(["a", "b"], [2, 3]), "k", specs, "m0")  # connects, EVAL
        copy = pickle.loads(pickle.dumps(store))  # what a task gets
        before = counters(monitor)
        assert copy.apply(deltas(["a", "c"], [5, 1]), "k", specs, "m1")
        assert not copy.apply(deltas(["a"], [100]), "k", specs, "m1")  # replayed marker
        spent = delta(before, counters(monitor))
        assert spent == {"scripts": 2, "reads": 2, "connections": 0}  # two EVALSHA, no connect
        assert store.applied_flushes() == 2
        frame = store.read_frame(specs, "k").sort_values("k")
        assert frame["k"].tolist() == ["a", "b", "c"] and frame["n"].tolist() == [7, 3, 1]
    finally:
        store.clear()


def test_near_the_64_bit_limit_the_exact_merge_decides(redis_server: Any,
                                                       monitor: Any) -> None:
    store, specs = counting_store(redis_server.url, "t:trips-limit")
    try:
        assert store.apply(deltas(["a"], [2**62]), "k", specs, "m0")  # general path
        before = counters(monitor)
        assert store.apply(deltas(["a", "b"], [5, 1]), "k", specs, "m1")
        spent = delta(before, counters(monitor))
        assert spent["scripts"] == 2 and spent["reads"] == 3  # refused, read, committed
        assert store.applied_flushes() == 2
        frame = store.read_frame(specs, "k").sort_values("k")
        assert frame["n"].tolist() == [2**62 + 5, 1]
    finally:
        store.clear()


def test_a_client_that_failed_is_dropped_and_a_flushed_script_is_run_again(
        redis_server: Any, monitor: Any) -> None:
    store, specs = counting_store(redis_server.url, "t:trips-noscript")
    try:
        assert store.apply(deltas(["a"], [1]), "k", specs, "m0")
        monitor.script_flush()  # as a restarted server: EVALSHA answers NOSCRIPT
        before = counters(monitor)
        assert store.apply(deltas(["a"], [1]), "k", specs, "m1")
        assert delta(before, counters(monitor))["reads"] == 2  # NOSCRIPT, then EVAL
        broken = RedisStore("redis://127.0.0.1:1/0", "t:x", socket_timeout=0.2)
        with pytest.raises(StoreUnavailableError):
            broken.apply(deltas(["a"], [1]), "k", specs, "m0")
        assert broken._client is None and broken._client_key not in redis_store._clients
        assert store.read_frame(specs, "k")["n"].tolist() == [2]
    finally:
        store.clear()


# ---------------------------------------------------------------------- apply_on="driver"
def _frame(spark: Any, n: int, with_nulls: bool = False) -> Any:
    """``n`` rows over 50 string keys in 4 partitions, a bigint and a double column."""
    rows = [(f"k{i % 50}", i, None if with_nulls and i % 7 == 0 else i / 4) for i in range(n)]
    return spark.createDataFrame(rows, "k string, v long, d double").repartition(4)


def test_driver_apply_is_one_round_trip_per_batch_exactly_once_in_either_mode(
        spark: Any, redis_server: Any, monitor: Any) -> None:
    from pyspark.sql import functions as F

    df = _frame(spark, 2_000)
    aggs = {"n": ("count", None)}
    want = sorted(tuple(r) for r in df.groupBy("k").agg(F.count(F.lit(1)).alias("n")).collect())
    store = RedisStore(redis_server.url, "t:driver", updated_field="t")
    store.clear()
    try:
        tl.global_merge(df, "k", aggs, store=store, batch_id=0, read=False,
                        apply_on="driver")  # connects and loads the script
        before = counters(monitor)
        tl.global_merge(df, "k", aggs, store=store, batch_id=1, read=False, apply_on="driver")
        # 4 partitions, every flush and the metadata: one script, one round trip
        assert delta(before, counters(monitor)) == {"scripts": 1, "reads": 1,
                                                    "connections": 0}
        for mode in ("driver", "tasks"):  # a replayed batch adds nothing, in either mode
            tl.global_merge(df, "k", aggs, store=store, batch_id=1, read=False, apply_on=mode)
        tl.global_merge(df, "k", aggs, store=store, batch_id=2, read=False, apply_on="tasks")
        tl.global_merge(df, "k", aggs, store=store, batch_id=2, read=False, apply_on="driver")
        got = store.read(spark)  # key and aggregates from the metadata the script wrote
        assert sorted(tuple(r) for r in got.collect()) == [(k, 3 * n) for k, n in want]
        client = redis.Redis.from_url(redis_server.url)
        stamps = [int(client.hget(f"t:driver:k:v{k}", "t")) for k, _ in want]
        client.close()
        assert all(s > 1_600_000_000_000 for s in stamps)  # commit times, in ms
        assert store.applied_flushes() == 12  # 3 batches x 4 partitions, each once
    finally:
        store.clear()


def test_driver_apply_merges_other_aggregates_in_two_round_trips(
        spark: Any, redis_server: Any, monitor: Any) -> None:
    df = _frame(spark, 1_000, with_nulls=True)
    aggs = {"n": ("count", None), "lo": ("min", "d"), "hi": ("max", "v"), "m": ("mean", "d"),
            "s": ("sum", "v")}
    store = RedisStore(redis_server.url, "t:driver-general")
    store.clear()
    try:
        want = tl.global_merge(df, "k", aggs)  # the driver store
        assert want is not None
        tl.global_merge(df, "k", aggs, store=store, batch_id=0, read=False, apply_on="driver")
        before = counters(monitor)
        tl.global_merge(df, "k", aggs, store=store, batch_id=0, read=False, apply_on="driver")
        assert delta(before, counters(monitor))["reads"] == 1  # the read finds it applied
        got = store.read(spark)
        assert sorted(map(tuple, got.collect())) == sorted(map(tuple, want.collect()))
        before = counters(monitor)
        tl.global_merge(df, "k", aggs, store=store, batch_id=1, read=False, apply_on="driver")
        spent = delta(before, counters(monitor))
        assert spent["reads"] == 2 and spent["scripts"] == 1  # one read, one commit
    finally:
        store.clear()


def test_driver_apply_refuses_bad_arguments(spark: Any, redis_server: Any) -> None:
    df = _frame(spark, 10)
    with pytest.raises(InvalidArgumentError, match="apply_on must be one of"):
        tl.global_merge(df, "k", {"n": ("count", None)}, apply_on="executors")
    with pytest.raises(InvalidArgumentError, match="updated_field"):
        RedisStore(redis_server.url, "t:x", updated_field="__v")
    store = RedisStore(redis_server.url, "t:x", updated_field="n")
    with pytest.raises(InvalidArgumentError, match="also a partial column"):
        tl.global_merge(df, "k", {"n": ("count", None)}, store=store, apply_on="driver")
