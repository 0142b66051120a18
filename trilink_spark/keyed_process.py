"""Keyed process functions on keyed watermarks (seed 002 §4.1, the template pattern).

:class:`KeyedWatermarkProcessFunction` separates what every stateful keyed operator repeats
(tracking each key's watermark, telling late rows from on-time ones, firing timers) from what a
user writes: three hooks, called per key with that key's rows of a batch as a pandas DataFrame.
Its shape follows PySpark's ``StatefulProcessor``: lifecycle hooks (``open``, ``close``) and a
handle, :class:`KeyedContext`, that gives out the key's state, timers and watermark.

**Semantics.** Within a partition, rows are taken in arrival order. A key's watermark is the
largest event time of its earlier rows minus ``delay``; a row below it is *late*
(``process_late``), otherwise *on time* (``process_on_time``). After a key's rows of a batch,
its timers at or below its new watermark fire in time order (``on_timer``). The partition-level
verdict (a single watermark over every key of the partition, as Spark or Flink would keep) is
counted beside it, so the two can be compared.

**Idle keys.** A key is idle when its partition's newest event time has moved on by more than
``idle_timeout`` since the key's last row arrived (a key that keeps sending is never idle, however
far its clock lags). An idle key's watermark is moved up to the partition's watermark and its
due timers fire, so a key that stopped sending does not keep its windows open for ever. If it
sends again, its rows are judged against that advanced watermark. Idleness is checked at the
end of each batch.

**Units.** Event times, watermarks and timers are numbers: microseconds since the epoch for
timestamp columns, the column's own unit for numeric ones. Hooks find a row's event time in
the column :data:`EVENT_TIME_COL`.
"""

from __future__ import annotations

import math
import pickle
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .timers import TimerService

__all__ = [
    "EVENT_TIME_COL",
    "KeyedContext",
    "KeyedWatermarkProcessFunction",
    "KeyedRuntime",
    "RuntimeCounters",
]

#: Column holding each row's event time in internal units, in the frames hooks receive.
EVENT_TIME_COL = "_tl_event_time"

Output = pd.DataFrame | Iterable[Any] | None


class KeyedContext:
    """The handle a hook receives: the current key's state, timers and watermark."""

    __slots__ = ("_runtime", "key")

    def __init__(self, runtime: KeyedRuntime, key: Hashable) -> None:
        self._runtime = runtime
        self.key = key

    @property
    def watermark(self) -> float:
        """The key's watermark (``-inf`` before its first row)."""
        return self._runtime.key_watermark(self.key)

    @property
    def partition_watermark(self) -> float:
        """The watermark a single per-partition watermark would have now."""
        return self._runtime.partition_high - self._runtime.delay

    def get_state(self, name: str, default: Any = None) -> Any:
        """The key's value ``name`` (``default`` when unset)."""
        return self._runtime.values.get(self.key, {}).get(name, default)

    def set_state(self, name: str, value: Any) -> None:
        """Set the key's value ``name`` (kept across batches in streaming; must pickle)."""
        self._runtime.values.setdefault(self.key, {})[name] = value

    def clear_state(self, name: str | None = None) -> None:
        """Drop one value of the key, or all of them."""
        values = self._runtime.values
        if name is None:
            values.pop(self.key, None)
            return
        mine = values.get(self.key)
        if mine is not None:
            mine.pop(name, None)
            if not mine:
                del values[self.key]

    def register_timer(self, timestamp: int) -> bool:
        """Fire ``on_timer`` once the key's watermark reaches ``timestamp`` (O(log n))."""
        return self._runtime.timers.register(self.key, int(timestamp))

    def delete_timer(self, timestamp: int) -> bool:
        return self._runtime.timers.delete(self.key, int(timestamp))

    def timers(self) -> list[int]:
        """The key's registered timers, ascending."""
        return self._runtime.timers.timers_of(self.key)


class KeyedWatermarkProcessFunction(ABC):
    """Template for keyed processing on keyed watermarks: subclass and fill in the hooks.

    Set :attr:`output_schema` (a Spark DDL string or ``StructType``) to the rows the hooks
    return. Each hook returns ``None``, a pandas DataFrame, or an iterable of rows (tuples or
    dicts in schema order). Configuration lives in the instance and must pickle (it is shipped
    to executors); per-key data lives in the state the context gives out.

    Examples
    --------
    >>> class CountOnTime(KeyedWatermarkProcessFunction):
    ...     output_schema = "key string, n long"
    ...     def process_on_time(self, key, rows, ctx):
    ...         ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
    ...         return None
    ...     def on_end(self, key, ctx):
    ...         return [(key, ctx.get_state("n", 0))]
    """

    output_schema: Any = None

    def open(self, partition_id: int) -> None:
        """Called once per partition and batch before any row."""

    @abstractmethod
    def process_on_time(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        """Rows of ``key`` at or above its watermark, in arrival order."""

    def process_late(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        """Rows of ``key`` below its watermark (default: dropped; the runtime counts them)."""
        return None

    def on_timer(self, key: Hashable, timestamp: int, ctx: KeyedContext) -> Output:
        """A timer of ``key`` whose time the key's watermark reached."""
        return None

    def on_end(self, key: Hashable, ctx: KeyedContext) -> Output:
        """Bounded (batch) input only: called for every key with state when input ends,
        after its timers fired with an infinite watermark."""
        return None

    def close(self) -> None:
        """Called once per partition and batch after the last row."""

    def bind(self, schema: Any, key: str, event_time: str, time_kind: str) -> None:
        """Called on the driver with the input schema before the job runs (e.g. to derive
        :attr:`output_schema` from the key's type). ``time_kind``: "timestamp", "integral" or
        "fractional"."""

    def process_batch(self, runtime: KeyedRuntime, frame: pd.DataFrame) -> list[Output]:
        """All of a partition's rows of one batch. The default calls the per-key hooks; a
        processor may override it with a vectorised version over every key at once."""
        return runtime.run_per_key(frame)

    def finish_batch(self, runtime: KeyedRuntime) -> list[Output]:
        """End of bounded input (see :meth:`on_end`); overridden with :meth:`process_batch`."""
        return runtime.finish_per_key()


@dataclass
class RuntimeCounters:
    """Rows seen, late by the key watermark, and late by the partition watermark."""

    rows: int = 0
    late: int = 0
    late_partition: int = 0


@dataclass
class _State:
    key_high: dict[Hashable, float] = field(default_factory=dict)
    partition_high: float = -math.inf
    values: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    timers: list[tuple[Hashable, int]] = field(default_factory=list)
    counters: RuntimeCounters = field(default_factory=RuntimeCounters)
    shared: dict[str, Any] = field(default_factory=dict)
    last_seen: dict[Hashable, float] = field(default_factory=dict)


class KeyedRuntime:
    """One partition's keyed state and the loop that drives a processor over it.

    Parameters
    ----------
    processor : KeyedWatermarkProcessFunction
    key : str
        Key column of the frames :meth:`process` receives.
    delay : float
        Allowed lateness in internal units.
    idle_timeout : float
        How far the partition's event time may move on without a row of a key before the key
        counts as idle (module docs).

    Notes
    -----
    Cost per batch: one vectorised pass for lateness, then one Python call per key per hook
    (not per row). Memory: per key seen, its highest event time (one dict entry; about 100
    bytes in memory, ~20 bytes pickled) plus whatever state and timers the processor keeps.
    """

    def __init__(
        self,
        processor: KeyedWatermarkProcessFunction,
        key: str,
        delay: float,
        idle_timeout: float,
        state: bytes | None = None,
    ) -> None:
        self.processor = processor
        self.key_column = key
        self.delay = float(delay)
        self.idle_timeout = float(idle_timeout)
        restored = pickle.loads(state) if state else _State()
        self.key_high: dict[Hashable, float] = restored.key_high
        self.partition_high: float = restored.partition_high
        self.values: dict[Hashable, dict[str, Any]] = restored.values
        self.timers = TimerService.from_list(restored.timers)
        self.counters = restored.counters
        #: Partition-wide state of a vectorised processor (pickled with the rest).
        self.shared: dict[str, Any] = restored.shared
        #: Partition's newest event time when each key last sent a row (for idleness).
        self.last_seen: dict[Hashable, float] = restored.last_seen

    def key_watermark(self, key: Hashable) -> float:
        return self.key_high.get(key, -math.inf) - self.delay

    def snapshot(self) -> bytes:
        """The partition's state as bytes (watermarks, user state, timers, counters)."""
        state = _State(self.key_high, self.partition_high, self.values, self.timers.to_list(),
                       self.counters, self.shared, self.last_seen)
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    # ------------------------------------------------------------------ driving
    def process(self, frame: pd.DataFrame) -> list[Output]:
        """Run one batch of rows (in arrival order, with :data:`EVENT_TIME_COL`)."""
        out: list[Output] = []
        if len(frame) == 0:
            return out
        et = frame[EVENT_TIME_COL].to_numpy(dtype=np.float64)
        valid = ~np.isnan(et)
        filled = np.where(valid, et, -np.inf)
        running = np.maximum.accumulate(np.concatenate(([self.partition_high], filled)))
        self.counters.late_partition += int(np.count_nonzero(et < running[:-1] - self.delay))
        self.partition_high = float(running[-1])
        self.counters.rows += len(frame)
        return self.processor.process_batch(self, frame)

    def run_per_key(self, frame: pd.DataFrame) -> list[Output]:
        """The template loop: lateness per key, then the hooks, then the key's timers."""
        out: list[Output] = []
        processor = self.processor
        for raw_key, rows in frame.groupby(self.key_column, sort=False, dropna=False):
            key: Hashable = raw_key.item() if isinstance(raw_key, np.generic) else raw_key
            ctx = KeyedContext(self, key)
            times = rows[EVENT_TIME_COL].to_numpy(dtype=np.float64)
            high = self.key_high.get(key, -math.inf)
            seen = np.maximum.accumulate(np.concatenate(([high], np.nan_to_num(times, nan=-np.inf))))
            late = times < seen[:-1] - self.delay  # nan (null event time) is never late
            if late.any():
                self.counters.late += int(late.sum())
                out.append(processor.process_late(key, rows[late], ctx))
            if not late.all():
                out.append(processor.process_on_time(key, rows[~late], ctx))
            self.key_high[key] = float(seen[-1])
            self.last_seen[key] = self.partition_high
            out.extend(self._fire(key, self.key_watermark(key), ctx))
        out.extend(self._fire_idle())
        return out

    def _fire(self, key: Hashable, watermark: float, ctx: KeyedContext) -> list[Output]:
        fired: list[Output] = []
        due = [ts for ts in self.timers.timers_of(key) if ts <= watermark]
        while due:
            for ts in due:
                self.timers.delete(key, ts)
                fired.append(self.processor.on_timer(key, ts, ctx))
            due = [ts for ts in self.timers.timers_of(key) if ts <= watermark]  # set in on_timer
        return fired

    def is_idle(self, key: Hashable) -> bool:
        """Whether the partition moved on by more than ``idle_timeout`` since ``key``'s last row."""
        return self.partition_high - self.last_seen.get(key, -math.inf) > self.idle_timeout

    def _fire_idle(self) -> list[Output]:
        """Idle keys follow the partition watermark (module docs)."""
        if not math.isfinite(self.idle_timeout) or not math.isfinite(self.partition_high):
            return []
        watermark = self.partition_high - self.delay
        idle = []
        for key, ts in self.timers:
            if ts > watermark:
                break
            if self.is_idle(key):
                idle.append(key)
        out: list[Output] = []
        for key in dict.fromkeys(idle):
            self.key_high[key] = max(self.key_high.get(key, -math.inf), self.partition_high)
            out.extend(self._fire(key, watermark, KeyedContext(self, key)))
        return out

    def finish(self) -> list[Output]:
        """End of bounded input: every watermark goes to infinity (the processor's
        :meth:`~KeyedWatermarkProcessFunction.finish_batch`)."""
        return self.processor.finish_batch(self)

    def finish_per_key(self) -> list[Output]:
        """Timers of every key fire with an infinite watermark, then ``on_end`` per key."""
        out: list[Output] = []
        for key in list(dict.fromkeys(k for k, _ in self.timers)):
            self.key_high[key] = math.inf
            out.extend(self._fire(key, math.inf, KeyedContext(self, key)))
        for key in list(self.values):
            out.append(self.processor.on_end(key, KeyedContext(self, key)))
        return out
