"""The plan of a validated Local Merge, which its engines share.

:class:`MergePlan` carries what a partition function needs (picklable; no DataFrame), built by
:func:`~trilink_spark.merge.engines.local.plan_merge`; :func:`slot_starts` gives each row's time slot
as Spark computes it, :data:`UNTIMED_SLOT` standing for the null slot of rows without a
finite event time, and :data:`SLOT` names the output column of slot starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bounds import DEFAULT_MAX_GROUPS
from ..algebra.expressions import AggSpec

__all__ = ["MergePlan", "SLOT", "UNTIMED_SLOT", "slot_starts"]

#: Output column: the start of each partial row's time slot.
SLOT = "slot_start"
#: Inside Local Merge: the internal slot of a row without a (finite) event time, kept in the
#: null slot (a row with a NaN slot and no event time is not merged).
UNTIMED_SLOT = float("inf")


@dataclass(frozen=True)
class MergePlan:
    """What the partition function of a validated merge needs (picklable; no DataFrame)."""

    key: str
    specs: list[AggSpec]
    mode: str
    quantity: int
    delay: float
    time_kind: str
    time_name: str
    names: list[str]
    out_schema: Any
    arrow_schema: Any
    max_groups: int = DEFAULT_MAX_GROUPS
    #: Source columns that travel under internal names (dotted or backticked names), mapped
    #: to the user's names: :func:`~trilink_spark.merge.engines.pandas_engine.partition_partials`
    #: gives the names back.
    aliases: dict[str, str] = field(default_factory=dict)
    #: Slot length in event-time units: slots are computed from the event time inside the
    #: partition (one column less crosses from the JVM).
    slot_units: float = 0.0


def slot_starts(et: np.ndarray, size: float) -> np.ndarray:
    """Each event time's slot start, as Spark's ``et - pmod(et, size)`` in doubles;
    :data:`UNTIMED_SLOT` where ``et`` is NaN. Vectorised, O(len(et))."""
    with np.errstate(invalid="ignore"):
        # Spark's Pmod for doubles: r = a % n (Java's %, C's fmod); r < 0 ? (r + n) % n : r.
        # Adding n to a positive remainder would round (0.1 % 3 -> 0.10000000000000009)
        # and -0.0 would keep its sign: both differ from Spark's slot
        rem = np.fmod(et, size)
        rem = np.where(rem < 0, np.fmod(rem + size, size), rem)
        start = et - rem
    slots: np.ndarray = np.where(np.isnan(et), UNTIMED_SLOT, start)
    return slots
