"""Argument checks shared by every layer.

Examples
--------
>>> check_num_partitions(4)
4
>>> check_num_partitions(0)
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: num_partitions must be >= 1, got 0
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["check_num_partitions", "MAX_PARTITIONS", "check_real"]

#: The most partitions a strategy places keys on (Spark's own limit is far above what a shuffle
#: of this many partitions could run; the bound keeps a hostile stored strategy from asking for
#: terabytes).
MAX_PARTITIONS = 1_000_000


def check_num_partitions(n: Any, name: str = "num_partitions") -> int:
    """Validate a partition count: an ``int`` from 1 to :data:`MAX_PARTITIONS`. O(1)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise InvalidArgumentTypeError(f"{name} must be an int >= 1, got {type(n).__name__}")
    if n < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got {n}")
    if n > MAX_PARTITIONS:
        raise InvalidArgumentError(f"{name} must be at most {MAX_PARTITIONS:,}, got {n}")
    return int(n)


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
