"""``strategy="auto"`` past ``spark.trilink.table.maxKeys`` sampled keys scores its candidates
on the executors: the driver never receives every sampled key, and every score is the loads
the sample really gets when placed as ``key_by`` places it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import trilink_spark as tl
from trilink_spark.errors import NullKeyError
from trilink_spark.placement.key_by import key_counts

LIMIT = 500
GROUPS = 4096


def zipf(spark: Any, keys: int, rows: int, ddl: str, nulls: int = 0, seed: int = 5) -> Any:
    """Every one of ``keys`` keys once, then ``rows`` rows of Zipf 1.1 over them: a long tail
    and a few heavy keys."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, keys + 1) ** 1.1
    picked = np.concatenate([np.arange(keys), rng.choice(keys, size=rows,
                                                         p=weights / weights.sum())])
    values: list[Any] = [int(v) if ddl != "string" else f"k{v}" for v in picked]
    frame = pd.DataFrame({"k": pd.Series(values + [None] * nulls, dtype=object)})
    return spark.createDataFrame(frame.sample(frac=1.0, random_state=seed), f"k {ddl}")


@pytest.fixture()
def bounded(spark: Any) -> Iterator[None]:
    spark.conf.set("spark.trilink.table.maxKeys", str(LIMIT))
    try:
        yield
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")


@pytest.fixture()
def results(spark: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every Arrow and row result the driver receives while the test runs."""
    seen: list[int] = []
    cls = type(spark.range(1))
    to_arrow, collect = cls.toArrow, cls.collect

    def arrow(self: Any) -> pa.Table:
        got = to_arrow(self)
        seen.append(got.num_rows)
        return got

    def rows(self: Any) -> list[Any]:
        got = collect(self)
        seen.append(len(got))
        return got

    monkeypatch.setattr(cls, "toArrow", arrow)
    monkeypatch.setattr(cls, "collect", rows)
    return seen


@pytest.mark.parametrize("ddl", ["bigint", "string"])
def test_the_driver_gets_at_most_max_keys_and_the_groups_never_every_sampled_key(
        spark: Any, bounded: None, results: list[int], ddl: str) -> None:
    df = zipf(spark, 60_000, 60_000, ddl, nulls=30)
    chosen = tl.resolve_strategy(df, "k", "auto", 8, sample_rate=0.5, seed=2, fit="none")
    sampled = key_counts(df, "k", 0.5, 2, "group")  # after: its own result is not counted
    distinct = sampled.num_rows
    assert distinct > 4 * (LIMIT + GROUPS), distinct  # the data really has many keys
    # a head of LIMIT + 2 keys, then one scan: the heaviest LIMIT keys, the groups (and the
    # null key's), 8 loads a candidate; the last result is key_counts' own
    assert len(results) == 3, results
    assert results[0] <= LIMIT + 2 and results[1] <= LIMIT + GROUPS + 1 + 8 * 4, results
    assert chosen.sample_rows == int(pa.compute.sum(sampled.column(1)).as_py())
    assert all(s.partitioner.bounded for s in chosen.scores if s.partitioner.is_stateful)


@pytest.mark.parametrize("ddl", ["bigint", "string"])
def test_each_score_is_the_samples_loads_as_key_by_places_them(
        spark: Any, bounded: None, ddl: str) -> None:
    """The loads of every candidate equal the sample's rows per partition of the fitted
    strategy, computed on the driver from the sample's exact counts (hash and modulo need
    no fit: their loads must equal the per-key evaluation's to the row)."""
    df = zipf(spark, 20_000, 80_000, ddl, nulls=17)
    chosen = tl.resolve_strategy(df, "k", "auto", 8, sample_rate=0.5, seed=4, fit="none")
    sampled = key_counts(df, "k", 0.5, 4, "group")
    keys, counts = sampled.column(0), sampled.column(1).to_numpy().astype(np.float64)
    assert sampled.num_rows > LIMIT
    exact = {s.name: s for s in tl.evaluate_strategies(
        dict(zip(keys.to_pylist(), counts.tolist())), 8, key_type="auto" if ddl == "string"
        else "long", max_keys=LIMIT, seed=4)}
    names = [s.name for s in chosen.scores]
    assert names == list(exact), names
    for s in chosen.scores:
        assert s.loads.sum() == counts.sum(), s.name
        p = s.partitioner
        pids = p.lookup(keys) if p.is_stateful else p.assign(keys)
        want = np.bincount(pids, weights=counts, minlength=8)
        np.testing.assert_array_equal(s.loads, want, err_msg=s.name)
        if not p.is_stateful:
            np.testing.assert_array_equal(s.loads, exact[s.name].loads, err_msg=s.name)
        assert s.keyed_bound == pytest.approx(exact[s.name].keyed_bound)
    by = {s.name: s.balance_degree for s in chosen.scores}
    assert by["least_count"] >= by["hash"], by  # Zipf keys: the heavy keys by name help


def test_a_null_key_under_error_is_refused_before_any_fit(spark: Any, bounded: None) -> None:
    df = zipf(spark, 20_000, 40_000, "bigint", nulls=3)
    with pytest.raises(NullKeyError, match="null keys"):
        tl.resolve_strategy(df, "k", "auto", 8, sample_rate=0.5, null_policy="error")


def test_a_sample_below_min_sample_counts_every_row(spark: Any, bounded: None) -> None:
    df = zipf(spark, 20_000, 20_000, "bigint")
    chosen = tl.resolve_strategy(df, "k", "auto", 8, sample_rate=0.01, min_sample=10_000,
                                 fit="none")
    assert chosen.sample_rows == 40_000  # every row, and scored on the executors
    assert {s.name for s in chosen.scores} == {"hash", "modulo", "least_key", "least_count"}
