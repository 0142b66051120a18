"""keyed_agg finds a sketch aggregate wherever it sits in an expression (under an arithmetic
operator, a CASE WHEN, a cast, coalesce, array, beside exact aggregates): Spark plans the
aggregate functions apart from the expressions around them, and a sketch anywhere in them
must take Spark's own plan to give ``groupBy``'s result. A pandas UDAF named like a sketch,
wrapped or not, is still placed exactly."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

import trilink_spark as tl
from trilink_spark.placement import explain_keyed_agg
from testkit.frames import rows, sketch_values

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def values(spark: Any) -> Any:
    return sketch_values(spark)


def _median() -> Any:
    # accuracy 100: merged in another order, the summaries give other percentiles
    return F.percentile_approx("v", 0.5, 100)


WRAPPED: dict[str, Callable[[], list[Any]]] = {
    "plus": lambda: [(_median() + 0).alias("p")],
    "case when": lambda: [F.when(F.count("v") > 0, _median()).alias("p")],
    "coalesce": lambda: [F.coalesce(_median(), F.lit(0)).alias("p")],
    "cast": lambda: [_median().cast("double").alias("p")],
    "array": lambda: [F.array(_median()).alias("p")],
    "beside exact ones": lambda: [F.sum("v").alias("s"), (_median() * 1).alias("p"),
                                  F.count("*").alias("n")],
    "in SQL text after a sum": lambda: [
        F.expr("sum(v) + percentile_approx(v, 0.5, 100)").alias("p")],
    "rounded count distinct": lambda: [F.round(F.approx_count_distinct("v")).alias("a")],
}


@pytest.mark.parametrize("form", sorted(WRAPPED))
def test_a_wrapped_sketch_takes_sparks_plan_and_equals_groupby(values: Any, form: str) -> None:
    exprs = WRAPPED[form]()
    plan = explain_keyed_agg(values, "k", *exprs)
    assert plan.combine, plan.reason
    sketch = "approx_count_distinct" if "distinct" in form else "percentile_approx"
    assert plan.reason.startswith(f"combine='auto': {sketch}"), plan.reason
    assert " is a sketch" in plan.reason, plan.reason
    got = tl.keyed_agg(values, "k", *exprs, strategy="hash", num_partitions=3)
    assert rows(got) == rows(values.groupBy("k").agg(*exprs))


def test_the_premise_exact_placement_changes_a_wrapped_percentile(values: Any) -> None:
    """The comparison above can fail: placed by a strategy, the rows of a key are merged in
    another order and give other percentiles."""
    exprs = WRAPPED["plus"]()
    placed = tl.keyed_agg(values, "k", *exprs, strategy="hash", num_partitions=3,
                          combine="never")
    assert rows(placed) != rows(values.groupBy("k").agg(*exprs))


def percentile_approx(v: pd.Series) -> float:
    """A pandas UDAF named like Spark's sketch."""
    return float(v.median())


def test_a_wrapped_python_udaf_named_like_a_sketch_is_placed_exactly(values: Any) -> None:
    udaf = pandas_udf(percentile_approx, "double")  # type: ignore[call-overload]
    exprs = [(udaf("v") + 1).alias("p")]
    plan = explain_keyed_agg(values, "k", *exprs)
    assert not plan.combine, plan.reason
    got = tl.keyed_agg(values, "k", *exprs, strategy="hash", num_partitions=3)
    assert rows(got) == rows(values.groupBy("k").agg(*exprs))


def test_a_sketch_of_an_unknown_column_is_refused_as_groupby_refuses_it(values: Any) -> None:
    """Spark's analysis error, not a plan chosen for "a Python aggregate named like a
    sketch" that then fails in key_by."""
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException):
        values.groupBy("k").agg(F.percentile_approx("nope", 0.5))
    with pytest.raises(AnalysisException, match="nope"):
        explain_keyed_agg(values, "k", F.percentile_approx("nope", 0.5))
    with pytest.raises(AnalysisException, match="nope"):
        tl.keyed_agg(values, "k", F.percentile_approx("nope", 0.5), strategy="hash",
                     num_partitions=3)
