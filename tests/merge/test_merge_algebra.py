"""One class per aggregate: registry, partial algebra in pandas, Redis form, Arrow names."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.merge import AGGREGATES
from trilink_spark.placement import SOURCE_AGGREGATES
from trilink_spark.merge.algebra import aggregates
from trilink_spark.merge.algebra.aggregates import (AGGREGATE_CLASSES, Combine, CombineAggregate,
                                                    Count, First, Last, Max, Mean, Min, Stddev,
                                                    Sum, Variance)
from trilink_spark.merge.algebra.expressions import AggSpec, parse_aggs, specs_for_partials
from trilink_spark.merge.algebra.partials import (finalize_frame, merge_partial_frames,
                                                  partial_frame)
from trilink_spark.merge.stores.redis_store import RedisStore

#: SOURCE_AGGREGATES as it was written out by hand before the algebra derived it.
FORMER_SOURCE_AGGREGATES = {
    "count": "count", "sum": "sum", "avg": "mean", "mean": "mean", "min": "min", "max": "max",
    "first": "first", "first_value": "first", "last": "last", "last_value": "last",
    "stddev": "stddev", "std": "stddev", "stddev_samp": "stddev", "stddev_pop": "stddev",
    "variance": "variance", "var_samp": "variance", "var_pop": "variance",
}


def test_registry_names_and_public_constants_stay() -> None:
    assert AGGREGATES == ("count", "sum", "min", "max", "mean", "first", "last")
    assert SOURCE_AGGREGATES == FORMER_SOURCE_AGGREGATES
    assert isinstance(SOURCE_AGGREGATES, dict)
    assert [AGGREGATE_CLASSES[n] for n in AGGREGATES] == [Count, Sum, Min, Max, Mean, First,
                                                           Last]
    assert not Stddev.mergeable and not Variance.mergeable
    assert AggSpec("s", "sum", "v").aggregate.__class__ is Sum
    assert isinstance(AggSpec("c", Combine(np.sum), "v").aggregate, CombineAggregate)


def test_every_aggregate_has_one_type_per_partial_column() -> None:
    for spec in parse_aggs({"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"),
                            "hi": ("max", "v"), "m": ("mean", "v"), "f": ("first", "v"),
                            "l": ("last", "v"), "c": (Combine(np.sum, "bigint"), "v")}, ["v"]):
        columns = spec.partial_columns
        assert len(columns) == len(spec.partial_types("int")) == len(set(columns))
        assert all(c == spec.name or c.startswith(spec.name + "__") for c in columns)


@pytest.mark.parametrize("func", ["stddev", "variance"])
def test_unmergeable_aggregates_are_refused_clearly(spark: Any, func: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{func}.*no exact partial form"):
        parse_aggs({"x": (func, "v")}, ["v"])
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    with pytest.raises(InvalidArgumentError, match="keyed_agg"):
        tl.local_merge(df, "k", "t", 10, {"x": (func, "v")})
    with pytest.raises(InvalidArgumentError):
        Stddev("x", "v").partial_types("double")


def test_unknown_aggregates_and_columns_still_raise() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown aggregate"):
        parse_aggs({"x": ("median", "v")}, ["v"])
    with pytest.raises(InvalidArgumentError, match="unknown aggregate"):
        parse_aggs([("x", ["sum"], "v")], ["v"])
    with pytest.raises(InvalidArgumentError, match="needs a column"):
        parse_aggs({"x": ("first", None)}, ["v"])
    assert [s.column for s in specs_for_partials({"n": ("count", None), "s": ("sum", "v")})] \
        == [None, "_"]


AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "m": ("mean", "v"), "f": ("first", "v"), "l": ("last", "v"),
        "c": (Combine(np.bitwise_or.reduce, "bigint"), "b")}


def test_partials_of_any_split_merge_to_the_partial_of_the_whole() -> None:
    rng = np.random.default_rng(5)
    n = 3_000
    rows = pd.DataFrame({"k": rng.integers(0, 30, n).astype(np.float64), "v": rng.normal(size=n),
                         "b": rng.integers(0, 1024, n), "t": rng.integers(0, 50, n) * 1.0,
                         "p": rng.permutation(n)})
    rows.loc[rng.random(n) < 0.2, "v"] = np.nan
    rows.loc[rows["k"] == 4, "v"] = np.nan  # a group with no values
    rows.loc[rng.random(n) < 0.02, "k"] = np.nan  # the null key is a group too
    specs = parse_aggs(AGGS, list(rows.columns))
    whole = finalize_frame(partial_frame(rows, ["k"], specs, "t", "p"), ["k"], specs)
    cuts = np.sort(rng.choice(np.arange(1, n), 40, replace=False)).tolist()
    parts = pd.concat([partial_frame(rows.iloc[a:b], ["k"], specs, "t", "p")
                       for a, b in zip([0, *cuts], [*cuts, n])], ignore_index=True)
    merged = finalize_frame(merge_partial_frames(parts, ["k"], specs, "t"), ["k"], specs)
    key = lambda f: f.sort_values("k", na_position="last").reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(key(merged), key(whole), check_dtype=False)
    # and against plain pandas
    present = rows[rows["v"].notna()].sort_values(["t", "p"])
    truth = key(whole).set_index("k")
    by_key = rows.groupby("k", dropna=False)
    assert truth["n"].tolist() == by_key.size().sort_index(na_position="last").tolist()
    np.testing.assert_allclose(truth["lo"], by_key["v"].min().sort_index(na_position="last"))
    np.testing.assert_allclose(truth["f"].dropna(),
                               present.groupby("k", dropna=False)["v"].first().sort_index(
                                   na_position="last"))
    assert np.isnan(truth.loc[4.0, "s"]) and np.isnan(truth.loc[4.0, "f"])
    assert truth["c"].tolist() == by_key["b"].agg(np.bitwise_or.reduce).sort_index(
        na_position="last").tolist()


def test_redis_form_comes_from_the_aggregates() -> None:
    specs = parse_aggs(AGGS, ["v", "b"])[:-1]  # every built-in
    ops = RedisStore.ops(specs)
    assert [(op.column, op.kind) for op in ops] == [
        ("n", "int"), ("s", "float"), ("s__n", "int"), ("lo", "min"), ("hi", "max"),
        ("m__sum", "float"), ("m__n", "int"), ("f", "first"), ("l", "last")]
    deltas = pd.DataFrame({"s": [0.1, np.nan], "s__n": [1, 0], "f": [2.5, np.nan],
                           "f__t": [3.0, np.nan], "f__p": [7, 0]})
    assert Sum("s", "v").redis_encode(deltas) == [["0.1", None], [1, 0]]
    assert First("f", "v").redis_encode(deltas) == [[[2.5, 3.0, 7], None]]
    hashes = [{b"s": b"0.1", b"s__n": b"1", b"f": b"2.5"}, {}]
    assert Sum("s", "v").redis_decode(hashes)["s__n"] == [1, 0]
    assert First("f", "v").redis_decode(hashes) == {"f": [2.5, None]}
    with pytest.raises(InvalidArgumentError, match="Combine"):
        RedisStore.ops(parse_aggs(AGGS, ["v", "b"]))


def test_no_private_name_crosses_modules() -> None:
    import ast
    import pathlib

    root = pathlib.Path(aggregates.__file__).resolve().parent.parent.parent
    merge = sorted((root / "merge").rglob("*.py"))
    assert len(merge) > 15  # every room of merge/
    for path in merge + [root / "placement" / "source.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (path.name, node.module, private)


def test_first_and_last_of_a_null_key_survive_two_group_columns() -> None:
    # the former label alignment lost them when grouping by (key, slot) with a null key
    rows = pd.DataFrame({"k": [np.nan, np.nan, 1.0], "slot": [0.0, 0.0, 0.0],
                         "v": [5.0, 6.0, 7.0], "t": [1.0, 0.0, 2.0], "p": [0, 1, 2]})
    specs = parse_aggs({"f": ("first", "v"), "l": ("last", "v")}, list(rows.columns))
    got = partial_frame(rows, ["k", "slot"], specs, "t", "p")
    assert got[["f", "l", "f__p", "l__p"]].values.tolist() == [[6.0, 5.0, 1, 0], [7.0, 7.0, 2, 2]]
