"""Local Merge on Arrow batches as they arrive (:class:`ArrowMerge`) against the pandas path
over the whole partition: the same partials, flush bounds kept, nothing lost, Spark's
semantics for nulls, NaN, infinities and integral overflow."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError
from trilink_spark.columns import ET_COL
from trilink_spark.merge.algebra.partials import arrow_partials
from trilink_spark.merge.engines.arrow_engine import ArrowMerge
from trilink_spark.merge.engines.pandas_engine import arrow_to_pandas, partition_partials
from trilink_spark.merge.engines.plan import SLOT
from trilink_spark.merge.engines.local import plan_merge

AGGS = {"n": ("count", None), "nv": ("count", "v"), "s": ("sum", "v"), "si": ("sum", "i"),
        "m": ("mean", "v"), "lo": ("min", "v"), "hi": ("max", "v"), "ilo": ("min", "i"),
        "ihi": ("max", "i"), "tag": ("max", "tag")}


def _rows(seed: int, n: int) -> pd.DataFrame:
    """Random rows: keys with nulls, values with nulls, NaN and infinities, event times with
    nulls, NaN, infinities and negative values, in no order."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, int(rng.integers(1, 60)), n).astype(object)
    keys[rng.random(n) < 0.05] = None
    v = rng.normal(size=n) * 100
    v[rng.random(n) < 0.05] = np.nan
    v[rng.random(n) < 0.01] = np.inf
    t = rng.uniform(-500, 500, n)
    t[rng.random(n) < 0.05] = np.nan
    t[rng.random(n) < 0.01] = -np.inf
    frame = pd.DataFrame({
        "k": pd.array(keys, dtype="Int64"),
        "v": pd.array(v, dtype="Float64"),
        "i": pd.array(rng.integers(-2**40, 2**40, n), dtype="Int64"),
        "t": pd.array(t, dtype="Float64"),
        "tag": rng.choice(["a", "b", "é", ""], n),
    })
    frame.loc[rng.random(n) < 0.05, "v"] = pd.NA
    frame.loc[rng.random(n) < 0.05, "t"] = pd.NA
    frame.loc[rng.random(n) < 0.05, "i"] = pd.NA
    return frame


def _source(spark: Any, frame: pd.DataFrame, mode: str, **kw: Any) -> tuple[Any, Any]:
    df = spark.createDataFrame(frame, "k bigint, v double, i bigint, t double, tag string")
    src, plan = plan_merge(df, "k", "t", 25.0, AGGS, mode, **kw)
    return src.toArrow(), plan


def _batches(table: pa.Table, rng: np.random.Generator) -> list[pa.RecordBatch]:
    """``table`` cut into batches of random sizes (empty ones too)."""
    cuts = np.sort(rng.integers(0, table.num_rows + 1, int(rng.integers(0, 8))))
    bounds = [0, *cuts.tolist(), table.num_rows]
    return [b for a, z in zip(bounds, bounds[1:]) for b in table.slice(a, z - a).to_batches()
            or [pa.RecordBatch.from_pylist([], schema=table.schema)]]


def _run(plan: Any, batches: list[pa.RecordBatch], check: Any) -> list[pa.Table]:
    merge = ArrowMerge.start(plan, batches[0])
    assert merge is not None
    out: list[pa.Table] = []
    for batch in batches:
        out += merge.add(batch)
        check(merge, out)
    out += merge.finish()
    check(merge, out)
    return out


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    slot = row[SLOT]
    return (row["k"] is None, row["k"], slot is None, slot)


def _same(a: Any, b: Any, exact: bool) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, float) and not exact:
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def _final(tables: list[pa.Table], plan: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every output merged per (key, slot), as Python rows."""
    table = pa.concat_tables(tables).rename_columns(
        [ET_COL if c == "t" else c for c in plan.arrow_schema.names])
    merged = arrow_partials(table, ["k", SLOT], plan.specs, ET_COL, merging=True)
    return {_key(r): r for r in merged.to_pylist()}


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["groups", "quantity"])
def test_arrow_merge_equals_the_pandas_path(spark: Any, seed: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    frame = _rows(seed, int(rng.integers(1, 3000)))
    max_groups = int(rng.integers(1, 80)) if seed % 2 else 1_000_000
    quantity = int(rng.integers(1, 500))
    table, plan = _source(spark, frame, mode, max_groups=max_groups, quantity=quantity)
    batches = _batches(table, rng)
    seen = {"rows": 0}

    def check(merge: ArrowMerge, out: list[pa.Table]) -> None:
        # invariants after every batch: flushes within the bound, buffer within the bound
        for flushed in out:
            groups = {(r["k"], r[SLOT]) for r in flushed.select(["k", SLOT]).to_pylist()}
            assert len(groups) == flushed.num_rows  # one row per (key, slot) per flush
            if mode == "groups":
                assert flushed.num_rows <= max_groups
        if mode == "groups":
            assert sum(p.num_rows for p in merge.pieces) <= max_groups or len(merge.pieces) == 1
        seen["rows"] = merge.rows_in

    got = _run(plan, batches, check)
    assert seen["rows"] == table.num_rows  # every row taken
    want = partition_partials(arrow_to_pandas(table), plan)
    if mode == "quantity" or len(batches) == 1 or max_groups == 1_000_000:
        # same flushes as the whole-partition path: the very same rows in the same order
        assert sum(t.num_rows for t in got) == len(want.frame)
    want_table = pa.Table.from_pandas(want.frame, preserve_index=False) if len(want.frame) \
        else None
    mine = _final(got, plan) if got else {}
    theirs = _final([want_table], plan) if want_table is not None else {}
    assert mine.keys() == theirs.keys()
    for group, row in mine.items():
        for col, value in row.items():
            exact = col not in ("s", "m__sum")  # float sums: summation order differs
            assert _same(value, theirs[group][col], exact), (group, col, value,
                                                              theirs[group][col])
    # counts conserve the rows: every input row is in exactly one partial
    assert sum(r["n"] for r in mine.values()) == table.num_rows


def test_rows_in_one_batch_flush_exactly_as_the_pandas_path(spark: Any) -> None:
    frame = _rows(7, 2000)
    table, plan = _source(spark, frame, "groups", max_groups=13)
    got = _run(plan, table.combine_chunks().to_batches(), lambda m, o: None)
    want = partition_partials(arrow_to_pandas(table), plan)
    pieces = list(want.pieces())
    assert [t.num_rows for t in got] == [len(p) for p in pieces]
    for mine, theirs in zip(got, pieces):  # the same groups in each flush, in slot order
        rows = mine.select(["k", SLOT]).to_pylist()
        assert sorted(rows, key=_key) == sorted(
            theirs[["k", SLOT]].astype(object).where(theirs[["k", SLOT]].notna(), None)
            .to_dict("records"), key=_key)
        slots = [math.inf if r[SLOT] is None else r[SLOT] for r in rows]
        assert slots == sorted(slots)


def test_spark_semantics_of_nan_and_nulls_in_arrow_partials() -> None:
    rows = pa.table({"k": [1, 1, 2, 2, None, None], "t": [1.0, 2.0, None, 3.0, 4.0, 5.0],
                     "v": [1.0, float("nan"), None, None, float("nan"), 2.0]})
    specs = tl.merge.algebra.expressions.parse_aggs(
        {"hi": ("max", "v"), "lo": ("min", "v"), "s": ("sum", "v"), "n": ("count", "v")},
        ["k", "v"])
    got = arrow_partials(rows, ["k"], specs, "t").to_pylist()
    by_key = {r["k"]: r for r in got}
    assert math.isnan(by_key[1]["hi"]) and by_key[1]["lo"] == 1.0  # NaN above all numbers
    assert by_key[2]["hi"] is None and by_key[2]["s"] is None and by_key[2]["n"] == 0
    assert by_key[2]["t"] == 3.0  # rows without a time move no maximum
    assert math.isnan(by_key[None]["hi"]) and by_key[None]["lo"] == 2.0


def test_integral_sum_overflow_is_refused_in_the_arrow_path() -> None:
    rows = pa.table({"k": [1, 1, 2], "t": [0.0, 1.0, 2.0],
                     "v": pa.array([2**62, 2**62, 5], pa.int64())})
    specs = tl.merge.algebra.expressions.parse_aggs({"s": ("sum", "v")}, ["k", "v"])
    with pytest.raises(ArithmeticOverflowError, match="'s'"):
        arrow_partials(rows, ["k"], specs, "t")
    near = pa.table({"k": [1, 1], "t": [0.0, 1.0], "v": pa.array([2**62, 2**62 - 1], pa.int64())})
    assert arrow_partials(near, ["k"], specs, "t")["s"].to_pylist() == [2**63 - 1]
    low = pa.table({"k": [1, 1], "t": [0.0, 1.0], "v": pa.array([-2**62, -2**62], pa.int64())})
    assert arrow_partials(low, ["k"], specs, "t")["s"].to_pylist() == [-2**63]


def test_plans_without_an_arrow_form_take_the_pandas_path(spark: Any) -> None:
    df = spark.createDataFrame([(0.5, 1.0, 2.0), (-0.0, 2.0, 3.0), (0.0, 3.0, 4.0)],
                               "k double, t double, v double")
    _, float_key = plan_merge(df, "k", "t", 10.0, {"n": ("count", None)})
    batch = pa.RecordBatch.from_pydict({"k": [0.0], "v": [1.0], ET_COL: [1.0]})
    assert ArrowMerge.start(float_key, batch) is None  # -0.0 and 0.0 are one Spark key
    _, first = plan_merge(df.withColumn("k", F.col("k").cast("int")), "k", "t", 10.0,
                          {"f": ("first", "v")})
    assert ArrowMerge.start(first, pa.RecordBatch.from_pydict(
        {"k": pa.array([0], pa.int32()), "v": [1.0], ET_COL: [1.0]})) is None
    # and the DataFrame result is Spark's either way (-0.0 and 0.0 one key)
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 10.0, {"n": ("count", None)}),
                               "k", {"n": ("count", None)})
    assert sorted(r["n"] for r in merged.collect()) == [1, 2]


def test_local_merge_on_many_batches_equals_spark(spark: Any) -> None:
    # more rows than one Arrow batch per partition: the streamed path over several batches
    n = 24_000
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"k": rng.integers(0, 500, n), "t": rng.uniform(0, 1000, n),
                          "v": rng.integers(-1000, 1000, n)})
    df = spark.createDataFrame(frame).repartition(2).cache()  # one placement for every job
    aggs = [F.count("*").alias("n"), F.sum("v").alias("s"), F.min("v").alias("lo"),
            F.max("v").alias("hi")]
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2048")
    try:
        want = df.groupBy("k").agg(*aggs).orderBy("k").collect()
        sizes = []
        for kw in ({}, {"max_groups": 700}, {"mode": "quantity", "quantity": 3000}):
            partial = tl.local_merge(df, "k", "t", 100.0, aggs, engine="python", **kw)
            assert tl.merge_partials(partial, "k", aggs).orderBy("k").collect() == want
            sizes.append(partial.count())
        # one row per (partition, key, slot) by default; smaller buffers split groups
        # across flushes
        groups = df.select(F.spark_partition_id().alias("p"), "k",
                           F.floor(F.col("t") / 100).alias("s")).distinct().count()
        assert sizes[0] == groups and sizes[1] > sizes[0] and sizes[2] > sizes[0]
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        df.unpersist()
