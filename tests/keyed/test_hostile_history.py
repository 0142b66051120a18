"""Hostile probes of a keyed run's history: forged key profiles in the tasks' timing records,
hostile key types on 1 and 64 partitions, malformed retention confs, a replayed batch, a
restart from the state path, the record size at 10,000 partitions, and the cost of a key
profile on a million distinct keys."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import RunningCount
from trilink_spark._internal.io.sealed import seal
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.keyed.records.history import (HOT_KEYS, MAX_SAMPLE, history_batches,
                                                 key_profile, read_history, record_batch)
from trilink_spark.state import KeyedStateStore
from trilink_spark.state.formats import MAX_PROFILE_KEY_CHARS, MAX_RECORD_BYTES

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Count(tl.KeyedWatermarkProcessFunction):
    """Rows per key so far, whatever the key's type."""

    output_schema = "n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(n,)]


def write_timing(store: KeyedStateStore, partition: int, batch: int, raw: str) -> None:
    """A task's timing record as ``raw`` JSON says (NaN and 400-digit numbers included)."""
    path = store.timing_path(partition, batch)
    store.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with store.fs.open_output_stream(path) as out:
        out.write(json.dumps(seal(json.loads(raw))).encode())


FORGED = {
    "nan key": '[[NaN, 3]]',
    "int beyond int64": '[[%d, 3]]' % 2**70,
    "a 1 MB key": '[["%s", 3]]' % ("x" * 1_100_000),
    "a 400-digit weight": '[["a", 1%s]]' % ("0" * 400),
    "an infinite weight": '[["a", 1e400]]',
    "a nested key": '[[["a"], 3]]',
}


@pytest.mark.parametrize("forged", sorted(FORGED))
def test_a_forged_key_profile_is_left_out_and_the_batch_keeps_its_record(
        tmp_path: Path, forged: str, caplog: pytest.LogCaptureFixture) -> None:
    from trilink_spark.ui.model import DashboardModel

    store = KeyedStateStore(str(tmp_path / "state"))
    write_timing(store, 0, 5, '{"rows": 3, "process_ms": 1.5, "late": 1, '
                 '"keys": {"hot": %s, "sample": [], "keys": 1}}' % FORGED[forged])
    write_timing(store, 1, 5, '{"rows": 4, "process_ms": 2.0, '
                 '"keys": {"hot": [["ok", 4]], "sample": [], "keys": 1}}')
    assert store.timing(0, 5) is not None  # read, not raised (OverflowError before)
    written = record_batch(store, 5, 2, "hash", seconds=0.1, keep=10)
    assert written is not None and "not written" not in caplog.text
    [kept] = read_history(store)
    assert kept["rows"] == [3, 4] and kept["task_ms"] == [1.5, 2.0] and kept["late"][0] == 1
    assert kept["hot_keys"] == [["ok", 4, 1]]  # partition 0's profile left out
    assert "key profile is not well-formed" in caplog.text
    model = DashboardModel()
    assert model.add_record(kept)
    json.loads(model.snapshot_json()["hot_keys"])


def test_a_record_of_10000_partitions_with_the_longest_keys_fits() -> None:
    partitions = 10_000
    longest = "k" * MAX_PROFILE_KEY_CHARS
    body = {"v": 1, "batch": 2**40, "time": 1795000000.123, "seconds": 12.3456,
            "strategy": "least_count", "partitions": partitions,
            "rows": [9_999_999] * partitions, "task_ms": [123456.789] * partitions,
            "late": [999_999] * partitions, "late_partition": [999_999] * partitions,
            "hot_keys": [[longest, 9_999_999, partitions - 1]] * HOT_KEYS,
            "sample": {"keys": [longest] * MAX_SAMPLE, "weights": [1234567.891] * MAX_SAMPLE},
            "swap": None, "request": None, "rebalance": None}
    size = len(json.dumps(seal(body), sort_keys=True).encode())
    assert size < MAX_RECORD_BYTES


def test_a_key_profile_of_a_million_distinct_keys_is_linear() -> None:
    rng = np.random.default_rng(1)
    times = []
    for n in (100_000, 1_000_000):
        keys = pa.array(rng.permutation(n))
        started = time.perf_counter()
        profile = key_profile(keys)
        times.append(time.perf_counter() - started)
        assert profile["keys"] == n and len(profile["hot"]) == HOT_KEYS
        assert sum(w for _, w in profile["sample"]) + HOT_KEYS == pytest.approx(n, rel=1e-6)
    assert times[1] < 3.0 and times[1] < 40 * times[0] + 0.1


HOSTILE_KEYS = {
    "double": "case when id % 4 = 0 then double('NaN') when id % 4 = 1 then double('inf') "
              "else double(id % 4) end",
    "bigint": "case when id % 3 = 0 then 9223372036854775807 when id % 3 = 1 "
              "then -9223372036854775808 else null end",
    "binary": "cast(repeat(cast(id % 3 as string), 100) as binary)",
    "string": "case when id = 0 then repeat('x', 1048576) when id % 3 = 1 then '' "
              "else '\U0001F600</script>' end",
    "boolean": "id % 2 = 0",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_KEYS))
def test_hostile_keys_on_one_partition_give_a_record_the_view_reads(
        spark: Any, tmp_path: Path, kind: str) -> None:
    from trilink_spark.ui.model import DashboardModel

    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Count(), 20,
                                 str(tmp_path / "state"), num_partitions=1)
    df = spark.range(30).selectExpr(f"{HOSTILE_KEYS[kind]} as k", "double(id) as t")
    run(df, 0)
    [kept] = read_history(run.store)
    assert kept["rows"] == [30]
    assert sum(n for _, n, _ in kept["hot_keys"]) == 30
    assert all(len(k) <= MAX_PROFILE_KEY_CHARS for k, _, _ in kept["hot_keys"]
               if isinstance(k, str))
    model = DashboardModel()
    assert model.add_record(kept)
    assert len(json.loads(model.snapshot_json()["hot_keys"])["key"]) == len(kept["hot_keys"])


def test_64_partitions_a_replay_and_a_restart_keep_one_record_per_batch(
        spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "state")

    def runner(**kw: Any) -> Any:
        return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 20,
                                      path, num_partitions=64, **kw)

    def batch(b: int, rows: int) -> Any:
        return spark.range(rows).selectExpr(f"concat('k', id % 97) as k",
                                            f"double(id + {b * 1000}) as t")

    run = runner()
    run(batch(0, 500), 0)
    run(batch(0, 500), 0)  # replayed with the same id
    run = runner(takeover=True)  # a restart from the state path
    run(batch(1, 200), 1)
    kept = read_history(path)
    assert [r["batch"] for r in kept] == [0, 1]
    assert [sum(r["rows"]) for r in kept] == [500, 200]
    assert all(r["partitions"] == 64 and len(r["task_ms"]) == 64 for r in kept)


@pytest.mark.parametrize("conf", ["0", "-3", "1e3", "ten", "2.5"])
def test_a_malformed_retention_conf_fails_the_batch_before_its_work(
        spark: Any, tmp_path: Path, conf: str) -> None:
    spark.conf.set("spark.trilink.historyBatches", conf)
    try:
        run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 20,
                                     str(tmp_path / "state"), num_partitions=2)
        df = spark.range(10).selectExpr("string(id % 3) as k", "double(id) as t")
        with pytest.raises(InvalidArgumentError, match="historyBatches"):
            run(df, 0)
    finally:
        spark.conf.unset("spark.trilink.historyBatches")
    assert run.store.read_manifest() is None  # nothing committed, nothing claimed
    assert history_batches(run.store) == []
    run(df, 0)  # the conf put right, the same batch runs
    assert [r["batch"] for r in read_history(run.store)] == [0]


def test_a_retention_of_one_keeps_the_newest_record_only(spark: Any, tmp_path: Path) -> None:
    spark.conf.set("spark.trilink.historyBatches", "1")
    try:
        run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 20,
                                     str(tmp_path / "state"), num_partitions=2)
        for b in range(3):
            run(spark.range(10).selectExpr("string(id % 3) as k", f"double(id + {b})"
                                           " as t"), b)
    finally:
        spark.conf.unset("spark.trilink.historyBatches")
    assert history_batches(run.store) == [2]
