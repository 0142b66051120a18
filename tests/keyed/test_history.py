"""A keyed run's history records: one per committed batch on the state path, holding what the
tasks measured (rows, task time, late rows by key and partition watermark, hot keys, a key
sample) and what the driver did (swaps, requests), bounded by ``spark.trilink.historyBatches``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import RunningCount
from trilink_spark.errors import InvalidArgumentError, StateCorruptError
from trilink_spark.keyed.records.history import (HOT_KEYS, SAMPLE_KEYS, display_key,
                                                 history_batches, key_profile, read_history)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def skewed(spark: Any, b: int, rows: int = 3_000) -> tuple[Any, pd.DataFrame]:
    """One hot key (40 % of the rows), 300 others; event times slightly out of order."""
    rng = np.random.default_rng(7 + b)
    keys = np.where(rng.random(rows) < 0.4, "hot", [f"k{i:03d}" for i in rng.integers(0, 300, rows)])
    t = np.arange(b * rows, (b + 1) * rows, dtype=np.int64) - rng.integers(0, 50, rows)
    frame = pd.DataFrame({"k": keys, "t": t})
    return spark.createDataFrame(frame), frame


def make_run(tmp_path: Path, **kw: Any) -> Any:
    kw.setdefault("num_partitions", 4)
    return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 20,
                                  str(tmp_path / "state"), **kw)


def test_each_batch_leaves_a_record_of_what_its_tasks_measured(spark: Any,
                                                                tmp_path: Path) -> None:
    run = make_run(tmp_path, strategy="least_count")
    frames = []
    for b in range(3):
        df, frame = skewed(spark, b)
        run(df, b)
        frames.append(frame)
    records = read_history(run.store)
    assert [r["batch"] for r in records] == [0, 1, 2]
    owners = run.owners()
    late_total = 0
    for record, frame in zip(records, frames):
        n = record["partitions"]
        assert n == 4 and record["strategy"] == "least_count"
        expected = [0] * n  # each partition's rows, from the placement in force
        for key, c in frame["k"].value_counts().items():
            expected[owners[key]] += int(c)
        assert record["rows"] == expected
        assert all(ms > 0 for ms, r in zip(record["task_ms"], record["rows"]) if r > 0)
        hot = record["hot_keys"]
        assert hot[0] == ["hot", int((frame["k"] == "hot").sum()), owners["hot"]]
        assert len(hot) == HOT_KEYS and [h[1] for h in hot] == sorted(
            (h[1] for h in hot), reverse=True)
        weights = dict(zip(record["sample"]["keys"], record["sample"]["weights"]))
        assert weights["hot"] == hot[0][1]  # heaviest keys exact, the rest scaled
        assert sum(weights.values()) == pytest.approx(len(frame), rel=0.15)
        assert all(late >= 0 for late in record["late"] + record["late_partition"])
        late_total += sum(record["late"])
    counters = run.counters()
    assert late_total == counters["late"] > 0  # the batches' late rows, as the run counts them
    assert sum(sum(r["late_partition"]) for r in records) == counters["late_partition"]
    assert counters["late_partition"] > counters["late"]  # a partition watermark drops more


def test_a_swap_and_its_request_are_recorded_at_their_batch(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, strategy="hash")
    for b in range(2):
        run(skewed(spark, b)[0], b)
    run.request_swap("least_count", refit="none")
    run(skewed(spark, 2)[0], 2)
    record = read_history(run.store, since=1)[0]
    report = run.swaps[-1]
    assert record["batch"] == 2 and record["strategy"] == "least_count"
    assert record["swap"]["moved_keys"] == report.moved_keys > 0
    assert record["swap"]["moved_bytes"] == report.moved_bytes > 0
    assert record["swap"]["seconds"] == pytest.approx(report.seconds)
    assert record["request"]["strategy"] == "least_count" and record["request"]["request_id"]
    assert read_history(run.store, since=1, last=5) == [record]
    assert [r["swap"] for r in read_history(run.store)[:2]] == [None, None]


def test_the_state_path_keeps_only_the_newest_batches(spark: Any, tmp_path: Path) -> None:
    spark.conf.set("spark.trilink.historyBatches", "2")
    try:
        run = make_run(tmp_path)
        for b in range(5):
            run(skewed(spark, b, rows=200)[0], b)
    finally:
        spark.conf.unset("spark.trilink.historyBatches")
    assert history_batches(run.store) == [3, 4]
    assert [r["batch"] for r in read_history(str(tmp_path / "state"), last=1)] == [4]
    spark.conf.set("spark.trilink.historyBatches", "zero")
    try:
        with pytest.raises(InvalidArgumentError, match="historyBatches"):
            make_run(tmp_path / "other")(skewed(spark, 0, rows=50)[0], 0)
    finally:
        spark.conf.unset("spark.trilink.historyBatches")


def test_a_damaged_or_foreign_record_is_refused_by_name(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    for b in range(2):
        run(skewed(spark, b, rows=200)[0], b)
    path = Path(run.store.record_path("history-000000000001"))
    path.write_bytes(path.read_bytes().replace(b"\"batch\": 1,", b"\"batch\": 7,"))
    with pytest.raises(StateCorruptError, match="history-000000000001"):
        read_history(run.store)
    assert [r["batch"] for r in read_history(run.store, skip_corrupt=True)] == [0]
    # a well-sealed record of another layout is refused too
    run.store.save_record("history-000000000002", {"v": 99, "batch": 2})
    with pytest.raises(StateCorruptError, match="not a history record"):
        read_history(run.store, since=1)


def test_a_key_profile_counts_exactly_and_samples_the_rest() -> None:
    rng = np.random.default_rng(3)
    keys = np.concatenate([np.repeat(np.arange(5), 1000), rng.integers(100, 10_000, 20_000)])
    rng.shuffle(keys)
    profile = key_profile(pa.array(keys))
    assert {k for k, _ in profile["hot"][:5]} == set(range(5))
    assert [n for _, n in profile["hot"][:5]] == [1000] * 5
    assert len(profile["sample"]) == SAMPLE_KEYS
    total = sum(n for _, n in profile["hot"]) + sum(w for _, w in profile["sample"])
    assert total == pytest.approx(len(keys), rel=0.1)
    assert profile["keys"] == len(np.unique(keys))
    assert key_profile(pa.array([], pa.string())) == {"hot": [], "sample": [], "keys": 0}
    json.dumps(key_profile(pa.array([b"\x00" * 100, None, b"x"])), allow_nan=False)
    assert display_key(float("inf")) == "inf" and display_key(2**70) == 2**70
