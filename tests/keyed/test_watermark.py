"""keyed_watermark against a row-by-row model, on several partitions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.errors import MissingColumnError


def model(rows: pd.DataFrame, delay: float, group_of: Any) -> pd.DataFrame:
    """Row by row, in arrival order: the brute-force definition."""
    key_high: dict[Any, float] = {}
    part_high: dict[int, float] = {}
    out = []
    for r in rows.sort_values("arr").itertuples():
        g = group_of(r.k)
        kw = key_high.get(g)
        pw = part_high.get(r.part)
        out.append({
            "arr": r.arr,
            "key_watermark": None if kw is None else kw - delay,
            "is_late": kw is not None and r.t < kw - delay,
            "is_late_partition": pw is not None and r.t < pw - delay,
        })
        key_high[g] = max(kw, r.t) if kw is not None else r.t
        part_high[r.part] = max(pw, r.t) if pw is not None else r.t
    return pd.DataFrame(out).set_index("arr").sort_index()


def random_rows(seed: int, n: int = 400, keys: int = 12, parts: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    part = rng.integers(0, parts, n)
    # arrival numbers increase within each input partition (the partition's own order)
    arr = np.arange(n) * 1
    return pd.DataFrame({
        "k": rng.integers(0, keys, n),
        "t": rng.integers(0, 60, n).astype(np.int64) + arr // 10,
        "arr": arr,
        "part": part,
    })


def frame_by_part(spark: Any, rows: pd.DataFrame) -> Any:
    """One Spark input partition per value of ``part``, rows in arrival order inside it."""
    from pyspark.sql import functions as F

    sdf = spark.createDataFrame(rows)
    parts = int(rows["part"].max()) + 1
    return sdf.repartitionById(parts, F.col("part").cast("int")).sortWithinPartitions("arr")


@pytest.mark.parametrize("seed", range(3))
def test_matches_the_row_by_row_model(spark: Any, seed: int) -> None:
    rows = random_rows(seed)
    df = frame_by_part(spark, rows)
    got = (tl.keyed_watermark(df, "k", "t", 5, order_by="arr").toPandas()
           .set_index("arr").sort_index())
    want = model(rows, 5, lambda k: k)
    assert got["is_late"].tolist() == want["is_late"].tolist()
    assert got["is_late_partition"].tolist() == want["is_late_partition"].tolist()
    wm = got["key_watermark"].astype("float").fillna(-1).tolist()
    assert wm == want["key_watermark"].astype("float").fillna(-1).tolist()


def test_input_order_without_order_by(spark: Any) -> None:
    rows = random_rows(7, n=200, parts=1)
    df = spark.createDataFrame(rows).coalesce(1)
    got = tl.keyed_watermark(df, "k", "t", 3).toPandas().set_index("arr").sort_index()
    want = model(rows, 3, lambda k: k)
    assert got["is_late"].tolist() == want["is_late"].tolist()
    assert got["is_late_partition"].tolist() == want["is_late_partition"].tolist()


def test_one_group_for_all_keys_equals_a_single_watermark(spark: Any) -> None:
    rows = random_rows(3, n=300, parts=1)
    df = spark.createDataFrame(rows).coalesce(1)
    got = (tl.keyed_watermark(df, "k", "t", 4, order_by="arr", n_keys=10_000).toPandas()
           .set_index("arr").sort_index())
    want = model(rows, 4, lambda k: 0)
    assert got["is_late"].tolist() == want["is_late"].tolist()
    # one partition: the partition watermark is that same single watermark
    assert got["is_late"].tolist() == got["is_late_partition"].tolist()


def test_skewed_source_clock_late_only_at_partition_level(spark: Any) -> None:
    """Three sources in order per sensor, one 4 s ahead, interleaved in one partition."""
    rng = np.random.default_rng(0)
    rows = []
    for sensor in range(30):
        skew = 4.0 if sensor % 3 == 0 else 0.0
        for i in range(20):
            rows.append((sensor, i * 1.0 + skew))
    frame = pd.DataFrame(rows, columns=["sensor", "t"])
    frame["arr"] = rng.permutation(len(frame))
    frame = frame.sort_values("arr")
    # keep each sensor's own rows in order of time (arrival order within a sensor)
    frame["t"] = frame.groupby("sensor")["t"].transform(lambda s: np.sort(s.to_numpy()))
    frame["ts"] = pd.to_datetime(frame["t"], unit="s")
    df = spark.createDataFrame(frame[["sensor", "ts", "arr"]]).coalesce(1)
    out = tl.keyed_watermark(df, "sensor", "ts", timedelta(seconds=1), order_by="arr")
    counts = out.selectExpr("sum(int(is_late)) AS k", "sum(int(is_late_partition)) AS p").first()
    assert counts["k"] == 0
    assert counts["p"] > 100


def test_null_event_times_are_neither_late_nor_counted(spark: Any) -> None:
    df = spark.createDataFrame(
        [("a", 10, 1), ("a", None, 2), ("a", 3, 3)], "k string, t long, arr long").coalesce(1)
    got = tl.keyed_watermark(df, "k", "t", 1, order_by="arr").orderBy("arr").collect()
    assert [r["is_late"] for r in got] == [False, None, True]
    assert [r["key_watermark"] for r in got] == [None, 9, 9]


def test_argument_errors(spark: Any) -> None:
    df = spark.createDataFrame([("a", 1)], "k string, t long")
    with pytest.raises(MissingColumnError):
        tl.keyed_watermark(df, "nope", "t", 1)
    with pytest.raises(MissingColumnError):
        tl.keyed_watermark(df, "k", "t", 1, order_by="nope")
    with pytest.raises(TypeError):
        tl.keyed_watermark(df, "k", "k", 1)
    with pytest.raises(TypeError):
        tl.keyed_watermark(df, "k", "t", timedelta(seconds=1))
    with pytest.raises(ValueError):
        tl.keyed_watermark(df, "k", "t", -1)
    with pytest.raises(ValueError):
        tl.keyed_watermark(df, "k", "t", 1, n_keys=0)
    with pytest.raises(ValueError):
        tl.keyed_watermark(df.withColumn("is_late", df.t), "k", "t", 1)
