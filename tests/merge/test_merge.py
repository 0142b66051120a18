"""Local Merge and Global Merge re-aggregate exactly what the raw rows give."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import MissingColumnError
from trilink_spark.merge import Combine, local_merge_foreach_batch
from trilink_spark.placement import shuffle_exchanges
from conftest import assert_same_aggregates as same
from conftest import raw_truth
from trilink_spark.merge.engines.bounds import flush_bounds

AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "m": ("mean", "v")}


def random_frame(seed: int, n: int = 6000, keys: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame({"k": rng.integers(0, keys, n), "t": rng.integers(0, 500, n),
                        "v": rng.normal(size=n), "mark": rng.random(n) < 0.01})
    pdf.loc[rng.random(n) < 0.1, "v"] = np.nan
    pdf.loc[pdf["k"] == 3, "v"] = np.nan  # a key with only null values
    return pdf


@pytest.mark.parametrize("mode, options", [
    ("quantity", {"quantity": 700}),
    ("periodic", {"delay": 50}),
    ("punctuation", {"punctuation": "mark"}),
])
def test_local_merge_then_merge_partials_equals_group_by(spark: Any, mode: str,
                                                         options: dict[str, Any]) -> None:
    df = spark.createDataFrame(random_frame(1)).repartition(3).cache()
    partial = tl.local_merge(df, "k", "t", 100, AGGS, mode, **options)
    assert partial.count() < df.count()
    same(tl.merge_partials(partial, "k", AGGS).toPandas(), raw_truth(df))
    # with the key_by placement in between: keyed_agg on partials sums them per key
    via_keyed = tl.keyed_agg(partial, "k", F.sum("n").alias("n"), strategy="hash",
                             num_partitions=4).orderBy("k").toPandas()
    assert via_keyed["n"].tolist() == raw_truth(df)["n"].tolist()
    df.unpersist()


def test_merged_rows_carry_max_event_time_and_leave_in_slot_order(spark: Any) -> None:
    pdf = random_frame(2, n=2000)
    df = spark.createDataFrame(pdf).coalesce(1)
    partial = tl.local_merge(df, "k", "t", 100, AGGS, quantity=10_000).toPandas()
    assert shuffle_exchanges(tl.local_merge(df, "k", "t", 100, AGGS)) == 0
    slots = (pdf["t"] // 100) * 100
    want = pdf.assign(slot_start=slots).groupby(["k", "slot_start"])["t"].max()
    got = partial.set_index(["k", "slot_start"])["t"]
    assert got.sort_index().tolist() == want.sort_index().tolist()
    assert partial["slot_start"].is_monotonic_increasing  # one flush: slots in time order


def test_first_and_last_follow_event_time_then_arrival(spark: Any) -> None:
    pdf = random_frame(3, n=1500)
    df = spark.createDataFrame(pdf).coalesce(1)
    aggs = {"f": ("first", "v"), "l": ("last", "v")}
    got = tl.merge_partials(tl.local_merge(df, "k", "t", 50, aggs, quantity=97), "k", aggs)
    got = got.toPandas().set_index("k").sort_index()
    present = pdf.assign(pos=np.arange(len(pdf)))[pdf["v"].notna()]
    first = present.sort_values(["t", "pos"]).groupby("k")["v"].first()
    last = present.sort_values(["t", "pos"]).groupby("k")["v"].last()
    assert np.allclose(got.loc[first.index, "f"], first)
    assert np.allclose(got.loc[last.index, "l"], last)
    assert got.loc[3, "f"] is None or np.isnan(got.loc[3, "f"])


@pytest.mark.connect
def test_user_defined_combine(spark: Any) -> None:
    pdf = pd.DataFrame({"k": [1, 1, 2, 2, 2], "t": [1, 2, 3, 4, 5], "bits": [1, 2, 4, 4, 8]})
    df = spark.createDataFrame(pdf).repartition(2)
    aggs = {"mask": (Combine(np.bitwise_or.reduce, "bigint"), "bits")}
    got = tl.merge_partials(tl.local_merge(df, "k", "t", 10, aggs, quantity=1), "k", aggs)
    assert sorted(tuple(r) for r in got.collect()) == [(1, 3), (2, 12)]


@pytest.mark.connect
def test_global_merge_has_no_exchange_and_equals_group_by(spark: Any) -> None:
    df = spark.createDataFrame(random_frame(4)).repartition(3).cache()
    got = tl.global_merge(df, "k", AGGS, quantity=1000).toPandas()
    same(got, raw_truth(df))
    periodic = tl.global_merge(df, "k", AGGS, mode="periodic", event_time="t", delay=30)
    same(periodic.toPandas(), raw_truth(df))
    df.unpersist()


def test_flush_bounds_modes() -> None:
    et = np.array([0.0, 1, 2, 3, 4, 5])
    assert flush_bounds(et, "quantity", 4, 0, None) == [4, 6]
    assert flush_bounds(et, "punctuation", 0, 0, np.array([0, 1, 0, 0, 1, 0], bool)) == [2, 5, 6]
    assert flush_bounds(et, "periodic", 0, 1.5, None) == [2, 4, 6]
    assert flush_bounds(np.array([]), "quantity", 3, 0, None) == []


@pytest.mark.connect
def test_argument_errors(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    with pytest.raises(ValueError):
        tl.local_merge(df, "k", "t", 10, {"x": ("median", "v")})
    with pytest.raises(ValueError):
        tl.local_merge(df, "k", "t", 10, {"x": ("sum", None)})
    with pytest.raises(ValueError):
        tl.local_merge(df, "k", "t", 10, AGGS, mode="sometimes")
    with pytest.raises(ValueError):
        tl.local_merge(df, "k", "t", 10, AGGS, mode="periodic")
    with pytest.raises(ValueError):
        tl.local_merge(df, "k", "t", 0, AGGS)
    with pytest.raises(MissingColumnError):
        tl.local_merge(df, "nope", "t", 10, AGGS)
    with pytest.raises(ValueError):
        tl.global_merge(df, "k", AGGS, store="zookeeper")


def test_streaming_buffers_carry_across_micro_batches(spark: Any, tmp_path: Any) -> None:
    pdf = random_frame(5, n=3000)
    parts = [pdf.iloc[i * 1000:(i + 1) * 1000] for i in range(3)]
    emitted: list[pd.DataFrame] = []
    run = local_merge_foreach_batch(lambda df, b: emitted.append(df.toPandas()), "k", "t",
                                    100, AGGS, str(tmp_path / "merge"), quantity=700)
    for batch_id, part in enumerate(parts):
        run(spark.createDataFrame(part).coalesce(1), batch_id)
    flushed = pd.concat(emitted, ignore_index=True)
    assert flushed["n"].sum() == 2800  # 4 flushes of 700; 200 rows wait in the buffer
    assert run.buffered() == 200
    rest = run.flush_remaining()
    merged = pd.concat([flushed, rest], ignore_index=True).groupby("k")["n"].sum()
    assert merged.sort_index().tolist() == pdf.groupby("k").size().sort_index().tolist()
    # a replay of the last batch id gives the same partials and buffer
    before = run.store.latest(0)
    run(spark.createDataFrame(parts[2]).coalesce(1), 2)
    pd.testing.assert_frame_equal(
        emitted[-1].sort_values(["k", "slot_start"]).reset_index(drop=True),
        emitted[2].sort_values(["k", "slot_start"]).reset_index(drop=True))
    assert run.store.latest(0) == before
