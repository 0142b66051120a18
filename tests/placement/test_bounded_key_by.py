"""key_by with bounded tables: fitted on the executors, placed in the JVM as in Python."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

import trilink_spark as tl
from trilink_spark.columns import PARTITION_COL
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.partitioners.choosing.catalogue import fit_counts
from trilink_spark.partitioners.core.keys import to_key_array

key_by_module = sys.modules["trilink_spark.placement.key_by"]


def _frame(spark, keys, dtype: str):
    table = pa.table({"k": pa.array(keys), "v": pa.array(np.arange(len(keys)))})
    return spark.createDataFrame(table.to_pandas(), schema=f"k {dtype}, v long")


def _placed(placed) -> tuple[list, list]:
    rows = placed.select("k", PARTITION_COL).collect()
    return [r[0] for r in rows], [r[1] for r in rows]


@pytest.mark.connect
@pytest.mark.parametrize("dtype,how", [("int", "aggregate"), ("bigint", "aggregate"),
                                       ("string", "aggregate"), ("bigint", "sample"),
                                       ("string", "sample")])
def test_bounded_key_by_places_every_key_where_python_does(spark, dtype, how):
    rng = np.random.default_rng(5)
    raw = (rng.zipf(1.2, 6_000) % 1_500).tolist()
    keys = [f"s{v}" for v in raw] if dtype == "string" else raw
    keys[::97] = [None] * len(keys[::97])
    df = _frame(spark, keys, dtype)
    p = tl.LeastCountPartitioner(4, max_keys=50)
    key_by_module.fit_table(df, "k", p, how=how)
    placed = tl.key_by(df, "k", p, fit="none")
    assert p.bounded and 0 < len(p) <= 50
    got_keys, got_pids = _placed(placed)
    assert p.assign(got_keys).tolist() == got_pids  # the JVM agrees with the driver
    per_key: dict = {}
    for k, pid in zip(got_keys, got_pids):
        assert per_key.setdefault(k, pid) == pid  # no key split
    assert per_key[None] == 42 % 4
    hashed = tl.partition_balance(tl.key_by(df, "k", "hash", 4)).balance_degree
    assert tl.partition_balance(placed).balance_degree >= hashed - 1e-9
    # the heaviest keys got the entries (exact counts)
    counts: dict = {}
    for k in keys:
        if k is not None:
            counts[k] = counts.get(k, 0) + 1
    heaviest = sorted(counts.items(), key=lambda kv: -kv[1])[: 10 if how == "aggregate" else 2]
    assert all(k in p for k, _ in heaviest)
    if how == "aggregate":
        assert len(p) == 50


@pytest.mark.connect
def test_within_the_bound_the_fit_is_the_per_key_fit(spark):
    keys = [f"u{i % 300}" for i in range(2_000)] + [None] * 7
    df = _frame(spark, keys, "string")
    fitted = tl.LeastCountPartitioner(4)
    tl.key_by(df, "k", fitted)
    counts = key_by_module.key_counts(df, "k", 1.0, 0, "group")
    expected = tl.LeastCountPartitioner(4)
    fit_counts(expected, to_key_array(counts.column(0).combine_chunks(), "group"),
               counts.column(1).to_numpy().astype(np.float64))
    assert not fitted.bounded
    assert fitted.assignments == expected.assignments
    assert fitted.loads.tolist() == expected.loads.tolist()


def test_fit_how_is_checked(spark):
    df = _frame(spark, [1, 2], "bigint")
    with pytest.raises(InvalidArgumentError, match="aggregate"):
        key_by_module.fit_table(df, "k", tl.LeastKeyPartitioner(2), how="sketch")


def test_conf_bounds_a_strategy_built_by_name(spark):
    df = _frame(spark, list(range(500)) * 2, "bigint")
    spark.conf.set("spark.trilink.table.maxKeys", "20")
    try:
        resolved = key_by_module.resolve_strategy(df, "k", "least_key", 4)
        p = resolved.partitioner
        assert p.bounded and len(p) == 20 and p.max_keys == 20
        spark.conf.set("spark.trilink.table.maxKeys", "lots")
        with pytest.raises(InvalidArgumentError, match="maxKeys"):
            key_by_module.resolve_strategy(df, "k", "least_key", 4)
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")


def test_sample_fit_and_second_fit_keep_placed_keys(spark):
    df = _frame(spark, list(range(3_000)) * 2, "bigint")
    p = tl.LeastCountPartitioner(4, max_keys=100)
    tl.key_by(df, "k", p, fit="sample", sample_rate=0.5)
    assert p.bounded
    before = p.assign(list(range(3_000))).tolist()
    version = p.table_version
    more = _frame(spark, list(range(3_000, 4_000)), "bigint")
    tl.key_by(more, "k", p)  # new keys go by group: nothing placed moves, no new version
    assert p.assign(list(range(3_000))).tolist() == before
    assert p.table_version == version
