"""keyed_agg runs sketch aggregates (percentile_approx, approx_count_distinct, count_min_sketch,
HLL, ...) on Spark's own ``groupBy(key).agg`` plan: their results depend on the order rows and
partial buffers are merged, so only that plan gives exactly ``groupBy``'s result. The data
below are ones where exact placement by a strategy gives other percentiles."""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

import trilink_spark as tl
from trilink_spark.placement import explain_keyed_agg, shuffle_exchanges
from testkit.frames import rows, sketch_values

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def values(spark: Any) -> Any:
    return sketch_values(spark)


def _median(values: Any) -> Any:
    # accuracy 100: the summaries are compressed when merged, so merge order shows
    return F.percentile_approx(values, 0.5, 100).alias("p")


@pytest.mark.connect
def test_percentile_approx_takes_sparks_plan_and_equals_groupby(values: Any) -> None:
    exprs = [_median("v"), F.sum("v").alias("s")]
    plan = explain_keyed_agg(values, "k", *exprs)
    assert plan.combine
    assert plan.reason.startswith("combine='auto': percentile_approx(v, 0.5, 100) is a sketch")
    want = values.groupBy("k").agg(*exprs)
    got = tl.keyed_agg(values, "k", *exprs, strategy="hash", num_partitions=3)
    assert rows(got) == rows(want)
    assert shuffle_exchanges(got) == shuffle_exchanges(want)
    # the premise: rows placed by a strategy are merged in another order, and give other
    # (equally accurate) percentiles than groupBy's
    placed = tl.keyed_agg(values, "k", *exprs, strategy="hash", num_partitions=3,
                          combine="never")
    assert rows(placed) != rows(want)


@pytest.mark.connect
@pytest.mark.parametrize("make", [
    lambda: [F.approx_count_distinct("v").alias("a")],
    lambda: [F.approx_percentile("v", [0.25, 0.75], 100).alias("q")],
    lambda: [F.count_min_sketch("v", F.lit(0.01), F.lit(0.9), F.lit(3)).alias("cms")],
    lambda: [F.hll_sketch_agg("v").alias("h"), F.count("*").alias("n")],
])
def test_other_sketches_take_sparks_plan(values: Any, make: Any) -> None:
    exprs = make()
    plan = explain_keyed_agg(values, "k", *exprs)
    assert plan.combine and "is a sketch" in plan.reason
    got = tl.keyed_agg(values, "k", *exprs, strategy="least_count", num_partitions=3)
    assert rows(got) == rows(values.groupBy("k").agg(*exprs))


def test_a_sketch_beside_an_unbounded_aggregate_still_takes_sparks_plan(values: Any) -> None:
    exprs = [F.collect_list("v").alias("l"), _median("v")]
    plan = explain_keyed_agg(values, "k", *exprs)
    assert plan.combine and "collect_list" in plan.reason and "combine='never'" in plan.reason
    got = tl.keyed_agg(values, "k", *exprs, strategy="hash", num_partitions=3)
    want = values.groupBy("k").agg(*exprs)
    assert [r[0::2] for r in rows(got)] == [r[0::2] for r in rows(want)]  # list order aside
    assert not explain_keyed_agg(values, "k", *exprs, combine="never").combine


def percentile_approx(v: pd.Series) -> float:
    """A pandas UDAF named like Spark's sketch."""
    return float(v.median())


def test_a_python_udaf_named_like_a_sketch_is_placed_exactly(values: Any) -> None:
    udaf = pandas_udf(percentile_approx, "double")  # type: ignore[call-overload]
    plan = explain_keyed_agg(values, "k", udaf("v"))
    assert not plan.combine and "Python aggregate" in plan.reason
