"""The runtime's key identities and one partition's plain state: what the semantics compute
on, with no I/O and no codec.

- :data:`NULL_KEY` and :data:`NAN_KEY`: the one object the runtime uses for the null key and
  for a floating column's NaN key, so each is found again from batch to batch and neither is
  merged with the other (as in Spark's ``groupBy``); :func:`user_key` gives them to the hooks
  as ``None`` and ``float("nan")``.
- :class:`PartitionState`: the plain fields of one partition's keyed runtime, which the
  durable layer encodes (:mod:`trilink_spark.keyed.durable.codec`) and decodes.
- :func:`check_value`: the one rule for a per-key value against the declared ``state_schema``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import StateTypeError

__all__ = ["NULL_KEY", "NAN_KEY", "user_key", "PartitionState", "object_array", "check_value"]

#: The one object the runtime uses for the null key, so that its state is found again from
#: batch to batch (NaN is not equal to itself; this object is identical). The hooks get
#: ``None`` instead (:func:`user_key`).
NULL_KEY: float = float("nan")


class _NaNKey:
    """The type of :data:`NAN_KEY` (one instance, equal only to itself)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NAN_KEY"

    def __reduce__(self) -> str:
        return "NAN_KEY"  # unpickles as the module's one object


#: The one object the runtime uses for the NaN key of a floating key column, a key of its
#: own beside the null key, as in Spark's ``groupBy``. Not a float: pandas takes every NaN
#: for a missing value, and would merge it with the null key in an index or a group-by. The
#: hooks get ``float("nan")`` instead (:func:`user_key`).
NAN_KEY: Any = _NaNKey()


def user_key(key: Any) -> Any:
    """A runtime key as the hooks and the results give it: ``None`` for the null key
    (:data:`NULL_KEY`, or any other float NaN standing for it), ``float("nan")`` for
    :data:`NAN_KEY`, every other key itself. O(1).

    Examples
    --------
    >>> user_key(NULL_KEY) is None, user_key(NAN_KEY), user_key(7)
    (True, nan, 7)
    """
    if key is NAN_KEY:
        return math.nan
    if isinstance(key, float) and key != key:
        return None
    return key


@dataclass
class PartitionState:
    """The plain fields of one partition's keyed runtime."""

    key_high: dict[Hashable, float] = field(default_factory=dict)
    last_seen: dict[Hashable, float] = field(default_factory=dict)
    key_rows: dict[Hashable, int] = field(default_factory=dict)
    values: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    timers: list[tuple[Hashable, int]] = field(default_factory=list)
    partition_high: float = -math.inf
    counters: dict[str, int] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    #: The processing time (ms since the epoch) of the last batch that brought each key a row
    #: (the ``batch_time`` column; a key without an entry has none recorded).
    batch_time: dict[Hashable, float] = field(default_factory=dict)


def object_array(items: Sequence[Any]) -> np.ndarray[Any, Any]:
    """A 1-d object array of ``items`` (one step per item, so tuple keys stay whole)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def check_value(name: str, value: Any, fields: dict[str, Any] | None, key: Hashable) -> None:
    """Refuse a value that the declared ``state_schema`` cannot hold (O(size of value)).

    Raises
    ------
    StateTypeError
        ``name`` is not a declared field, or ``value`` does not convert to its type.
    """
    if fields is None:
        return
    import pyarrow as pa

    if name not in fields:
        raise StateTypeError(
            f"state value {name!r} of key {key!r} is not declared in the processor's "
            f"state_schema (declared: {', '.join(fields)})")
    try:
        pa.scalar(value, type=fields[name], from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as err:
        raise StateTypeError(
            f"state value {name!r} of key {key!r} is {value!r} ({type(value).__name__}), which "
            f"does not fit its declared type {fields[name]} ({err})") from None
