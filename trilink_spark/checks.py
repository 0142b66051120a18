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

from typing import Any

import numpy as np

from .errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["check_num_partitions", "MAX_PARTITIONS"]

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
