"""Hostile checks of ``strategy="auto"`` scored on the executors (``fit.key_head``,
``fit.scan_sample``) and of ``trilink-spark balance`` past ``spark.trilink.table.maxKeys``
keys (``cli.wide.wide_balance``).

The truth every score is held to: the rows per partition Spark really gives when the frame
is placed with the scored strategy (``key_by(df, key, p.copy(), fit="none")``, then
``partition_balance``), or a typed :class:`~trilink_spark.errors.TrilinkError`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import trilink_spark as tl
from trilink_spark.cli import run_balance
from trilink_spark.cli.wide import loads_balance
from trilink_spark.errors import InvalidArgumentError, NullKeyError, TrilinkError
from trilink_spark.partitioners.core.balance import keyed_bound_of
from trilink_spark.partitioners.core.kafka_hash import kafka_default_partition
from trilink_spark.partitioners.core.keys import null_partition

LIMIT = 6
N = 8


@pytest.fixture()
def bounded(spark: Any) -> Iterator[None]:
    spark.conf.set("spark.trilink.table.maxKeys", str(LIMIT))
    try:
        yield
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")


def frame(spark: Any, keys: int, ddl: str = "long", nulls: int = 0, rows: int = 300,
          name: str = "k", seed: int = 1) -> Any:
    """Every one of ``keys`` keys once, then ``rows`` Zipf 1.1 rows over them, then
    ``nulls`` null keys."""
    rng = np.random.default_rng(seed)
    if keys:
        weights = 1.0 / np.arange(1, keys + 1) ** 1.1
        picked = np.concatenate([np.arange(keys),
                                 rng.choice(keys, size=rows, p=weights / weights.sum())])
    else:
        picked = np.zeros(0, dtype=np.int64)
    if ddl == "string":
        values: list[Any] = [f"k{v}" for v in picked]
    elif ddl == "binary":
        values = [f"k{v}".encode() for v in picked]
    else:
        values = [int(v) for v in picked]
    data = pd.DataFrame({name: pd.Series(values + [None] * nulls, dtype=object)})
    quoted = "`" + name.replace("`", "``") + "`"
    return spark.createDataFrame(data, f"{quoted} {ddl}")


def placed_loads(df: Any, key: str, p: Any) -> np.ndarray:
    """Rows per partition when ``key_by`` places ``df`` with ``p`` (Spark's own count)."""
    return np.asarray(tl.partition_balance(tl.key_by(df, key, p.copy(), fit="none")).loads,
                      dtype=np.float64)


def exact_counts(df: Any, key: str) -> dict[Any, int]:
    return {r[0]: int(r[1]) for r in df.groupBy(key).count().collect()}


# ---------------------------------------------------------------- findings (fail now)

def test_wide_balance_refuses_a_sample_with_no_rows_as_the_narrow_path_does(
        spark: Any, bounded: None) -> None:
    """A --sample-rate that samples no row of a small file: the per-key path refuses it
    (InvalidArgumentError "a ... sample of ... has no rows"); past maxKeys the tables are
    silently fitted on nothing and reported as "fitted on 0"."""
    narrow = spark.range(LIMIT).selectExpr("id AS k")
    wide = spark.range(LIMIT + 2).selectExpr("id AS k")
    assert wide.select("k").sample(fraction=0.05, seed=0).count() == 0  # the premise
    with pytest.raises(InvalidArgumentError, match="no rows"):
        run_balance(narrow, "k", "f", N, 0.05, 0, measure=False)
    with pytest.raises(InvalidArgumentError, match="no rows"):
        run_balance(wide, "k", "f", N, 0.05, 0, measure=False)


@pytest.mark.parametrize("rate", [-0.5, math.nan])
def test_a_bad_sample_rate_is_a_typed_error_on_the_wide_path(
        spark: Any, bounded: None, rate: float) -> None:
    """run_balance (exported) validates no sample_rate: past maxKeys a negative or NaN rate
    reaches Spark's sampler and surfaces as a raw IllegalArgumentException."""
    df = frame(spark, LIMIT + 4, rows=50)
    with pytest.raises(TrilinkError):
        run_balance(df, "k", "f", N, rate, 0, measure=False)


def test_collated_string_keys_score_what_key_by_places_or_are_refused(
        spark: Any, bounded: None) -> None:
    """A UTF8_LCASE key column: Spark's groupBy merges 'k1' and 'K1' (one key) while hash()
    and the placement keep them apart, so the counted scores are not the loads key_by
    gives. Either score what Spark places, or refuse the column with a typed error."""
    rng = np.random.default_rng(3)
    base = [f"k{v}" for v in np.concatenate([np.arange(20), rng.integers(0, 20, 300)])]
    values = [v.upper() if rng.random() < 0.5 else v for v in base] + [None] * 2
    raw = spark.createDataFrame(pd.DataFrame({"k": pd.Series(values, dtype=object)}),
                                "k string")
    df = raw.selectExpr("k COLLATE UTF8_LCASE AS k")
    try:
        chosen = tl.resolve_strategy(df, "k", "auto", N, sample_rate=1.0, fit="none")
        wide = run_balance(df, "k", "f", N, 1.0, 0, measure=False)
    except TrilinkError:
        return  # refused with a typed error: fine
    for s in [*chosen.scores, *wide.scores]:
        np.testing.assert_array_equal(s.loads, placed_loads(df, "k", s.partitioner),
                                      err_msg=s.name)


@pytest.mark.parametrize("twin", ["k", "K"])
def test_an_ambiguous_key_column_is_a_typed_error(spark: Any, bounded: None,
                                                  twin: str) -> None:
    """Two columns that Spark resolves as the key (a duplicate name, or the same name in
    another case under the default case-insensitive analysis): a raw AnalysisException
    [AMBIGUOUS_REFERENCE] from auto and from balance, not a TrilinkError."""
    df = frame(spark, LIMIT + 4, rows=50)
    dup = df.select("k", (df.k + 1).alias(twin))
    with pytest.raises(TrilinkError):
        tl.resolve_strategy(dup, "k", "auto", N, sample_rate=1.0, fit="none")
    with pytest.raises(TrilinkError):
        run_balance(dup, "k", "f", N, 1.0, 0, measure=False)


# ------------------------------------------------------------ checks that pass (guards)

@pytest.mark.parametrize(("extra", "ddl", "policy"), [
    (0, "long", "group"),         # exactly maxKeys non-null keys (+ the null key): per key
    (1, "int", "group"),          # maxKeys + 1: the scan / the wide path
    (2, "binary", "group"),       # maxKeys + 2: the head's own limit
    (1, "string", "partition0"),
    (2, "long", "partition0"),
])
def test_every_score_is_what_key_by_places_around_max_keys(
        spark: Any, bounded: None, extra: int, ddl: str, policy: str) -> None:
    nulls = 5
    df = frame(spark, LIMIT + extra, ddl, nulls=nulls)
    counts = exact_counts(df, "k")
    total = sum(counts.values())
    heaviest = max(counts.values())
    chosen = tl.resolve_strategy(df, "k", "auto", N, sample_rate=1.0, fit="none",
                                 null_policy=policy)
    assert chosen.sample_rows == total
    got = run_balance(df, "k", "f", N, 1.0, 0, measure=False, kafka=True, null_policy=policy)
    assert (got.max_keys is None) == (extra == 0)
    assert got.records == total and got.null_rows == nulls
    assert got.distinct_keys == LIMIT + extra + 1
    for s in [*chosen.scores, *got.scores]:
        assert s.loads.sum() == total, s.name
        assert s.keyed_bound == pytest.approx(keyed_bound_of(total, heaviest, N)), s.name
        np.testing.assert_array_equal(s.loads, placed_loads(df, "k", s.partitioner),
                                      err_msg=s.name)
    keys = [k for k in counts if k is not None]
    want = np.bincount(kafka_default_partition(keys, N),
                       weights=np.array([counts[k] for k in keys], dtype=np.float64),
                       minlength=N).astype(np.float64)
    assert got.kafka == pytest.approx(loads_balance(want))


def test_null_keys_under_error_are_refused_by_auto_and_balance(spark: Any,
                                                               bounded: None) -> None:
    for keys in (LIMIT, LIMIT + 1, 0):  # per key, on the executors, the null key alone
        df = frame(spark, keys, nulls=3, rows=40 if keys else 0)
        with pytest.raises(NullKeyError):
            tl.resolve_strategy(df, "k", "auto", N, sample_rate=1.0, null_policy="error")
        with pytest.raises(NullKeyError):
            run_balance(df, "k", "f", N, 1.0, 0, measure=False, null_policy="error")


def test_a_frame_whose_only_key_is_null(spark: Any, bounded: None) -> None:
    df = frame(spark, 0, nulls=10, rows=0)
    chosen = tl.resolve_strategy(df, "k", "auto", N, sample_rate=1.0, fit="none")
    assert chosen.partitioner.strategy_name == "hash" and chosen.scores == []
    for policy in ("group", "partition0"):
        got = run_balance(df, "k", "f", N, 1.0, 0, measure=False, kafka=True,
                          null_policy=policy)
        assert got.records == 10 and got.null_rows == 10 and got.distinct_keys == 1
        for s in got.scores:
            assert s.loads[null_partition(policy, N)] == 10, s.name


def test_an_empty_frame_is_hash_for_auto_and_a_typed_error_for_balance(
        spark: Any, bounded: None) -> None:
    df = frame(spark, 0)
    chosen = tl.resolve_strategy(df, "k", "auto", N, sample_rate=1.0, fit="none")
    assert chosen.partitioner.strategy_name == "hash" and chosen.sample_rows == 0
    with pytest.raises(TrilinkError):
        run_balance(df, "k", "f", N, 1.0, 0, measure=False)


@pytest.mark.parametrize("name", ["a.b`c d", "_tl_score_key"])
def test_odd_and_internal_looking_key_names_score_as_a_plain_name(
        spark: Any, bounded: None, name: str) -> None:
    df = frame(spark, LIMIT + 5, nulls=2, rows=120, name=name)
    plain = df.withColumnRenamed(name, "k")
    odd_auto = tl.resolve_strategy(df, name, "auto", N, sample_rate=1.0, fit="none")
    plain_auto = tl.resolve_strategy(plain, "k", "auto", N, sample_rate=1.0, fit="none")
    odd = run_balance(df, name, "f", N, 1.0, 0, measure=False, kafka=True)
    base = run_balance(plain, "k", "f", N, 1.0, 0, measure=False, kafka=True)
    for a, b in [*zip(odd_auto.scores, plain_auto.scores), *zip(odd.scores, base.scores)]:
        assert a.name == b.name
        np.testing.assert_array_equal(a.loads, b.loads, err_msg=a.name)
    assert odd.kafka == base.kafka


def test_wide_balance_never_brings_every_key_to_the_driver(
        spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    limit, keys = 50, 12_000
    spark.conf.set("spark.trilink.table.maxKeys", str(limit))
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
    try:
        df = spark.range(keys).selectExpr("id * 7919 % 1000003 AS k")
        got = run_balance(df, "k", "f", N, 1.0, 0, measure=False, kafka=True)
        chosen = tl.resolve_strategy(df, "k", "auto", N, sample_rate=1.0, fit="none")
    finally:
        spark.conf.unset("spark.trilink.table.maxKeys")
    assert got.distinct_keys == keys and chosen.sample_rows == keys
    # the heaviest maxKeys keys and one row per key group (4,096, the null key's) at most
    assert seen and max(seen) <= limit + 4096 + 1 + N * 6, seen
