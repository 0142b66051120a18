"""Hostile inputs and faults for ``global_merge(..., apply_on="driver")``, RedisStore's
``apply_flushes``/``updated_field`` and ``lean_client``, on real redis-servers (no mocks)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import StoreUnavailableError
from trilink_spark.merge import RedisStore
from trilink_spark.merge.algebra.expressions import parse_aggs
from trilink_spark.merge.stores.redis_store import lean_client
from trilink_spark.testing import free_port

PW = "s3cret-pw"
AGGS = {"n": ("count", None), "s": ("sum", "v")}
BIG = "x" * (1 << 20)
KEYS = [None, "", BIG, "😀", "a", None, "😀", "", "a", "a"]


def hostile(spark: Any) -> Any:
    return spark.createDataFrame([(k, i) for i, k in enumerate(KEYS)], "k string, v long")


def truth() -> dict[Any, tuple[int, int]]:
    out: dict[Any, tuple[int, int]] = {}
    for i, k in enumerate(KEYS):
        n, s = out.get(k, (0, 0))
        out[k] = (n + 1, s + i)
    return out


def got(frame: Any) -> dict[Any, tuple[int, int]]:
    rows = frame.collect()
    assert len(rows) == len({r.k for r in rows})  # one row per key: null and "" are two
    return {r.k: (r.n, r.s) for r in rows}


def test_bad_arguments_are_refused_typed(spark: Any, redis_server: Any) -> None:
    df = hostile(spark)
    store = RedisStore(redis_server.url, "hostile:args")
    for bad in ("nonsense", "DRIVER", ""):
        with pytest.raises(InvalidArgumentError, match="apply_on must be one of"):
            tl.global_merge(df, "k", AGGS, store=store, apply_on=bad)
    for bad in (None, ["driver"]):  # not a str: a type error, naming what is allowed
        with pytest.raises(InvalidArgumentTypeError,
                           match="apply_on must be a str, one of 'tasks', 'driver'"):
            tl.global_merge(df, "k", AGGS, store=store, apply_on=bad)  # type: ignore[arg-type]
    for field in ("n", "s", "s__n"):  # a partial column's name
        clash = RedisStore(redis_server.url, "hostile:args", updated_field=field)
        with pytest.raises(InvalidArgumentError, match="updated_field"):
            tl.global_merge(df, "k", AGGS, store=clash, apply_on="driver")
    for field in ("", "__v", "__token", 5):
        with pytest.raises(InvalidArgumentError, match="updated_field"):
            RedisStore(redis_server.url, "x", updated_field=field)  # type: ignore[arg-type]
    for timeout in (0, -1, float("nan"), float("inf"), True, "2"):
        with pytest.raises(InvalidArgumentError, match="socket_timeout"):
            RedisStore(redis_server.url, "x", socket_timeout=timeout)  # type: ignore[arg-type]


def test_hostile_keys_apply_once_whatever_the_mode_replaying(spark: Any,
                                                            redis_server: Any) -> None:
    """null, empty, 1 MB and emoji keys; a batch replayed in its own mode and in the other;
    the key's name as updated_field (the key is not a hash field)."""
    store = RedisStore(redis_server.url, "hostile:keys", updated_field="k")
    store.clear()
    df = hostile(spark).repartition(3)
    try:
        assert got(tl.global_merge(df, "k", AGGS, store=store, apply_on="driver",
                                   batch_id=1)) == truth()
        applied = store.applied_flushes()
        assert 1 <= applied <= 3
        for mode in ("driver", "tasks"):  # replays: nothing applied twice
            assert got(tl.global_merge(df, "k", AGGS, store=store, apply_on=mode,
                                       batch_id=1)) == truth()
            assert store.applied_flushes() == applied
        tasks_first = RedisStore(redis_server.url, "hostile:keys2")
        tasks_first.clear()
        tl.global_merge(df, "k", AGGS, store=tasks_first, apply_on="tasks", batch_id=-7,
                        read=False)
        assert got(tl.global_merge(df, "k", AGGS, store=tasks_first, apply_on="driver",
                                   batch_id=-7)) == truth()
        # the general (two-trip) path: a mean and a max of the 1 MB keys, replayed
        general = {"m": ("mean", "v"), "mx": ("max", "k")}
        twice = RedisStore(redis_server.url, "hostile:keys3", updated_field="when")
        twice.clear()
        for _ in range(2):
            rows = {r.k: (r.m, r.mx) for r in tl.global_merge(
                df, "k", general, store=twice, apply_on="driver", batch_id=3).collect()}
        assert rows[BIG] == (2.0, BIG) and rows[None] == (2.5, None)
        assert rows["a"] == (7.0, "a") and rows[""] == (4.0, "")
    finally:
        store.clear()


def test_a_batch_without_rows(spark: Any, redis_server: Any) -> None:
    store = RedisStore(redis_server.url, "hostile:empty")
    store.clear()
    empty = spark.createDataFrame([], "k string, v long")
    for _ in range(2):  # replayed too
        assert tl.global_merge(empty, "k", AGGS, store=store, apply_on="driver",
                               batch_id=0).collect() == []
        assert tl.global_merge(empty, "k", AGGS, store=store, apply_on="driver",
                               batch_id=1, read=False) is None
    assert store.applied_flushes() == 0


def test_redis_down_during_apply_then_rerun_applies_the_rest_once(spark: Any,
                                                                  own_redis: Any) -> None:
    from pyspark.sql import functions as F

    df = hostile(spark).coalesce(2)
    store = RedisStore(own_redis.url, "hostile:down", socket_timeout=1.0)
    own_redis.stop()
    with pytest.raises(StoreUnavailableError, match="batch 5"):
        tl.global_merge(df, "k", AGGS, store=store, apply_on="driver", batch_id=5)
    own_redis.start()
    assert store.applied_flushes() == 0  # nothing half-applied
    # partition 0's flush was applied before the fault (by its own marker); the rerun applies
    # the rest, and partition 0's exactly once
    placed = df.withColumn("p", F.spark_partition_id()).collect()
    first = Counter(r.k for r in placed if r.p == 0)
    sums = Counter()
    for r in placed:
        if r.p == 0:
            sums[r.k] += r.v
    assert first  # partition 0 holds rows
    specs = parse_aggs(AGGS, ["k", "v"])
    store.bind_schema(pa.schema([("k", pa.string()), ("n", pa.int64()), ("s", pa.int64()),
                                 ("s__n", pa.int64())]))
    ks = list(first)
    flush = pa.table({"k": pa.array(ks, pa.string()),
                      "n": pa.array([first[k] for k in ks], pa.int64()),
                      "s": pa.array([sums[k] for k in ks], pa.int64()),
                      "s__n": pa.array([first[k] for k in ks], pa.int64())})
    assert store.apply_flushes([("5:0:0", flush)], "k", specs) == 1
    assert got(tl.global_merge(df, "k", AGGS, store=store, apply_on="driver",
                               batch_id=5)) == truth()
    assert store.applied_flushes() == 2
    assert got(tl.global_merge(df, "k", AGGS, store=store, apply_on="driver",
                               batch_id=5)) == truth()  # and a replay adds nothing


def test_passwords_never_leak(spark: Any, redis_server: Any,
                              caplog: pytest.LogCaptureFixture) -> None:
    dead = free_port()
    caplog.set_level(logging.DEBUG)
    store = RedisStore(f"redis://:{PW}@127.0.0.1:{dead}/0", "hostile:pw",
                       socket_timeout=0.5)
    assert PW not in repr(store)
    with pytest.raises(StoreUnavailableError) as err:
        tl.global_merge(hostile(spark), "k", AGGS, store=store, apply_on="driver")
    assert PW not in str(err.value) and PW not in repr(err.value)
    urls = [f"redis://:{PW}@127.0.0.1:{dead}/0", f"redis://127.0.0.1:{dead}/0?password={PW}",
            f"redis://user:{PW}@127.0.0.1:{dead}/0", f"rediss://:{PW}@127.0.0.1:{dead}/0"]
    for url in urls:
        client = lean_client(url, timeout=0.5)
        assert PW not in repr(client)
        with pytest.raises(Exception) as failure:
            client.ping()
        assert PW not in str(failure.value)
        client.close()
    for url in (f"http://:{PW}@127.0.0.1:{dead}/0", PW, ""):
        with pytest.raises(InvalidArgumentError) as wrong:
            lean_client(url)
        assert PW not in str(wrong.value)
    for url in (None, 5, f"redis://:{PW}@x".encode()):
        with pytest.raises(InvalidArgumentTypeError) as typed:
            lean_client(url)  # type: ignore[arg-type]
        assert PW not in str(typed.value)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        lean_client(redis_server.url, timeout=0)
    wrong_pw = lean_client(redis_server.url.replace(PW, PW + "x"), timeout=1.0)
    with pytest.raises(Exception) as denied:
        wrong_pw.ping()
    assert PW not in str(denied.value)
    wrong_pw.close()
    good = lean_client(redis_server.url, timeout=1.0)
    assert good.ping() and PW not in repr(good)
    good.close()
    assert PW not in caplog.text
