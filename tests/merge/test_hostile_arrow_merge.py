"""Hostile inputs for Local Merge's Arrow path (:class:`ArrowMerge`).

Two kinds of check. Without a Spark job: ArrowMerge on hand-made Arrow batches against a
row-by-row model of Spark's aggregates and against the pandas path (``partition_partials``),
over hostile keys, values, event times, batch cuts and flush bounds. With Spark (few, small
jobs): ``merge_partials(local_merge(...))`` against ``df.groupBy(key).agg(...)``.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError, InvalidArgumentError
from trilink_spark.columns import ET_COL
from trilink_spark.merge.engines.arrow_engine import _FEW_PIECES, ArrowMerge, arrow_merge_partition
from trilink_spark.merge.engines.local import plan_merge
from trilink_spark.merge.engines.pandas_engine import arrow_to_pandas, partition_partials, to_arrow
from trilink_spark.merge.engines.plan import SLOT, MergePlan

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # task functions defined here

NAN, INF = float("nan"), float("inf")
BIG = "x" * (1 << 20)  # a 1 MB key


# ---------------------------------------------------------------------- a row-by-row model
def _order(value: Any) -> tuple[int, Any]:
    """Spark's ordering of non-null values: NaN above every number."""
    if isinstance(value, float) and math.isnan(value):
        return (1, 0.0)
    return (0, value)


def _extreme(values: list[Any], func: str) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    pick = min if func == "min" else max
    return pick(present, key=_order)


def _float_sum(values: list[float]) -> float:
    with np.errstate(invalid="ignore"):  # inf - inf
        return float(np.sum(np.asarray(values, dtype=np.float64)))


def _close(a: Any, b: Any, scale: float = 0.0) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12 * scale)
    return bool(a == b) and type(a) is type(b)


class Model:
    """Spark's ``groupBy(key).agg`` over raw rows, and the same over partial rows."""

    def __init__(self, aggs: dict[str, tuple[str, str | None]], integral: set[str]) -> None:
        self.aggs = aggs
        self.integral = integral  # aggregated columns of integral type (exact sums)

    def raw(self, rows: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
        by: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by[_hashable(row[key])].append(row)
        out = {}
        for k, group in by.items():
            res: dict[str, Any] = {}
            for name, (func, col) in self.aggs.items():
                values = [r[col] for r in group] if col else [1] * len(group)
                present = [v for v in values if v is not None]
                if func == "count":
                    res[name] = len(present)
                elif func == "sum":
                    if col in self.integral:
                        total = sum(present)
                        if not -(2**63) <= total < 2**63:
                            res[name] = OverflowError
                        else:
                            res[name] = total if present else None
                    else:
                        res[name] = _float_sum(present) if present else None
                    res[name + "~"] = sum(abs(float(v)) for v in present
                                          if math.isfinite(float(v)))
                elif func == "mean":
                    res[name] = _float_sum([float(v) for v in present]) / len(present) \
                        if present else None
                    res[name + "~"] = sum(abs(float(v)) for v in present
                                          if math.isfinite(float(v)))
                else:
                    res[name] = _extreme(present, func)
            out[k] = res
        return out

    def merged(self, partials: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
        by: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for row in partials:
            by[_hashable(row[key])].append(row)
        out = {}
        for k, group in by.items():
            res: dict[str, Any] = {}
            for name, (func, col) in self.aggs.items():
                if func == "count":
                    res[name] = sum(r[name] for r in group)
                elif func == "sum":
                    n = sum(r[name + "__n"] for r in group)
                    sums = [r[name] for r in group if r[name] is not None]
                    assert len(sums) == sum(1 for r in group if r[name + "__n"]), name
                    if col in self.integral:
                        res[name] = sum(sums) if n else None
                    else:
                        res[name] = _float_sum(sums) if n else None
                elif func == "mean":
                    n = sum(r[name + "__n"] for r in group)
                    sums = [r[name + "__sum"] for r in group if r[name + "__sum"] is not None]
                    res[name] = _float_sum(sums) / n if n else None
                else:
                    res[name] = _extreme([r[name] for r in group], func)
            out[k] = res
        return out

    def same(self, got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]]) -> None:
        assert got.keys() == want.keys()
        for k, row in want.items():
            for name, (func, _) in self.aggs.items():
                scale = row.get(name + "~", 0.0)
                assert _close(got[k][name], row[name], scale), (k, name, got[k][name], row[name])


def _hashable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


# ---------------------------------------------------------------------- plans and sources
def _plan(spark: Any, ddl: str, key: str, aggs: Any, mode: str = "groups", slot: Any = 25.0,
          event_time: str = "t", **kw: Any) -> tuple[MergePlan, pa.Schema]:
    """The plan of a merge of an (empty) DataFrame of ``ddl``, and its source's Arrow schema
    (what the partition function gets). No Spark job."""
    zone = spark.conf.get("spark.sql.session.timeZone")
    memo = (ddl, key, repr(aggs), mode, repr(slot), event_time, repr(sorted(kw.items())), zone)
    if memo not in _PLANS:
        df = spark.createDataFrame([], ddl)
        src, plan = plan_merge(df, key, event_time, slot, aggs, mode, **kw)
        _PLANS[memo] = plan, to_arrow_schema(src.schema, timezone=zone)
    return _PLANS[memo]


_PLANS: dict[tuple[str, ...], tuple[MergePlan, pa.Schema]] = {}


def _source(plan: MergePlan, schema: pa.Schema, data: dict[str, list[Any]],
            et: list[float | None]) -> pa.Table:
    """The source table of ``data`` (user column names) with event-time units ``et``."""
    arrays = []
    for field in schema:
        if field.name == ET_COL:
            arrays.append(pa.array(et, pa.float64()))
        else:
            arrays.append(pa.array(data[plan.aliases.get(field.name, field.name)], field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _cuts(table: pa.Table, how: str, seed: int = 0) -> list[pa.RecordBatch]:
    if how == "one":
        return table.combine_chunks().to_batches() or [
            pa.RecordBatch.from_pylist([], schema=table.schema)]
    if how == "single":  # maxRecordsPerBatch=1
        return table.to_batches(max_chunksize=1)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, table.num_rows + 1, 6)).tolist()
    bounds = [0, *cuts, table.num_rows]
    out = [table.slice(a, b - a).combine_chunks() for a, b in zip(bounds, bounds[1:])]
    return [b for t in out for b in (t.to_batches() or [
        pa.RecordBatch.from_pylist([], schema=table.schema)])]


def _arrow_run(plan: MergePlan, batches: list[pa.RecordBatch]) -> list[pa.Table]:
    merge = ArrowMerge.start(plan, batches[0])
    assert merge is not None, "expected the Arrow path"
    out: list[pa.Table] = []
    for batch in batches:
        out += merge.add(batch)
        if plan.mode == "groups":  # the buffer never holds more than max_groups groups
            held = [(_hashable(k), s) for p in merge.pieces
                    for k, s in zip(p[plan.key].to_pylist(), p["_tl_slot"].to_pylist())]
            assert len(set(held)) <= plan.max_groups
            assert len(held) <= 2 * plan.max_groups or len(merge.pieces) == 1
    out += merge.finish()
    assert merge.rows_in == sum(b.num_rows for b in batches)
    for table in out:
        assert table.schema == plan.arrow_schema  # partial types are the output's
        assert table.num_rows > 0
        groups = set(map(lambda r: (_hashable(r[plan.key]), r[SLOT]),
                         table.select([plan.key, SLOT]).to_pylist()))
        assert len(groups) == table.num_rows  # one row per (key, slot) per flush
        if plan.mode == "groups":
            assert table.num_rows <= plan.max_groups
    return out


def _pandas_run(plan: MergePlan, table: pa.Table) -> list[pa.Table]:
    flushed = partition_partials(arrow_to_pandas(table), plan)
    return [to_arrow(f, plan.arrow_schema) for f in flushed.pieces()]


def _rows(plan: MergePlan, tables: list[pa.Table]) -> list[dict[str, Any]]:
    return [r for t in tables for r in t.to_pylist()]


def _check(plan: MergePlan, table: pa.Table, model: Model, raw: list[dict[str, Any]],
           cuts: tuple[str, ...] = ("one", "single", "random")) -> None:
    """ArrowMerge over each way of cutting ``table`` equals the model per key and per (key,
    slot), as the pandas path does; event times are the largest of the rows'."""
    with_slot = [{**r, "ks": (_hashable(r[plan.key]), _slot(r["t"], plan.slot_units))}
                 for r in raw]
    want, want_slots = model.raw(raw, plan.key), model.raw(with_slot, "ks")
    pandas_rows = _rows(plan, _pandas_run(plan, table))
    for got in [pandas_rows, *(_rows(plan, _arrow_run(plan, _cuts(table, how))) for how in cuts)]:
        model.same(model.merged(got, plan.key), want)
        assert sum(r["n"] for r in got) == len(raw)  # every row in exactly one partial
        slotted = [{**r, "ks": (_hashable(r[plan.key]), r[SLOT])} for r in got]
        model.same(model.merged(slotted, "ks"), want_slots)
        # the event time of a key's partials: the largest of its rows' (none: no finite one)
        highs: dict[Any, Any] = {}
        for r in got:
            assert (r[plan.time_name] is None) == (r[SLOT] is None)
            if r[plan.time_name] is not None:
                k = _hashable(r[plan.key])
                highs[k] = max(highs.get(k, r[plan.time_name]), r[plan.time_name])
        assert highs == _highs(plan, raw)


def _slot(t: float | None, size: float) -> float | None:
    """Spark's slot start ``t - pmod(t, size)`` in doubles; None without a finite time."""
    if t is None or not math.isfinite(t):
        return None
    rem = math.fmod(t, size)
    if rem < 0:
        rem = math.fmod(rem + size, size)
    return t - rem


def _highs(plan: MergePlan, raw: list[dict[str, Any]]) -> dict[Any, Any]:
    highs: dict[Any, Any] = {}
    for r in raw:
        t = r["t"]
        if t is not None and math.isfinite(t):
            k = _hashable(r[plan.key])
            highs[k] = max(highs.get(k, t), t)
    return highs


# ---------------------------------------------------------------------- keys
AGGS_ALL = {"n": ("count", None), "nv": ("count", "v"), "s8": ("sum", "b8"),
            "s16": ("sum", "i16"), "s32": ("sum", "i32"), "sl": ("sum", "l"),
            "sf": ("sum", "f32"), "sv": ("sum", "v"), "m8": ("mean", "b8"), "mf": ("mean", "f32"),
            "mv": ("mean", "v"), "ml": ("mean", "l"), "lo8": ("min", "b8"), "hi8": ("max", "b8"),
            "lof": ("min", "f32"), "hif": ("max", "f32"), "lov": ("min", "v"), "hiv": ("max", "v"),
            "los": ("min", "str"), "his": ("max", "str"), "lob": ("min", "flag"),
            "hib": ("max", "flag"), "lod": ("min", "day"), "hid": ("max", "day"),
            "lots": ("min", "ts"), "hits": ("max", "ts")}
DDL_ALL = ("k {key}, t double, b8 tinyint, i16 smallint, i32 int, l bigint, f32 float, "
           "v double, str string, flag boolean, day date, ts timestamp")
INTEGRAL = {"b8", "i16", "i32", "l"}

UTC = dt.timezone.utc


def _values(n: int, seed: int) -> dict[str, list[Any]]:
    """Hostile value columns: nulls, NaN, +-inf, -0.0, extremes of every integer type."""
    rng = np.random.default_rng(seed)
    pick = lambda pool: [pool[i] for i in rng.integers(0, len(pool), n)]  # noqa: E731
    return {
        "b8": pick([None, -128, 127, 0, 5]),
        "i16": pick([None, -(2**15), 2**15 - 1, 7]),
        "i32": pick([None, -(2**31), 2**31 - 1, 3]),
        "l": pick([None, 2**56, -(2**56), 2**53 + 1, 1]),  # sums beyond 2**53
        "f32": pick([None, NAN, INF, -INF, 1.5, -0.0, 2.0**100]),
        "v": pick([None, NAN, INF, 1e300, -1e300, 0.1, -0.0, 2.0**60]),
        "str": pick([None, "", "😀", "a", "é", BIG[:1000]]),
        "flag": pick([None, True, False]),
        "day": pick([None, dt.date(1, 1, 1), dt.date(1970, 1, 1), dt.date(9999, 12, 31)]),
        "ts": pick([None, dt.datetime(1900, 1, 1, tzinfo=UTC), dt.datetime(2200, 1, 1, tzinfo=UTC),
                    dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)]),
    }


KEY_POOLS: dict[str, tuple[str, list[Any]]] = {
    "string": ("string", [None, "", "😀", "a", "A", BIG, BIG + "y", "a\x00b"]),
    "binary": ("binary", [None, b"", b"\x00", b"\xff" * 3, b"a", BIG.encode()]),
    "bigint": ("bigint", [None, -(2**63), 2**63 - 1, 0, -1]),
    "tinyint": ("tinyint", [None, -128, 127, 0]),
    "boolean": ("boolean", [None, True, False]),
    "date": ("date", [None, dt.date(1, 1, 1), dt.date(1970, 1, 1), dt.date(9999, 12, 31)]),
    "timestamp": ("timestamp", [None, dt.datetime(1900, 1, 1, tzinfo=UTC),
                                dt.datetime(1970, 1, 1, tzinfo=UTC),
                                dt.datetime(2200, 6, 1, 12, 30, tzinfo=UTC)]),
}


@pytest.mark.parametrize("kind", sorted(KEY_POOLS))
def test_hostile_keys_and_values_equal_the_model_and_the_pandas_path(spark: Any,
                                                                      kind: str) -> None:
    spark_type, pool = KEY_POOLS[kind]
    n = 40
    rng = np.random.default_rng(len(kind))
    data = _values(n, len(kind))
    data["k"] = [pool[i] for i in rng.integers(0, len(pool), n)]
    et = [None if i % 9 == 0 else float(x) for i, x in enumerate(rng.integers(-60, 60, n))]
    data["t"] = et
    raw = [dict(zip(data, vals)) for vals in zip(*data.values())]
    model = Model(AGGS_ALL, INTEGRAL)
    configs: list[tuple[str, dict[str, int], tuple[str, ...]]] = [
        ("groups", {}, ("one", "random")), ("groups", {"max_groups": 3}, ("single", "random")),
        ("quantity", {"quantity": 7}, ("random",))]
    if kind == "string":
        configs += [("groups", {"max_groups": 1}, ("one", "random")),
                    ("quantity", {"quantity": 1}, ("one", "single"))]
    for mode, kw, cuts in configs:
        plan, schema = _plan(spark, DDL_ALL.format(key=spark_type), "k", AGGS_ALL, mode, **kw)
        table = _source(plan, schema, data, et)
        _check(plan, table, model, raw, cuts)


def test_a_non_utc_session_time_zone_keeps_instants(spark: Any) -> None:
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kathmandu")  # +05:45
    try:
        test_hostile_keys_and_values_equal_the_model_and_the_pandas_path(spark, "timestamp")
    finally:
        spark.conf.unset("spark.sql.session.timeZone")


# ---------------------------------------------------------------------- event times, batches
@pytest.mark.parametrize("how", ["one", "single", "random"])
def test_hostile_event_times_and_batch_cuts(spark: Any, how: str) -> None:
    aggs = {"n": ("count", None), "s": ("sum", "l"), "hi": ("max", "v")}
    plan_g, schema = _plan(spark, "k string, t double, l bigint, v double", "k", aggs,
                           max_groups=2)
    plan_q, _ = _plan(spark, "k string, t double, l bigint, v double", "k", aggs, "quantity",
                      quantity=3)
    # null (Spark sends NaN and +-inf as null), 1e300, beyond 2**53, -0.0, equal, unsorted
    et = [None, 1e300, -1e300, 2.0**60 + 2**8, 2.0**60, -0.0, 0.0, 5.0, 5.0, 5.0, 24.999999,
          25.0, -25.0, -0.5, None, 3.0, 1e-300, -1e-300]
    n = len(et)
    data = {"k": ["a", "b", "a", None, "a", "b", "b", "", "", "a", None, "a", "😀", "a", "a",
                  "b", "a", "a"],
            "t": et, "l": [2**60 if i % 2 else -(2**59) for i in range(n)],
            "v": [NAN if i % 5 == 0 else float(i) for i in range(n)]}
    raw = [dict(zip(data, vals)) for vals in zip(*data.values())]
    model = Model(aggs, {"l"})
    for plan in (plan_g, plan_q):
        table = _source(plan, schema, data, et)
        _check(plan, table, model, raw, cuts=(how,))
    # -0.0 is in the slot 0.0 (Spark's -0.0 - pmod(-0.0, 25)), never a slot -0.0 of its own
    got = _arrow_run(plan_g, _cuts(_source(plan_g, schema, data, et), how))
    slots = [r[SLOT] for t in got for r in t.to_pylist() if r[SLOT] == 0.0]
    assert slots and all(math.copysign(1.0, s) == 1.0 for s in slots)


def test_empty_batches_and_an_empty_partition(spark: Any) -> None:
    aggs = {"n": ("count", None), "s": ("sum", "l")}
    plan, schema = _plan(spark, "k bigint, t double, l bigint", "k", aggs)
    none = pa.RecordBatch.from_pylist([], schema=schema)
    assert list(arrow_merge_partition(plan)(iter([]))) == []
    assert list(arrow_merge_partition(plan)(iter([none, none]))) == []
    rows = _source(plan, schema, {"k": [1, 1], "l": [2, 3]}, [1.0, 2.0])
    out = list(arrow_merge_partition(plan)(iter([none, *rows.to_batches(), none])))
    assert pa.Table.from_batches(out).select(["k", "n", "s"]).to_pylist() == [
        {"k": 1, "n": 2, "s": 5}]


# ---------------------------------------------------------------------- integral sums
def test_long_sums_beyond_2_53_are_exact_and_beyond_2_63_refused(spark: Any) -> None:
    aggs = {"s": ("sum", "l"), "m": ("mean", "l"), "n": ("count", None)}
    plan, schema = _plan(spark, "k bigint, t double, l bigint", "k", aggs)
    plan_q, _ = _plan(spark, "k bigint, t double, l bigint", "k", aggs, "quantity", quantity=2)
    fine = _source(plan, schema, {"k": [1, 1, 1, 2], "l": [2**53, 1, 1, -(2**63)]},
                   [1.0, 2.0, 3.0, 4.0])
    model = Model(aggs, {"l"})
    raw = [{"k": 1, "l": 2**53}, {"k": 1, "l": 1}, {"k": 1, "l": 1}, {"k": 2, "l": -(2**63)}]
    for p in (plan, plan_q):
        for how in ("one", "single"):
            got = model.merged(_rows(p, _arrow_run(p, _cuts(fine, how))), "k")
            model.same(got, model.raw(raw, "k"))
            assert got[1]["s"] == 2**53 + 2 and got[2]["s"] == -(2**63)  # exact
            assert got[2]["m"] == -(2.0**63)  # a long beyond 2**53 averages as a double
    # the total of one batch passes 2**63: refused, as the pandas path refuses it
    over = _source(plan, schema, {"k": [1, 1, 1], "l": [2**62, 2**62, 1]}, [1.0, 2.0, 3.0])
    with pytest.raises(ArithmeticOverflowError, match="overflows bigint"):
        _arrow_run(plan, _cuts(over, "one"))
    with pytest.raises(ArithmeticOverflowError, match="overflows bigint"):
        _pandas_run(plan, over)
    # ... and when only the merge of two batches' partials passes it
    with pytest.raises(ArithmeticOverflowError, match="overflows bigint"):
        _arrow_run(plan, _cuts(over, "single"))
    # each flush of quantity mode is within range: no error, the exchange's merge decides
    split = _source(plan_q, schema, {"k": [1, 1, 1, 1], "l": [2**62, 2**62 - 1, 2**62, 0]},
                    [1.0, 2.0, 3.0, 4.0])
    sums = [r["s"] for t in _arrow_run(plan_q, _cuts(split, "one")) for r in t.to_pylist()]
    assert sums == [2**63 - 1, 2**62]
    # below -2**63 too
    under = _source(plan, schema, {"k": [7, 7], "l": [-(2**63), -1]}, [1.0, 2.0])
    with pytest.raises(ArithmeticOverflowError):
        _arrow_run(plan, _cuts(under, "single"))


def test_float32_sums_are_double_sums_as_in_spark(spark: Any) -> None:
    aggs = {"s": ("sum", "f"), "m": ("mean", "f"), "hi": ("max", "f"), "n": ("count", None)}
    plan, schema = _plan(spark, "k bigint, t double, f float", "k", aggs)
    table = _source(plan, schema, {"k": [1, 1, 2, 2], "f": [2.0**127, 2.0**127, NAN, 1.0]},
                    [1.0, 2.0, 3.0, 4.0])
    rows = {r["k"]: r for t in _arrow_run(plan, _cuts(table, "one")) for r in t.to_pylist()}
    assert rows[1]["s"] == 2.0**128  # the double sum; float32 would overflow to inf
    assert rows[1]["m__sum"] == 2.0**128 and rows[1]["hi"] == 2.0**127
    assert math.isnan(rows[2]["s"]) and math.isnan(rows[2]["hi"])


@pytest.mark.xfail(strict=True, reason="pandas path (periodic/punctuation modes, decimals...) "
                   "sums float32 values in float32: 2**127 + 2**127 is inf, Spark's is 2**128")
def test_float32_sums_of_the_pandas_path_are_double_sums(spark: Any) -> None:
    aggs = {"s": ("sum", "f"), "n": ("count", None)}
    plan, schema = _plan(spark, "k bigint, t double, f float", "k", aggs)
    table = _source(plan, schema, {"k": [1, 1], "f": [2.0**127, 2.0**127]}, [1.0, 2.0])
    assert [r["s"] for r in _rows(plan, _pandas_run(plan, table))] == [2.0**128]


# ---------------------------------------------------------------------- bounds and cost
def test_max_groups_one_and_quantity_one_flush_every_group(spark: Any) -> None:
    aggs = {"n": ("count", None), "s": ("sum", "l")}
    plan, schema = _plan(spark, "k bigint, t double, l bigint", "k", aggs, max_groups=1)
    plan_q, _ = _plan(spark, "k bigint, t double, l bigint", "k", aggs, "quantity", quantity=1)
    n = 700
    keys = [i % 7 for i in range(n)]
    table = _source(plan, schema, {"k": keys, "l": list(range(n))},
                    [float(i % 50) for i in range(n)])
    raw = [{"k": k, "l": v, "t": float(i % 50)} for i, (k, v) in enumerate(zip(keys, range(n)))]
    model = Model(aggs, {"l"})
    for p in (plan, plan_q):
        for how in ("one", "random"):
            got = _arrow_run(p, _cuts(table, how))
            model.same(model.merged(_rows(p, got), "k"), model.raw(raw, "k"))
            if how == "one":  # one batch: every flush exactly as the pandas path cuts it
                want = _pandas_run(p, table)
                assert [t.num_rows for t in got] == [t.num_rows for t in want]
                assert [t.to_pylist() for t in got] == [t.to_pylist() for t in want]


def test_many_tiny_batches_hold_few_pieces(spark: Any) -> None:
    """One-row batches of few groups: the buffer holds a few pieces, not one per batch."""
    aggs = {"n": ("count", None)}
    plan, schema = _plan(spark, "k bigint, t double", "k", aggs)
    n = 3 * _FEW_PIECES
    table = _source(plan, schema, {"k": [i % 3 for i in range(n)]}, [1.0] * n)
    merge = ArrowMerge.start(plan, table.to_batches()[0])
    assert merge is not None
    most = 0
    for batch in table.to_batches(max_chunksize=1):
        assert merge.add(batch) == []
        most = max(most, len(merge.pieces))
    assert most <= _FEW_PIECES + 1  # not one piece per batch
    assert sorted((r["k"], r["n"]) for t in merge.finish() for r in t.to_pylist()) == [
        (0, n // 3), (1, n // 3), (2, n // 3)]


def test_groups_near_max_groups_over_many_batches_keep_the_bound(spark: Any) -> None:
    aggs = {"n": ("count", None), "lo": ("min", "l")}
    limit = 40
    plan, schema = _plan(spark, "k bigint, t double, l bigint", "k", aggs, max_groups=limit)
    rng = np.random.default_rng(5)
    n = 4000
    keys = rng.integers(0, int(limit * 0.9), n).tolist()  # always near the bound
    keys[2000:2100] = list(range(1000, 1100))  # then one batch alone beyond it
    values = rng.integers(-(2**40), 2**40, n).tolist()
    table = _source(plan, schema, {"k": keys, "l": values}, [1.0] * n)
    raw = [{"k": k, "l": v, "t": 1.0} for k, v in zip(keys, values)]
    model = Model(aggs, {"l"})
    for how in ("random", "one"):
        got = _arrow_run(plan, _cuts(table, how, seed=3))
        model.same(model.merged(_rows(plan, got), "k"), model.raw(raw, "k"))
    chunks = [table.slice(i, 50).combine_chunks().to_batches()[0] for i in range(0, n, 50)]
    got = _arrow_run(plan, chunks)
    model.same(model.merged(_rows(plan, got), "k"), model.raw(raw, "k"))
    # a partition with at most max_groups groups: one partial row per group, whatever the
    # batches (as the pandas path), even when the buffer runs near the bound for long
    for distinct in (int(limit * 0.8), limit):
        keys = [*range(distinct), *rng.integers(0, distinct, 400).tolist()]
        table = _source(plan, schema, {"k": keys, "l": keys}, [1.0] * len(keys))
        for how in ("random", "single"):
            got = _arrow_run(plan, _cuts(table, how, seed=distinct))
            assert sum(t.num_rows for t in got) == distinct, (distinct, how)


# ---------------------------------------------------------------------- a failing first attempt
def test_a_partition_run_again_after_a_failure_gives_the_same_rows(spark: Any) -> None:
    aggs = {"n": ("count", None), "s": ("sum", "l")}
    plan, schema = _plan(spark, "k bigint, t double, l bigint", "k", aggs, max_groups=3)
    table = _source(plan, schema, {"k": [i % 5 for i in range(50)], "l": list(range(50))},
                    [float(i) for i in range(50)])
    batches = table.to_batches(max_chunksize=7)

    def failing() -> Iterator[pa.RecordBatch]:
        yield from batches[:4]
        raise RuntimeError("task killed")

    with pytest.raises(RuntimeError, match="killed"):
        list(arrow_merge_partition(plan)(failing()))
    again = pa.Table.from_batches(list(arrow_merge_partition(plan)(iter(batches))))
    clean = pa.Table.from_batches(list(arrow_merge_partition(plan)(iter(batches))))
    assert again.equals(clean)
    assert sum(again["n"].to_pylist()) == 50


# ---------------------------------------------------------------------- against Spark
def _norm(rows: list[Any]) -> list[tuple[Any, ...]]:
    def one(v: Any) -> Any:
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else round(v, 6) if abs(v) < 1e15 else float(
                f"{v:.12g}")
        return v
    return sorted((tuple(one(v) for v in r) for r in rows), key=repr)


def _spark_aggs() -> list[Any]:
    return [F.count("*").alias("n"), F.count("v").alias("nv"), F.sum("l").alias("sl"),
            F.sum("f").alias("sf"), F.sum("b8").alias("sb"), F.avg("l").alias("ml"),
            F.min("v").alias("lo"), F.max("v").alias("hi"), F.min("f").alias("lof"),
            F.max("f").alias("hif"), F.min("str").alias("los"), F.max("str").alias("his"),
            F.min("flag").alias("lob"), F.max("flag").alias("hib"), F.min("day").alias("lod"),
            F.max("ts").alias("hits")]


def _hostile_frame(spark: Any) -> Any:
    rng = np.random.default_rng(11)
    n = 80
    vals = _values(n, 11)
    t = [None if i % 11 == 0 else NAN if i % 13 == 0 else INF if i % 17 == 0 else
         -INF if i % 19 == 0 else 1e300 if i % 23 == 0 else float(rng.integers(-99, 99))
         for i in range(n)]
    keys = KEY_POOLS["string"][1][:-1] + ["k" + "😀" * 3]
    rows = [(keys[int(rng.integers(0, len(keys)))],
             KEY_POOLS["binary"][1][int(rng.integers(0, 5))],  # not the 1 MB one: keep it small
             KEY_POOLS["bigint"][1][int(rng.integers(0, 5))],
             KEY_POOLS["timestamp"][1][int(rng.integers(0, 4))],
             t[i], vals["b8"][i], vals["l"][i], vals["f32"][i], vals["v"][i], vals["str"][i],
             vals["flag"][i], vals["day"][i], vals["ts"][i]) for i in range(n)]
    ddl = ("ks string, kb binary, kl bigint, kts timestamp, t double, b8 tinyint, l bigint, "
           "f float, v double, str string, flag boolean, day date, ts timestamp")
    return spark.createDataFrame(rows, ddl)  # two partitions


def test_merge_of_partials_is_sparks_groupby_on_hostile_keys(spark: Any) -> None:
    """``merge_partials(local_merge(...))`` equals ``groupBy(key).agg`` on hostile keys and
    values, in a non-UTC session, with three-row Arrow batches, in both modes and tiny bounds."""
    spark.conf.set("spark.sql.session.timeZone", "America/St_Johns")  # -03:30
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    df = _hostile_frame(spark)
    try:
        for key, kw in (("ks", {"max_groups": 1}), ("kts", {"mode": "quantity", "quantity": 1})):
            aggs = _spark_aggs()
            partial = tl.local_merge(df, key, "t", 25.0, aggs, **kw)
            got = tl.merge_partials(partial, key, aggs)
            want = df.groupBy(key).agg(*aggs)
            assert got.schema.simpleString() == want.schema.simpleString()
            assert _norm(got.collect()) == _norm(want.collect()), key
    finally:
        spark.conf.unset("spark.sql.session.timeZone")
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_slots_and_event_times_of_timestamp_and_bigint_times_are_sparks(spark: Any) -> None:
    """One partition, one flush: the partial rows are Spark's groupBy(key, slot), with the
    largest event time, for timestamp event times in a non-UTC session and bigint ones."""
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kathmandu")  # +05:45
    try:
        stamps = [dt.datetime(2024, 3, 31, 1, 59, 59, 999999), dt.datetime(1969, 12, 31, 23),
                  None, dt.datetime(2024, 3, 31, 1, 15), dt.datetime(1900, 1, 1),
                  dt.datetime(2024, 3, 31, 3, 0), dt.datetime(2024, 3, 31, 1, 15)]
        longs = [2**53, -(2**53), None, 7, -7, 0, 2**53 - 1]
        df = spark.createDataFrame([(i % 2, s, v) for i, (s, v) in enumerate(zip(stamps, longs))],
                                   "k int, ts timestamp, lt bigint").coalesce(1)
        aggs = [F.count("*").alias("n")]
        micros = F.unix_micros("ts")
        for col, slot, start in (
                ("ts", "1 hour", F.timestamp_micros(micros - F.pmod(micros, F.lit(3_600_000_000)))),
                ("lt", 10, F.col("lt") - F.pmod("lt", F.lit(10)))):
            got = tl.local_merge(df, "k", col, slot, aggs).select("k", SLOT, col, "n")
            want = df.groupBy("k", start.alias(SLOT)).agg(F.max(col).alias(col),
                                                          F.count("*").alias("n"))
            assert got.schema[col].dataType == df.schema[col].dataType
            assert _norm(got.collect()) == _norm(want.select("k", SLOT, col, "n").collect())
    finally:
        spark.conf.unset("spark.sql.session.timeZone")


def test_overflow_of_a_long_sum_fails_the_job_with_the_typed_error(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, 2**62), (1, 2.0, 2**62), (2, 3.0, 2**53)],
                               "k int, t double, l bigint").coalesce(1)
    with pytest.raises(Exception, match="ArithmeticOverflowError"):
        tl.local_merge(df, "k", "t", 10.0, {"s": ("sum", "l")}).collect()


def test_dotted_and_backticked_names_and_odd_frames(spark: Any) -> None:
    """Names with dots and backticks (they travel under aliases), six partitions, every key
    distinct but a null one, max_groups=1 (the exact cut of a batch), an empty frame."""
    df = spark.range(0, 40, 1, 6).selectExpr(
        "if(id % 13 = 0, null, id) as `k.e``y`", "if(id % 7 = 0, null, double(id)) as `t.x`",
        "if(id % 5 = 0, null, id * 3) as `v``a.l`")
    aggs = [F.sum(F.col("`v``a.l`")).alias("s.um"), F.count("*").alias("n`")]
    got = tl.merge_partials(tl.local_merge(df, "k.e`y", "t.x", 10.0, aggs, max_groups=1),
                            "k.e`y", aggs)
    want = df.groupBy(F.col("`k.e``y`")).agg(*aggs)
    assert _norm(got.collect()) == _norm(want.collect())
    assert tl.local_merge(df.where(F.lit(False)), "k.e`y", "t.x", 10.0, aggs).count() == 0


def test_a_task_failing_on_its_first_attempt_gives_sparks_result(flaky_frame: Any) -> None:
    df, flaky, marker = flaky_frame
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    got = tl.merge_partials(tl.local_merge(flaky, "k", "t", 5.0, aggs, max_groups=2), "k", aggs)
    want = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    assert _norm(got.collect()) == _norm(want.collect())
    assert marker.exists()  # the first attempt did fail (after a flush had been emitted)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="plan_merge does not refuse a key named slot_start or named like the "
                   "event time: the job fails inside the task with pandas/Arrow's 'Duplicate "
                   "column names' ValueError (both paths)")
@pytest.mark.parametrize("key, event_time", [("slot_start", "t"), ("t", "t")])
def test_a_key_named_like_an_output_column_is_refused_before_the_job(
        spark: Any, key: str, event_time: str) -> None:
    df = spark.createDataFrame([], "slot_start bigint, t double, v bigint")
    try:
        plan_merge(df, key, event_time, 10.0, {"n": ("count", None)})
    except InvalidArgumentError:
        return
    raise AssertionError("planned a merge whose output has two columns of one name")


@pytest.mark.parametrize("ddl, aggs", [
    ("k bigint, t double, d decimal(20,2)", {"s": ("sum", "d")}),
    ("k bigint, t double, d decimal(20,2)", {"m": ("mean", "d")}),
    ("k bigint, t double, b binary", {"hi": ("max", "b")}),
    ("k decimal(10,0), t double, v bigint", {"n": ("count", None)}),
    ("k float, t double, v bigint", {"n": ("count", None)}),
])
def test_what_has_no_arrow_form_takes_the_pandas_path(spark: Any, ddl: str,
                                                      aggs: dict[str, Any]) -> None:
    plan, schema = _plan(spark, ddl, "k", aggs)
    assert ArrowMerge.start(plan, pa.RecordBatch.from_pylist([], schema=schema)) is None
