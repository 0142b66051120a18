"""Bad input: a clear TrilinkError that is also a ValueError/TypeError, and no corrupted state."""

from __future__ import annotations

import math

import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import InvalidKeyTypeError, MissingColumnError, NullKeyError
from trilink_spark.errors import UnknownStrategyError


@pytest.mark.parametrize("n", [0, -3])
def test_partitions_below_one(n):
    with pytest.raises(InvalidArgumentError, match=">= 1") as err:
        tl.HashPartitioner(n)
    assert isinstance(err.value, ValueError) and isinstance(err.value, tl.TrilinkError)


def test_partitions_wrong_type():
    with pytest.raises(TypeError, match="int >= 1"):
        tl.LeastKeyPartitioner("4")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tl.LeastKeyPartitioner(True)  # type: ignore[arg-type]


def test_modulo_on_non_integer_keys(spark):
    p = tl.ModuloPartitioner(4)
    for bad in ("a", b"a", 1.5, True):
        with pytest.raises(TypeError) as err:
            p.partition(bad)
        assert isinstance(err.value, tl.TrilinkError)
    with pytest.raises(InvalidKeyTypeError, match="Modulo needs integer"):
        p.assign(["a", "b"])
    df = spark.createDataFrame([("a", 1)], "k string, v int")
    with pytest.raises(InvalidKeyTypeError, match="Modulo needs an integer key column"):
        tl.key_by(df, "k", "modulo", 2)


@pytest.mark.parametrize(
    "weights,match",
    [
        ([50, -10, 60], "non-negative"),
        ([50, math.nan, 50], "finite"),
        ([50, 40], "sum to 100"),
        ([], "non-empty"),
    ],
)
def test_bad_weights(weights, match):
    with pytest.raises(InvalidArgumentError, match=match):
        tl.WeightPartitioner(weights)


def test_weights_wrong_length_and_type():
    with pytest.raises(InvalidArgumentError, match="num_partitions is 4"):
        tl.WeightPartitioner([50, 50], num_partitions=4)
    with pytest.raises(TypeError):
        tl.WeightPartitioner("100")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="'hash' or 'random'"):
        tl.WeightPartitioner([100], mode="round-robin")


def test_none_keys_refused_under_the_error_policy():
    for p in (tl.HashPartitioner(3, null_policy="error"),
              tl.LeastKeyPartitioner(3, null_policy="error"),
              tl.LeastCountPartitioner(3, null_policy="error")):
        with pytest.raises(NullKeyError, match="partition0"):
            p.partition(None)
        with pytest.raises(ValueError, match="null key"):
            p.assign(["a", None])
    with pytest.raises(InvalidArgumentError, match="null_policy"):
        tl.HashPartitioner(3, null_policy="drop")


def test_bad_input_leaves_state_untouched():
    p = tl.LeastCountPartitioner(3, null_policy="error").fit(["a", "b", "a"])
    before = p.to_dict()
    with pytest.raises(tl.TrilinkError):
        p.fit(["c", None, "d"])
    with pytest.raises(tl.TrilinkError):
        p.fit(["c", 1])
    with pytest.raises(tl.TrilinkError):
        p.fit({"c": -5})
    assert p.to_dict() == before
    p._check()


def test_null_keys_in_dataframe(spark):
    df = spark.createDataFrame([(None, 1), (2, 2)], "k int, v int")
    with pytest.raises(NullKeyError):  # counted on the driver: raised eagerly
        tl.key_by(df, "k", "least_key", 2, null_policy="error")
    placed = tl.key_by(df, "k", "hash", 2, null_policy="error")  # fails when the job runs
    with pytest.raises(Exception, match="NullKeyError"):
        placed.collect()


def test_unknown_strategy_name(spark):
    with pytest.raises(UnknownStrategyError, match="known: hash") as err:
        tl.key_by(spark.range(3), "id", "fastest", 2)
    assert isinstance(err.value, ValueError)
    with pytest.raises(UnknownStrategyError):
        tl.Partitioner.from_dict({"strategy": "nope", "num_partitions": 2})
    with pytest.raises(InvalidArgumentError, match="unknown candidate"):
        tl.evaluate_strategies([1, 2], 2, strategies=["best"])


def test_missing_key_column(spark):
    with pytest.raises(MissingColumnError, match="'user'.*columns are \\['id'\\]"):
        tl.key_by(spark.range(3), "user", "hash", 2)
    with pytest.raises(MissingColumnError):
        tl.keyed_agg(spark.range(3), "user", F.count("*"))


def test_other_argument_errors(spark):
    df = spark.range(10)
    with pytest.raises(InvalidArgumentError, match="differs"):
        tl.key_by(df, "id", tl.HashPartitioner(3), 4)
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        tl.key_by(df, "id", "auto", 2, sample_rate=0)
    with pytest.raises(InvalidArgumentError, match="fit must be"):
        tl.key_by(df, "id", "least_key", 2, fit="some")
    with pytest.raises(InvalidArgumentError, match="needs weights"):
        tl.key_by(df, "id", "weight", 2)
    with pytest.raises(InvalidKeyTypeError, match="supports int"):
        tl.key_by(df.selectExpr("cast(id as double) AS d"), "d", "least_key", 2)
    with pytest.raises(InvalidArgumentTypeError):
        tl.key_by(df, "id", 3, 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyTypeError, match="64"):
        tl.HashPartitioner(2).assign([2**70])
    with pytest.raises(InvalidKeyTypeError, match="floating"):
        tl.LeastKeyPartitioner(2).assign(__import__("numpy").array([1.5]))
