"""Event time in one internal unit: microseconds for timestamps, the column's own for numbers.

Every time-based operator (keyed watermarks, keyed process functions, windows, Local Merge)
converts its event-time column, its delays and its slot or window lengths with these functions,
so they agree on units and on what a duration means.

Examples
--------
>>> from datetime import timedelta
>>> delay_in_units(timedelta(seconds=2), "timestamp")
2000000.0
>>> delay_in_units(5, "integral")
5.0
>>> delay_in_units("1 minute 30 seconds", "timestamp")
90000000.0
>>> from_units([1_500_000.0], "integral").tolist()
[1500000]
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ._internal.validation import INTERVAL_UNITS, choice, parse_interval
from .columns import require_columns
from .errors import InvalidArgumentError, InvalidArgumentTypeError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["TIME_KINDS", "SPARK_TIME_TYPES", "MAX_EXACT", "time_kind", "event_time_micros",
           "event_time_whole", "delay_in_units", "from_units", "parse_interval", "INTERVAL_UNITS"]

#: Kinds of event-time column: timestamps, integers, fractional numbers.
TIME_KINDS: tuple[str, ...] = ("timestamp", "integral", "fractional")
#: Largest integral event time (internal units) a double represents exactly.
MAX_EXACT = 2**53
#: Spark type of a time value (a window bound, a slot start) per kind.
SPARK_TIME_TYPES: dict[str, str] = {
    "timestamp": "timestamp", "integral": "bigint", "fractional": "double",
}


def time_kind(df: DataFrame, column: str) -> str:
    """``"timestamp"``, ``"integral"`` or ``"fractional"`` for an event-time column of ``df``.

    Raises :class:`~trilink_spark.errors.MissingColumnError` for an unknown column and
    :class:`~trilink_spark.errors.InvalidArgumentTypeError` for a column of another type.
    """
    from pyspark.sql import types as T

    require_columns(df, [column], "event time column")
    dtype = df.schema[column].dataType
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return "timestamp"
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "integral"
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "fractional"
    raise InvalidArgumentTypeError(
        f"event time column {column!r} is {dtype.simpleString()}; use a timestamp or a number"
    )


def event_time_micros(df: DataFrame, column: str) -> tuple[Column, str]:
    """The event time as a double Spark column in internal units, and the column's kind.

    Integral times (and timestamps, in microseconds) are exact in a double up to
    :data:`MAX_EXACT` (2**53; for timestamps, the year 2255). A row beyond it fails the job with
    a message naming ``InvalidArgumentError`` instead of rounding silently: nanosecond epochs
    (about 1.7e18) must be converted first.

    Notes
    -----
    A column expression: computed by Spark, no job.
    """
    from pyspark.sql import functions as F

    kind = time_kind(df, column)
    whole = event_time_whole(df, column)
    if whole is None:
        return F.col("`" + column.replace("`", "``") + "`").cast("double"), kind
    return whole.cast("double"), kind


def event_time_whole(df: DataFrame, column: str) -> Column | None:
    """The event time as a bigint Spark column in internal units (microseconds for
    timestamps), for a timestamp or integral column; None for a fractional one.

    The values are those of :func:`event_time_micros`, refused beyond :data:`MAX_EXACT` the
    same way, so arithmetic on them in longs gives what it gives in doubles.

    Notes
    -----
    A column expression: computed by Spark, no job.
    """
    from pyspark.sql import functions as F

    kind = time_kind(df, column)
    if kind == "fractional":
        return None
    col = F.col("`" + column.replace("`", "``") + "`")
    whole = F.unix_micros(col.cast("timestamp")) if kind == "timestamp" else col.cast("long")
    # doubles hold integers exactly up to 2**53: refuse what would silently round
    message = (
        f"trilink_spark.errors.InvalidArgumentError: event time column {column!r} has a value beyond "
        f"+-2**53 {'microseconds' if kind == 'timestamp' else 'units'}, which cannot be "
        "represented exactly; convert it first (for nanosecond epochs: a timestamp column, "
        "or the value divided by 1000 as microseconds)"
    )
    exact = F.when(F.abs(whole) > F.lit(MAX_EXACT), F.raise_error(F.lit(message)))
    checked: Column = exact.otherwise(whole)
    return checked


def delay_in_units(delay: Any, kind: str, name: str = "delay") -> float:
    """A duration in internal units: microseconds for timestamps, the column's own otherwise.

    For a timestamp column, ``delay`` is an interval string (:func:`parse_interval`), a
    ``timedelta`` or a number of seconds; for a numeric column, a number in its unit. ``name``
    is the argument named in error messages.
    """
    choice(kind, "time kind", TIME_KINDS)
    if isinstance(delay, (bool, np.bool_)):
        raise InvalidArgumentTypeError(
            f"{name} must be an interval string, a timedelta or a number, not a bool")
    if isinstance(delay, str):
        if kind != "timestamp":
            raise InvalidArgumentTypeError(
                f"an interval string {name} ({delay!r}) needs a timestamp event time; give a "
                "number in the column's unit")
        delay = parse_interval(delay, name)
    if isinstance(delay, timedelta):
        if kind != "timestamp":
            raise InvalidArgumentTypeError(
                f"a timedelta {name} needs a timestamp event time; give a number in the "
                "column's unit"
            )
        value = delay.total_seconds() * 1e6
    elif isinstance(delay, (int, float, np.integer, np.floating)):
        try:
            value = float(delay) * (1e6 if kind == "timestamp" else 1.0)
        except OverflowError:
            value = math.inf
    else:
        raise InvalidArgumentTypeError(
            f"{name} must be an interval string ('10 seconds'), a timedelta or a number, got "
            f"{type(delay).__name__}"
        )
    if not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be finite and >= 0, got {delay!r}")
    return value


def from_units(units: Any, kind: str) -> Any:
    """Internal units back to the column's kind: UTC timestamps, int64 or float64 (numpy).

    Notes
    -----
    Vectorised, O(len(units)).
    """
    values = np.asarray(units, dtype=np.float64)
    if kind == "timestamp":
        return pd.to_datetime(np.rint(values).astype(np.int64), unit="us", utc=True)
    if kind == "integral":
        return np.rint(values).astype(np.int64)
    return values
