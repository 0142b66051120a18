"""Hostile pass on ``input_columns()``: what a processor names is what its hooks get, whatever
iterable it returns, and a bad name is a typed error before any task runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sys

import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.keyed import KeyedContext

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class SumV(tl.KeyedWatermarkProcessFunction):
    """Emits, per on-time batch of a key, the sum of ``v`` and the columns it saw."""

    output_schema = "k string, s double, cols string"

    def __init__(self, names: Any) -> None:
        self.names = names

    def input_columns(self) -> Any:
        return self.names() if callable(self.names) else self.names

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        seen = ",".join(sorted(c for c in rows.columns if not c.startswith("_tl")))
        return [(key, float(rows["v"].sum()), seen)]


def frame(spark: Any) -> Any:
    return spark.createDataFrame([("a", 1.0, 2.0, "x"), ("a", 2.0, 3.0, "y"), ("b", 3.0, 4.0, "z")],
                                 "k string, t double, v double, junk string")


def names() -> Iterator[str]:
    yield "v"


@pytest.mark.parametrize("wanted", [["v"], ("v",), names], ids=["list", "tuple", "generator"])
def test_the_named_columns_reach_the_hooks(spark: Any, wanted: Any) -> None:
    out = tl.keyed_process(frame(spark), "k", "t", SumV(wanted), delay=0.0).collect()
    assert sorted((r["k"], r["s"]) for r in out) == [("a", 5.0), ("b", 4.0)]
    assert {r["cols"] for r in out} == {"k,v"}


@pytest.mark.parametrize("wanted", [["nope"], "v", [1]], ids=["missing", "string", "not-str"])
def test_bad_input_columns_are_typed_errors(spark: Any, wanted: Any) -> None:
    with pytest.raises(tl.TrilinkError):
        tl.keyed_process(frame(spark), "k", "t", SumV(wanted), delay=0.0)


def test_the_key_and_the_event_time_may_be_named(spark: Any) -> None:
    out = tl.keyed_process(frame(spark), "k", "t", SumV(["k", "t", "v", "v"]),
                           delay=0.0).collect()
    assert sorted((r["k"], r["s"]) for r in out) == [("a", 5.0), ("b", 4.0)]
    assert {r["cols"] for r in out} == {"k,t,v"}
