"""Partial aggregates that merge exactly: the common language of Local Merge and Global Merge.

An aggregate is named and applied to a column: ``{"total": ("sum", "amount")}``. Each has a
*partial* form, a few columns that two partials of the same group combine into one, and a
*final* form. Aggregating partials of any split of the rows gives exactly what aggregating
the rows gives (the frame operations are in :mod:`~trilink_spark.merge.algebra.partials`, the
forms of ``aggs`` users write are read by :mod:`~trilink_spark.merge.algebra.expressions`).

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

Nulls in the value column are skipped, as Spark skips them. Types and non-finite values follow
Spark's ``groupBy().agg()``: a sum of an integral column is a bigint, computed exactly (a sum
beyond 64 bits raises :class:`~trilink_spark.errors.ArithmeticOverflowError` naming the aggregate,
as Spark's ANSI mode fails the query), of a float or double a double (``inf`` and NaN propagate),
of a decimal(p, s) a decimal(min(38, p + 10), s), exactly; a mean of a decimal(p, s) is Spark's
decimal ``avg`` (exact sum over count, rounded half up as Spark rounds it), a decimal(min(38,
p + 4), min(38, s + 4)), any other mean a double (a decimal sum or mean beyond 38 digits raises
ArithmeticOverflowError); count a bigint; min, max, first and last keep the input type. In
frames with pandas' nullable dtypes (what the merges read), NaN is a value distinct from null:
``max`` is NaN when a group has a NaN (Spark orders NaN above everything) and ``min`` only when
every value is NaN; in plain float64 frames NaN stands for null.

Each row of the table is one class (:class:`Count`, :class:`Sum`, :class:`Min`, :class:`Max`,
:class:`Mean`, :class:`First`, :class:`Last`, :class:`CombineAggregate`), which owns every form
of its aggregate: partial columns and their Spark types, the partial of raw rows and the merge
of partials (pandas), the final value, the Spark merge expression of
:func:`~trilink_spark.merge.algebra.partials.merge_partials`, and the values it ships to a Redis global
store. :data:`AGGREGATE_CLASSES` maps each name to its class. Count, sum, min, max and mean
also have a Spark form of their partials of raw rows (:meth:`Aggregate.spark_init`), which
``local_merge(engine="spark")`` aggregates in the JVM.
:class:`Stddev` and :class:`Variance` only name Arrow's per-partition aggregates
(:func:`arrow_aggregates`); they have no exact partial form here and Local Merge refuses them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd

from ...columns import column_of
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from .kernels import Groups, by_code, decimal_means, decimal_sums
from .kernels import exact_int_sums, floats, is_nullable_float, join_halves, mean_type
from .kernels import numeric_kind, python_final, spark_checked_sum, sum_type
from .kernels import summed_type

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType

__all__ = [
    "AGGREGATES",
    "AGGREGATE_CLASSES",
    "Aggregate",
    "ArrowStep",
    "Combine",
    "CombineAggregate",
    "Count",
    "First",
    "Last",
    "Max",
    "Mean",
    "Min",
    "POS",
    "RedisOp",
    "Stddev",
    "Sum",
    "TIME",
    "VALUE_TYPE_META",
    "Variance",
    "arrow_aggregates",
    "make_aggregate",
]

#: Suffixes of the partial columns of first and last: event time, arrival position.
TIME = "__t"
POS = "__p"
#: Partial field metadata: the input's Spark type, where the partial types do not say it.
VALUE_TYPE_META = "trilink.value_type"


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
    :func:`~trilink_spark.merge.algebra.partials.merge_partials`), and its Redis form
    (:meth:`redis_ops`, :meth:`redis_encode`, :meth:`redis_decode`). Class attributes name it:
    ``func`` (the name in ``aggs``), ``spark_names`` and ``arrow`` (the Spark functions it
    computes per partition with Arrow's hash aggregation, see :func:`arrow_aggregates`).

    Notes
    -----
    The pandas methods are vectorised over groups (one group-by per aggregate column, or one
    sort); a :class:`Combine` calls Python once per group. Aggregates with ``mergeable`` False
    have no partial form: their type, pandas, Spark and Redis methods raise
    :class:`~trilink_spark.errors.InvalidArgumentError`.

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

    def unmergeable(self) -> InvalidArgumentError:
        """The error for a form this aggregate lacks (``mergeable`` False): an
        InvalidArgumentError naming it and what merges instead, raised by the caller."""
        return InvalidArgumentError(
            f"aggregate {self.name!r} ({self.func}) has no exact partial form: local_merge and "
            f"global_merge merge {', '.join(AGGREGATES)} or a Combine; compute {self.func} "
            "with keyed_agg, or from merged sums"
        )

    @property
    def _what(self) -> str:  # the aggregate, in messages
        return f"{self.func} {self.name!r} of column {self.column!r}"

    def _numeric(self, value_type: str) -> str:
        """``value_type`` when numeric; else InvalidArgumentTypeError naming the column."""
        if not numeric_kind(value_type):
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
        raise self.unmergeable()

    def final_type(self, value_type: str) -> str:
        """Spark type of the final value, given the Spark type of the aggregated column."""
        raise self.unmergeable()

    def partial_metadata(self, value_type: str) -> dict[str, dict[str, str]]:
        """Spark field metadata of partial columns (by column), for :meth:`merged_type`."""
        return {}

    def merged_type(self, partials: StructType) -> str:
        """Spark type of the final value, given the schema of the partial rows (where the
        aggregated column is not): by default :meth:`final_type` of the partial ``name``."""
        field = partials[self.name] if self.name in partials.names else None
        return self.final_type("double" if field is None else field.dataType.simpleString())

    # ---------------------------------------------------------------- pandas
    def _values(self, groups: Groups) -> Any:
        return groups.grouped[str(self.column)]

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        """Partials of raw rows, per group of ``groups`` (labelled by ``groups.index``)."""
        raise self.unmergeable()

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        """Partials of partial rows, per group of ``groups`` (labelled by ``groups.index``)."""
        raise self.unmergeable()

    def finalize(self, merged: pd.DataFrame) -> pd.Series:
        """The final value from fully merged partial columns."""
        if not self.mergeable:
            raise self.unmergeable()
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
        raise self.unmergeable()

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

    def spark_merge(self, partials: StructType) -> Column | None:
        """The Spark aggregate expression merging partial rows of schema ``partials`` into
        the final value, of :meth:`merged_type` (None: merge in pandas)."""
        raise self.unmergeable()

    # ---------------------------------------------------------------- Redis
    def redis_ops(self) -> list[RedisOp]:
        """The partial values shipped to a Redis store, one op each."""
        raise self.unmergeable()

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

    def spark_merge(self, partials: StructType) -> Column:
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
        return sum_type(self._numeric(value_type))

    def merged_type(self, partials: StructType) -> str:  # the partial is the sum already
        names = partials.names
        return partials[self.name].dataType.simpleString() if self.name in names else "double"

    def _sum(self, values: pd.Series, groups: Groups) -> pd.Series:
        if pd.api.types.is_integer_dtype(values.dtype):
            summed = exact_int_sums(values, groups.codes, len(groups.index), self._what)
        elif values.dtype == object:  # decimals: exact, as Spark sums them
            summed = decimal_sums(values, groups.codes, self._what)
        else:
            summed = by_code(values, groups).sum(min_count=1)
        return summed.set_axis(groups.index)

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
        joined = join_halves(low, high, f"sum {self.name!r} of column {self.column!r}")
        empty = counts.to_numpy(zero_copy_only=False) == 0
        return {self.name: pa.array(joined, pa.int64(), mask=empty),
                f"{self.name}__n": counts}

    def spark_init(self, value: Column | None, value_type: str) -> list[Column] | None:
        from pyspark.sql import functions as F

        if value is None:
            return None
        dtype = self.final_type(value_type)  # exact, or the query fails naming the sum
        return [spark_checked_sum(value, dtype, self._what).cast(dtype).alias(self.name),
                F.count(value).alias(f"{self.name}__n")]

    def spark_merge(self, partials: StructType) -> Column:
        from pyspark.sql import functions as F

        n = self.name
        # the partial's type (Spark would widen a decimal sum again), exact or failing
        total = spark_checked_sum(column_of(n), self.merged_type(partials), self._what)
        return F.when(F.sum(column_of(f"{n}__n")) > 0, total).alias(n)

    def redis_ops(self) -> list[RedisOp]:
        n = self.name
        return [RedisOp(n, "float", n), RedisOp(f"{n}__n", "int", f"{n}__n")]


class Mean(Aggregate):
    """Mean of non-null values; partials ``name__sum`` (double; of a decimal column, its exact
    sum, typed as Spark's ``sum``) and ``name__n`` (bigint).

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

    def partial_types(self, value_type: str) -> list[str]:  # decimals: their exact sum
        decimal = numeric_kind(self._numeric(value_type)) == "decimal"
        return [sum_type(value_type) if decimal else "double", "bigint"]

    def final_type(self, value_type: str) -> str:
        return mean_type(self._numeric(value_type))

    def partial_metadata(self, value_type: str) -> dict[str, dict[str, str]]:
        # a decimal(38, s) sum is the sum of a decimal(p, s) for any p >= 28: keep p
        decimal = numeric_kind(value_type) == "decimal"
        return {f"{self.name}__sum": {VALUE_TYPE_META: value_type}} if decimal else {}

    def merged_type(self, partials: StructType) -> str:
        if f"{self.name}__sum" not in partials.names:
            return "double"
        field = partials[f"{self.name}__sum"]
        declared = (field.metadata or {}).get(VALUE_TYPE_META)
        if isinstance(declared, str) and numeric_kind(declared) == "decimal":
            return mean_type(declared)
        return mean_type(summed_type(field.dataType.simpleString()))

    def init(self, groups: Groups, time_col: str, pos_col: str) -> dict[str, pd.Series]:
        values = groups.rows[str(self.column)]
        if values.dtype == object:  # decimals: their exact sum
            total = decimal_sums(values, groups.codes, self._what).set_axis(groups.index)
        else:
            nullable = is_nullable_float(values) or \
                pd.api.types.is_extension_array_dtype(values.dtype)
            as_float = values.astype("Float64") if nullable else values.astype(np.float64)
            total = by_code(as_float, groups).sum(min_count=1).set_axis(groups.index)
        return {f"{self.name}__sum": total, f"{self.name}__n": self._values(groups).count()}

    def merge(self, groups: Groups) -> dict[str, pd.Series]:
        g, n = groups.grouped, self.name
        sums = groups.rows[f"{n}__sum"]
        total = (decimal_sums(sums, groups.codes, self._what).set_axis(groups.index)
                 if sums.dtype == object else g[f"{n}__sum"].sum(min_count=1))
        return {f"{n}__sum": total, f"{n}__n": g[f"{n}__n"].sum()}

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
        n, sums = merged[f"{self.name}__n"], merged[f"{self.name}__sum"]
        if sums.dtype == object:  # decimals: Spark's decimal avg, exactly
            return decimal_means(sums, n, self._what)
        result: pd.Series = (sums / n).where(n > 0)
        return result

    def spark_init(self, value: Column | None, value_type: str) -> list[Column] | None:
        from pyspark.sql import functions as F

        if value is None:
            return None
        total = (spark_checked_sum(value, sum_type(value_type), self._what)
                 if numeric_kind(self._numeric(value_type)) == "decimal"
                 else F.sum(value.cast("double")))
        return [total.alias(f"{self.name}__sum"), F.count(value).alias(f"{self.name}__n")]

    def spark_merge(self, partials: StructType) -> Column:
        from pyspark.sql import functions as F

        n = self.name
        total, count = F.sum(column_of(f"{n}__sum")), F.sum(column_of(f"{n}__n"))
        dtype = self.merged_type(partials)
        if numeric_kind(dtype) != "decimal":
            return (total / count).alias(n)
        # Spark's decimal division is not avg's rounding: finalize per group, in Python
        def final(sums: pd.Series, counts: pd.Series) -> pd.Series:
            return self.finalize(pd.DataFrame({f"{n}__sum": sums, f"{n}__n": counts}))

        # the sums' type, as Spark's avg buffer: failing, never null, when they overflow it
        sums = spark_checked_sum(column_of(f"{n}__sum"),
                                 partials[f"{n}__sum"].dataType.simpleString(), self._what)
        return python_final(final, dtype, sums, count).alias(n)

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
        if not is_nullable_float(values):
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

    def spark_merge(self, partials: StructType) -> Column:
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
        times = floats(rows[time_col])
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

    def spark_merge(self, partials: StructType) -> Column:
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

    def spark_merge(self, partials: StructType) -> None:
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
