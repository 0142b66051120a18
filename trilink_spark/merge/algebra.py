"""Partial aggregates that merge exactly: the common language of Local Merge and Global Merge.

An aggregate is named and applied to a column: ``{"total": ("sum", "amount")}``. Each has a
*partial* form, a few columns that two partials of the same group combine into one, and a
*final* form. :func:`partial_frame` computes partials of raw rows (pandas, vectorised per
group); :func:`merge_partial_frames` combines partials (pandas); :func:`merge_partials`
combines them with Spark. Aggregating partials of any split of the rows gives exactly what
aggregating the rows gives.

=============== =========================================== ===============================
aggregate       partial columns                             final
=============== =========================================== ===============================
count           ``name`` (rows)                             sum
sum             ``name``, ``name__n`` (non-null values)     sum, null when no values
min / max       ``name``                                    min / max
mean            ``name__sum``, ``name__n``                  sum / n
first / last    ``name``, ``name__t`` (event time),         the value at the smallest /
                ``name__p`` (arrival position)              largest (time, position)
:class:`Combine` ``name``                                   the combine over the partials
=============== =========================================== ===============================

Nulls in the value column are skipped, as Spark skips them. Types and non-finite values
follow Spark's ``groupBy().agg()``: a sum of an integral column is a bigint, computed exactly
(a sum beyond 64 bits raises :class:`ArithmeticOverflowError` naming the aggregate, as Spark's
ANSI mode fails the query), of a float or double a double (``inf`` and NaN propagate), of a
decimal(p, s) a decimal(min(38, p + 10), s); a mean is a double; count a bigint; min, max,
first and last keep the input type. In frames with pandas' nullable dtypes (what the merges
read), NaN is a value distinct from null: ``max`` is NaN when a group has a NaN (Spark orders
NaN above everything) and ``min`` only when every value is NaN; in plain float64 frames NaN
stands for null.

Each row of the table is one class (:class:`Count`, :class:`Sum`, :class:`Min`, :class:`Max`,
:class:`Mean`, :class:`First`, :class:`Last`, :class:`CombineAggregate`), which owns every form
of its aggregate: partial columns and their Spark types, the partial of raw rows and the merge
of partials (pandas), the final value, the Spark merge expression of :func:`merge_partials`,
and the values it ships to a Redis global store. :data:`AGGREGATE_CLASSES` maps each name to
its class. Count, sum, min, max and mean also have a Spark form of their partials of raw rows
(:meth:`Aggregate.spark_init`), which ``local_merge(engine="spark")`` aggregates in the JVM.
:class:`Stddev` and :class:`Variance` only name Arrow's per-partition aggregates
(:func:`arrow_aggregates`); they have no exact partial form here and Local Merge refuses them.

Examples
--------
>>> import pandas as pd
>>> rows = pd.DataFrame({"k": [1, 1, 2], "v": [1.0, 3.0, None], "t": [0.0, 1.0, 2.0],
...                      "p": [0, 1, 2]})
>>> specs = parse_aggs({"s": ("sum", "v"), "m": ("mean", "v")}, rows.columns)
>>> parts = partial_frame(rows, ["k"], specs, "t", "p")
>>> finalize_frame(merge_partial_frames(parts, ["k"], specs, None), ["k"], specs)
   k    s    m
0  1  4.0  2.0
1  2  NaN  NaN
"""

from __future__ import annotations

import decimal
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd

from ..columns import INTERNAL_PREFIX, column_of, quoted
from ..errors import ArithmeticOverflowError, InvalidArgumentError, InvalidArgumentTypeError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "AGGREGATES",
    "AGGREGATE_CLASSES",
    "AggSpec",
    "Aggregate",
    "Combine",
    "CombineAggregate",
    "Count",
    "First",
    "Groups",
    "Last",
    "Max",
    "Mean",
    "Min",
    "RedisOp",
    "Stddev",
    "Sum",
    "Variance",
    "arrow_aggregates",
    "combinable",
    "SPARK_COMBINABLE",
    "UNMERGEABLE_SPARK",
    "finalize_frame",
    "make_aggregate",
    "merge_partial_frames",
    "merge_partials",
    "parse_aggs",
    "partial_frame",
    "partial_groups",
    "arrow_partials",
    "ArrowStep",
    "specs_for_partials",
]

TIME = "__t"
POS = "__p"

_INTEGRAL_TYPES = ("tinyint", "smallint", "int", "bigint")
_FLOAT_TYPES = ("float", "double")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Digits of Python's decimal arithmetic in sums of decimals: exact for up to 10**62 values of
#: Spark's 38 digits (Python's default context rounds to 28).
_DECIMAL_SUM_DIGITS = 100


def _numeric_kind(value_type: str) -> str:
    """``"integral"``, ``"fractional"``, ``"decimal"`` or ``""`` for a Spark type name."""
    if value_type in _INTEGRAL_TYPES:
        return "integral"
    if value_type in _FLOAT_TYPES:
        return "fractional"
    if value_type.startswith("decimal"):
        return "decimal"
    return ""


def _sum_type(value_type: str) -> str:
    """Spark's result type of ``sum`` over ``value_type`` (a numeric Spark type name)."""
    kind = _numeric_kind(value_type)
    if kind == "integral":
        return "bigint"
    if kind == "decimal":
        digits = value_type[len("decimal("):-1].split(",")
        precision, scale = int(digits[0]), int(digits[1])
        return f"decimal({min(38, precision + 10)},{scale})"
    return "double"


def _is_nullable_float(values: pd.Series) -> bool:
    """Whether ``values`` has a pandas nullable float dtype (NaN distinct from null)."""
    return isinstance(values.dtype, pd.api.extensions.ExtensionDtype) and \
        pd.api.types.is_float_dtype(values.dtype)


def _exact_int_sums(values: pd.Series, codes: np.ndarray, groups: int, what: str) -> pd.Series:
    """Exact 64-bit sums of integer ``values`` per group code (nullable Int64; null for a
    group with no value); a sum outside the int64 range raises ArithmeticOverflowError.

    Each value is split into its high and low 32 bits, summed separately (no intermediate can
    overflow below 2**31 rows) and recombined with a range check. Cost: one stable sort and
    two ``np.add.reduceat``; vectorised.
    """
    present = values.notna().to_numpy()
    v = values.to_numpy(dtype=np.int64, na_value=0) if len(values) else np.zeros(0, np.int64)
    out = np.zeros(groups, dtype=np.int64)
    if len(v):
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        v = v[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        low = np.add.reduceat(v & 0xFFFFFFFF, starts)
        high = np.add.reduceat(v >> 32, starts)
        out[ordered[starts]] = _join_halves(low, high, what)
    counts = np.bincount(codes[present], minlength=groups)
    return pd.Series(pd.arrays.IntegerArray(out, counts == 0))


def _overflow_message(what: str) -> str:
    """The message of an integral sum beyond 64 bits (pandas, Arrow and Spark forms alike)."""
    return (f"{what} overflows bigint (the int64 range [-2**63, 2**63 - 1]); Spark's sum "
            "fails the same way in ANSI mode: cast the column to decimal(38,0) or double first")


def _spark_exact_sum(value: Column, what: str) -> Column:
    """Spark's exact sum of an integral column per group, as :func:`_join_halves` computes
    it: the low and the high 32 bits summed apart (no intermediate overflows below 2**31
    rows, ANSI mode or not), recombined, and the query failed with a message naming
    ``ArithmeticOverflowError`` and ``what`` when the sum is outside the int64 range; null
    when the group has no value. An aggregate expression (one per group, no job)."""
    from pyspark.sql import functions as F

    wide = value.cast("bigint")
    low = F.sum(wide.bitwiseAND(F.lit(0xFFFFFFFF)))
    high = F.sum(F.shiftright(wide, 32)) + F.shiftright(low, 32)
    over = (high < F.lit(-(2**31))) | (high >= F.lit(2**31))
    joined = F.shiftleft(high, 32).bitwiseOR(low.bitwiseAND(F.lit(0xFFFFFFFF)))
    return F.when(over, _spark_overflow(_overflow_message(what), "bigint")).otherwise(joined)


def _spark_overflow(message: str, dtype: str) -> Column:
    """An expression of type ``dtype`` that fails the query with ``message``, named as
    :class:`ArithmeticOverflowError` (Spark cannot raise a Python exception: the task's error
    carries the name, as the event-time and null-key checks do)."""
    from pyspark.sql import functions as F

    failed: Column = F.raise_error(
        F.lit("trilink_spark.ArithmeticOverflowError: " + message)).cast(dtype)
    return failed


def _join_halves(low: np.ndarray, high: np.ndarray, what: str) -> np.ndarray:
    """Sums of the low 32 bits and of the high 32 bits (arithmetic shift) of int64 values
    recombined into their exact int64 sums; ArithmeticOverflowError naming ``what`` when one
    is outside the int64 range. Vectorised, O(len(low))."""
    high = high + (low >> 32)
    over = (high < -(2**31)) | (high >= 2**31)
    if over.any():
        raise ArithmeticOverflowError(_overflow_message(what))
    joined: np.ndarray = (high << 32) | (low & 0xFFFFFFFF)
    return joined


@dataclass(frozen=True)
class Combine:
    """A user-defined associative, commutative combine, e.g. ``Combine(np.bitwise_or.reduce)``.

    ``func`` receives a numpy array of a group's non-null values (or partial results) and
    returns one value of ``dtype`` (a Spark type name). Applied once per group, in Python.
    """

    func: Callable[[np.ndarray], Any]
    dtype: str = "double"

    def __post_init__(self) -> None:
        if not callable(self.func):
            raise InvalidArgumentTypeError("Combine.func must be callable")


class RedisOp(NamedTuple):
    """One partial value an aggregate ships to a Redis store.

    ``column`` is the partial column, ``kind`` the Lua merge (``int`` and ``float`` add,
    ``min``/``max`` compare, ``first``/``last`` compare (time, position)), ``field`` the hash
    field it lands in.
    """

    column: str
    kind: str
    field: str


class ArrowStep(NamedTuple):
    """One Arrow hash aggregation an aggregate asks for: ``values`` (an array as long as the
    table), the Arrow function (``"sum"``, ``"count"``, ``"min"``, ...) and its options."""

    values: Any
    func: str
    options: Any = None


@dataclass(frozen=True, eq=False)
class Groups:
    """Rows split into groups once, shared by every aggregate of one partial or merge step.

    Built by ``Groups.of(rows, by)``, ``by`` being column names or arrays as long as ``rows``
    (``pandas.DataFrame.groupby`` keys).

    Notes
    -----
    Cost: one hash group-by of ``rows`` (nulls are a group of their own; groups in order of
    first appearance). ``codes`` numbers each row's group, ``index`` labels the groups.

    Examples
    --------
    >>> g = Groups.of(pd.DataFrame({"k": ["a", "b", "a"]}), ["k"])
    >>> g.codes.tolist(), list(g.index)
    ([0, 1, 0], ['a', 'b'])
    """

    rows: pd.DataFrame
    grouped: Any  # pandas DataFrameGroupBy
    codes: np.ndarray
    index: pd.Index

    @classmethod
    def of(cls, rows: pd.DataFrame, by: Sequence[Any]) -> Groups:
        grouped = rows.groupby(list(by), sort=False, dropna=False)
        codes = grouped.ngroup().to_numpy(dtype=np.int64)
        return cls(rows, grouped, codes, grouped.size().index)

    def pick(self, present: np.ndarray, time: Any, pos: Any,
             smallest: bool) -> np.ndarray:
        """Per group, the row position with the smallest (or largest) ``(time, pos)`` among
        rows where ``present`` holds; -1 for a group with none.

        Ties keep the earliest row. Cost: one ``lexsort`` of the present rows.
        """
        rows = np.flatnonzero(present)
        codes = self.codes[rows]
        t = _floats(time)[rows]
        p = (pos.to_numpy(dtype=np.int64, na_value=0) if isinstance(pos, pd.Series)
             else np.asarray(pos))[rows]
        order = np.lexsort((p, t, codes) if smallest else (-p, -t, codes))
        ordered = codes[order]
        heads = np.ones(len(order), dtype=bool)
        heads[1:] = ordered[1:] != ordered[:-1]
        picked = np.full(len(self.index), -1, dtype=np.int64)
        picked[ordered[heads]] = rows[order[heads]]
        return picked

    def combine(self, values: pd.Series, func: Callable[[np.ndarray], Any]) -> pd.Series:
        """``func`` of each group's non-null ``values`` (a numpy array, in row order), labelled
        by group; NaN for a group with none.

        Cost: one stable sort of the present rows, then one Python call of ``func`` per group
        (on a numpy slice, no pandas object per group).
        """
        present = values.notna().to_numpy()
        codes = self.codes[present]
        if not len(codes):
            return pd.Series(np.nan, index=self.index, dtype=np.float64)
        order = np.argsort(codes, kind="stable")
        codes = codes[order]
        data = values[present].to_numpy()[order]
        ends = (np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist()
        starts = [0, *ends]
        combined = [func(data[a:b]) for a, b in zip(starts, [*ends, len(data)])]
        by_code = pd.Series(combined, index=codes[starts])
        return by_code.reindex(np.arange(len(self.index))).set_axis(self.index)

    def take(self, values: pd.Series, picked: np.ndarray) -> pd.Series:
        """``values`` at the rows ``picked`` per group (null where -1), labelled by group."""
        found = picked >= 0
        taken = values.iloc[picked[found]].set_axis(np.flatnonzero(found))
        return taken.reindex(np.arange(len(picked))).set_axis(self.index)


def _floats(values: Any) -> np.ndarray:
    """``values`` (a Series of any numeric dtype, or an array) as float64, NaN for null."""
    if isinstance(values, pd.Series):
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(values, dtype=np.float64)


def _by_code(values: pd.Series, groups: Groups) -> Any:
    """``values`` (one per row of ``groups.rows``) grouped by the group codes."""
    return values.reset_index(drop=True).groupby(groups.codes, sort=True)


def _jsonable(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


class Aggregate:
    """One aggregate of the algebra, bound to its output ``name`` and input ``column``.

    A subclass owns every form of its aggregate: :attr:`partial_columns` and
    :meth:`partial_types`, :meth:`init` (partials of raw rows), :meth:`merge` (partials of
    partials), :meth:`finalize`, :meth:`spark_merge` (the expression of
    :func:`merge_partials`), and its Redis form (:meth:`redis_ops`, :meth:`redis_encode`,
    :meth:`redis_decode`). Class attributes name it: ``func`` (the name in ``aggs``),
    ``spark_names`` and ``arrow`` (the Spark functions it computes per partition with Arrow's
    hash aggregation, see :func:`arrow_aggregates`).

    Notes
    -----
    The pandas methods are vectorised over groups (one group-by per aggregate column, or one
    sort); a :class:`Combine` calls Python once per group. Aggregates with ``mergeable`` False
    have no partial form: their type, pandas, Spark and Redis methods raise
    :class:`~trilink_spark.InvalidArgumentError`.

    Examples
    --------
    >>> agg = AGGREGATE_CLASSES["sum"]("total", "amount")
    >>> agg.partial_columns, agg.partial_types("int"), agg.final_type("int")
    (['total', 'total__n'], ['bigint', 'bigint'], 'bigint')
    """

    func: ClassVar[str] = ""
    spark_names: ClassVar[tuple[str, ...]] = ()
    arrow: ClassVar[str | None] = None
    mergeable: ClassVar[bool] = True
    needs_column: ClassVar[bool] = True

    def __init__(self, name: str, column: str | None) -> None:
        self.name = name
        self.column = column

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.column!r})"

    def _unmergeable(self) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"aggregate {self.name!r} ({self.func}) has no exact partial form: local_merge and "
            f"global_merge merge {', '.join(AGGREGATES)} or a Combine; compute {self.func} "
            "with keyed_agg, or from merged sums"
        )

    def _numeric(self, value_type: str) -> str:
        """``value_type`` when numeric; else InvalidArgumentTypeError naming the column."""
        if not _numeric_kind(value_type):
            raise InvalidArgumentTypeError(
                f"aggregate {self.name!r} ({self.func}) needs a numeric column; column "
                f"{self.column!r} is {value_type}"
            )
        return value_type

    # ---------------------------------------------------------------- schema
    @property
    def partial_columns(self) -> list[str]:
        """The partial columns, in output order."""
        return [self.name]

    def partial_types(self, value_type: str) -> list[str]:
        """Spark types of :attr:`partial_columns`, given the aggregated column's type."""
        raise self._unmergeable()

    def final_type(self, value_type: str) -> str:
        """Spark type of the final value, given the Spark type of the aggregated column."""
        raise self._unmergeable()

    # ---------------------------------------------------------------- pandas
    def _values(self, groups: Groups) -> Any:
        return groups.grouped[str(self.column)]

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        """Partials of raw rows, per group of ``groups`` (labelled by ``groups.index``)."""
        raise self._unmergeable()

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        """Partials of partial rows, per group of ``groups`` (labelled by ``groups.index``)."""
        raise self._unmergeable()

    def finalize(self, merged: pd.DataFrame) -> pd.Series:
        """The final value from fully merged partial columns."""
        if not self.mergeable:
            raise self._unmergeable()
        return merged[self.name]

    # ---------------------------------------------------------------- Arrow
    def arrow_steps(self, table: Any, merging: bool) -> list[ArrowStep] | None:
        """The Arrow hash aggregations that compute this aggregate's partials of ``table``
        (a ``pyarrow.Table`` of raw rows, or of partial rows when ``merging``), read back in
        order by :meth:`arrow_finish`; None when the aggregate or its input's type has no
        Arrow form (the caller then uses the pandas form)."""
        return None

    def arrow_finish(self, results: list[Any], merging: bool) -> dict[str, Any]:
        """The partial columns (Arrow arrays, one value per group) from the results of
        :meth:`arrow_steps`, in the same order."""
        raise self._unmergeable()

    def _arrow_source(self, table: Any, merging: bool, column: str | None = None) -> Any:
        """The column a step reads: the value column of raw rows, else the partial
        ``column`` (default: ``name``)."""
        return table[column or self.name] if merging else table[str(self.column)]

    def _arrow_count(self, table: Any, merging: bool) -> ArrowStep:
        """The ``name__n`` step: non-null values of raw rows, or the sum of partial counts."""
        import pyarrow.compute as pc

        if merging:
            return ArrowStep(table[f"{self.name}__n"], "sum")
        return ArrowStep(table[str(self.column)], "count", pc.CountOptions(mode="only_valid"))

    # ---------------------------------------------------------------- Spark
    def spark_init(self, value: Column | None, value_type: str) -> list[Column] | None:
        """Spark aggregate expressions computing :attr:`partial_columns` of raw rows, aliased
        and in order (``value``: the aggregated column, None for a count of rows;
        ``value_type`` its Spark type), as :meth:`init` computes them; None when the
        aggregate has no Spark form (first, last, Combine: they need arrival order or
        Python), so only the Python engine of Local Merge computes it."""
        return None

    def spark_merge(self) -> Column | None:
        """The Spark aggregate expression merging partial rows (None: merge in pandas)."""
        raise self._unmergeable()

    # ---------------------------------------------------------------- Redis
    def redis_ops(self) -> list[RedisOp]:
        """The partial values shipped to a Redis store, one op each."""
        raise self._unmergeable()

    def redis_encode(self, deltas: pd.DataFrame) -> list[list[Any]]:
        """One list of JSON values per :meth:`redis_ops` entry, a value per row of
        ``deltas``: ints as ints, floats as exact decimal strings (Lua would round to 14
        digits), nulls as None (skipped by the script)."""
        out = []
        for op in self.redis_ops():
            values = deltas[op.column].tolist()
            if op.kind == "int":
                out.append([_jsonable(v) for v in values])
            else:
                out.append([None if _jsonable(v) is None else repr(float(v)) for v in values])
        return out

    def redis_decode(self, hashes: Sequence[Mapping[bytes, bytes]]) -> dict[str, list[Any]]:
        """Partial columns read back from the key hashes (0 or NaN for a missing field)."""
        out: dict[str, list[Any]] = {}
        for op in self.redis_ops():
            raw = [h.get(op.field.encode()) for h in hashes]
            if op.kind == "int":
                out[op.column] = [0 if v is None else int(v) for v in raw]
            else:
                out[op.column] = [np.nan if v is None else float(v) for v in raw]
        return out


class Count(Aggregate):
    """Rows per group (no column), or non-null values of ``column`` per group, as Spark's
    ``count(*)`` and ``count(v)``; partial ``name`` (bigint), merged by summing.

    Examples
    --------
    >>> Count("n", None).redis_ops()
    [RedisOp(column='n', kind='int', field='n')]
    """

    func = "count"
    spark_names = ("count",)
    arrow = "count"
    needs_column = False

    def partial_types(self, value_type: str) -> list[str]:
        return ["bigint"]

    def final_type(self, value_type: str) -> str:
        return "bigint"

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        if self.column is None:
            return {self.name: groups.grouped.size()}
        return {self.name: self._values(groups).count().astype(np.int64)}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        return {self.name: groups.grouped[self.name].sum()}

    def arrow_steps(self, table: Any, merging: bool) -> list[ArrowStep] | None:
        import pyarrow.compute as pc

        if merging:
            return [ArrowStep(table[self.name], "sum")]
        if self.column is None:  # count(*): every row, nulls included
            return [ArrowStep(table.column(0), "count", pc.CountOptions(mode="all"))]
        return [ArrowStep(table[self.column], "count", pc.CountOptions(mode="only_valid"))]

    def arrow_finish(self, results: list[Any], merging: bool) -> dict[str, Any]:
        return {self.name: results[0].fill_null(0)}

    def spark_init(self, value: Column | None, value_type: str) -> list[Column]:
        from pyspark.sql import functions as F

        counted = F.count(F.lit(1)) if value is None else F.count(value)
        return [counted.alias(self.name)]

    def spark_merge(self) -> Column:
        from pyspark.sql import functions as F

        return F.sum(column_of(self.name)).cast("bigint").alias(self.name)

    def redis_ops(self) -> list[RedisOp]:
        return [RedisOp(self.name, "int", self.name)]


class Sum(Aggregate):
    """Sum of non-null values; partials ``name`` (double) and ``name__n`` (values), null when
    a group has no value.

    Examples
    --------
    >>> [op.kind for op in Sum("s", "v").redis_ops()]
    ['float', 'int']
    """

    func = "sum"
    spark_names = ("sum",)
    arrow = "sum"

    @property
    def partial_columns(self) -> list[str]:
        return [self.name, f"{self.name}__n"]

    def partial_types(self, value_type: str) -> list[str]:
        return [self.final_type(value_type), "bigint"]

    def final_type(self, value_type: str) -> str:
        return _sum_type(self._numeric(value_type))

    def _sum(self, values: pd.Series, groups: Groups) -> pd.Series:
        if pd.api.types.is_integer_dtype(values.dtype):
            sums = _exact_int_sums(values, groups.codes, len(groups.index),
                                   f"sum {self.name!r} of column {self.column!r}")
            return sums.set_axis(groups.index)
        with decimal.localcontext() as context:  # decimals: exact, as Spark sums them
            context.prec = _DECIMAL_SUM_DIGITS  # (the default context rounds to 28 digits)
            summed: pd.Series = _by_code(values, groups).sum(min_count=1).set_axis(groups.index)
        return summed

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        values = groups.rows[str(self.column)]
        return {self.name: self._sum(values, groups),
                f"{self.name}__n": self._values(groups).count()}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        g = groups.grouped
        return {self.name: self._sum(groups.rows[self.name], groups),
                f"{self.name}__n": g[f"{self.name}__n"].sum()}

    def finalize(self, merged: pd.DataFrame) -> pd.Series:
        return merged[self.name].where(merged[f"{self.name}__n"] > 0)

    def arrow_steps(self, table: Any, merging: bool) -> list[ArrowStep] | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        source = self._arrow_source(table, merging)
        if pa.types.is_integer(source.type):  # exact: the two 32-bit halves summed apart
            wide = source.cast(pa.int64())
            return [ArrowStep(pc.bit_wise_and(wide, 0xFFFFFFFF), "sum"),
                    ArrowStep(pc.shift_right(wide, 32), "sum"),
                    self._arrow_count(table, merging)]
        if pa.types.is_floating(source.type):  # Spark sums floats as doubles
            return [ArrowStep(source.cast(pa.float64()), "sum",
                              pc.ScalarAggregateOptions(min_count=1)),
                    self._arrow_count(table, merging)]
        return None  # decimals: the pandas form keeps their precision

    def arrow_finish(self, results: list[Any], merging: bool) -> dict[str, Any]:
        import pyarrow as pa

        counts = results[-1].fill_null(0)
        if len(results) == 2:
            return {self.name: results[0], f"{self.name}__n": counts}
        low, high = (r.fill_null(0).to_numpy() for r in results[:2])
        joined = _join_halves(low, high, f"sum {self.name!r} of column {self.column!r}")
        empty = counts.to_numpy(zero_copy_only=False) == 0
        return {self.name: pa.array(joined, pa.int64(), mask=empty),
                f"{self.name}__n": counts}

    def spark_init(self, value: Column | None, value_type: str) -> list[Column] | None:
        from pyspark.sql import functions as F

        if value is None:
            return None
        if value_type in _INTEGRAL_TYPES:  # exact in 64 bits, or the query fails
            total = _spark_exact_sum(value, f"sum {self.name!r} of column {self.column!r}")
        else:  # floats as doubles, decimals as decimal(p + 10, s): Spark's own sum
            total = F.sum(value)
        if _numeric_kind(value_type) == "decimal":
            # outside ANSI mode Spark's decimal sum is null on overflow, which merging the
            # partials would skip (a wrong sum): fail the query, as ANSI mode does
            failed = _spark_overflow(
                f"sum {self.name!r} of column {self.column!r} overflows "
                f"{self.final_type(value_type)}; cast the column to double first",
                self.final_type(value_type))
            total = F.when(total.isNull() & (F.count(value) > 0), failed).otherwise(total)
        return [total.cast(self.final_type(value_type)).alias(self.name),
                F.count(value).alias(f"{self.name}__n")]

    def spark_merge(self) -> Column:
        from pyspark.sql import functions as F

        n = self.name
        return F.when(F.sum(column_of(f"{n}__n")) > 0, F.sum(column_of(n))).alias(n)

    def redis_ops(self) -> list[RedisOp]:
        n = self.name
        return [RedisOp(n, "float", n), RedisOp(f"{n}__n", "int", f"{n}__n")]


class Mean(Aggregate):
    """Mean of non-null values; partials ``name__sum`` (double) and ``name__n`` (bigint).

    Examples
    --------
    >>> Mean("m", "v").partial_columns
    ['m__sum', 'm__n']
    """

    func = "mean"
    spark_names = ("avg", "mean")
    arrow = "mean"

    @property
    def partial_columns(self) -> list[str]:
        return [f"{self.name}__sum", f"{self.name}__n"]

    def partial_types(self, value_type: str) -> list[str]:
        self._numeric(value_type)
        return ["double", "bigint"]

    def final_type(self, value_type: str) -> str:
        self._numeric(value_type)
        return "double"

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        values = groups.rows[str(self.column)]
        nullable = (_is_nullable_float(values) or values.dtype == object
                    or pd.api.types.is_extension_array_dtype(values.dtype))
        as_float = values.astype("Float64") if nullable else values.astype(np.float64)
        return {f"{self.name}__sum": _by_code(as_float, groups).sum(min_count=1)
                .set_axis(groups.index),
                f"{self.name}__n": self._values(groups).count()}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        g, n = groups.grouped, self.name
        return {f"{n}__sum": g[f"{n}__sum"].sum(min_count=1), f"{n}__n": g[f"{n}__n"].sum()}

    def arrow_steps(self, table: Any, merging: bool) -> list[ArrowStep] | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        source = self._arrow_source(table, merging, f"{self.name}__sum")
        if not (pa.types.is_integer(source.type) or pa.types.is_floating(source.type)):
            return None  # decimals: the pandas form
        # safe=False: a long beyond 2**53 rounds to the nearest double, as Spark's avg casts
        # it (Arrow's safe cast refuses it)
        return [ArrowStep(source.cast(pa.float64(), safe=False), "sum",
                          pc.ScalarAggregateOptions(min_count=1)),
                self._arrow_count(table, merging)]

    def arrow_finish(self, results: list[Any], merging: bool) -> dict[str, Any]:
        return {f"{self.name}__sum": results[0], f"{self.name}__n": results[1].fill_null(0)}

    def finalize(self, merged: pd.DataFrame) -> pd.Series:
        n = merged[f"{self.name}__n"]
        result: pd.Series = (merged[f"{self.name}__sum"] / n).where(n > 0)
        return result

    def spark_init(self, value: Column | None, value_type: str) -> list[Column] | None:
        from pyspark.sql import functions as F

        if value is None:
            return None
        self._numeric(value_type)
        return [F.sum(value.cast("double")).alias(f"{self.name}__sum"),
                F.count(value).alias(f"{self.name}__n")]

    def spark_merge(self) -> Column:
        from pyspark.sql import functions as F

        n = self.name
        return (F.sum(column_of(f"{n}__sum")) / F.sum(column_of(f"{n}__n"))).alias(n)

    def redis_ops(self) -> list[RedisOp]:
        n = self.name
        return [RedisOp(f"{n}__sum", "float", f"{n}__sum"), RedisOp(f"{n}__n", "int", f"{n}__n")]


class _Extreme(Aggregate):
    """Min or max: partial ``name`` of the column's type, merged by the same reduction."""

    def partial_types(self, value_type: str) -> list[str]:
        return [value_type]

    def final_type(self, value_type: str) -> str:
        return value_type

    def _extreme(self, column: str, groups: Groups) -> pd.Series:
        values = groups.rows[column]
        if values.dtype == object:  # strings, binary, decimals: reduce the non-null values
            present = values.notna().to_numpy()
            kept = pd.Series(values.to_numpy()[present])
            reduced = getattr(kept.groupby(groups.codes[present], sort=True), self.func)()
            full: pd.Series = reduced.reindex(np.arange(len(groups.index)))
            return full.set_axis(groups.index)
        result: pd.Series = getattr(groups.grouped[column], self.func)()
        if not _is_nullable_float(values):
            return result
        # Spark orders NaN above every number: max is NaN when a group has one, min only
        # when all its values are NaN (pandas skips NaN, so fix those groups up)
        nan = np.isnan(values.to_numpy(dtype=np.float64, na_value=0.0))
        if not nan.any():
            return result
        ngroups = len(groups.index)
        with_nan = np.bincount(groups.codes[nan], minlength=ngroups) > 0
        numbers = np.bincount(groups.codes[values.notna().to_numpy() & ~nan],
                              minlength=ngroups)
        to_nan = with_nan if self.func == "max" else with_nan & (numbers == 0)
        dtype = np.float32 if str(values.dtype) == "Float32" else np.float64
        out = result.to_numpy(dtype=dtype, na_value=0.0)
        mask = result.isna().to_numpy()
        out[to_nan] = np.nan
        mask[to_nan] = False
        return pd.Series(pd.arrays.FloatingArray(out, mask), index=result.index)

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        return {self.name: self._extreme(str(self.column), groups)}

    def arrow_steps(self, table: Any, merging: bool) -> list[ArrowStep] | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        source = self._arrow_source(table, merging)
        kind = source.type
        if not any(test(kind) for test in (pa.types.is_integer, pa.types.is_floating,
                                           pa.types.is_string, pa.types.is_large_string,
                                           pa.types.is_boolean, pa.types.is_date32,
                                           pa.types.is_timestamp)):
            return None  # binary, decimals, ...: the pandas form
        steps = [ArrowStep(source, self.func)]
        if self.func == "max" and pa.types.is_floating(kind):
            # Arrow skips NaN unless a group has nothing else (what Spark's min does);
            # Spark's max is NaN when a group has one
            steps.append(ArrowStep(pc.is_nan(source), "any"))
        return steps

    def arrow_finish(self, results: list[Any], merging: bool) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        if len(results) == 1:
            return {self.name: results[0]}
        nan = pa.scalar(float("nan"), results[0].type)
        return {self.name: pc.if_else(results[1].fill_null(False), nan, results[0])}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        return {self.name: self._extreme(self.name, groups)}

    def spark_init(self, value: Column | None, value_type: str) -> list[Column] | None:
        from pyspark.sql import functions as F

        if value is None:
            return None
        reduce = getattr(F, self.func)  # Spark's min and max: NaN above every number
        return [reduce(value).alias(self.name)]

    def spark_merge(self) -> Column:
        from pyspark.sql import functions as F

        reduce = getattr(F, self.func)
        return reduce(column_of(self.name)).alias(self.name)  # type: ignore[no-any-return]

    def redis_ops(self) -> list[RedisOp]:
        return [RedisOp(self.name, self.func, self.name)]


class Min(_Extreme):
    """Smallest non-null value.

    Examples
    --------
    >>> Min("lo", "v").partial_types("int")
    ['int']
    """

    func = "min"
    spark_names = ("min",)
    arrow = "min"


class Max(_Extreme):
    """Largest non-null value.

    Examples
    --------
    >>> Max("hi", "v").redis_ops()
    [RedisOp(column='hi', kind='max', field='hi')]
    """

    func = "max"
    spark_names = ("max",)
    arrow = "max"


class _Ordered(Aggregate):
    """First or last non-null value by (event time, arrival position): partials ``name``,
    ``name__t`` (event time, double) and ``name__p`` (arrival position, bigint)."""

    smallest: ClassVar[bool] = True

    @property
    def partial_columns(self) -> list[str]:
        return [self.name, self.name + TIME, self.name + POS]

    def partial_types(self, value_type: str) -> list[str]:
        return [value_type, "double", "bigint"]

    def final_type(self, value_type: str) -> str:
        return value_type

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        rows = groups.rows
        values = rows[str(self.column)]
        # a row without an event time (null, NaN) comes after every timed row, by position
        times = _floats(rows[time_col])
        time = pd.Series(np.where(np.isnan(times), np.inf, times), index=rows.index)
        picked = groups.pick(values.notna().to_numpy(), time, rows[pos_col], self.smallest)
        return {self.name: groups.take(values, picked),
                self.name + TIME: groups.take(time, picked).astype(np.float64),
                self.name + POS: groups.take(rows[pos_col], picked)}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        rows = groups.rows
        time = rows[self.name + TIME]
        picked = groups.pick(time.notna().to_numpy(), time, rows[self.name + POS],
                             self.smallest)
        return {col: groups.take(rows[col], picked) for col in self.partial_columns}

    def spark_merge(self) -> Column:
        from pyspark.sql import functions as F

        n = self.name
        order = F.struct(column_of(n + TIME), column_of(n + POS))
        pick = F.min_by if self.smallest else F.max_by
        return pick(column_of(n), F.when(column_of(n + TIME).isNotNull(), order)).alias(n)

    def redis_ops(self) -> list[RedisOp]:
        return [RedisOp(self.name, self.func, self.name)]

    def redis_encode(self, deltas: pd.DataFrame) -> list[list[Any]]:
        """One list: ``[value, time, position]`` per row (None where the value is null);
        the script keeps the value (as JSON) at the smallest / largest (time, position)."""
        n = self.name
        return [[None if _jsonable(v) is None else [_jsonable(v), float(t), int(p)]
                 for v, t, p in zip(deltas[n], deltas[n + TIME], deltas[n + POS])]]

    def redis_decode(self, hashes: Sequence[Mapping[bytes, bytes]]) -> dict[str, list[Any]]:
        raw = [h.get(self.name.encode()) for h in hashes]
        return {self.name: [None if v is None else json.loads(v) for v in raw]}


class First(_Ordered):
    """The value at the smallest (event time, arrival position).

    Examples
    --------
    >>> First("f", "v").partial_columns
    ['f', 'f__t', 'f__p']
    """

    func = "first"
    spark_names = ("first", "first_value")
    arrow = "first"
    smallest = True


class Last(_Ordered):
    """The value at the largest (event time, arrival position).

    Examples
    --------
    >>> Last("l", "v").partial_types("string")
    ['string', 'double', 'bigint']
    """

    func = "last"
    spark_names = ("last", "last_value")
    arrow = "last"
    smallest = False


class CombineAggregate(Aggregate):
    """A :class:`Combine` as an aggregate: partial ``name`` of ``combine.dtype``, merged by
    the same combine (in Python, once per group). Redis cannot run it.

    Examples
    --------
    >>> CombineAggregate("mask", "bits", Combine(np.bitwise_or.reduce, "bigint")).final_type("int")
    'bigint'
    """

    func = "combine"

    def __init__(self, name: str, column: str | None, combine: Combine) -> None:
        super().__init__(name, column)
        self.combine = combine

    def partial_types(self, value_type: str) -> list[str]:
        return [self.combine.dtype]

    def final_type(self, value_type: str) -> str:
        return self.combine.dtype

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        return {self.name: groups.combine(groups.rows[str(self.column)], self.combine.func)}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        return {self.name: groups.combine(groups.rows[self.name], self.combine.func)}

    def spark_merge(self) -> None:
        return None

    def redis_ops(self) -> list[RedisOp]:
        raise InvalidArgumentError(
            f"aggregate {self.name!r} uses a Combine; RedisStore merges built-in aggregates only"
        )


class Stddev(Aggregate):
    """Standard deviation: computed per partition by Arrow (``keyed_agg`` on a
    ``keyed_by_source`` frame), not merged by Local Merge.

    Examples
    --------
    >>> Stddev.mergeable, Stddev.arrow
    (False, 'stddev')
    """

    func = "stddev"
    spark_names = ("stddev", "std", "stddev_samp", "stddev_pop")
    arrow = "stddev"
    mergeable = False


class Variance(Aggregate):
    """Variance: computed per partition by Arrow, not merged by Local Merge.

    Examples
    --------
    >>> Variance.spark_names
    ('variance', 'var_samp', 'var_pop')
    """

    func = "variance"
    spark_names = ("variance", "var_samp", "var_pop")
    arrow = "variance"
    mergeable = False


#: Aggregate classes by name (the built-in ``func`` names of ``aggs``, then the unmergeable).
AGGREGATE_CLASSES: dict[str, type[Aggregate]] = {
    cls.func: cls for cls in (Count, Sum, Min, Max, Mean, First, Last, Stddev, Variance)
}
#: Built-in aggregates.
AGGREGATES: tuple[str, ...] = tuple(n for n, c in AGGREGATE_CLASSES.items() if c.mergeable)
_SPARK_NAMES = ", ".join(n for c in AGGREGATE_CLASSES.values() if c.mergeable
                         for n in c.spark_names)


def arrow_aggregates() -> dict[str, str]:
    """Spark aggregate function names mapped to Arrow hash-aggregate functions.

    Notes
    -----
    Built from the ``spark_names`` and ``arrow`` of :data:`AGGREGATE_CLASSES`; O(classes).

    Examples
    --------
    >>> arrow_aggregates()["avg"], arrow_aggregates()["var_pop"]
    ('mean', 'variance')
    """
    return {spark: cls.arrow for cls in AGGREGATE_CLASSES.values() if cls.arrow is not None
            for spark in cls.spark_names}


def make_aggregate(func: str | Combine, name: str, column: str | None) -> Aggregate:
    """The aggregate object of ``func`` (a name of :data:`AGGREGATE_CLASSES` or a Combine).

    Examples
    --------
    >>> make_aggregate("mean", "m", "v")
    Mean('m', 'v')
    """
    if isinstance(func, Combine):
        return CombineAggregate(name, column, func)
    cls = AGGREGATE_CLASSES.get(func) if isinstance(func, str) else None
    if cls is None:
        raise InvalidArgumentError(
            f"unknown aggregate {func!r} for {name!r}; choose from {AGGREGATES} or a Combine"
        )
    return cls(name, column)


@dataclass(frozen=True)
class AggSpec:
    """One aggregate: output ``name``, ``func`` (a name or a Combine), input ``column``.

    Its :attr:`aggregate` (from :func:`make_aggregate`) does the work.

    Examples
    --------
    >>> AggSpec("s", "sum", "v").partial_columns
    ['s', 's__n']
    """

    name: str
    func: str | Combine
    column: str | None
    aggregate: Aggregate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "aggregate", make_aggregate(self.func, self.name, self.column))

    @property
    def partial_columns(self) -> list[str]:
        return self.aggregate.partial_columns

    def final_type(self, value_type: str) -> str:
        """Spark type of the final value, given the Spark type of the aggregated column."""
        return self.aggregate.final_type(value_type)

    def partial_types(self, value_type: str) -> list[str]:
        return self.aggregate.partial_types(value_type)


#: Spark aggregate functions with no exact partial form, refused by name.
UNMERGEABLE_SPARK: tuple[str, ...] = (
    "collect_list", "collect_set", "array_agg", "percentile", "percentile_approx",
    "approx_percentile", "percentile_cont", "percentile_disc", "median", "mode",
    "approx_count_distinct", "count_distinct", "count_min_sketch", "hll_sketch_agg",
    "stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop",
    "skewness", "kurtosis", "corr", "covar_pop", "covar_samp", "listagg", "string_agg",
)
_COUNT_ALL = ("*", "1", "unresolvedstar()")


def _spark_func(spark_name: str) -> str | None:
    """The algebra's ``func`` computing Spark function ``spark_name`` (None: none does)."""
    for cls in AGGREGATE_CLASSES.values():
        if cls.mergeable and spark_name in cls.spark_names:
            return cls.func
    return None


def _top_level(text: str, sep: str) -> list[int]:
    """Positions of ``sep`` (case-insensitive) in ``text`` outside parentheses and backticks."""
    out, depth, quoted, lowered, i = [], 0, False, text.lower(), 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and lowered.startswith(sep, i):
            out.append(i)
            i += len(sep)
            continue
        i += 1
    return out


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == "`":
        return name[1:-1].replace("``", "`")
    return name


def _column_text(col: Any) -> str:
    """The text of a Spark Column (``sum(v) AS s``), the same on classic and Connect."""
    text = str(col)
    if text.startswith("Column<'") and text.endswith("'>"):
        text = text[len("Column<'"):-2]
    return text


_NULLS_CLAUSES = {" ignore nulls": "true", " respect nulls": "false"}


class _Reading(NamedTuple):
    """One way to read a Column aggregate's text: the call, its arguments, the nulls clause
    (``first(v) ignore nulls``) and the alias text, if any."""

    spark_name: str
    args: list[str]
    nulls: str | None
    alias: str | None


def _readings(text: str) -> list[_Reading]:
    """Every way to split ``text`` into ``func(args) [ignore nulls] [AS alias]``, the shortest
    call first. Names are printed unquoted (``sum(x as y)``, ``sum(v) AS a as b``), so the
    text alone can be ambiguous: the caller picks the reading that names input columns, or
    that Spark's analysis confirms."""
    lowered = text.lower()
    ends = [i for i in range(len(text)) if lowered.startswith(" as ", i)] + [len(text)]
    out = []
    for end in ends:
        call, alias = text[:end], (text[end + 4:] if end < len(text) else None)
        nulls = None
        for clause, flag in _NULLS_CLAUSES.items():
            if call.lower().endswith(clause):
                call, nulls = call[: -len(clause)], flag
        head, paren, rest = call.partition("(")
        spark_name = head.strip().lower()
        if not paren or not rest.endswith(")") or not spark_name.replace("_", "").isalnum():
            continue
        body = rest[:-1]
        commas = _top_level(body, ",")
        args = [body[i + 1:j].strip() for i, j in zip([-1, *commas], [*commas, len(body)])]
        out.append(_Reading(spark_name, args, nulls, alias))
    return out


def _alias_names(alias: str) -> tuple[list[str], str]:
    """The names an alias text may stand for, and the one read without other evidence.

    Aliases are printed unquoted, so ``AS a as b`` is ``alias("a as b")`` or
    ``alias("a").alias("b")``: the options are all of it, or what follows each inner
    `` AS `` (each also unquoted); the default is what follows the last `` AS `` outside
    backticks (a nested alias, Spark's name for it), unquoted."""
    lowered = alias.lower()
    tails = [alias] + [alias[i + 4:] for i in range(len(alias)) if lowered.startswith(" as ", i)]
    options: list[str] = []
    for tail in tails:
        for name in (tail, _unquote(tail)):
            if name and name not in options:
                options.append(name)
    nested = _top_level(alias, " as ")
    return options, _unquote(alias[nested[-1] + 4:] if nested else alias)


def _column_item(col: Any, columns: Sequence[str] | None,
                 available: Sequence[str] | None = None) -> tuple[str, str, str | None]:
    """``(name, func, column)`` of a Spark Column aggregate such as ``F.sum("v").alias("s")``,
    read from its text (the same on classic and Spark Connect sessions); refuses what the
    algebra cannot merge exactly, naming it.

    Of several readings of the text, the first whose argument is a column of ``columns`` (or
    a count of rows) wins; of several alias readings, the one whose partial columns are in
    ``available`` (the partial rows' columns, for :func:`merge_partials`), else the last (a
    nested alias). With the input at hand, :func:`parse_aggs` has Spark confirm both."""
    text = _column_text(col)
    readings = _readings(text)
    if not readings:
        raise InvalidArgumentError(
            f"aggregate {text!r} is not a call of an aggregate function on a column; give "
            f"F.<func>(column) with func one of {_SPARK_NAMES}, or (name, func, column)")

    def names_a_column(reading: _Reading) -> bool:
        first = reading.args[0]
        return (columns is None or _unquote(first) in columns
                or (reading.spark_name == "count" and first.lower() in _COUNT_ALL))

    reading = next((r for r in readings if names_a_column(r)), readings[0])
    spark_name, args, nulls, alias_text = reading
    first = args[0]
    alias: str | None = None
    if alias_text is not None:
        options, alias = _alias_names(alias_text)
        if available is not None:
            alias = next((n for n in options if n in available or f"{n}__n" in available),
                         alias)
    shown = alias or text
    if spark_name in UNMERGEABLE_SPARK or first.lower().startswith("distinct "):
        what = f"{spark_name}(DISTINCT ...)" if first.lower().startswith("distinct ") \
            else spark_name
        raise InvalidArgumentError(
            f"aggregate {shown!r} ({what}) cannot be merged exactly from partials: local_merge "
            f"and global_merge merge {_SPARK_NAMES}; compute {what} with keyed_agg (exact "
            "placement) instead")
    func = _spark_func(spark_name)
    if func is None:
        raise InvalidArgumentError(
            f"aggregate {shown!r} uses {spark_name!r}, which the merge algebra does not know; "
            f"it merges {_SPARK_NAMES} (or a Combine in the (name, func, column) form)")
    column: str | None = _unquote(first)
    if func == "count" and first.lower() in _COUNT_ALL and (
            columns is None or column not in columns):
        column, spark_arg = None, "1"
    else:
        spark_arg = column or ""
        if columns is not None and column not in columns:
            lowered = text.lower()
            clause = ("over a window" if " over (" in lowered or "windowexpression(" in lowered
                      else "with a FILTER clause" if " filter (" in lowered else "")
            if clause:
                raise InvalidArgumentError(
                    f"aggregate {shown!r} is computed {clause}, which the merge cannot do; "
                    f"give a plain F.<func>(column) with func one of {_SPARK_NAMES}")
            raise InvalidArgumentError(
                f"aggregate {shown!r}: {first!r} is not a column of the input ({list(columns)})"
                "; an aggregate of an expression needs the expression as a column first "
                "(df.withColumn)")
    if func in ("first", "last"):
        flag = args[1].strip().lower() if len(args) > 1 else (nulls or "false")
        if flag != "true":
            raise InvalidArgumentError(
                f"aggregate {shown!r}: the merge keeps the {func} non-null value by event time; "
                f"write F.{func}({spark_arg!r}, ignorenulls=True) (Spark's {func} without it "
                "depends on row order)")
    elif len(args) > 1 or nulls is not None:
        raise InvalidArgumentError(f"aggregate {shown!r} has extra arguments {args[1:]}")
    output = "avg" if func == "mean" else spark_name
    return (alias if alias is not None else f"{output}({spark_arg})", func, column)


def _dict_item(column: Any, spark_name: Any, columns: Sequence[str] | None
               ) -> tuple[str, str, str | None]:
    """``(name, func, column)`` of Spark's dict form ``{column: "sum"}``, named as Spark
    names it (``sum(v)``, ``avg(v)`` for mean, ``count(1)`` for ``{"*": "count"}``)."""
    if not isinstance(column, str) or not isinstance(spark_name, str):
        raise InvalidArgumentTypeError(
            f"Spark's dict form maps column names to function names ({{'v': 'sum'}}); got "
            f"{column!r}: {spark_name!r}")
    func = _spark_func(spark_name.lower())
    if func is None:
        raise InvalidArgumentError(
            f"aggregate {{{column!r}: {spark_name!r}}}: {spark_name!r} "
            + ("cannot be merged exactly from partials; compute it with keyed_agg"
               if spark_name.lower() in UNMERGEABLE_SPARK or spark_name in AGGREGATE_CLASSES
               else "is not an aggregate the merge algebra knows")
            + f" (it merges {_SPARK_NAMES})")
    if column == "*":
        if func != "count":
            raise InvalidArgumentError(f"'*' takes only count, got {spark_name!r}")
        return ("count(1)", "count", None)
    if columns is not None and column not in columns:
        raise InvalidArgumentError(
            f"column {column!r} of aggregate {{{column!r}: {spark_name!r}}} is not in "
            f"{list(columns)}")
    output = "avg" if func == "mean" else spark_name.lower()
    return (f"{output}({column})", func, column)


def _agg_entries(aggs: Any, columns: Sequence[str] | None = None,
                 available: Sequence[str] | None = None) -> list[tuple[tuple[Any, ...], Any]]:
    """``aggs`` as ``(name, func, column)`` tuples, each with the Spark Column it was read
    from (None for the other forms): a mapping ``{name: (func, column)}``, Spark's dict form
    ``{column: "func"}``, a sequence of ``(name, func, column)``, or Spark Column aggregates
    (one or a sequence)."""
    from pyspark.sql import Column

    if isinstance(aggs, Column):
        aggs = [aggs]
    if isinstance(aggs, Mapping):
        if aggs and all(isinstance(v, str) for v in aggs.values()):
            return [(_dict_item(c, f, columns), None) for c, f in aggs.items()]
        out: list[tuple[tuple[Any, ...], Any]] = []
        for name, spec in aggs.items():
            if not isinstance(spec, tuple):
                raise InvalidArgumentTypeError(
                    f"aggregate {name!r}: give (func, column), or Spark's dict form "
                    f"{{column: 'func'}} for every entry; got {spec!r}")
            out.append(((name, *spec), None))
        return out
    if isinstance(aggs, Sequence) and not isinstance(aggs, str):
        entries: list[tuple[tuple[Any, ...], Any]] = []
        for a in aggs:
            if isinstance(a, Column):
                entries.append((_column_item(a, columns, available), a))
            elif isinstance(a, (tuple, list)):
                entries.append((tuple(a), None))
            else:
                raise InvalidArgumentTypeError(
                    f"aggregate {a!r} is a {type(a).__name__}; give Spark Column aggregates "
                    "(F.sum('v')) or (name, func, column) tuples")
        return entries
    raise InvalidArgumentTypeError(
        "aggs must be {name: (func, column)}, Spark's {column: 'func'}, [(name, func, column)] "
        f"or Spark Column aggregates (F.sum('v').alias('s')); got {type(aggs).__name__}")


def _agg_items(aggs: Any, columns: Sequence[str] | None = None,
               available: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
    """``aggs`` as ``(name, func, column)`` tuples (see :func:`_agg_entries`)."""
    return [item for item, _ in _agg_entries(aggs, columns, available)]


def _needs_column(func: Any) -> bool:
    cls = AGGREGATE_CLASSES.get(func) if isinstance(func, str) else None
    return cls is None or cls.needs_column


#: Spark aggregate functions whose partial aggregation keeps a fixed-size buffer per key, so a
#: map-side combine bounds what a hot key costs (beyond the merge algebra's own set).
SPARK_COMBINABLE: tuple[str, ...] = (
    "count", "sum", "min", "max", "avg", "mean", "first", "first_value", "last", "last_value",
    "any_value", "stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp",
    "var_pop", "skewness", "kurtosis", "corr", "covar_pop", "covar_samp", "count_if",
    "bool_and", "bool_or", "every", "some", "any", "bit_and", "bit_or", "bit_xor", "max_by",
    "min_by", "approx_count_distinct", "regr_count", "regr_avgx", "regr_avgy", "regr_slope",
    "regr_intercept", "regr_r2", "regr_sxx", "regr_sxy", "regr_syy", "try_sum", "try_avg",
)


def combinable(exprs: Sequence[Any], df: DataFrame | None = None) -> tuple[bool, str]:
    """Whether Spark's partial aggregation bounds the cost of every aggregate of ``exprs``
    (one fixed-size buffer per key and input partition), and why.

    True for the functions of :data:`SPARK_COMBINABLE` (over any argument expression); False
    for anything else: those whose buffer grows with the rows (collect_list, percentiles,
    DISTINCT aggregates), pandas UDAFs (no partial aggregation) and functions it does not
    know. ``df``: the input, to find DISTINCT aggregates that a classic session prints without
    the word (one query plan, no job).

    Examples
    --------
    >>> from pyspark.sql import functions as F  # doctest: +SKIP
    >>> combinable([F.sum("v"), F.collect_list("v")])  # doctest: +SKIP
    (False, "collect_list(v) keeps every value of a key: exact placement bounds it instead")
    """
    for col in exprs:
        text = str(col)
        if text.startswith("Column<'") and text.endswith("'>"):
            text = text[len("Column<'"):-2]
        aliases = _top_level(text, " as ")
        call = text[: aliases[0]] if aliases else text
        head, paren, rest = call.partition("(")
        name = head.strip().lower()
        if not paren or not name.replace("_", "").isalnum():
            return False, f"{text} is not a call of a known aggregate function"
        if rest.lower().startswith("distinct "):
            return False, f"{text} is a DISTINCT aggregate: its buffer keeps every value"
        if name not in SPARK_COMBINABLE:
            why = ("keeps every value of a key" if name in UNMERGEABLE_SPARK
                   else "is not an aggregate with a fixed-size partial buffer (a UDAF or "
                        "unknown function)")
            shown = text if len(text) <= 80 else f"{name}(...)"  # a UDF prints its JVM tree
            return False, f"{shown} {why}: exact placement bounds it instead"
    if df is not None:
        distinct = _distinct_in_plan(df, list(exprs))
        if distinct:
            return False, f"{str(distinct[0])} is a DISTINCT aggregate: its buffer keeps every value"
    return True, "every aggregate has a fixed-size partial buffer: Spark's map-side combine " \
        "bounds what a hot key costs"


def _distinct_in_plan(df: DataFrame, cols: list[Any]) -> list[Any]:
    """The Column aggregates of ``cols`` that Spark plans as DISTINCT aggregates (a classic
    session's ``F.count_distinct("v")`` prints as ``count(v)``): one plan, no job. The plan
    text is captured with :func:`~trilink_spark._internal.spark.compat.plan_text` (thread-safe: concurrent
    callers do not swap ``sys.stdout``)."""
    import re

    from .._internal.spark.compat import plan_text

    def distinct(group: list[Any]) -> bool:
        return re.search(r"\(distinct ", plan_text(df.agg(*group))) is not None

    if not cols or not distinct(cols):
        return []
    return [c for c in cols if distinct([c])]


def spark_aggregate(func: str, column: str | None) -> Column:
    """The Spark aggregate the algebra computes for ``(func, column)`` (``column`` None:
    ``count(1)``, the rows). O(1), no job.

    Examples
    --------
    >>> spark_aggregate("mean", "v")  # doctest: +SKIP
    Column<'avg(v)'>
    """
    from pyspark.sql import functions as F

    arg = F.lit(1) if column is None else column_of(column)
    if func in ("first", "last"):
        return F.first(arg, ignorenulls=True) if func == "first" else \
            F.last(arg, ignorenulls=True)
    call: Column = {"count": F.count, "sum": F.sum, "min": F.min, "max": F.max,
                    "mean": F.avg}[func](arg)
    return call


def _confirm_with_spark(df: DataFrame, entries: list[tuple[tuple[Any, ...], Any]]
                        ) -> list[tuple[Any, ...]]:
    """The items of ``entries`` with Spark's own output names for the Column aggregates, each
    confirmed to be the plain aggregate of a column that its text reads as (a column named
    like an expression, ``count(lit('v'))`` printed as ``count(v)``, a window or FILTER clause,
    a DISTINCT aggregate printed without the word are refused). Cost: Spark's analysis of
    three small plans (no job), more only to name a refused aggregate."""
    from pyspark.errors import PySparkException

    cols = [(i, col) for i, (_, col) in enumerate(entries) if col is not None]
    items = [item for item, _ in entries]
    if not cols:
        return items
    try:
        names = df.agg(*[c for _, c in cols]).columns
    except PySparkException as err:
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise InvalidArgumentError(
            f"Spark cannot compute the aggregates {[_column_text(c) for _, c in cols]} on "
            f"this DataFrame: {first}") from err

    def tagged(calls: list[Any]) -> DataFrame:
        return df.agg(*[c.alias(f"_tl_agg{i}") for i, c in enumerate(calls)])

    plains = [spark_aggregate(items[i][1], items[i][2]) for i, _ in cols]
    if not tagged([c for _, c in cols]).sameSemantics(tagged(plains)):
        for (i, col), plain in zip(cols, plains):
            if tagged([col]).sameSemantics(tagged([plain])):
                continue
            text, (_, func, column) = _column_text(col), items[i]
            if func == "count" and column is not None and \
                    tagged([col]).sameSemantics(tagged([spark_aggregate("count", None)])):
                items[i] = (items[i][0], "count", None)  # count(1) beside a column named 1
                continue
            if _distinct_in_plan(df, [col]):
                raise InvalidArgumentError(
                    f"aggregate {text!r} is a DISTINCT aggregate, which cannot be merged "
                    "exactly from partials; compute it with keyed_agg (exact placement) "
                    "instead")
            what = "count of rows" if column is None else f"{func} of column {column!r}"
            raise InvalidArgumentError(
                f"aggregate {text!r} is not the plain {what} that its text reads as: Spark "
                "computes it over an expression, a literal, a window or a FILTER clause, which "
                "the merge cannot; add the expression as a column first (df.withColumn) and "
                "aggregate that column, or use keyed_agg")
    for (i, _), name in zip(cols, names):
        items[i] = (name, *items[i][1:])
    return items


def parse_aggs(aggs: Any, columns: Sequence[str], df: DataFrame | None = None
               ) -> list[AggSpec]:
    """Validate ``aggs``, in any of these forms:

    - ``{name: (func, column)}`` (``column`` None for a count of rows), or a sequence of
      ``(name, func, column)``; ``func`` one of :data:`AGGREGATES` or a :class:`Combine`;
    - Spark's dict form ``{column: "func"}`` (``{"v": "sum", "*": "count"}``), named as Spark
      names it (``sum(v)``, ``avg(v)`` for mean, ``count(1)``);
    - Spark Column aggregates, one or a sequence: ``F.sum("v").alias("s")``, ``F.count("*")``,
      ``F.avg``/``F.mean``, ``F.min``, ``F.max``, ``F.first``/``F.last`` with
      ``ignorenulls=True`` (the first/last non-null value by event time); unaliased, named as
      Spark names them (``sum(v)``, ``count(1)``, ``first(v)``).

    ``df``: the input, when at hand: Spark then names the Column aggregates and confirms that
    each is the plain aggregate of the column its text reads as (a column named like an
    expression, a literal, a window or FILTER clause and DISTINCT aggregates are refused).

    Names may hold any character (``__`` too) but may not start with ``__``, and no two
    aggregates may write the same column (a name, or a partial column such as ``s__n``).

    Raises :class:`~trilink_spark.InvalidArgumentError` for an unknown aggregate, one with no
    exact partial form (stddev, variance, collect_list, percentiles, DISTINCT aggregates: the
    message names it and points to ``keyed_agg``), an aggregate of an expression, a missing or
    unknown column, or repeated names; :class:`~trilink_spark.InvalidArgumentTypeError` for
    another shape.

    Notes
    -----
    Cost: O(aggregates); with ``df`` and Column aggregates, Spark's analysis of three small
    plans (no job).

    Examples
    --------
    >>> parse_aggs({"n": ("count", None)}, ["v"])
    [AggSpec(name='n', func='count', column=None)]
    """
    entries = _agg_entries(aggs, columns)
    if not entries:
        raise InvalidArgumentError("aggs is empty; give at least one aggregate")
    for item, _ in entries:
        if len(item) != 3:
            raise InvalidArgumentError(f"aggregate {item!r} must be (name, func, column)")
    items = _confirm_with_spark(df, entries) if df is not None else \
        [item for item, _ in entries]
    out = []
    for name, func, column in items:
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise InvalidArgumentError(
                f"aggregate name {name!r} must be a non-empty str not starting with '__'")
        if not isinstance(func, Combine) and not (isinstance(func, str) and func in AGGREGATES):
            known = isinstance(func, str) and func in AGGREGATE_CLASSES
            if known:
                raise make_aggregate(func, name, column)._unmergeable()
            raise InvalidArgumentError(
                f"unknown aggregate {func!r} for {name!r}; choose from {AGGREGATES} or a Combine"
            )
        if column is None and _needs_column(func):
            raise InvalidArgumentError(f"aggregate {name!r} ({func}) needs a column")
        if column is not None and column not in columns:
            raise InvalidArgumentError(f"column {column!r} of aggregate {name!r} is not in {list(columns)}")
        out.append(AggSpec(name, func, column))
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(
            f"aggregate names repeat: {names}; alias them apart (F.sum('v').alias('s2'))")
    written: dict[str, str] = {}  # Spark resolves names case-insensitively by default
    for spec in out:
        for column in spec.partial_columns:
            if column.lower() in written:
                raise InvalidArgumentError(
                    f"aggregates {written[column.lower()]!r} and {spec.name!r} would both "
                    f"write the partial column {column!r} (Spark compares names ignoring "
                    "case); rename one of them")
            written[column.lower()] = spec.name
    return out


def specs_for_partials(aggs: Any, available: Sequence[str] | None = None) -> list[AggSpec]:
    """Parse aggregates without checking input columns (partials carry other names).

    ``available``: the columns of the partial rows, to read an ambiguous alias of a Column
    aggregate (``AS a as b``) as the name that is there.

    Examples
    --------
    >>> [s.func for s in specs_for_partials({"n": ("count", None), "s": ("sum", "v")})]
    ['count', 'sum']
    """
    items = [(i[0], i[1], "_" if _needs_column(i[1]) else None) if len(i) == 3 else i
             for i in _agg_items(aggs, None, available)]
    return parse_aggs(items, ["_"])


# ---------------------------------------------------------------------- pandas side
def partial_groups(
    rows: pd.DataFrame, by: Sequence[Any], specs: list[AggSpec], time_col: str, pos_col: str
) -> pd.DataFrame:
    """Partials of raw rows grouped by ``by`` (column names or arrays), indexed by group.

    Columns: ``time_col`` (the largest per group), then each aggregate's partial columns.
    Groups come in order of first appearance.

    Notes
    -----
    Cost: one hash group-by, then one vectorised reduction per partial column (first/last: one
    sort of the rows; a Combine: one Python call per group).

    Examples
    --------
    >>> rows = pd.DataFrame({"k": [1, 1], "t": [0.0, 5.0], "p": [0, 1]})
    >>> partial_groups(rows, ["k"], parse_aggs({"n": ("count", None)}, ["k"]), "t", "p")
         t  n
    k
    1  5.0  2
    """
    groups = Groups.of(rows, by)
    out = pd.DataFrame({time_col: groups.grouped[time_col].max()})
    for spec in specs:
        for column, values in spec.aggregate.init(groups, time_col, pos_col).items():
            out[column] = values
    return out


def partial_frame(
    rows: pd.DataFrame, groups: list[str], specs: list[AggSpec], time_col: str, pos_col: str
) -> pd.DataFrame:
    """Partials of raw rows grouped by the columns ``groups`` (:func:`partial_groups`, with
    the group columns first)."""
    return partial_groups(rows, groups, specs, time_col, pos_col).reset_index()


def merge_partial_frames(
    parts: pd.DataFrame, groups: list[str], specs: list[AggSpec], time_col: str | None
) -> pd.DataFrame:
    """Combine partial rows of the same group into one (pandas).

    Notes
    -----
    Cost: one hash group-by of ``parts``, one vectorised reduction per partial column.

    Examples
    --------
    >>> parts = pd.DataFrame({"k": [1, 1], "n": [2, 3]})
    >>> merge_partial_frames(parts, ["k"], parse_aggs({"n": ("count", None)}, []), None)
       k  n
    0  1  5
    """
    grouped = Groups.of(parts, groups)
    out = pd.DataFrame(index=grouped.index)
    if time_col is not None:
        out[time_col] = grouped.grouped[time_col].max()
    for spec in specs:
        for column, values in spec.aggregate.merge(grouped).items():
            out[column] = values
    return out.reset_index()


def finalize_frame(merged: pd.DataFrame, groups: list[str], specs: list[AggSpec]) -> pd.DataFrame:
    """Final values from fully merged partials (pandas; vectorised, O(rows))."""
    out = merged[groups].copy()
    for spec in specs:
        out[spec.name] = spec.aggregate.finalize(merged)
    return out


# ---------------------------------------------------------------------- Arrow side
def arrow_partials(
    table: Any, by: Sequence[str], specs: list[AggSpec], time_col: str, merging: bool = False
) -> Any:
    """Partials of ``table`` (raw rows, or partial rows when ``merging``) grouped by the
    columns ``by``, with Arrow's hash aggregation; None when an aggregate has no Arrow form
    for its input (first, last, a Combine, decimal sums: use :func:`partial_groups`).

    The result has the ``by`` columns, ``time_col`` (the largest per group) and each
    aggregate's partial columns; nulls are a group of their own. Groups come in no set order
    (Arrow keeps first appearance for one key column, not for several). Sums and means are
    over doubles (integral sums exactly, in int64).

    Notes
    -----
    Cost: one single-threaded Arrow hash aggregation, O(rows), plus O(groups) to finish;
    nothing per row in Python.

    Examples
    --------
    >>> import pyarrow as pa
    >>> rows = pa.table({"k": [1, 1, 2], "t": [0.0, 5.0, 1.0], "v": [2, 3, None]})
    >>> specs = parse_aggs({"s": ("sum", "v")}, ["k", "v"])
    >>> arrow_partials(rows, ["k"], specs, "t").to_pydict()
    {'k': [1, 2], 't': [5.0, 1.0], 's': [5, None], 's__n': [2, 0]}
    """
    import pyarrow as pa

    plans = []
    for spec in specs:
        steps = spec.aggregate.arrow_steps(table, merging)
        if steps is None:
            return None
        plans.append(steps)
    names = [*by, time_col]
    arrays = [table[c] for c in names]
    aggs: list[tuple[Any, ...]] = [(time_col, "max")]
    outputs: list[list[str]] = []
    for i, steps in enumerate(plans):
        outputs.append([])
        for j, step in enumerate(steps):
            name = f"{INTERNAL_PREFIX}a{i}_{j}"
            names.append(name)
            arrays.append(step.values)
            aggs.append((name, step.func) if step.options is None
                        else (name, step.func, step.options))
            outputs[-1].append(f"{name}_{step.func}")
    grouped = pa.Table.from_arrays(arrays, names=names).group_by(
        list(by), use_threads=False).aggregate(aggs)
    out = {c: grouped[c] for c in by}
    out[time_col] = grouped[f"{time_col}_max"]
    for spec, results in zip(specs, outputs):
        out.update(spec.aggregate.arrow_finish([grouped[r] for r in results], merging))
    return pa.table(out)


# ---------------------------------------------------------------------- Spark side
def merge_partials(
    df: DataFrame, key: str | Sequence[str], aggs: Any, *, keep_partials: bool = False
) -> DataFrame:
    """Final aggregates from partial rows (output of local_merge), grouped by ``key``.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Partial rows, e.g. from :func:`~trilink_spark.local_merge`.
    key : str or sequence of str
        Grouping columns (add ``"slot_start"`` to keep time slots apart).
    aggs
        The same aggregates given to ``local_merge``.

    Returns
    -------
    pyspark.sql.DataFrame
        One row per group: the keys, then one column per aggregate.

    Notes
    -----
    Cost: one ``groupBy`` (Spark's hash aggregation, map-side combined). Built-in aggregates
    merge in the JVM; a :class:`Combine` runs in Python per group (``applyInPandas``).

    Examples
    --------
    >>> totals = tl.merge_partials(tl.local_merge(df, "k", "ts", 60, aggs), "k", aggs)  # doctest: +SKIP
    """
    keys = [key] if isinstance(key, str) else list(key)
    specs = specs_for_partials(aggs, df.columns)
    exprs = [e for e in (spec.aggregate.spark_merge() for spec in specs) if e is not None]
    if len(exprs) < len(specs):  # a Combine merges in Python
        return _merge_with_pandas(df, keys, specs)
    merged = df.groupBy(*[column_of(k) for k in keys]).agg(*exprs)
    # Spark widens a sum of decimals again: keep the partial's (the raw rows' sum) type
    decimals = {s.name: df.schema[s.name].dataType for s in specs
                if isinstance(s.aggregate, Sum) and s.name in df.columns
                and df.schema[s.name].dataType.typeName() == "decimal"}
    if decimals:
        merged = merged.select(*[column_of(c).cast(decimals[c]).alias(c) if c in decimals
                                 else column_of(c) for c in merged.columns])
    return merged


def _merge_with_pandas(df: DataFrame, keys: list[str], specs: list[AggSpec]) -> DataFrame:
    """The same merge in pandas per group, for aggregates with a Python Combine."""
    # the partial column of min/max/first/last has the input column's type
    fields = [f"{quoted(k)} {df.schema[k].dataType.simpleString()}" for k in keys]
    for spec in specs:
        value_type = (df.schema[spec.name].dataType.simpleString()
                      if spec.name in df.columns else "double")
        fields.append(f"{quoted(spec.name)} {spec.final_type(value_type)}")

    def merge(pdf: pd.DataFrame) -> pd.DataFrame:
        merged = merge_partial_frames(pdf, keys, specs, None)
        return finalize_frame(merged, keys, specs)

    return df.groupBy(*[column_of(k) for k in keys]).applyInPandas(merge, ", ".join(fields))
