"""Hostile cases of bounded tables at scale: group swaps on integer keys and across a restart,
auto's scores past maxKeys, the rebalancer's strategies. Real Spark, real RocksDB; each test
states the behaviour it holds the code to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import KeylessCount, RunningCount
from testkit.swaps import check_invariants

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STRING_KEYS: list[Any] = [f"u{i:04d}" for i in range(900)]
INT_KEYS: list[Any] = list(range(-450, 450))
BOUND = 60


def _batch(spark: Any, b: int, rows: int, keys: list[Any], ddl: str,
           nulls: int = 0) -> tuple[Any, pd.Series]:
    """Batch ``b`` of skewed rows (every key once more in batch 0), ``nulls`` null keys, and
    the rows per key (the null key as ``"<null>"``)."""
    rng = np.random.default_rng(11 + b)
    weights = 1.0 / np.arange(1, len(keys) + 1) ** 1.1
    picked = rng.choice(len(keys), size=rows, p=weights / weights.sum())
    if b == 0:
        picked = np.concatenate([np.arange(len(keys)), picked])
    values: list[Any] = [keys[i] for i in picked] + [None] * nulls
    frame = pd.DataFrame({"k": pd.Series(values, dtype=object),
                          "t": np.arange(b * 10_000, b * 10_000 + len(values), dtype=np.int64)})
    counts = frame["k"].astype(object).where(frame["k"].notna(), "<null>").value_counts()
    return spark.createDataFrame(frame, f"k {ddl}, t long"), counts


@pytest.fixture(autouse=True)
def _by_blocks(spark: Any) -> Any:
    spark.conf.set("spark.trilink.state.blockPlans", "true")
    yield
    spark.conf.unset("spark.trilink.state.blockPlans")


def _run(path: Path, store: str, processor: Any, sink: Any = None, **kw: Any) -> Any:
    return tl.keyed_foreach_batch(sink or (lambda df, b: df.count()), "k", "t", processor,
                                  1_000_000, str(path), state_store=store,
                                  strategy=tl.LeastCountPartitioner(4, max_keys=BOUND), **kw)


def _fitted(n: int, keys: list[Any], seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return tl.LeastCountPartitioner(n, max_keys=BOUND).fit(
        {k: int(c) for k, c in zip(keys, rng.integers(1, 50, len(keys)))})


# ---------------------------------------------------------------- c28760e: auto on a sample
def test_auto_on_uniform_keys_past_max_keys_scores_the_stateless_strategies_as_they_place(
        spark: Any) -> None:
    """Held against a defect once in (placement/fit.py sampled_counts, placement/key_by.py _choose_auto): past
    maxKeys distinct keys the light keys are sampled 1 in ``step`` and their counts multiplied
    by ``step``. Scoring hash/modulo on that mapping treats each sampled key as one unit of
    ``step`` times its rows, which inflates the stateless strategies' imbalance by about
    sqrt(step): 100,000 consecutive long keys with 2 rows each (maxKeys=500, step=200) score
    modulo at ~0.63 and hash at ~0.76, when on the data modulo is perfect (1.0) and hash
    ~0.98. auto then chooses least_count (a table, its fit job and broadcast) over modulo,
    which the rule "a table only if it beats the best stateless one by more than min_gain"
    forbids on these data."""
    keys = np.repeat(np.arange(100_000, dtype=np.int64), 2)
    df = spark.createDataFrame(pd.DataFrame({"k": keys}), "k bigint")
    spark.conf.set("spark.trilink.table.maxKeys", "500")
    try:
        chosen = tl.resolve_strategy(df, "k", "auto", 8, sample_rate=1.0, seed=1)
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")
    exact = {s.name: s.balance_degree for s in tl.evaluate_strategies(
        {int(k): 2 for k in range(100_000)}, 8, key_type="long", max_keys=500)}
    scored = {s.name: s.balance_degree for s in chosen.scores}
    assert exact["modulo"] == pytest.approx(1.0) and exact["hash"] > 0.95
    assert scored["modulo"] == pytest.approx(exact["modulo"], abs=0.05), scored
    assert scored["hash"] == pytest.approx(exact["hash"], abs=0.05), scored
    assert chosen.partitioner.strategy_name == "modulo", (chosen.partitioner.strategy_name,
                                                          scored)


# ---------------------------------------------------------------- 847a963: group plans
@pytest.mark.parametrize("ddl", ["int", "bigint"])
def test_a_fluid_group_swap_on_integer_keys_lands_as_the_key_plan_does(
        spark: Any, tmp_path: Path, ddl: str) -> None:
    """GUARD (keyed/swaps/block_plan.py _plan_group_swap/_step_groups/_group_step): the
    shipped fluid test only steps string keys. Integer key columns (int hashed as the
    table's fallback type, long) stepping down 4 -> 3 partitions by groups, nulls included,
    must keep every key once with its exact count after each step and end with the key
    plan's owners."""
    by_groups = _run(tmp_path / f"g-{ddl}", "rocksdb", KeylessCount())
    by_keys = _run(tmp_path / f"k-{ddl}", "files", KeylessCount())
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = _batch(spark, b, 2_000, INT_KEYS, ddl, nulls=2)
        by_groups(df, b)
        by_keys(df, b)
        total = total.add(counts, fill_value=0)
    aim = _fitted(3, INT_KEYS, 9)
    for run in (by_groups, by_keys):
        run.request_swap(strategy=aim, refit="none", mode="fluid", max_keys_per_batch=150)
    b = 2
    while True:
        df, counts = _batch(spark, b, 200, INT_KEYS, ddl, nulls=1)
        by_groups(df, b)
        by_keys(df, b)
        total = total.add(counts, fill_value=0)
        plan = by_groups.store.load_plan(b)
        assert plan is not None and plan["planned_by"] == "groups", plan
        check_invariants(by_groups, total, null_key="<null>")
        if by_groups.swaps[-1].complete and by_keys.swaps[-1].complete:
            break
        b += 1
        assert b < 30, "the fluid swap did not finish"
    check_invariants(by_keys, total, null_key="<null>")
    assert by_groups.owners() == by_keys.owners()
    kind = "int" if ddl == "int" else "long"
    assert by_groups.store.placement_at(b)[0].to_dict() == aim.for_column(kind).to_dict()


def test_a_fluid_group_swap_survives_a_restart_and_a_replayed_step(
        spark: Any, tmp_path: Path) -> None:
    """GUARD (847a963 fluid steps): a driver that dies after a group step's tasks wrote their
    state and before the commit, then a new runner started with the job's original
    arguments on the same state path, replays that step and finishes the swap: every key
    once with its exact count, the final placement the requested bounded table."""
    path = tmp_path / "state"
    dying = {"at": 3}

    def sink(out: Any, b: int) -> None:
        out.count()
        if b == dying["at"]:
            dying["at"] = -1
            raise RuntimeError("driver died")

    run = _run(path, "rocksdb", RunningCount(), sink)
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = _batch(spark, b, 2_000, STRING_KEYS, "string", nulls=2)
        run(df, b)
        total = total.add(counts, fill_value=0)
    aim = _fitted(6, STRING_KEYS, 5)
    run.request_swap(strategy=aim, refit="none", mode="fluid", max_keys_per_batch=120)
    df, counts = _batch(spark, 2, 300, STRING_KEYS, "string", nulls=1)
    run(df, 2)
    total = total.add(counts, fill_value=0)
    plan = run.store.load_plan(2)
    assert plan is not None and plan["planned_by"] == "groups" and not plan["complete"]
    df3, counts3 = _batch(spark, 3, 300, STRING_KEYS, "string", nulls=1)
    with pytest.raises(Exception, match="driver died"):
        run(df3, 3)
    # the original arguments (a runner fed by hand has no query id: it takes the path over)
    restarted = _run(path, "rocksdb", RunningCount(), sink, takeover=True)
    restarted(df3, 3)
    total = total.add(counts3, fill_value=0)
    check_invariants(restarted, total, null_key="<null>")
    b = 3
    while not restarted.store.load_plan(b) or not restarted.store.load_plan(b)["complete"]:
        b += 1
        assert b < 30, "the fluid swap did not finish after the restart"
        df, counts = _batch(spark, b, 300, STRING_KEYS, "string", nulls=1)
        restarted(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(restarted, total, null_key="<null>")
    assert restarted.store.placement_at(b)[0].to_dict() == aim.for_column("string").to_dict()


# ---------------------------------------------------------------- 575859d: rebalancer
def test_a_rebalancer_refuses_a_weight_strategy_that_never_holds_a_table(
        tmp_path: Path) -> None:
    """Held against a defect once in (keyed/swaps/placement.py check_rebalancer): it accepts any TablePartitioner
    subclass, by object or by name, but WeightPartitioner in its default ``mode="hash"`` is
    stateless: it never holds entries and is never bounded (a fit of 70,000 keys leaves it
    with 0), so the rebalancer can never move anything and only logs each batch that it
    waits for the table to pass max_keys. It should be refused at call time as 'hash' is."""
    from trilink_spark.keyed.swaps.placement import check_rebalancer
    from trilink_spark.switching import LoadAwareRebalancer

    weight = tl.WeightPartitioner([50, 50])
    fitted = weight.fit({f"k{i}": 1 for i in range(70_000)})
    assert not fitted.is_stateful and not getattr(fitted, "bounded", False) and len(fitted) == 0
    with pytest.raises(ValueError, match="rebalancer"):
        check_rebalancer(LoadAwareRebalancer(), weight)
    with pytest.raises(ValueError, match="rebalancer"):
        tl.keyed_foreach_batch(lambda df, b: None, "k", "t", RunningCount(), 1_000_000,
                               str(tmp_path / "w"), strategy=tl.WeightPartitioner([50, 50]),
                               rebalancer=LoadAwareRebalancer())
