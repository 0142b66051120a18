"""Argument validation shared by every layer: counts, numbers, fractions, durations, Spark
interval strings, choices among names, the int64 range and how a key is shown. Every check
raises a typed error (:class:`~trilink_spark.errors.
InvalidArgumentError` or :class:`~trilink_spark.errors.InvalidArgumentTypeError`, so also
``ValueError`` / ``TypeError``) that says what was wrong and what is allowed. All are O(1),
except the interval parser, O(len(text)).

Examples
--------
>>> check_num_partitions(4)
4
>>> check_num_partitions(0)
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: num_partitions must be >= 1, got 0
>>> seconds("5 seconds", "window_s")
5.0
>>> positive(0, "unit_rate")
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: unit_rate must be a finite number > 0, got 0
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
from datetime import date, datetime, timedelta
from collections.abc import Collection
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StreamingNotSupportedError

__all__ = ["check_num_partitions", "MAX_PARTITIONS", "check_real", "number", "positive",
           "fraction", "count", "is_count", "INT64_MIN", "INT64_MAX", "fits_int64", "seconds",
           "parse_interval", "INTERVAL_UNITS", "short_repr", "text", "choice", "JsonKey",
           "KEY_DISPLAY_CHARS", "MAX_KEY_TEXT_CHARS", "display_key", "key_text", "check_key",
           "refuse_streaming", "refuse_streaming_batch_function", "loads"]

#: The most partitions a strategy places keys on (Spark's own limit is far above what a shuffle
#: of this many partitions could run; the bound keeps a hostile stored strategy from asking for
#: terabytes).
MAX_PARTITIONS = 1_000_000

#: The int64 range (Spark's ``bigint``, Arrow's and NumPy's ``int64``): the one pair every
#: check of "fits a 64-bit signed integer" uses (:func:`fits_int64`, ``count(high=INT64_MAX)``).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def check_num_partitions(n: Any, name: str = "num_partitions") -> int:
    """Validate a partition count: an ``int`` from 1 to :data:`MAX_PARTITIONS`. O(1)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise InvalidArgumentTypeError(f"{name} must be an int >= 1, got {type(n).__name__}")
    if n < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got {n}")
    if n > MAX_PARTITIONS:
        raise InvalidArgumentError(f"{name} must be at most {MAX_PARTITIONS:,}, got {n}")
    return int(n)


def loads(values: Any, name: str = "counts") -> npt.NDArray[np.float64]:
    """``values`` as a flat float64 array of finite, non-negative numbers (loads, counts):
    the one check of a collection of loads. O(len(values)).

    Examples
    --------
    >>> loads([1, 2.5]).tolist()
    [1.0, 2.5]
    """
    try:
        raw = np.asarray(values)
        if raw.size and raw.dtype.kind not in "iuf" and not (
                raw.dtype.kind == "O" and all(  # numbers boxed as objects (nullable ints)
                    isinstance(v, (int, float, np.integer, np.floating))
                    and not isinstance(v, bool) for v in raw.ravel().tolist())):
            raise TypeError(raw.dtype)  # text, bools, anything else: not loads
        out = raw.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgumentError(f"{name} must be finite, non-negative numbers") from None
    if out.ndim != 1:
        raise InvalidArgumentError(f"{name} must be a flat collection of loads")
    if out.size and (not np.all(np.isfinite(out)) or out.min() < 0):
        raise InvalidArgumentError(f"{name} must be finite and non-negative")
    return out


def check_real(value: object, what: str, *, positive: bool = False) -> float:
    """A finite real ``>= 0`` (``> 0`` with ``positive``) as a float, else a typed error
    that says what is allowed (bools and ints beyond the float range are refused). O(1).

    Examples
    --------
    >>> check_real(3, "rate")
    3.0
    >>> check_real(0, "rate", positive=True)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: rate must be > 0, got 0.0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentTypeError(
            f"{what} must be a real number (int or float), got {type(value).__name__}")
    try:
        out = float(value)
    except OverflowError:  # an int beyond the float range
        bits = value.bit_length() if isinstance(value, int) else "?"
        raise InvalidArgumentError(
            f"{what} must be finite, got an integer of {bits} bits (floats end near "
            "1.8e308)") from None
    if math.isnan(out) or math.isinf(out):
        raise InvalidArgumentError(f"{what} must be finite, got {out!r}")
    if out < 0 or (positive and out == 0):
        raise InvalidArgumentError(f"{what} must be {'> 0' if positive else '>= 0'}, got "
                                   f"{out!r}")
    return out


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
        if value > INT64_MAX:
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


def _float(value: Any, name: str) -> float:
    """``float(value)``, with an int beyond the float range refused by a typed error."""
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgumentError(
            f"{name} must be a finite number, got an integer of {int(value).bit_length()} bits "
            "(floats end near 1.8e308)") from None


def number(value: Any, name: str, *, low: float | None = None,
           high: float | None = None, json: bool = False) -> float:
    """A finite real number (bools refused), within ``[low, high]`` when bounds are given
    (NaN is out of every range). O(1).

    With ``json``, the rules of a configuration field (:mod:`trilink_spark.switching.settings`):
    only ``int`` and ``float``, the numbers a JSON document holds (NumPy's ``float64`` is a
    float; its other scalars are refused), an ``int`` beyond the float range counts as not
    finite, and a value that is not finite is refused as ``"{name} must be finite, got ..."``,
    quoted by :func:`short_repr` (a peer's 5,000-digit number has no ``repr``).

    Examples
    --------
    >>> number(0.9, "lambda_", low=0.85, high=1.0)
    0.9
    >>> number(2, "lambda_", low=0.85, high=1.0)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: lambda_ must be in [0.85, 1.0], got 2
    >>> number(float("nan"), "threshold", json=True)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: threshold must be finite, got nan
    """
    types = (int, float) if json else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, types):
        raise InvalidArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    if json:
        try:
            out = float(value)
        except OverflowError:  # an int beyond the range of a double: not finite
            out = math.inf
        if not math.isfinite(out):
            raise InvalidArgumentError(f"{name} must be finite, got {short_repr(value)}")
    else:
        out = _float(value, name)
    if low is not None or high is not None:
        lo = -math.inf if low is None else low
        hi = math.inf if high is None else high
        if not lo <= out <= hi:
            allowed = (f"in [{low}, {high}]" if low is not None and high is not None
                       else f">= {low}" if low is not None else f"<= {high}")
            raise InvalidArgumentError(f"{name} must be {allowed}, got {value!r}")
    if not math.isfinite(out):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}")
    return out


def short_repr(value: Any, limit: int = 60) -> str:
    """A short ``repr`` for a message, at most ``limit`` characters; never raises (``repr`` of
    a 5000-digit int does). O(limit) beyond the ``repr`` itself."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - describe what cannot be shown
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """A finite number > 0 (or >= 0 with ``allow_zero``). O(1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    out = _float(value, name)
    ok = math.isfinite(out) and (out >= 0 if allow_zero else out > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(f"{name} must be a finite number {bound}, got {value!r}")
    return out


def fraction(value: Any, name: str, *, open_low: bool = True) -> float:
    """A number in ``(0, 1]`` (or ``[0, 1]`` with ``open_low=False``). O(1)."""
    out = number(value, name)
    if (out <= 0 if open_low else out < 0) or out > 1:
        interval = "(0, 1]" if open_low else "[0, 1]"
        raise InvalidArgumentError(f"{name} must be in {interval}, got {value!r}")
    return out


def count(value: Any, name: str, low: int = 1, *, high: int | None = None,
          plain: bool = False) -> int:
    """An ``int`` >= ``low`` (and <= ``high`` when given; bools refused): the one check of a
    whole-number count. O(1).

    A refused value is quoted by its ``repr`` (``np.int64(0)``), or with ``plain`` as the
    integer it is (``0``), as the control plane's checks have always quoted it; one beyond
    ``high`` by :func:`short_repr` (a forged 400-digit count has no short ``repr``).

    Examples
    --------
    >>> count(3, "batches")
    3
    >>> count(2**63, "rows", 0, high=INT64_MAX)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: rows must be at most 9,223,372,036,854,775,807, ...
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        shown = int(value) if plain else repr(value)
        raise InvalidArgumentError(f"{name} must be >= {low}, got {shown}")
    if high is not None and value > high:
        raise InvalidArgumentError(
            f"{name} must be at most {high:,}, got {short_repr(int(value))}")
    return int(value)


def is_count(value: object, low: int = 0, high: int | None = None) -> bool:
    """Whether :func:`count` takes ``value`` (an int, not a bool, in ``[low, high]``): the
    same check as a predicate, for a stored file read field by field. O(1).

    Examples
    --------
    >>> is_count(0), is_count(True), is_count(2**63, high=INT64_MAX)
    (True, False, False)
    """
    try:
        count(value, "value", low, high=high)
    except (InvalidArgumentError, InvalidArgumentTypeError):
        return False
    return True


def fits_int64(value: object) -> bool:
    """Whether ``value`` is an integer (NumPy's too, not a bool) in ``[INT64_MIN, INT64_MAX]``:
    the one check of the int64 range. O(1).

    Examples
    --------
    >>> fits_int64(INT64_MAX), fits_int64(INT64_MAX + 1), fits_int64(INT64_MIN), fits_int64(1.0)
    (True, False, True, False)
    """
    return bool(isinstance(value, (int, np.integer)) and not isinstance(value, bool)
                and INT64_MIN <= value <= INT64_MAX)


def seconds(value: Any, name: str) -> float:
    """A duration > 0 in seconds: a number, a :class:`~datetime.timedelta` or a Spark interval
    string (``"5 seconds"``, see :func:`parse_interval`). O(len(value))."""
    if isinstance(value, str):
        value = parse_interval(value, name)
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return positive(value, name)


def text(value: Any, name: str, limit: int, *, empty: bool = True) -> str:
    """A ``str`` of at most ``limit`` characters (non-empty unless ``empty``); a longer one is
    refused, not cut (a caller that shows a shorter one cuts it itself). O(1).

    Examples
    --------
    >>> text("least_count", "strategy", 200)
    'least_count'
    >>> text("s" * 300, "strategy", 200)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: strategy is 300 characters long; at most 200 ...
    """
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{name} must be a str, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidArgumentError(
            f"{name} is {len(value):,} characters long; at most {limit:,} are allowed")
    if not empty and not value:
        raise InvalidArgumentError(f"{name} must be a non-empty str")
    return value


def choice(value: Any, name: str, allowed: Collection[str], *, also: str = "",
           error: type[Exception] = InvalidArgumentError,
           type_error: type[Exception] = InvalidArgumentTypeError) -> str:
    """One of the strings ``allowed``: the one "must be one of" check. A value that is not a
    ``str`` is a ``type_error`` (default :class:`~trilink_spark.errors.InvalidArgumentTypeError`),
    another string an ``error`` (default :class:`~trilink_spark.errors.InvalidArgumentError`);
    both name what is allowed. O(len(allowed)).

    Parameters
    ----------
    value
        What was given.
    name : str
        The argument (or conf, or field) named in the message.
    allowed : collection of str
        The strings taken (a mapping: its keys), in the order the message lists them.
    also : str
        What else the caller takes, appended to the list (``" or None"``, ``" or a
        RedisStore"``): the caller accepts it before calling.
    error, type_error : type of Exception
        The classes raised (a configuration field raises ``ConfigError`` and
        ``ConfigTypeError``).

    Examples
    --------
    >>> choice("event", "clock", ("event", "processing"))
    'event'
    >>> choice("wall", "clock", ("event", "processing"))
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: clock must be one of 'event', 'processing', ...
    >>> choice("x", "kind", ("int", "long"), also=" or None")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: kind must be one of 'int', 'long' or None, got 'x'
    """
    names = ", ".join(map(repr, allowed)) + also
    if not isinstance(value, str):
        raise type_error(
            f"{name} must be a str, one of {names}, got {type(value).__name__}")
    if value not in allowed:
        raise error(f"{name} must be one of {names}, got {short_repr(value)}")
    return value


#: A key as a record and the page hold it: a JSON scalar.
JsonKey: TypeAlias = str | int | float | bool | None

#: The display limit: a key shown in a history record, on the dashboard's page or in a message
#: is cut to this many characters, then "…" (bytes: ``0x`` and the hex digits of the first
#: ``KEY_DISPLAY_CHARS // 2`` bytes, then "…"). Applied by :func:`display_key`.
KEY_DISPLAY_CHARS = 80
#: The stored-record bound: the longest key text a history record or a task's key profile may
#: hold (:func:`check_key`). :func:`display_key` writes at most ``KEY_DISPLAY_CHARS + 3``
#: characters (``0x``, 80 hex digits, "…"); a longer key text was not written by it, and a
#: record of 10,000 partitions whose keys are all this long still fits a store record.
MAX_KEY_TEXT_CHARS = 100


def _cut(text: str) -> str:
    return text if len(text) <= KEY_DISPLAY_CHARS else text[:KEY_DISPLAY_CHARS] + "\u2026"


def display_key(value: Any) -> JsonKey:
    """A key as records and the page show it: a JSON scalar (None, bool, int, a finite float
    or a str), texts cut at :data:`KEY_DISPLAY_CHARS`. The one rule of how a key is shown.
    O(:data:`KEY_DISPLAY_CHARS`) beyond ``str(value)``.

    Examples
    --------
    >>> display_key(b"\\x00\\xff"), display_key(float("nan")), display_key("x" * 100)[-3:]
    ('0x00ff', 'NaN', 'xx…')
    >>> len(display_key(bytes(100)))
    83
    """
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value).replace("nan", "NaN")
    if isinstance(value, (bytes, bytearray, memoryview)):
        half = KEY_DISPLAY_CHARS // 2
        text = "0x" + bytes(value[:half]).hex()
        return text + ("\u2026" if len(value) > half else "")
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        value = str(value)
    return _cut(value if isinstance(value, str) else str(value))


def key_text(key: JsonKey) -> str:
    """A key as text: a str as it is, another key as JSON (``null``, ``true``, ``17``), cut as
    :func:`display_key` cuts it. O(:data:`KEY_DISPLAY_CHARS`).

    Examples
    --------
    >>> key_text("u1"), key_text(17), key_text(None), key_text(True), len(key_text("k" * 500))
    ('u1', '17', 'null', 'true', 81)
    """
    if isinstance(key, str):
        return _cut(key)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return _cut(repr(key))


def check_key(value: Any, name: str) -> JsonKey:
    """A key as a record holds it (:func:`display_key`'s output): null, a bool, an int64, a
    finite float, or a str of at most :data:`MAX_KEY_TEXT_CHARS`; else a typed error naming
    ``name``. O(1).

    Examples
    --------
    >>> check_key("k", "hot_keys[0] key")
    'k'
    >>> check_key(2**70, "hot_keys[0] key")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: hot_keys[0] key must be a 64-bit integer, got...
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) > MAX_KEY_TEXT_CHARS:
            raise InvalidArgumentError(
                f"{name} is {len(value):,} characters long; a key is held cut to at most "
                f"{MAX_KEY_TEXT_CHARS}")
        return value
    if isinstance(value, int):
        if not fits_int64(value):
            raise InvalidArgumentError(f"{name} must be a 64-bit integer, got "
                                       f"{short_repr(value)}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{name} must be finite, got {value!r}")
        return value
    raise InvalidArgumentTypeError(
        f"{name} must be a JSON scalar (str, int, float, bool or null), got "
        f"{type(value).__name__}")


def refuse_streaming(df: Any, api: str, why: str, route: str | None = None) -> None:
    """Refuse a streaming DataFrame at call time: the one refusal every batch-only call uses.

    Parameters
    ----------
    df
        The frame given (anything without ``isStreaming`` passes: other checks judge it).
    api : str
        The call, as the user wrote it (``"keyed_watermark"``).
    why : str
        Why it cannot run on a stream, in words.
    route : str, optional
        What runs on a stream instead; default: the call on each micro-batch inside
        ``writeStream.foreachBatch``, with a one-line example.

    Raises
    ------
    StreamingNotSupportedError
        ``df.isStreaming``: the message names ``api``, says ``why`` and gives the route.

    Notes
    -----
    Cost: O(1) (``isStreaming`` reads the analysed plan; no job runs).

    Examples
    --------
    >>> import textwrap
    >>> class Stream:
    ...     isStreaming = True
    >>> try:
    ...     refuse_streaming(Stream(), "partition_balance", "it counts every partition's rows")
    ... except StreamingNotSupportedError as err:
    ...     print(textwrap.fill(str(err), 80))
    partition_balance does not run on a streaming DataFrame: it counts every
    partition's rows. Call it on each micro-batch instead:
    stream.writeStream.foreachBatch(lambda batch_df, batch_id:
    partition_balance(batch_df, ...)).start()
    """
    if not getattr(df, "isStreaming", False):
        return
    if route is None:
        route = ("Call it on each micro-batch instead: stream.writeStream.foreachBatch("
                 f"lambda batch_df, batch_id: {api}(batch_df, ...)).start()")
    raise StreamingNotSupportedError(
        f"{api} does not run on a streaming DataFrame: {why}. {route}")


def refuse_streaming_batch_function(batch_df: Any, what: str, made_by: str) -> None:
    """Refuse a streaming DataFrame given to a ``foreachBatch`` callable directly
    (``run(stream_df, 0)``): Spark calls it with each micro-batch, a batch DataFrame. Refused
    before the callable claims a state path, plans a batch or runs a job.

    Parameters
    ----------
    batch_df
        The frame given.
    what : str
        The callable's class (``"KeyedBatchFunction"``).
    made_by : str
        The call that made it (``"keyed_foreach_batch"``).

    Raises
    ------
    StreamingNotSupportedError
        ``batch_df.isStreaming``.

    Notes
    -----
    Cost: O(1), as :func:`refuse_streaming`.

    Examples
    --------
    >>> class Stream:
    ...     isStreaming = True
    >>> try:
    ...     refuse_streaming_batch_function(Stream(), "KeyedBatchFunction", "keyed_foreach_batch")
    ... except StreamingNotSupportedError as err:
    ...     print(str(err)[:72])
    KeyedBatchFunction does not run on a streaming DataFrame: what keyed_for
    """
    refuse_streaming(
        batch_df, what, f"what {made_by} returns is called by Spark with each micro-batch (a "
        "batch DataFrame) and its batch id, never with the stream itself",
        "Give it to the stream's sink: stream.writeStream.foreachBatch(run)"
        ".option('checkpointLocation', path).start()")
