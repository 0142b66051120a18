"""The fields of a run-time configuration and their checks (the config center's validator).

A :class:`~trilink_spark.switching.ConfigCenter` validates every update with
:func:`validate_update` unless it is given another validator. The strategies an update may pin are
the catalogue's (:mod:`trilink_spark.partitioners.choosing.catalogue`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .._internal.validation import choice, number
from ..errors import ConfigError, ConfigTypeError, InvalidArgumentError, InvalidArgumentTypeError
from ..eventtime import parse_interval
from ..partitioners.choosing.catalogue import configurable_names
from .wire import MAX_VERSION, short_repr

__all__ = ["MODES", "CONFIG_STRATEGIES", "CONFIG_FIELDS", "MAX_INTEGER", "validate_update"]

#: Switching modes: Table 6 of the Trilink paper, plus ``"manual"`` (never switch on its own).
MODES: tuple[str, ...] = ("periodic", "quantity", "threshold", "manual")
#: Strategies a configuration may pin (``strategy``) or offer as candidates (at import time;
#: the check itself reads the catalogue).
CONFIG_STRATEGIES: tuple[str, ...] = configurable_names()
#: Largest integer any field (``version`` included) may hold: 2**53 - 1, the largest integer a
#: double holds exactly (Redis' Lua compares versions as doubles, JSON readers often do too).
MAX_INTEGER: int = MAX_VERSION


def _integer(value: Any, name: str, low: int, high: int = MAX_INTEGER) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {short_repr(value)}")
    if value > high:
        raise ConfigError(f"{name} must be <= {high}, got {short_repr(value)}")
    return value


def _in_range(value: Any, name: str, low: float, high: float, *, open_low: bool = False,
              open_high: bool = False) -> float:
    try:  # the one number check, its errors as a config's
        x = number(value, name, json=True)
    except InvalidArgumentTypeError as err:
        raise ConfigTypeError(str(err)) from None
    except InvalidArgumentError as err:
        raise ConfigError(str(err)) from None
    bad_low = x <= low if open_low else x < low
    bad_high = x >= high if open_high else x > high
    if bad_low or bad_high:
        lo, hi = ("(" if open_low else "["), (")" if open_high else "]")
        raise ConfigError(f"{name} must be in {lo}{low}, {high}{hi}, got {short_repr(value)}")
    return x


def _strategy(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigTypeError(f"{name} must be a strategy name (str), got {type(value).__name__}")
    allowed = configurable_names()
    if value not in allowed:
        raise ConfigError(f"{name} {short_repr(value)} is unknown; choose from {', '.join(allowed)}")
    return value


def _candidates(value: Any, name: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{name} must be a non-empty list of strategy names")
    out = [_strategy(v, name) for v in value]
    if len(set(out)) != len(out):
        raise ConfigError(f"{name} lists a strategy twice: {short_repr(out)}")
    return out


def _mode(value: Any, name: str) -> str:
    return choice(value, name, MODES, error=ConfigError, type_error=ConfigTypeError)


def _period(value: Any, name: str) -> float:
    """Seconds: a number, a timedelta or a Spark interval string (``"30 seconds"``)."""
    from datetime import timedelta

    if isinstance(value, str):
        try:
            value = parse_interval(value, name)
        except InvalidArgumentError as err:
            raise ConfigError(str(err)) from None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return _in_range(value, name, 0.0, math.inf, open_low=True, open_high=True)


def _optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    def run(value: Any, name: str) -> Any:
        return None if value is None else check(value, name)

    return run


#: The fields a configuration may carry, each with its validator. ``None`` unsets
#: ``period_s`` / ``period_batches``. Integers lie in ``[low, MAX_INTEGER]``: a ``version``
#: above 2**53 - 1 would stop the compare-and-set of Redis' Lua (doubles) from ever moving on.
CONFIG_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "version": lambda v, n: _integer(v, n, 1),
    "strategy": _strategy,
    "candidates": _candidates,
    "sample_rate": lambda v, n: _in_range(v, n, 0.0, 1.0, open_low=True),
    "mode": _mode,
    "threshold": lambda v, n: _in_range(v, n, 0.0, 1.0),
    "period_s": _optional(_period),
    "period_batches": _optional(lambda v, n: _integer(v, n, 1)),
    "quantity": lambda v, n: _integer(v, n, 1),
    "min_gain": lambda v, n: _in_range(v, n, 0.0, 1.0),
    "decay": lambda v, n: _in_range(v, n, 0.0, 1.0, open_high=True),
    "min_sample": lambda v, n: _integer(v, n, 1),
    # rows per trigger a trilink-kafka stream admits (None: no cap); see follow_trigger_cap
    "max_offsets_per_trigger": _optional(lambda v, n: _integer(v, n, 1)),
}


def validate_update(update: Any) -> dict[str, Any]:
    """A checked copy of a configuration update; raises :class:`~trilink_spark.errors.ConfigError`.

    Every error is a :class:`~trilink_spark.errors.ConfigError` (or its subclass
    :class:`~trilink_spark.errors.ConfigTypeError`), whatever the update holds; the values it
    quotes are shortened.

    Notes
    -----
    O(number of fields + length of ``candidates``).

    Examples
    --------
    >>> validate_update({"mode": "threshold", "threshold": 0.6})
    {'mode': 'threshold', 'threshold': 0.6}
    >>> validate_update({"colour": "red"})
    Traceback (most recent call last):
    ...
    trilink_spark.errors.ConfigError: unknown config field(s) ['colour']; allowed: ...
    """
    if not isinstance(update, Mapping):
        raise ConfigTypeError(f"a config update must be a mapping, got {type(update).__name__}")
    unknown = [k for k in update if not isinstance(k, str) or k not in CONFIG_FIELDS]
    if unknown:
        names = sorted(k if isinstance(k, str) else short_repr(k) for k in unknown)
        raise ConfigError(
            f"unknown config field(s) {short_repr(names, 200)}; allowed: {', '.join(CONFIG_FIELDS)}"
        )
    return {k: CONFIG_FIELDS[k](v, k) for k, v in update.items()}


