"""The null key in keyed state: a key of its own (``null_policy="group"``, the default), on
``pmod(42, n)`` like everywhere else, through swaps that move it when the partition count
moves its partition (planned by keys and by blocks), and read back as ``None``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import NullKeyError
from trilink_spark.keyed import read_state
from conftest import KeylessCount, RunningCount
from testkit.swaps import check_invariants

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS: list[Any] = [None] + [f"u{i:02d}" for i in range(30)]
NULL = "<null>"  # the oracle's label of the null key


def make_batch(spark: Any, b: int, keys: list[Any] = KEYS, rows: int = 120,
               kind: str = "string") -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    picked = [keys[i] for i in rng.integers(0, len(keys), rows)] + [None] * 5
    frame = pd.DataFrame({"k": pd.Series(picked, dtype=object),
                          "t": np.arange(b * 1000, b * 1000 + len(picked), dtype=np.int64)})
    counts = pd.Series(picked, dtype=object).fillna(NULL).value_counts()
    return spark.createDataFrame(frame, f"k {kind}, t long"), counts


def make_run(tmp_path: Path, name: str, **kw: Any) -> Any:
    kw.setdefault("processor", RunningCount())
    processor = kw.pop("processor")
    return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", processor, 10**6,
                                  str(tmp_path / name), **kw)


def null_owner(run: Any) -> int:
    owners = run.owners()
    assert None in owners and not any(isinstance(k, float) for k in owners)
    return int(owners[None])


@pytest.mark.parametrize("store", ["rocksdb", "files"])
def test_the_null_key_is_a_group_of_its_own_on_pmod_42_n(spark: Any, tmp_path: Path,
                                                       store: str) -> None:
    run = make_run(tmp_path, "state", strategy="least_count", num_partitions=4,
                   state_store=store)
    total = pd.Series(dtype=float)
    for b in (0, 1):
        df, counts = make_batch(spark, b)
        run(df, b)
        total = total.add(counts, fill_value=0)
    check_invariants(run, total, null_key=NULL)
    assert null_owner(run) == 42 % 4
    values = run.state_values()
    assert values[None] == {"n": int(total[NULL])}  # None, never NaN
    frame = read_state(spark, str(tmp_path / "state")).toPandas()
    assert frame["key"].isna().sum() == 1


def test_the_policy_is_a_keyword_and_fixed_with_the_placement(spark: Any,
                                                              tmp_path: Path) -> None:
    df, counts = make_batch(spark, 0)
    refused = make_run(tmp_path, "refused", num_partitions=3, null_policy="error")
    with pytest.raises(NullKeyError):
        refused(df, 0)
    with pytest.raises(tl.errors.InvalidArgumentError, match="null_policy"):
        make_run(tmp_path, "bad", null_policy="drop")
    run = make_run(tmp_path, "zero", num_partitions=3, null_policy="partition0")
    run(df, 0)
    check_invariants(run, counts.astype(float), null_key=NULL)
    assert null_owner(run) == 0
    spark.conf.set("spark.trilink.nullPolicy", "error")  # the keyword wins over the conf
    try:
        grouped = make_run(tmp_path, "grouped", num_partitions=3, null_policy="group")
        grouped(df, 0)
        assert null_owner(grouped) == 42 % 3
        strict = make_run(tmp_path, "strict", num_partitions=3)
        with pytest.raises(NullKeyError):
            strict(df, 0)
    finally:
        spark.conf.unset("spark.trilink.nullPolicy")
    with pytest.raises(NullKeyError):
        tl.HashPartitioner(2, null_policy="error").partition(None)


def test_integer_keys_come_back_as_ints_and_none(spark: Any, tmp_path: Path) -> None:
    keys: list[Any] = [None, 1, 2, 2**53 + 1, -7]
    run = make_run(tmp_path, "ints", processor=KeylessCount(), num_partitions=3)
    df, counts = make_batch(spark, 0, keys, rows=40, kind="long")
    run(df, 0)
    values = run.state_values()
    assert set(values) == set(keys)
    assert all(type(k) is int for k in values if k is not None)
    assert {k: v["n"] for k, v in values.items()} == {
        (None if k == NULL else k): int(c) for k, c in counts.items()}
    assert set(run.owners()) == set(keys)


SWAPS = [
    # key plans (file store): 42 % 3 == 0, 42 % 4 == 2, 42 % 5 == 2
    pytest.param("files", tl.HashPartitioner(3), {"num_partitions": 4}, id="hash-up"),
    pytest.param("files", tl.HashPartitioner(4), {"strategy": "least_count",
                                                   "num_partitions": 3}, id="by-name-down"),
    pytest.param("files", tl.HashPartitioner(3), {"num_partitions": 5, "mode": "fluid",
                                                   "max_keys_per_batch": 6}, id="fluid-keys"),
    # block plans (local copies): 42 % 4 == 2, 42 % 6 == 0, 42 % 7 == 0
    pytest.param("rocksdb", tl.BlockPartitioner(4, num_blocks=32), {"num_partitions": 6},
                 id="blocks-refit"),
    pytest.param("rocksdb", tl.BlockPartitioner(4, num_blocks=32),
                 {"strategy": tl.BlockPartitioner(7, num_blocks=32), "refit": "none",
                  "mode": "fluid", "max_keys_per_batch": 8}, id="blocks-fluid-up"),
]


@pytest.mark.parametrize("store, strategy, swap", SWAPS)
def test_swaps_move_the_null_key_with_the_partition_count(
        spark: Any, tmp_path: Path, store: str, strategy: tl.Partitioner,
        swap: dict[str, Any]) -> None:
    spark.conf.set("spark.trilink.state.blockPlans", "true")
    try:
        run = make_run(tmp_path, "state", strategy=strategy, state_store=store)
        total = pd.Series(dtype=float)
        for b in (0, 1):
            df, counts = make_batch(spark, b)
            run(df, b)
            total = total.add(counts, fill_value=0)
        assert null_owner(run) == 42 % strategy.num_partitions
        run.request_swap(**swap)
        b = 2
        while True:
            df, counts = make_batch(spark, b)
            run(df, b)
            total = total.add(counts, fill_value=0)
            check_invariants(run, total, null_key=NULL)  # every key once, exact counts
            placement, n = run.store.placement_at(b)
            assert placement.null_policy == "group"
            assert null_owner(run) == 42 % n, (b, n)
            plan = run.store.load_plan(b)
            assert plan is not None and run.swaps[-1].refused is None
            if store == "rocksdb":
                assert plan.get("planned_by") == "blocks"
            if run.swaps[-1].complete:
                break
            b += 1
            assert b < 15, "the fluid swap did not finish"
        assert null_owner(run) == 42 % placement.num_partitions
        assert b > 2 or swap.get("mode") != "fluid"  # a fluid swap took several steps
        df, counts = make_batch(spark, b + 1)  # rows after the swap find the null key's state
        run(df, b + 1)
        check_invariants(run, total.add(counts, fill_value=0), null_key=NULL)
    finally:
        spark.conf.unset("spark.trilink.state.blockPlans")
