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
           "delay_in_units", "from_units", "parse_interval", "INTERVAL_UNITS"]

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
    col = F.col(column)
    if kind == "fractional":
        return col.cast("double"), kind
    whole = F.unix_micros(col.cast("timestamp")) if kind == "timestamp" else col.cast("long")
    # doubles hold integers exactly up to 2**53: refuse what would silently round
    message = (
        f"trilink_spark.InvalidArgumentError: event time column {column!r} has a value beyond "
        f"+-2**53 {'microseconds' if kind == 'timestamp' else 'units'}, which cannot be "
        "represented exactly; convert it first (for nanosecond epochs: a timestamp column, "
        "or the value divided by 1000 as microseconds)"
    )
    exact = F.when(F.abs(whole) > F.lit(MAX_EXACT), F.raise_error(F.lit(message)))
    return exact.otherwise(whole.cast("double")), kind


#: Units of an interval string and their length in microseconds (singular or plural, any
#: case). Months and years are not fixed durations and are refused, as by Spark's windows.
INTERVAL_UNITS: dict[str, int] = {
    "week": 7 * 86_400_000_000, "day": 86_400_000_000, "hour": 3_600_000_000,
    "minute": 60_000_000, "second": 1_000_000, "millisecond": 1_000, "microsecond": 1,
}
_VARIABLE_UNITS = ("month", "year")
_INTERVAL_PART = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s+([a-z]+)\b")
_MAX_INTERVAL_CHARS = 200


def parse_interval(text: str, name: str = "interval") -> timedelta:
    """A Spark interval string, as ``F.window`` and ``withWatermark`` take it, as a timedelta.

    The one parser of interval strings in trilink-spark: every argument that takes a duration
    (``slot``, ``delay``, ``idle_timeout``, window sizes, ``period``) accepts what it accepts.

    Parameters
    ----------
    text : str
        ``"10 seconds"``, ``"1 minute"``, ``"500 milliseconds"``, ``"1 hour 30 minutes"``,
        optionally prefixed by ``interval`` (``"INTERVAL 2 days"``): one or more
        ``<number> <unit>`` parts, units in :data:`INTERVAL_UNITS` (singular or plural, any
        case), numbers possibly fractional (``"1.5 seconds"``) or signed.
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
        (not a fixed duration), or more than 200 characters.
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
    trilink_spark.errors.InvalidArgumentError: interval '2 fortnights' has unit 'fortnights'; ...
    """
    if not isinstance(text, str):
        raise InvalidArgumentTypeError(f"{name} must be a str, got {type(text).__name__}")
    if len(text) > _MAX_INTERVAL_CHARS:
        raise InvalidArgumentError(
            f"{name} is {len(text)} characters long; an interval string has at most "
            f"{_MAX_INTERVAL_CHARS}")
    body = text.strip().lower()
    if body.startswith("interval"):
        body = body[len("interval"):].strip()
    shown = f"{name} {text!r}"
    allowed = ", ".join(INTERVAL_UNITS)
    if not body:
        raise InvalidArgumentError(
            f"{shown} is empty; give '<number> <unit>' parts such as '10 seconds' "
            f"(units: {allowed})")
    micros = 0.0
    position = 0
    for match in _INTERVAL_PART.finditer(body):
        if body[position:match.start()].strip():
            break
        number, unit = match.group(1), match.group(2)
        singular = unit[:-1] if unit.endswith("s") and unit[:-1] in INTERVAL_UNITS else unit
        if singular.rstrip("s") in _VARIABLE_UNITS:
            raise InvalidArgumentError(
                f"{shown} has unit {unit!r}, which is not a fixed duration (months and years "
                f"vary); use {allowed}")
        if singular not in INTERVAL_UNITS:
            raise InvalidArgumentError(
                f"{shown} has unit {unit!r}; units are {allowed} (singular or plural)")
        micros += float(number) * INTERVAL_UNITS[singular]
        position = match.end()
    if position == 0 or body[position:].strip():
        raise InvalidArgumentError(
            f"{shown} is not an interval string: give '<number> <unit>' parts such as "
            f"'10 seconds' or '1 hour 30 minutes' (units: {allowed})")
    if not math.isfinite(micros) or abs(micros) > timedelta.max.total_seconds() * 1e6:
        raise InvalidArgumentError(f"{shown} is beyond the longest duration Python holds")
    return timedelta(microseconds=round(micros))


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
