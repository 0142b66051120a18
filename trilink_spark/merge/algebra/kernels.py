"""The vectorised kernels under the aggregate classes of :mod:`~trilink_spark.merge.algebra.aggregates`.

:class:`Groups` splits rows into groups once, for every aggregate of one partial or merge step.
The functions give Spark's numeric kind and ``sum`` type of a column type
(:func:`numeric_kind`, :func:`sum_type`), exact 64-bit sums of integers per group in numpy
(:func:`exact_int_sums`, :func:`join_halves`) and in Spark (:func:`spark_exact_sum`), exact
sums and Spark's ``avg`` of decimals (:func:`decimal_sums`, :func:`decimal_means`,
:func:`spark_checked_sum`, :func:`mean_type`), and the failure of a sum beyond its type
(:class:`~trilink_spark.errors.ArithmeticOverflowError`, as Spark's ANSI mode fails the query;
:func:`spark_overflow` in Spark).
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..._internal.validation import INT64_MAX, INT64_MIN
from ...errors import ArithmeticOverflowError

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "DECIMAL_SUM_DIGITS",
    "Groups",
    "INTEGRAL_TYPES",
    "by_code",
    "decimal_means",
    "decimal_sums",
    "exact_int_sums",
    "floats",
    "is_nullable_float",
    "join_halves",
    "mean_type",
    "numeric_kind",
    "python_final",
    "spark_checked_sum",
    "spark_exact_sum",
    "spark_overflow",
    "sum_type",
    "summed_type",
]

#: Spark's integral type names (their sums are exact, in 64 bits).
INTEGRAL_TYPES = ("tinyint", "smallint", "int", "bigint")
_FLOAT_TYPES = ("float", "double")
#: Digits of Python's decimal arithmetic in sums of decimals: exact for up to 10**62 values of
#: Spark's 38 digits (Python's default context rounds to 28).
DECIMAL_SUM_DIGITS = 100
#: Spark's largest decimal precision (and scale).
DECIMAL_DIGITS = 38


def numeric_kind(value_type: str) -> str:
    """``"integral"``, ``"fractional"``, ``"decimal"`` or ``""`` for a Spark type name."""
    if value_type in INTEGRAL_TYPES:
        return "integral"
    if value_type in _FLOAT_TYPES:
        return "fractional"
    if value_type.startswith("decimal"):
        return "decimal"
    return ""


def _decimal_digits(value_type: str) -> tuple[int, int]:
    """``(precision, scale)`` of a Spark decimal type name such as ``decimal(10,2)``."""
    digits = value_type[len("decimal("):-1].split(",")
    return int(digits[0]), int(digits[1])


def sum_type(value_type: str) -> str:
    """Spark's result type of ``sum`` over ``value_type`` (a numeric Spark type name)."""
    kind = numeric_kind(value_type)
    if kind == "integral":
        return "bigint"
    if kind == "decimal":
        precision, scale = _decimal_digits(value_type)
        return f"decimal({min(DECIMAL_DIGITS, precision + 10)},{scale})"
    return "double"


def summed_type(sum_type_name: str) -> str:
    """The widest column type whose :func:`sum_type` is ``sum_type_name``: a decimal(p, s)
    for a decimal sum (p + 10 = the sum's precision, or 38 when that is 38), else a double."""
    if numeric_kind(sum_type_name) != "decimal":
        return "double"
    precision, scale = _decimal_digits(sum_type_name)
    return f"decimal({precision - 10 if precision < DECIMAL_DIGITS else DECIMAL_DIGITS},{scale})"


def mean_type(value_type: str) -> str:
    """Spark's result type of ``avg`` over ``value_type`` (a numeric Spark type name): a
    decimal(p, s) gives decimal(min(38, p + 4), min(38, s + 4)), anything else a double."""
    if numeric_kind(value_type) != "decimal":
        return "double"
    precision, scale = _decimal_digits(value_type)
    return f"decimal({min(DECIMAL_DIGITS, precision + 4)},{min(DECIMAL_DIGITS, scale + 4)})"


def decimal_sums(values: pd.Series, codes: np.ndarray, what: str) -> pd.Series:
    """Exact sums of Python Decimals per group code (null for a group with no value),
    labelled by code in order; ArithmeticOverflowError naming ``what`` when a sum needs more
    than 38 digits (no Spark decimal holds it: Spark's ANSI mode fails the query).

    Notes
    -----
    Cost: one pandas group-by sum of the object column (its loop in C, Python's decimal
    addition per value) in a 100-digit context, exact for up to 10**62 values of 38 digits
    (the default context rounds to 28); then one digit count per group.
    """
    with decimal.localcontext() as context:
        context.prec = DECIMAL_SUM_DIGITS
        sums: pd.Series = values.reset_index(drop=True).groupby(codes, sort=True) \
            .sum(min_count=1)
    present = sums.notna().to_numpy()
    if present.any():
        digits = np.frompyfunc(lambda d: len(d.as_tuple().digits), 1, 1)(
            sums.to_numpy(dtype=object)[present])
        if (digits > DECIMAL_DIGITS).any():
            raise ArithmeticOverflowError(
                f"{what} needs more than {DECIMAL_DIGITS} digits, which no Spark decimal "
                "holds; Spark's sum fails the same way in ANSI mode: cast the column to "
                "double first")
    return sums


def _half_up(numerator: np.ndarray, denominator: Any) -> np.ndarray:
    """``numerator / denominator`` rounded half away from zero (Java's ``HALF_UP``), for
    object arrays of Python ints and a positive ``denominator``: exact."""
    magnitude = (2 * np.abs(numerator) + denominator) // (2 * denominator)
    rounded: np.ndarray = np.where(numerator < 0, -magnitude, magnitude)
    return rounded


def decimal_means(sums: pd.Series, counts: pd.Series, what: str) -> pd.Series:
    """Spark's ``avg`` of decimals from exact sums (Python Decimals of the column's sum type,
    one scale ``s``) and counts: ``sum / count`` rounded half up (away from zero) to scale
    ``min(38, s + 4)``, as Spark's avg rounds it (its division truncates at 39 places first,
    which changes no half-up rounding at 38 places or fewer); null where the count is 0 or
    the sum null. ArithmeticOverflowError naming ``what`` when the mean needs more than 38
    digits (Spark's ANSI mode fails the query; without it Spark gives null).

    Notes
    -----
    Cost: exact integer arithmetic on Python ints over object arrays, O(groups); no
    floating point anywhere.

    Examples
    --------
    >>> from decimal import Decimal
    >>> decimal_means(pd.Series([Decimal("6.35"), None]), pd.Series([3, 0]), "m").tolist()
    [Decimal('2.116667'), None]
    """
    present = sums.notna().to_numpy() & (counts.to_numpy(dtype=np.int64, na_value=0) > 0)
    out = np.full(len(sums), None, dtype=object)
    if present.any():
        values = sums.to_numpy(dtype=object)[present]
        scale = -min(np.frompyfunc(lambda d: d.as_tuple().exponent, 1, 1)(values))
        target = min(DECIMAL_DIGITS, scale + 4)
        numerator, denominator = np.frompyfunc(lambda d: d.as_integer_ratio(), 1, 2)(values)
        n = counts.to_numpy(dtype=np.int64, na_value=0)[present].astype(object)
        unscaled = _half_up(numerator * 10 ** target, denominator * n)
        if (np.abs(unscaled) >= 10 ** DECIMAL_DIGITS).any():
            raise ArithmeticOverflowError(
                f"{what} needs more than {DECIMAL_DIGITS} digits at scale {target}; Spark's "
                "avg fails the same way in ANSI mode (without it Spark gives null): cast the "
                "column to double first")
        out[present] = np.frompyfunc(lambda u: decimal.Decimal(f"{u}E-{target}"), 1, 1)(
            unscaled)
    return pd.Series(out, index=sums.index, dtype=object)


def is_nullable_float(values: pd.Series) -> bool:
    """Whether ``values`` has a pandas nullable float dtype (NaN distinct from null)."""
    return isinstance(values.dtype, pd.api.extensions.ExtensionDtype) and \
        pd.api.types.is_float_dtype(values.dtype)


def exact_int_sums(values: pd.Series, codes: np.ndarray, groups: int, what: str) -> pd.Series:
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
        out[ordered[starts]] = join_halves(low, high, what)
    counts = np.bincount(codes[present], minlength=groups)
    return pd.Series(pd.arrays.IntegerArray(out, counts == 0))


def _overflow_message(what: str) -> str:
    """The message of an integral sum beyond 64 bits (pandas, Arrow and Spark forms alike)."""
    return (f"{what} overflows bigint (the int64 range [-2**63, 2**63 - 1]); Spark's sum "
            "fails the same way in ANSI mode: cast the column to decimal(38,0) or double first")


def spark_exact_sum(value: Column, what: str) -> Column:
    """Spark's exact sum of an integral column per group, as :func:`join_halves` computes
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
    return F.when(over, spark_overflow(_overflow_message(what), "bigint")).otherwise(joined)


def spark_checked_sum(value: Column, dtype: str, what: str) -> Column:
    """Spark's exact sum of ``value`` per group as Spark type ``dtype`` (:func:`sum_type` of
    a column's type, or the type of the partial sums being merged), and the query failed
    with a message naming ``ArithmeticOverflowError`` and ``what`` when the sum leaves
    ``dtype``, ANSI mode or not (outside it Spark's sum wraps a bigint around and makes a
    decimal null, which a merge of partials would skip; in it Spark's error names no
    aggregate). A bigint by :func:`spark_exact_sum`; a decimal by ``try_sum`` and
    ``try_cast``, null only on overflow; a double by Spark's sum. Null when the group has no
    value. An aggregate expression (one per group, no job)."""
    from pyspark.sql import functions as F

    kind = numeric_kind(dtype)
    if kind == "integral":
        return spark_exact_sum(value, what)
    if kind != "decimal":
        return F.sum(value)
    total = F.try_sum(value).try_cast(dtype)
    failed = spark_overflow(f"{what} overflows {dtype}; cast the column to double first", dtype)
    return F.when(total.isNull() & (F.count(value) > 0), failed).otherwise(total)


def python_final(func: Callable[..., pd.Series], dtype: str, *columns: Column) -> Column:
    """``func`` (pandas Series in, one Series of Spark type ``dtype`` out) applied to
    ``columns`` as a scalar pandas UDF. Over aggregate expressions, Spark evaluates it after
    the aggregation: one Python call per Arrow batch of groups, no row of the input."""
    from pyspark.sql.pandas.functions import pandas_udf

    udf = pandas_udf(func, dtype)  # type: ignore[call-overload]
    applied: Column = udf(*columns)
    return applied


def spark_overflow(message: str, dtype: str) -> Column:
    """An expression of type ``dtype`` that fails the query with ``message``, named as
    :class:`~trilink_spark.errors.ArithmeticOverflowError` (Spark cannot raise a Python exception:
    the task's error carries the name, as the event-time and null-key checks do)."""
    from pyspark.sql import functions as F

    failed: Column = F.raise_error(
        F.lit("trilink_spark.errors.ArithmeticOverflowError: " + message)).cast(dtype)
    return failed


def join_halves(low: np.ndarray, high: np.ndarray, what: str) -> np.ndarray:
    """Sums of the low 32 bits and of the high 32 bits (arithmetic shift) of int64 values
    recombined into their exact int64 sums; ArithmeticOverflowError naming ``what`` when one
    is outside the int64 range. Vectorised, O(len(low))."""
    high = high + (low >> 32)
    over = (high < -(2**31)) | (high >= 2**31)
    if over.any():
        raise ArithmeticOverflowError(_overflow_message(what))
    joined: np.ndarray = (high << 32) | (low & 0xFFFFFFFF)
    return joined


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
        t = floats(time)[rows]
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


def floats(values: Any) -> np.ndarray:
    """``values`` (a Series of any numeric dtype, or an array) as float64, NaN for null."""
    if isinstance(values, pd.Series):
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(values, dtype=np.float64)


def by_code(values: pd.Series, groups: Groups) -> Any:
    """``values`` (one per row of ``groups.rows``) grouped by the group codes."""
    return values.reset_index(drop=True).groupby(groups.codes, sort=True)
