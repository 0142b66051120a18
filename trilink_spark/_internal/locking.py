"""Objects that hold a lock and still pickle: the lock is left out and made anew.

A run, a rebalancer or a replanner is shipped to a Spark Connect server (cloudpickle) or
copied, while a lock never pickles. :class:`PicklableLock` gives a class the two methods that
leave ``_lock`` out of its pickled state and make a fresh one of :attr:`lock_type` when it is
unpickled.

Examples
--------
>>> import copy, threading
>>> class Counter(PicklableLock):
...     def __init__(self):
...         self.n = 0
...         self._lock = type(self).lock_type()
>>> counter = Counter()
>>> "_lock" in counter.__getstate__()
False
>>> back = copy.copy(counter)  # through __getstate__ / __setstate__, as pickle goes
>>> back.n, back._lock is counter._lock, isinstance(back._lock, type(threading.Lock()))
(0, False, True)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["PicklableLock"]


class PicklableLock:
    """Mixin: pickles without ``_lock``, and unpickles with a new ``lock_type()``. O(fields)."""

    #: What a new lock is made with (``threading.RLock`` for a re-entrant one).
    lock_type: ClassVar[Callable[[], Any]] = threading.Lock

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = type(self).lock_type()
