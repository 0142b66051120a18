"""Event-time timers of one partition, kept in order (the Trilink paper, §4.1).

The paper keeps a keyed operator's timers in a red-black tree: registering is O(log n) and the
earliest timer is found in O(1). :class:`TimerService` does the same with a
``sortedcontainers.SortedList`` of ``(timestamp, key)`` pairs plus a per-key index, so that
every timer of a key can also be found and dropped (idle keys, state clean-up).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

from sortedcontainers import SortedKeyList

from ...errors import InvalidArgumentTypeError
from .keys import NAN_KEY

__all__ = ["TimerService"]


def _firing_order(timer: tuple[int, Hashable]) -> tuple[int, int, Any]:
    """The sort key of a ``(timestamp, key)`` timer: by time, then the null key first, the
    other keys in their order, the NaN key last (Spark's ascending order). A null key is a
    float NaN (the runtime's ``NULL_KEY``) or None; comparing it with a string or with
    another number would fail or say nothing, and break the ordered list. O(1)."""
    ts, key = timer
    if key is None or (isinstance(key, float) and key != key):
        return ts, 0, 0
    if key is NAN_KEY:
        return ts, 2, 0
    return ts, 1, key


def _check_ts(ts: Any) -> int:
    if isinstance(ts, bool) or not isinstance(ts, int):
        try:
            import numpy as np

            if isinstance(ts, np.integer):
                return int(ts)
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
        raise InvalidArgumentTypeError(
            f"timer timestamps are integers (e.g. epoch milliseconds), got {type(ts).__name__}"
        )
    return ts


class TimerService:
    """Ordered event-time timers: ``(key, timestamp)`` pairs, each registered at most once.

    Keys of one service must be mutually comparable (all ints, all strings or all bytes),
    besides the null key and the NaN key: two timers with the same timestamp fire in key
    order, the null key's first and the NaN key's last, so the firing order is deterministic.

    Notes
    -----
    Runtime complexity: :meth:`register` and :meth:`delete` O(log n); :meth:`peek` O(1);
    :meth:`pop_due` O(log n) per timer fired; :meth:`delete_key` O(t log n) for the key's ``t``
    timers. Memory: two entries per timer (the ordered list and the per-key index).

    Examples
    --------
    >>> timers = TimerService()
    >>> timers.register("a", 20), timers.register("b", 10), timers.register("a", 20)
    (True, True, False)
    >>> timers.peek()
    ('b', 10)
    >>> list(timers.pop_due(15))
    [('b', 10)]
    >>> len(timers)
    1
    """

    def __init__(self) -> None:
        self._ordered: SortedKeyList = SortedKeyList(key=_firing_order)
        self._by_key: dict[Hashable, set[int]] = {}

    def __len__(self) -> int:
        return len(self._ordered)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        key, ts = item
        return ts in self._by_key.get(key, ())

    def __iter__(self) -> Iterator[tuple[Hashable, int]]:
        """Every timer in firing order, as ``(key, timestamp)``."""
        return ((key, ts) for ts, key in self._ordered)

    def register(self, key: Hashable, ts: int) -> bool:
        """Add a timer; returns False when ``(key, ts)`` was already registered."""
        ts = _check_ts(ts)
        stamps = self._by_key.get(key)
        if stamps is None:
            stamps = self._by_key[key] = set()
        elif ts in stamps:
            return False
        self._ordered.add((ts, key))
        stamps.add(ts)
        return True

    def delete(self, key: Hashable, ts: int) -> bool:
        """Remove one timer; returns False when it was not registered."""
        stamps = self._by_key.get(key)
        if stamps is None or ts not in stamps:
            return False
        self._ordered.remove((ts, key))
        stamps.discard(ts)
        if not stamps:
            del self._by_key[key]
        return True

    def delete_key(self, key: Hashable) -> int:
        """Remove every timer of ``key``; returns how many there were."""
        stamps = self._by_key.pop(key, set())
        for ts in stamps:
            self._ordered.remove((ts, key))
        return len(stamps)

    def timers_of(self, key: Hashable) -> list[int]:
        """The timestamps registered for ``key``, ascending."""
        return sorted(self._by_key.get(key, ()))

    def peek(self) -> tuple[Hashable, int] | None:
        """The earliest timer as ``(key, timestamp)``, or ``None``; O(1)."""
        if not self._ordered:
            return None
        ts, key = self._ordered[0]
        return key, ts

    def pop_due(self, watermark: int) -> Iterator[tuple[Hashable, int]]:
        """Remove and yield, in time order, every timer with ``timestamp <= watermark``.

        Timers registered while iterating fire in the same call when they are due too.
        """
        ordered = self._ordered
        while ordered and ordered[0][0] <= watermark:
            ts, key = ordered.pop(0)
            stamps = self._by_key[key]
            stamps.discard(ts)
            if not stamps:
                del self._by_key[key]
            yield key, ts

    def to_list(self) -> list[tuple[Hashable, int]]:
        """Every timer as ``(key, timestamp)`` in firing order (for snapshots)."""
        return list(self)

    @classmethod
    def from_list(cls, timers: list[tuple[Hashable, int]]) -> TimerService:
        """Rebuild from :meth:`to_list` output."""
        out = cls()
        for key, ts in timers:
            out.register(key, ts)
        return out

    def _check(self) -> None:
        """Invariant checker: the ordered list and the per-key index hold the same timers."""
        pairs = {(key, ts) for ts, key in self._ordered}
        if len(pairs) != len(self._ordered):
            raise AssertionError("a timer is registered twice")
        indexed = {(key, ts) for key, stamps in self._by_key.items() for ts in stamps}
        if pairs != indexed:
            raise AssertionError("ordered timers and the per-key index differ")
        if any(not stamps for stamps in self._by_key.values()):
            raise AssertionError("a key with no timers is still indexed")
        self._ordered._check()

    def __repr__(self) -> str:
        return f"TimerService({len(self)} timers, next={self.peek()!r})"
