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
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

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

    Raises :class:`~trilink_spark.MissingColumnError` for an unknown column and
    :class:`~trilink_spark.InvalidArgumentTypeError` for a column of another type.
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
        f"trilink_spark.InvalidArgumentError: event time column {column!r} has a value beyond "
        f"+-2**53 {'microseconds' if kind == 'timestamp' else 'units'}, which cannot be "
        "represented exactly; convert it first (for nanosecond epochs: a timestamp column, "
        "or the value divided by 1000 as microseconds)"
    )
    exact = F.when(F.abs(whole) > F.lit(MAX_EXACT), F.raise_error(F.lit(message)))
    checked: Column = exact.otherwise(whole)
    return checked


#: Units of an interval string and their length in microseconds (singular or plural, any
#: case). Months and years are not fixed durations and are refused, as by Spark's windows.
INTERVAL_UNITS: dict[str, int] = {
    "week": 7 * 86_400_000_000, "day": 86_400_000_000, "hour": 3_600_000_000,
    "minute": 60_000_000, "second": 1_000_000, "millisecond": 1_000, "microsecond": 1,
}
_VARIABLE_UNITS = ("month", "year")
_MAX_INTERVAL_CHARS = 200
# Spark's parser (IntervalUtils.stringToInterval) works on ASCII bytes: whitespace is Java's
# Character.isWhitespace, the ends are trimmed of whitespace and ISO control characters
_SPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
_TRIMMED = "".join(map(chr, range(0x21))) + "\x7f"
_INTERVAL_PART = re.compile(
    rf"([+-]?)[{_SPACE}]*([0-9]*)(?:(\.)([0-9]*))?[{_SPACE}]+"
    rf"({'|'.join([*INTERVAL_UNITS, *_VARIABLE_UNITS])})s?(?:[{_SPACE}]+|\Z)")
_INT64_MAX = 2**63 - 1


def parse_interval(text: str, name: str = "interval") -> timedelta:
    """A Spark interval string, as ``F.window`` and ``withWatermark`` take it, as a timedelta.

    The one parser of interval strings in trilink-spark: every argument that takes a duration
    (``slot``, ``delay``, ``idle_timeout``, window sizes, ``period``) accepts what it accepts.
    It accepts exactly the strings Spark's ``CAST(text AS INTERVAL)`` accepts without months
    or years, with the same value.

    Parameters
    ----------
    text : str
        ``"10 seconds"``, ``"1 minute"``, ``"500 milliseconds"``, ``"1 hour 30 minutes"``,
        optionally prefixed by ``interval`` (``"INTERVAL 2 days"``): one or more
        ``<number> <unit>`` parts, units in :data:`INTERVAL_UNITS` (singular or plural, any
        case), numbers signed (``"-1 second"``, ``"- 1 second"``); only seconds take a
        fractional part (``"1.5 seconds"``, up to 9 digits, truncated to microseconds).
    name : str
        The argument named in error messages.

    Returns
    -------
    datetime.timedelta
        The sum of the parts (microsecond resolution, as Spark's intervals).

    Raises
    ------
    InvalidArgumentError
        Empty text, a part that is not ``<number> <unit>``, an unknown unit, a month or year
        (not a fixed duration), a fractional part on another unit than seconds, a value Spark's
        interval overflows with (64-bit microseconds, 32-bit days), or more than 200
        characters.
    InvalidArgumentTypeError
        ``text`` is not a str.

    Notes
    -----
    Cost: O(len(text)).

    Examples
    --------
    >>> parse_interval("1 hour 30 minutes")
    datetime.timedelta(seconds=5400)
    >>> parse_interval("500 milliseconds").total_seconds()
    0.5
    >>> parse_interval("2 fortnights")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: interval '2 fortnights' is not an interval string...
    """
    if not isinstance(text, str):
        raise InvalidArgumentTypeError(f"{name} must be a str, got {type(text).__name__}")
    if len(text) > _MAX_INTERVAL_CHARS:
        raise InvalidArgumentError(
            f"{name} is {len(text)} characters long; an interval string has at most "
            f"{_MAX_INTERVAL_CHARS}")
    shown = f"{name} {text!r}"
    allowed = ", ".join(INTERVAL_UNITS)
    not_interval = InvalidArgumentError(
        f"{shown} is not an interval string: give '<number> <unit>' parts such as "
        f"'10 seconds' or '1 hour 30 minutes' (units: {allowed}; singular or plural; only "
        "seconds take a fractional part)")
    body = text.strip(_TRIMMED)
    if not body.isascii():
        raise not_interval
    body = body.lower()
    if body.startswith("interval"):
        if len(body) > len("interval") and body[len("interval")] not in _SPACE:
            raise not_interval
        body = body[len("interval"):].lstrip(_SPACE)
    if not body:
        raise InvalidArgumentError(
            f"{shown} is empty; give '<number> <unit>' parts such as '10 seconds' "
            f"(units: {allowed})")
    days = micros = 0
    position = 0
    while position < len(body):
        match = _INTERVAL_PART.match(body, position)
        if match is None:
            raise not_interval
        sign, whole, point, fraction, unit = match.groups()
        if not whole and (not point or not fraction) and (not point or not sign):
            raise not_interval  # '.' alone is no number ('-.' and '1.' are, as in Spark)
        if unit in _VARIABLE_UNITS:
            raise InvalidArgumentError(
                f"{shown} has unit {unit!r}, which is not a fixed duration (months and years "
                f"vary); use {allowed}")
        if point and unit != "second":
            raise InvalidArgumentError(
                f"{shown} has a fractional number of {unit}s; only seconds take a fractional "
                "part (as in Spark): write '90 minutes' or '5400.5 seconds'")
        if len(fraction or "") > 9:
            raise InvalidArgumentError(
                f"{shown} has more than 9 fractional digits of a second (Spark's intervals "
                "hold nanoseconds at most, truncated to microseconds)")
        value = int(whole or "0")  # Spark reads the digits into a long, then the sign
        if value > _INT64_MAX:
            raise _too_long(shown)
        if sign == "-":
            value = -value
        if unit in ("week", "day"):  # days: a 32-bit field of their own
            if unit == "day" and not _fits(value, 32):
                raise _too_long(shown)
            days += value * (7 if unit == "week" else 1)
            if not _fits(days, 32):
                raise _too_long(shown)
        else:  # microseconds: a 64-bit field, each step checked as Math.*Exact does
            nanos = int((fraction or "").ljust(9, "0"))
            step = value * INTERVAL_UNITS[unit]
            micros += step
            if not _fits(step, 64) or not _fits(micros, 64):
                raise _too_long(shown)
            micros += (-1 if sign == "-" else 1) * (nanos // 1000)
            if not _fits(micros, 64):
                raise _too_long(shown)
        position = match.end()
    try:
        return timedelta(days=days, microseconds=micros)
    except OverflowError:
        raise _too_long(shown) from None


def _fits(value: int, bits: int) -> bool:
    """Whether ``value`` is in the range of a signed ``bits``-bit integer."""
    return bool(-(2 ** (bits - 1)) <= value < 2 ** (bits - 1))


def _too_long(shown: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{shown} is beyond the longest duration an interval holds (Spark: 2**63 - 1 "
        "microseconds and 2**31 - 1 days; Python: 999,999,999 days)")


def delay_in_units(delay: Any, kind: str, name: str = "delay") -> float:
    """A duration in internal units: microseconds for timestamps, the column's own otherwise.

    For a timestamp column, ``delay`` is an interval string (:func:`parse_interval`), a
    ``timedelta`` or a number of seconds; for a numeric column, a number in its unit. ``name``
    is the argument named in error messages.
    """
    if kind not in TIME_KINDS:
        raise InvalidArgumentError(f"time kind must be one of {TIME_KINDS}, got {kind!r}")
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
