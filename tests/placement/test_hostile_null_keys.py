"""Hostile review of null keys in placement: where the null key lands under every strategy,
what keyed operators give for it beside NaN and signed zeros, and the refusals' words.

Spark's ``repartition(n, k)`` is the oracle of where the null key goes (``pmod(42, n)``) and
``groupBy`` of what each key's group holds.
"""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, NullKeyError
from trilink_spark.partitioners import BlockPartitioner
from trilink_spark.partitioners.tables.overlay import OverlayPartitioner
from trilink_spark.placement import keyed_by_source, resolve_strategy
from testkit.frames import rows

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NAN = float("nan")
#: What every refusal of a null key names: the argument and the conf.
NAMES = r"argument null_policy.*conf spark\.trilink\.nullPolicy"


def spark_null_partition(df: Any, n: int) -> set[int]:
    return {r[0] for r in df.repartition(n, "k").where("k IS NULL")
            .select(F.spark_partition_id()).collect()}


@pytest.mark.parametrize("n", [1, 43, 200])
def test_every_strategy_puts_the_null_key_where_spark_does(spark: Any, n: int) -> None:
    df = spark.createDataFrame([(None if i % 4 == 0 else f"s{i % 9}", i) for i in range(40)],
                               "k string, v long")
    keys = [f"s{i}" for i in range(9)]
    expected = spark_null_partition(df, n)
    assert expected == {42 % n}
    objects: dict[str, Any] = {
        "table": tl.LeastKeyPartitioner(n).fit(keys),
        "overlay": OverlayPartitioner(tl.HashPartitioner(n), {"s1": n - 1}),
        "block": BlockPartitioner(n, num_blocks=4 * n),
        "weight": tl.WeightPartitioner([100 / n] * n)}
    for name in ["hash", "least_count", "block", "auto", *objects]:
        strategy = objects.get(name, name)
        placed = tl.key_by(df, "k", strategy, None if name in objects else n)
        got = {tuple(r) for r in placed.where("k IS NULL")
               .select(tl.PARTITION_COL, F.spark_partition_id()).collect()}
        assert got == {(p, p) for p in expected}, (name, n, got)


def test_a_bad_conf_value_names_the_conf_and_the_choices(spark: Any) -> None:
    df = spark.createDataFrame([(None, 1), ("a", 2)], "k string, v long")
    spark.conf.set("spark.trilink.nullPolicy", "drop")
    try:
        for call in (lambda: tl.key_by(df, "k", "hash", 4),
                     lambda: resolve_strategy(df, "k", "auto", 4),
                     lambda: tl.keyed_agg(df, "k", F.sum("v"))):
            with pytest.raises(InvalidArgumentError,
                               match=r"spark\.trilink\.nullPolicy \(the default of "
                                     r"null_policy\) must be one of 'group', 'error', "
                                     r"'partition0', got 'drop'"):
                call()
        # an argument does not read the conf
        assert rows(tl.keyed_agg(df, "k", F.sum("v"), null_policy="group")) \
            == rows(df.groupBy("k").agg(F.sum("v")))
    finally:
        spark.conf.unset("spark.trilink.nullPolicy")


def test_every_null_key_error_names_the_argument_and_the_conf() -> None:
    with pytest.raises(NullKeyError, match=NAMES):
        BlockPartitioner(4).block_of(None)
    with pytest.raises(NullKeyError, match=NAMES):
        tl.LeastCountPartitioner(4, null_policy="error").fit([None, "a"])


def test_keyed_agg_keeps_null_nan_and_signed_zeros_as_groupby(spark: Any) -> None:
    keys = [None, NAN, -0.0, 0.0, 1.5, float("inf")]
    df = spark.createDataFrame([(k, i) for i, k in enumerate(keys * 3)], "k double, v long")
    exprs = [F.sum("v").alias("s"), F.count("*").alias("c")]
    expected = rows(df.groupBy("k").agg(*exprs))
    assert len(expected) == 5  # null, NaN, 0.0, 1.5, inf
    for combine in ("auto", "always", "never"):
        for policy in ("group", "partition0"):
            out = tl.keyed_agg(df, "k", *exprs, strategy="hash", num_partitions=3,
                               combine=combine, null_policy=policy)
            assert rows(out) == expected, (combine, policy)
        with pytest.raises(Exception, match="NullKeyError.*" + NAMES):
            tl.keyed_agg(df, "k", *exprs, strategy="hash", num_partitions=3, combine=combine,
                         null_policy="error").collect()
    # the argument wins over a strategy object's own policy, on the combine plan too
    own = tl.HashPartitioner(3, null_policy="error")
    assert rows(tl.keyed_agg(df, "k", *exprs, strategy=own, null_policy="group")) == expected
    with pytest.raises(Exception, match="NullKeyError"):
        tl.keyed_agg(df, "k", *exprs, strategy=own).collect()


def sizes(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
    value = key[0]
    shown = "nan" if isinstance(value, float) and value != value else str(value)
    return pd.DataFrame({"key": [shown], "type": [type(value).__name__], "n": [len(pdf)]})


SCHEMA = "key string, type string, n long"
BIG = 2**53  # BIG and BIG + 1 are one float


def integer_keys(spark: Any) -> Any:
    return spark.createDataFrame([(k, i) for i, k in enumerate([None, 1, BIG, BIG + 1] * 2)],
                                 "k long, v long")


#: Each key's group: the key as PySpark gives it (numpy ints), but None for the null key.
EXPECTED = sorted([("None", "NoneType", 2), ("1", "int64", 2), (str(BIG), "int64", 2),
                   (str(BIG + 1), "int64", 2)])


def test_keyed_apply_gives_none_for_an_integer_null_key(spark: Any) -> None:
    out = tl.keyed_apply(integer_keys(spark), "k", sizes, SCHEMA, strategy="hash",
                         num_partitions=3)
    assert sorted(tuple(r) for r in out.collect()) == EXPECTED  # PySpark gives (nan,)


def test_keyed_apply_on_a_keyed_by_source_frame_groups_exactly(spark: Any) -> None:
    # grouped by pandas where the rows are, which made floats of the keys beside a null
    # (merging BIG + 1 into BIG) and took NaN for the null key
    declared = keyed_by_source(integer_keys(spark).coalesce(1), "k")  # one partition
    assert sorted(tuple(r) for r in tl.keyed_apply(declared, "k", sizes, SCHEMA).collect()) \
        == EXPECTED
    doubles = spark.createDataFrame([(k, 1) for k in [None, NAN, -0.0, 0.0] * 2],
                                    "k double, v long")
    got = sorted(tuple(r) for r in tl.keyed_apply(
        keyed_by_source(doubles.coalesce(1), "k"), "k", sizes, SCHEMA).collect())
    assert got == [("0.0", "float64", 4), ("None", "NoneType", 2), ("nan", "float64", 2)]
