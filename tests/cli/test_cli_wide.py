"""``trilink-spark balance`` past ``spark.trilink.table.maxKeys`` distinct keys counts every
score on the executors: each strategy's loads are the rows Spark really puts on each
partition, the tables in their bounded form, and the report says it did so."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
import trilink_spark as tl
from trilink_spark.cli import _format_table, run_balance  # noqa: PLC2701 - the report's text
from trilink_spark.errors import NullKeyError
from trilink_spark.partitioners.core.balance import keyed_bound_of
from trilink_spark.partitioners.core.keys import null_partition

LIMIT = 300
N = 8


def frame(spark: Any, keys: int, rows: int, ddl: str = "long", nulls: int = 0,
          seed: int = 3) -> Any:
    """Every key once, then ``rows`` Zipf 1.1 rows over them: heavy keys and a long tail."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, keys + 1) ** 1.1
    picked = np.concatenate([np.arange(keys), rng.choice(keys, size=rows,
                                                         p=weights / weights.sum())])
    values: list[Any] = [int(v) if ddl != "string" else f"k{v}" for v in picked]
    data = pd.DataFrame({"k": pd.Series(values + [None] * nulls, dtype=object)})
    return spark.createDataFrame(data.sample(frac=1.0, random_state=seed), f"k {ddl}")


@pytest.fixture()
def bounded(spark: Any) -> Iterator[None]:
    spark.conf.set("spark.trilink.table.maxKeys", str(LIMIT))
    try:
        yield
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")


def placed_loads(df: Any, p: Any) -> np.ndarray:
    """Rows per partition when ``key_by`` places ``df`` with ``p`` (Spark's own count)."""
    return np.asarray(tl.partition_balance(tl.key_by(df, "k", p.copy(), fit="none")).loads,
                      dtype=np.float64)


@pytest.mark.parametrize("ddl", ["long", "string"])
def test_every_score_is_what_spark_places(spark: Any, bounded: None, ddl: str) -> None:
    df = frame(spark, 3000, 9000, ddl, nulls=17)
    got = run_balance(df, "k", "frame", N, 1.0, 0, measure=False, kafka=True)
    assert got.max_keys == LIMIT and got.to_dict()["counted_on_executors"] is True
    assert got.records == 12017 and got.null_rows == 17 and got.distinct_keys == 3001
    assert got.sampled_records == got.records
    counts = df.groupBy("k").count().toArrow()
    heaviest = max(r["count"] for r in counts.to_pylist() if r["k"] is not None)
    total = got.records
    assert got.scores[0].keyed_bound == pytest.approx(
        keyed_bound_of(total, heaviest, N))
    for s in got.scores:
        assert s.loads.sum() == total, s.name
        np.testing.assert_array_equal(s.loads, placed_loads(df, s.partitioner), err_msg=s.name)
        if s.partitioner.is_stateful:  # bounded: at most LIMIT keys by name
            assert s.bounded and len(s.partitioner) <= LIMIT, s.name
            assert s.per_key_balance is None
    by_name = {s.name: s for s in got.scores}
    assert by_name["hash"].balance_degree < by_name["least_count"].balance_degree
    # Kafka's placement equals the driver's per-key computation of the same counts
    keyed = {r["k"]: int(r["count"]) for r in counts.to_pylist() if r["k"] is not None}
    keys = list(keyed)
    want = np.bincount(tl.partitioners.kafka_default_partition(keys, N),
                       weights=np.array([keyed[k] for k in keys], dtype=np.float64),
                       minlength=N)
    assert got.kafka is not None
    assert got.kafka["balance_degree"] == pytest.approx(float(want.min() / want.max()))
    out = io.StringIO()
    _format_table([got], N, out)
    assert f"more than {LIMIT:,} keys" in out.getvalue()


def test_null_rows_land_where_the_policy_says(spark: Any, bounded: None) -> None:
    df = frame(spark, 2000, 2000, nulls=40)
    for policy in ("group", "partition0"):
        got = run_balance(df, "k", "frame", N, 1.0, 0, measure=False, null_policy=policy)
        without = run_balance(df.where("k IS NOT NULL"), "k", "frame", N, 1.0, 0,
                              measure=False, null_policy=policy)
        at = null_partition(policy, N)
        for s, t in zip(got.scores, without.scores):
            if not s.partitioner.is_stateful:  # stateless: the same loads plus the nulls
                diff = s.loads - t.loads
                assert diff[at] == 40 and diff.sum() == 40, (policy, s.name)
    with pytest.raises(NullKeyError):
        run_balance(df, "k", "frame", N, 1.0, 0, measure=False, null_policy="error")


def test_a_sample_fits_and_every_row_scores(spark: Any, bounded: None) -> None:
    df = frame(spark, 2500, 20000, seed=9)
    got = run_balance(df, "k", "frame", N, 0.3, 4, measure=True)
    assert got.records == 22500
    assert got.sampled_records == df.select("k").sample(fraction=0.3, seed=4).count()
    assert 0 < got.sampled_records < got.records
    for s in got.scores:
        np.testing.assert_array_equal(s.loads, placed_loads(df, s.partitioner), err_msg=s.name)
    best = next(s for s in got.scores if s.name == got.best)
    assert got.measured[got.best]["balance_degree"] == pytest.approx(best.balance_degree)


def test_at_most_max_keys_keys_keeps_the_per_key_report(spark: Any, bounded: None) -> None:
    df = frame(spark, LIMIT, 3000)
    got = run_balance(df, "k", "frame", N, 1.0, 0, measure=False)
    assert got.max_keys is None and got.to_dict()["counted_on_executors"] is False
    assert got.distinct_keys == LIMIT and got.records == LIMIT + 3000
    assert all(not s.bounded for s in got.scores)
