"""keyed_agg picks the cheaper plan: Spark's map-side combine for aggregates with a fixed-size
partial buffer, exact placement for the rest (collect_list, exact percentiles, DISTINCT, UDAFs);
sketches (tests/placement/test_keyed_sketches.py) always take Spark's plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.placement import explain_keyed_agg, shuffle_exchanges

pytestmark = pytest.mark.connect


@pytest.fixture(scope="module")
def orders(spark: Any) -> Any:
    rng = np.random.default_rng(5)
    keys = rng.zipf(1.5, 3000) % 40
    frame = pd.DataFrame({"k": keys.astype(np.int64), "v": rng.integers(0, 100, 3000)})
    return spark.createDataFrame(frame).repartition(3)


def _sorted(df: Any) -> list[tuple[Any, ...]]:
    out = []
    for row in df.collect():
        out.append(tuple(sorted(x) if isinstance(x, list) else x for x in row))
    return sorted(out, key=str)


@pytest.mark.parametrize("make", [
    lambda: [F.sum("v").alias("s")],
    lambda: [F.count("*"), F.avg("v"), F.max("v"), F.stddev("v").alias("sd")],
    lambda: [F.sum(F.col("v") * 2).alias("s2"), F.count_if(F.col("v") > 50).alias("c")],
])
def test_decomposable_aggregates_take_sparks_combine(orders: Any, make: Any) -> None:
    exprs = make()
    plan = explain_keyed_agg(orders, "k", *exprs)
    assert plan.combine and "fixed-size" in plan.reason
    out = tl.keyed_agg(orders, "k", *exprs, strategy="least_count", num_partitions=4)
    assert _sorted(out) == _sorted(orders.groupBy("k").agg(*exprs))
    # Spark's own plan: no exchange beyond plain groupBy's
    assert shuffle_exchanges(out) == shuffle_exchanges(orders.groupBy("k").agg(*exprs))


@pytest.mark.parametrize("make, name", [
    (lambda: [F.collect_list("v").alias("l")], "collect_list"),
    (lambda: [F.sum("v"), F.percentile("v", 0.5).alias("p")], "percentile"),
    (lambda: [F.count_distinct("v").alias("d")], "DISTINCT"),
])
def test_aggregates_without_a_bounded_buffer_take_exact_placement(
        orders: Any, make: Any, name: str) -> None:
    exprs = make()
    plan = explain_keyed_agg(orders, "k", *exprs)
    assert not plan.combine and name in plan.reason
    strategy = tl.LeastCountPartitioner(4)
    out = tl.keyed_agg(orders, "k", *exprs, strategy=strategy)
    assert _sorted(out) == _sorted(orders.groupBy("k").agg(*exprs))
    # exact placement: each key sits on the partition the strategy gave it
    placed = out.select("k", F.spark_partition_id().alias("p")).collect()
    assigned = strategy.assign([r["k"] for r in placed])
    assert [r["p"] for r in placed] == list(assigned)


def test_combine_can_be_forced_either_way(orders: Any) -> None:
    exprs = [F.sum("v").alias("s")]
    never = explain_keyed_agg(orders, "k", *exprs, combine="never")
    assert not never.combine
    out = tl.keyed_agg(orders, "k", *exprs, strategy="hash", num_partitions=4, combine="never")
    assert _sorted(out) == _sorted(orders.groupBy("k").agg(*exprs))
    assert explain_keyed_agg(orders, "k", F.collect_list("v"), combine="always").combine
    with pytest.raises(InvalidArgumentError, match="combine"):
        tl.keyed_agg(orders, "k", *exprs, combine="sometimes")
