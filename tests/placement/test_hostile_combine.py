"""Hostile pass on ``keyed_agg(combine=...)`` and ``explain_keyed_agg``: whatever plan is
picked, the result is ``df.groupBy(key).agg(*exprs)`` (null, NaN, signed-zero and infinite
keys, empty frames, keyed_by_source frames, pandas UDAFs, mixed aggregates, an aggregate named
like the partition column, a task that fails once); bad placement arguments are refused on
every plan; the choice is safe from several threads."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import UnknownStrategyError
from trilink_spark.placement import explain_keyed_agg, keyed_by_source, shuffle_exchanges
from testkit.frames import rows

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODES = ("auto", "always", "never")
NAN, INF = float("nan"), float("inf")


def _mean(v: pd.Series) -> float:
    return float(v.mean())


def mean_udf(column: Any) -> Any:
    """A pandas grouped-aggregate UDF (built lazily: it needs a session)."""
    return pandas_udf(_mean, "double")(column)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def hostile(spark: Any) -> Any:
    keys = [NAN, None, 0.0, -0.0, INF, -INF, 1.0, 2.5]
    rows = [(k, float(v) if v % 4 else None) for i, k in enumerate(keys)
            for v in range(1, 4 + 3 * i)]
    return spark.createDataFrame(rows, "k double, v double").repartition(3)


AGGREGATE_SETS = {
    "combinable": lambda: [F.sum("v").alias("s"), F.count("*"), F.avg("v"), F.min("v"),
                           F.max("v"), F.stddev("v").alias("sd"), F.count("v")],
    "collect": lambda: [F.collect_list("v").alias("l")],
    "udaf": lambda: [mean_udf("v").alias("m")],
    "distinct": lambda: [F.count_distinct("v").alias("d")],
    "mixed": lambda: [F.sum("v").alias("s"), F.collect_set("v").alias("cs"),
                      F.percentile_approx("v", 0.5).alias("p")],
    "expression": lambda: [F.round(F.avg("v"), 2).alias("r"), (F.sum("v") / 2).alias("h")],
}


@pytest.mark.parametrize("which", list(AGGREGATE_SETS))
def test_every_mode_equals_groupby_on_hostile_keys(hostile: Any, which: str) -> None:
    exprs = AGGREGATE_SETS[which]()
    expected = hostile.groupBy("k").agg(*exprs)
    for mode in MODES:
        out = tl.keyed_agg(hostile, "k", *exprs, strategy="hash", num_partitions=3,
                           combine=mode, null_policy="partition0")
        assert out.columns == expected.columns, mode
        assert rows(out) == rows(expected), (which, mode)


def test_udafs_and_distinct_take_exact_placement_with_a_short_reason(hostile: Any) -> None:
    plan = explain_keyed_agg(hostile, "k", mean_udf("v"))
    assert not plan.combine and plan.reason.startswith("combine='auto': _mean(")
    assert "StackTrace" not in plan.reason and len(plan.reason) < 200
    assert not explain_keyed_agg(hostile, "k", F.count_distinct("v")).combine
    assert explain_keyed_agg(hostile, "k", F.sum("v"), F.count("v")).combine


def test_string_keys_with_a_table_strategy(spark: Any) -> None:
    keys = ["", " ", "é", "🙂", "x" * 100_000, "a\x00b", None, "A", "a"]
    data = [(k, float(i * j)) for i, k in enumerate(keys) for j in range(i + 1)]
    df = spark.createDataFrame(data, "k string, v double").repartition(2)
    for exprs in ([F.sum("v"), F.count("*")], [F.collect_list("v").alias("l")]):
        expected = rows(df.groupBy("k").agg(*exprs))
        for mode in MODES:
            out = tl.keyed_agg(df, "k", *exprs, strategy="least_count", num_partitions=4,
                               combine=mode, null_policy="partition0")
            assert rows(out) == expected, mode


def test_empty_frames_give_empty_results_in_every_mode(spark: Any) -> None:
    empty = spark.createDataFrame([], "k string, v double")
    for exprs in ([F.sum("v")], [F.collect_list("v")], [mean_udf("v")]):
        for mode in MODES:
            out = tl.keyed_agg(empty, "k", *exprs, combine=mode)
            assert out.collect() == [] and out.columns == empty.groupBy("k").agg(*exprs).columns


def test_keyed_by_source_frames_group_signed_zeros_as_one_key(spark: Any) -> None:
    data = [(k, float(v)) for k in [NAN, None, 0.0, -0.0, 1.0] for v in range(4)]
    base = spark.createDataFrame(data, "k double, v double").repartition(3, "k")
    declared = keyed_by_source(base, "k")
    exprs = [F.sum("v"), F.count("*"), F.max("v"), F.count_distinct("v").alias("d")]
    expected = rows(base.groupBy("k").agg(*exprs))
    for mode in MODES:
        out = tl.keyed_agg(declared, "k", *exprs, combine=mode)
        assert rows(out) == expected, mode
        assert shuffle_exchanges(out) == shuffle_exchanges(declared)  # still no exchange
        plan = explain_keyed_agg(declared, "k", *exprs, combine=mode)
        assert not plan.combine and "keyed_by_source" in plan.reason


def test_keyed_by_source_refuses_what_it_cannot_compute_per_partition(spark: Any) -> None:
    declared = keyed_by_source(spark.range(10).withColumn("k", F.col("id") % 3), "k")
    for expr in (mean_udf(F.col("id").cast("double")), F.collect_list("id")):
        with pytest.raises(InvalidArgumentError, match="key_by"):
            tl.keyed_agg(declared, "k", expr)


def test_an_aggregate_named_like_the_partition_column_survives(hostile: Any) -> None:
    exprs = [F.sum("v").alias(tl.PARTITION_COL), F.collect_list("v").alias("l")]
    expected = hostile.groupBy("k").agg(*exprs)
    for mode in MODES:
        out = tl.keyed_agg(hostile, "k", *exprs, strategy="hash", combine=mode,
                           null_policy="partition0")
        assert out.columns == expected.columns, mode
        assert rows(out) == rows(expected), mode


def test_an_aggregate_named_like_the_key(hostile: Any) -> None:
    exprs = [F.count("*").alias("k")]
    expected = rows(hostile.groupBy("k").agg(*exprs))
    for mode in MODES:
        out = tl.keyed_agg(hostile, "k", *exprs, combine=mode, null_policy="partition0")
        assert out.columns == ["k", "k"] and rows(out) == expected, mode


@pytest.mark.parametrize("kwargs, error", [
    ({"strategy": "bogus"}, UnknownStrategyError),
    ({"strategy": 3}, InvalidArgumentTypeError),
    ({"num_partitions": 0}, InvalidArgumentError),
    ({"num_partitions": -3}, InvalidArgumentError),
    ({"num_partitions": 2.5}, InvalidArgumentTypeError),
    ({"null_polcy": "partition0"}, InvalidArgumentTypeError),
    ({"null_policy": "ignore"}, InvalidArgumentError),
    ({"fit": "sometimes"}, InvalidArgumentError),
    ({"strategy": tl.HashPartitioner(4), "num_partitions": 5}, InvalidArgumentError),
])
def test_bad_placement_arguments_fail_whichever_plan_is_picked(hostile: Any, kwargs: Any,
                                                             error: type) -> None:
    for exprs in ([F.sum("v")], [F.collect_list("v")]):
        for mode in MODES:
            with pytest.raises(error):
                tl.keyed_agg(hostile, "k", *exprs, combine=mode, **kwargs)


def test_null_keys_under_the_default_policy(hostile: Any) -> None:
    # every plan keeps the null key's group, as groupBy does ('group' by default); 'error'
    # refuses it on every plan, and says so by name
    expected = rows(hostile.groupBy("k").agg(F.sum("v")))
    for mode in MODES:
        assert rows(tl.keyed_agg(hostile, "k", F.sum("v"), combine=mode)) == expected, mode
        with pytest.raises(Exception, match="NullKeyError"):
            tl.keyed_agg(hostile, "k", F.sum("v"), combine=mode, null_policy="error").collect()


def _fail_first_attempt(v: pd.Series) -> pd.Series:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0 and context.partitionId() == 0:
        raise RuntimeError("injected failure of a first attempt")
    return v


def test_a_task_failing_once_changes_nothing(spark: Any) -> None:
    flaky = pandas_udf(_fail_first_attempt, "double")  # type: ignore[call-overload]
    data = [(f"k{i % 17}", float(i)) for i in range(600)]
    df = spark.createDataFrame(data, "k string, v double").repartition(3)
    exprs = [F.sum("v").alias("s"), F.collect_list("v").alias("l")]
    expected = rows(df.groupBy("k").agg(*exprs))
    for mode in ("always", "never"):
        out = tl.keyed_agg(df.withColumn("v", flaky("v")), "k", *exprs,
                           strategy="least_count", num_partitions=4, combine=mode)
        assert rows(out) == expected, mode


def test_explain_from_threads_keeps_stdout_and_answers(hostile: Any) -> None:
    before = sys.stdout
    cases = [([F.sum("v")], True), ([F.count_distinct("v")], False),
             ([F.sum_distinct("v")], False), ([F.avg("v"), F.count("*")], True)]
    answers: list[tuple[bool, bool]] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        exprs, want = cases[i % len(cases)]
        got = explain_keyed_agg(hostile, "k", *exprs).combine
        with lock:
            answers.append((got, want))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sys.stdout is before
    assert len(answers) == 8 and all(got == want for got, want in answers)


def test_combine_argument_is_checked_first(hostile: Any) -> None:
    allowed = "'auto', 'always', 'never'"
    for bad, error, words in (
            ("sometimes", InvalidArgumentError, f"combine must be one of {allowed}, got "
                                                "'sometimes'"),
            ("AUTO", InvalidArgumentError, f"combine must be one of {allowed}, got 'AUTO'"),
            (None, InvalidArgumentTypeError, f"combine must be a str, one of {allowed}, got "
                                             "NoneType"),
            (True, InvalidArgumentTypeError, f"combine must be a str, one of {allowed}, got "
                                             "bool")):
        for call in (tl.keyed_agg, explain_keyed_agg):
            with pytest.raises(error, match=words):
                call(hostile, "k", F.sum("v"), combine=bad)
