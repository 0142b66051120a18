"""Argument checks of the elastic package (numbers, counts, durations).

Examples
--------
>>> seconds("5 seconds", "window_s")
5.0
>>> positive(0, "unit_rate")
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: unit_rate must be a finite number > 0, got 0
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..eventtime import parse_interval

__all__ = ["number", "positive", "fraction", "count", "seconds"]


def _float(value: Any, name: str) -> float:
    """``float(value)``, with an int beyond the float range refused by a typed error."""
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgumentError(
            f"{name} must be a finite number, got an integer of {int(value).bit_length()} bits "
            "(floats end near 1.8e308)") from None


def number(value: Any, name: str) -> float:
    """A finite real number (bools refused). O(1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    out = _float(value, name)
    if not math.isfinite(out):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}")
    return out


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


def count(value: Any, name: str, low: int = 1) -> int:
    """An ``int`` >= ``low`` (bools refused). O(1)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise InvalidArgumentError(f"{name} must be >= {low}, got {value!r}")
    return int(value)


def seconds(value: Any, name: str) -> float:
    """A duration > 0 in seconds: a number, a :class:`~datetime.timedelta` or a Spark interval
    string (``"5 seconds"``, see :func:`~trilink_spark.parse_interval`). O(len(value))."""
    if isinstance(value, str):
        value = parse_interval(value, name)
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return positive(value, name)
