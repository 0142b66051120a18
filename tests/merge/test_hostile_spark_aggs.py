"""Hostile pass on Spark Column and dict aggregates in Local Merge and Global Merge: odd
column names and aliases, expressions that print like column names, windows, FILTER, literals,
``F.expr`` forms, NaN/null/inf values and keys, and name collisions. The oracle is Spark's own
``groupBy().agg()`` on the same Columns: the same names and the same values, or a typed
refusal that says what was wrong."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from conftest import greedy_group_bounds
from testkit.frames import rows
from trilink_spark.merge.algebra.expressions import parse_aggs, specs_for_partials

pytestmark = pytest.mark.connect

ODD = ["my col", "a.b", "f(x)", "x as y", "é€ ✓", "a__b", "a`b", "abs(v)", "1", "x"]


def _q(name: str) -> Any:
    return F.col("`" + name.replace("`", "``") + "`")


@pytest.fixture(scope="module")
def odd(spark: Any) -> Any:
    rng = random.Random(3)
    rows = []
    for i in range(300):
        values = [None if rng.random() < 0.15 else float(rng.randint(-50, 50)) for _ in ODD]
        rows.append((rng.choice("abcde"), float(rng.randint(0, 99)), float(i % 7), *values))
    ddl = "k string, t double, v double, " + ", ".join(
        "`" + n.replace("`", "``") + "` double" for n in ODD)
    return spark.createDataFrame(rows, ddl).repartition(3)


def _both_merges_equal_groupby(df: Any, cols: list[Any], glob: bool = True) -> None:
    expected = df.groupBy("k").agg(*cols)
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 25.0, cols), "k", cols)
    assert merged.columns == expected.columns
    assert rows(merged) == rows(expected)
    if not glob:
        return
    result = tl.global_merge(df, "k", cols)
    assert result is not None and result.columns == expected.columns
    assert rows(result) == rows(expected)


def test_odd_column_names_merge_under_sparks_names(odd: Any) -> None:
    cols = [F.sum(_q(n)) for n in ODD[:8]] + [F.avg(_q("a.b")), F.max(_q("x as y")),
                                              F.count(_q("a`b")), F.min(_q("é€ ✓"))]
    _both_merges_equal_groupby(odd, cols)


ALIASES = ["a b", "a as b", "b AS a", "x) AS (y", "a`b", "`q`", "é€", "sum(v)", "a__b", "s.t",
           "count(1)"]


def test_odd_aliases_are_spark_names(odd: Any) -> None:
    cols = [(F.avg if i % 2 else F.sum)("v").alias(a) for i, a in enumerate(ALIASES)]
    _both_merges_equal_groupby(odd, [*cols, F.count("*").alias("n")])


def test_nested_aliases_take_the_outer_name(odd: Any) -> None:
    cols = [F.sum("v").alias("inner").alias("outer"), F.avg("v").alias("a as b").alias("m")]
    _both_merges_equal_groupby(odd, cols)


def test_ambiguous_aliases_merge_partials_picks_the_name_that_is_there(odd: Any) -> None:
    for col in (F.sum("v").alias("a as b"), F.sum("v").alias("a").alias("b")):
        partial = tl.local_merge(odd, "k", "t", 25.0, [col])
        assert [s.name for s in specs_for_partials([col], partial.columns)] == \
            [c for c in odd.groupBy("k").agg(col).columns if c != "k"]


@pytest.mark.parametrize("make", [
    lambda: [F.expr("sum(v)"), F.expr("count(*)"), F.expr("sum(v) as s"),
             F.expr("avg(`my col`)"), F.expr("max(`a.b`) AS `m m`"), F.mean("v"), F.count("v")],
    lambda: [F.expr("SUM(v)").alias("S"), F.expr("count(1)"), F.expr("min(`x as y`)")],
    lambda: [F.count(F.lit(1))], lambda: [F.count("*")], lambda: [F.count(F.col("*"))],
])
def test_expr_and_count_forms_equal_groupby(odd: Any, make: Any) -> None:
    cols = make()
    _both_merges_equal_groupby(odd, cols, glob=len(cols) > 1)


def test_first_and_last_forms_follow_event_time(spark: Any) -> None:
    data = [("a", 3.0, 30.0), ("a", 1.0, None), ("a", 2.0, 20.0), ("a", 4.0, None),
            ("b", 5.0, None)]
    df = spark.createDataFrame(data, "k string, t double, v double").orderBy("t").coalesce(1)
    cols = [F.expr("first(v) ignore nulls"), F.expr("last(v, true)").alias("l"),
            F.first("v", True).alias("f2"), F.expr("first_value(v, true)").alias("fv")]
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 100.0, cols), "k", cols)
    assert merged.columns == ["k", "first(v)", "l", "f2", "fv"]
    assert rows(merged) == [("a", 20.0, 30.0, 20.0, 20.0), ("b", None, None, None, None)]
    with pytest.raises(InvalidArgumentError, match="ignorenulls=True"):
        tl.local_merge(df, "k", "t", 10.0, [F.expr("first(v) respect nulls")])


def test_count_of_a_literal_beside_a_column_named_like_it(odd: Any) -> None:
    # a column named '1' and count(lit(1)): rows, not the column's values
    _both_merges_equal_groupby(odd, [F.count(F.lit(1)).alias("rows"),
                                     F.count(_q("1")).alias("ones")], glob=False)


@pytest.mark.parametrize("make, match", [
    (lambda: F.sum(F.abs("v")), "not the plain sum"),  # a column 'abs(v)' exists
    (lambda: F.count(F.lit("x")), "(not the plain count|not a column)"),  # so does 'x'
    (lambda: F.sum(F.lit(1)), "(not the plain sum|not a column)"),  # and '1'
    (lambda: F.sum("v").over(Window.partitionBy("k")), "window"),
    (lambda: F.expr("sum(v) FILTER (WHERE v > 0)"), "FILTER"),
    (lambda: F.sum(F.col("v") * 2), "not a column"),
    (lambda: F.count(F.lit(None)), "not a column"),
    (lambda: F.sum_distinct(F.col("v")), "(?i)distinct"),
    (lambda: F.expr("count(DISTINCT v)"), "(?i)distinct"),
    (lambda: F.try_sum("v"), "does not know"),
    (lambda: F.sum("v") + F.count("v"), "not a call"),
    (lambda: F.sum("nope"), "not a column"),
])
def test_what_is_not_a_plain_aggregate_of_a_column_is_refused(odd: Any, make: Any,
                                                             match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match) as err:
        tl.local_merge(odd, "k", "t", 10.0, [make()])
    assert isinstance(err.value, ValueError)


def test_values_nan_inf_null_and_keys_nan_null_signed_zero(spark: Any) -> None:
    nan, inf = float("nan"), float("inf")
    keys = [nan, None, 0.0, -0.0, inf, -inf, 1.0]
    values = [nan, None, inf, -inf, 1.0, -0.0, 2.5, 1e308, 1e308]
    data = [(k, float(i * len(values) + j), v) for i, k in enumerate(keys)
            for j, v in enumerate(values)]
    random.Random(0).shuffle(data)
    df = spark.createDataFrame(data, "k double, t double, v double").repartition(3)
    cols = [F.sum("v"), F.count("v"), F.count("*"), F.min("v"), F.max("v"), F.avg("v")]
    expected = rows(df.groupBy("k").agg(*cols))
    for max_groups in (1, 2, 1_000_000):
        partial = tl.local_merge(df, "k", "t", 5.0, cols, max_groups=max_groups)
        assert rows(tl.merge_partials(partial, "k", cols)) == expected
    glob = tl.global_merge(df, "k", cols)
    assert glob is not None and rows(glob) == expected
    # the signed zero key comes back as Spark shows it
    zero = [r["k"] for r in glob.collect() if r["k"] == 0.0]
    assert len(zero) == 1 and math.copysign(1.0, zero[0]) == 1.0


def test_integer_and_decimal_values_with_dict_form(spark: Any) -> None:
    rows = [("a", float(i), 2**62 if i % 3 else None, i * 0.01) for i in range(30)]
    df = spark.createDataFrame(rows, "k string, t double, w bigint, d double") \
        .withColumn("d", F.col("d").cast("decimal(10,2)")).repartition(2)
    aggs = {"w": "max", "d": "sum"}
    merged = tl.merge_partials(tl.local_merge(df, "k", "t", 7.0, aggs), "k", aggs)
    expected = df.groupBy("k").agg(aggs)
    assert merged.select(*expected.columns).collect() == expected.collect()
    assert dict(merged.dtypes) == dict(expected.dtypes)


@pytest.mark.parametrize("cols, match", [
    (lambda: [F.sum("v").alias("k")], "key"),
    (lambda: [F.sum("v").alias("t")], "'t'"),
    (lambda: [F.sum("v").alias("slot_start")], "slot_start"),
    (lambda: [F.sum("v"), F.sum("v")], "repeat"),
    (lambda: [F.count("*"), F.count(F.lit(1))], "repeat"),
    (lambda: [F.sum("v").alias("s"), F.count("v").alias("s__n")], "s__n"),
    (lambda: [F.avg("v").alias("m"), F.sum("v").alias("m__sum")], "m__sum"),
    (lambda: [F.sum("v").alias("__v")], "__"),
    (lambda: [F.sum("v").alias("K")], "key"),
    (lambda: [F.sum("v").alias("S"), F.avg("v").alias("s")], "ignoring case"),
    (lambda: [F.sum("v").alias("")], "name"),
])
def test_name_collisions_are_refused_with_the_name(odd: Any, cols: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        tl.local_merge(odd, "k", "t", 10.0, cols())


def test_names_with_double_underscores_inside_are_fine(odd: Any) -> None:
    _both_merges_equal_groupby(odd, [F.sum("a__b"), F.avg("v").alias("x__y"),
                                     F.min("v").alias("f__t__p"), F.max("a__b").alias("a__n")])


@pytest.mark.parametrize("aggs", [lambda: [1], lambda: ["sum"], lambda: [None], lambda: 5,
                                  lambda: "sum(v)", lambda: [F.sum("v"), 3]])
def test_shapes_that_are_no_aggregates_are_refused_typed(spark: Any, aggs: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError) as err:
        parse_aggs(aggs(), ["k", "v"])
    assert isinstance(err.value, TypeError)


def test_mixed_forms_in_one_list(odd: Any) -> None:
    cols = [F.sum("v").alias("s"), ("n", "count", None), ("m", "max", "my col")]
    merged = tl.merge_partials(tl.local_merge(odd, "k", "t", 30.0, cols), "k", cols)
    expected = odd.groupBy("k").agg(F.sum("v").alias("s"), F.count("*").alias("n"),
                                    F.max(_q("my col")).alias("m"))
    assert rows(merged) == rows(expected)


def test_streaming_frames_take_column_aggregates(spark: Any) -> None:
    from trilink_spark.merge.engines.local import plan_merge

    stream = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
              .withColumn("k", F.col("value") % 3))
    _, plan = plan_merge(stream, "k", "timestamp", "10 seconds",
                         [F.sum("value").alias("s"), F.count("*")])
    assert [s.name for s in plan.specs] == ["s", "count(1)"]
    with pytest.raises(InvalidArgumentError, match="(?i)distinct"):
        plan_merge(stream, "k", "timestamp", "10 seconds", [F.count_distinct("value")])


# ---------------------------------------------------------------------- groups mode
@pytest.mark.parametrize("codes, max_groups", [
    ([7], 1), ([7], 2**62), ([0, 0, 0], 1), ([1, 2, 1, 2, 1, 2], 1),
    ([-(2**63), 2**63 - 1, -(2**63), 0], 2), (list(range(200)) * 3, 199),
    (list(range(200)) * 3, 200), ([5] * 1000 + [6], 1), (list(range(1000)), 10**30),
])
def test_group_bounds_on_extreme_codes_follow_the_greedy_definition(
        codes: list[int], max_groups: int) -> None:
    from trilink_spark.merge.engines.bounds import flush_bounds

    array = np.array(codes, dtype=np.int64)
    got = flush_bounds(np.zeros(len(codes)), "groups", 0, 0.0, None, array, max_groups)
    assert got == greedy_group_bounds(codes, max_groups)


@pytest.mark.parametrize(("max_groups", "error"), [
    (0, InvalidArgumentError), (-1, InvalidArgumentError),
    (True, InvalidArgumentTypeError), (1.5, InvalidArgumentTypeError),
    (None, InvalidArgumentTypeError)])
def test_a_max_groups_below_one_is_refused_not_a_hang(max_groups: Any, error: type) -> None:
    """A count below one is a value error, anything but an int a type error (one count check
    for every whole-number argument)."""
    from trilink_spark.merge.engines.bounds import flush_bounds

    with pytest.raises(error, match="max_groups"):
        flush_bounds(np.zeros(3), "groups", 0, 0.0, None, np.array([1, 2, 3]), max_groups)
    with pytest.raises(InvalidArgumentError, match="quantity"):
        flush_bounds(np.zeros(3), "quantity", 0, 0.0, None)


@pytest.mark.parametrize("layout", ["random", "sorted", "one_group_per_flush"])
def test_group_bounds_scan_each_row_a_bounded_number_of_times(layout: str, monkeypatch: Any
                                                              ) -> None:
    """The galloping scan over flushes reads each row O(1) times: the rows its windows cover
    grow as the input does (4x the rows, at most ~4x the rows read), on unsorted input too.
    Counted, not timed: every window the scan reads goes through ``np.flatnonzero``."""
    from trilink_spark.merge.engines.bounds import flush_bounds

    real = np.flatnonzero
    read: list[int] = []

    def counting(a: Any) -> Any:
        read.append(len(a))
        return real(a)

    monkeypatch.setattr(np, "flatnonzero", counting)
    rng = np.random.default_rng(7)
    sizes = [50_000, 200_000, 800_000] if layout != "one_group_per_flush" else \
        [10_000, 40_000, 160_000]
    work = []
    for n in sizes:
        if layout == "random":
            codes, max_groups = rng.integers(0, n // 4, n), 1000
        elif layout == "sorted":
            codes, max_groups = np.sort(rng.integers(0, n // 4, n)), 1000
        else:  # a flush per row: the walk over flushes is the cost
            codes, max_groups = np.arange(n) % 2, 1
        read.clear()
        bounds = flush_bounds(np.zeros(n), "groups", 0, 0.0, None, codes, max_groups)
        assert bounds and bounds[-1] == n and read
        work.append(sum(read))
    assert work[1] <= 4.5 * work[0] and work[2] <= 4.5 * work[1], work
    assert work[2] <= 200 * sizes[2], work  # a constant number of reads per row


def test_no_flush_holds_more_than_max_groups_and_the_merge_stays_exact(spark: Any) -> None:
    from trilink_spark.merge.engines.local import plan_merge
    from trilink_spark.merge.engines.pandas_engine import arrow_to_pandas, partition_partials

    rng = np.random.default_rng(11)
    n = 3000
    keys = rng.choice([0.0, -0.0, 1.0, 2.0, 3.0, np.nan, np.inf] + list(range(4, 60)), n)
    data = [(None if i % 97 == 0 else float(k), float(rng.integers(0, 300)),
             float(rng.normal())) for i, k in enumerate(keys)]
    df = spark.createDataFrame(data, "k double, t double, v double").repartition(2)
    aggs = [F.sum("v").alias("s"), F.count("*").alias("n"), F.max("v").alias("m")]
    expected = rows(df.groupBy("k").agg(*aggs))
    for max_groups in (1, 7, 64, 10**9):
        src, plan = plan_merge(df, "k", "t", 40.0, aggs, max_groups=max_groups)
        assert plan.mode == "groups"
        flushed = partition_partials(arrow_to_pandas(src.coalesce(1).toArrow()), plan)
        per_flush = np.bincount(flushed.flush)
        assert per_flush.max() <= max_groups  # one partial row per group of a flush
        partial = tl.local_merge(df, "k", "t", 40.0, aggs, max_groups=max_groups)
        assert rows(tl.merge_partials(partial, "k", aggs)) == expected, max_groups
