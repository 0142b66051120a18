"""Tumbling event-time windows per key, closed by the key's own watermark (seed 002 §4.1).

:class:`KeyedWindowAggregate` is the built-in :class:`~trilink_spark.KeyedWatermarkProcessFunction`:
it emits a key's window ``[start, start + size)`` as soon as *that key's* watermark reaches the
window end, instead of waiting for a global watermark. It is vectorised over every key of a
partition (pandas group-bys; no Python call per key or row): open windows live in one table per
partition, keyed by ``(key, window start)``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from .errors import InvalidArgumentError, InvalidArgumentTypeError, MissingColumnError
from .keyed_process import EVENT_TIME_COL, KeyedContext, KeyedRuntime
from .keyed_process import KeyedWatermarkProcessFunction, Output
from .watermark import delay_in_units

__all__ = ["KeyedWindowAggregate", "WINDOW_AGGS"]

#: Aggregates :class:`KeyedWindowAggregate` computes.
WINDOW_AGGS: tuple[str, ...] = ("count", "sum", "min", "max", "mean")
_ACC = ("count", "nn", "sum", "min", "max")


class KeyedWindowAggregate(KeyedWatermarkProcessFunction):
    """Tumbling windows per key with count, sum, min, max and mean.

    Parameters
    ----------
    size : float or datetime.timedelta
        Window length: seconds (or a timedelta) for timestamp event times, the column's unit
        for numeric ones.
    value : str, optional
        Column that sum, min, max and mean aggregate (nulls skipped, as in Spark).
    aggs : sequence of str
        Any of :data:`WINDOW_AGGS`; ``count`` counts rows, like ``groupBy().count()``.

    Notes
    -----
    Output rows: the key, ``window_start``, ``window_end`` (the event time's type), then one
    column per aggregate (``count`` bigint, the others double; null when the window had no
    non-null value). Late rows (below the key's watermark) are dropped and counted. State: one
    row per open window (five numbers) plus the key's highest event time; a window's row is
    removed when it is emitted. With bounded input every window is emitted at the end.

    Examples
    --------
    >>> agg = KeyedWindowAggregate(10.0, value="volts", aggs=("count", "mean"))
    >>> out = tl.keyed_process(readings, "sensor", "ts", agg, delay=2.0)  # doctest: +SKIP
    """

    def __init__(
        self,
        size: float | timedelta,
        value: str | None = None,
        aggs: Sequence[str] = ("count",),
    ) -> None:
        if isinstance(aggs, str) or not aggs:
            raise InvalidArgumentTypeError("aggs must be a non-empty sequence of aggregate names")
        unknown = [a for a in aggs if a not in WINDOW_AGGS]
        if unknown:
            raise InvalidArgumentError(f"unknown aggregate(s) {unknown}; choose from {WINDOW_AGGS}")
        if value is None and any(a != "count" for a in aggs):
            raise InvalidArgumentError("sum, min, max and mean need value=<column>")
        self.size = size
        self.value = value
        self.aggs = tuple(aggs)
        self.size_units = math.nan
        self.key_column = ""
        self.time_kind = ""

    def bind(self, schema: Any, key: str, event_time: str, time_kind: str) -> None:
        if self.value is not None and self.value not in schema.names:
            raise MissingColumnError(f"value column {self.value!r} is not in the DataFrame")
        size = delay_in_units(self.size, time_kind)
        if size <= 0:
            raise InvalidArgumentError(f"window size must be > 0, got {self.size!r}")
        self.size_units = size
        self.key_column = key
        self.time_kind = time_kind
        bound = {"timestamp": "timestamp", "integral": "bigint", "fractional": "double"}[time_kind]
        fields = [f"`{key}` {schema[key].dataType.simpleString()}",
                  f"window_start {bound}", f"window_end {bound}"]
        fields += [f"`{a}` {'bigint' if a == 'count' else 'double'}" for a in self.aggs]
        self.output_schema = ", ".join(fields)

    def process_on_time(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        raise NotImplementedError("KeyedWindowAggregate runs vectorised (process_batch)")

    # ------------------------------------------------------------------ vectorised batch
    def process_batch(self, runtime: KeyedRuntime, frame: pd.DataFrame) -> list[Output]:
        key = runtime.key_column
        et = frame[EVENT_TIME_COL].to_numpy(dtype=np.float64)
        valid = ~np.isnan(et)
        codes, uniques = pd.factorize(frame[key], sort=False, use_na_sentinel=False)
        names = [u.item() if isinstance(u, np.generic) else u for u in uniques.tolist()]
        prior = np.array([runtime.key_high.get(k, -math.inf) for k in names], dtype=np.float64)
        times = pd.Series(np.where(valid, et, -np.inf))
        grouped = times.groupby(codes, sort=False)
        running = grouped.cummax()
        before = running.groupby(codes, sort=False).shift(1).fillna(-np.inf).to_numpy()
        before = np.maximum(before, prior[codes])
        late = valid & (et < before - runtime.delay)
        runtime.counters.late += int(late.sum())
        highest = np.maximum(prior, grouped.max().reindex(range(len(names))).to_numpy())
        runtime.key_high.update(zip(names, highest.tolist()))
        runtime.last_seen.update(dict.fromkeys(names, runtime.partition_high))
        keep = valid & ~late
        self._accumulate(runtime, np.asarray(names, dtype=object)[codes[keep]], et[keep],
                         frame[self.value].to_numpy()[keep] if self.value else None)
        return [self._emit(runtime, final=False)]

    def _accumulate(self, runtime: KeyedRuntime, keys: Any, et: Any, values: Any) -> None:
        if len(keys) == 0:
            return
        starts = np.floor(et / self.size_units) * self.size_units
        vals = (np.asarray(values, dtype=np.float64) if values is not None
                else np.zeros(len(keys)))
        part = pd.DataFrame({"k": keys, "s": starts, "v": vals})
        grouped = part.groupby(["k", "s"], sort=False)["v"]
        batch = pd.DataFrame({"count": grouped.size(), "nn": grouped.count(),
                              "sum": grouped.sum(min_count=1), "min": grouped.min(),
                              "max": grouped.max()})
        table = runtime.shared.get("windows")
        if table is not None and len(table):
            both = pd.concat([table, batch])
            merged = both.groupby(level=[0, 1], sort=False)
            batch = pd.DataFrame({"count": merged["count"].sum(), "nn": merged["nn"].sum(),
                                  "sum": merged["sum"].sum(min_count=1),
                                  "min": merged["min"].min(), "max": merged["max"].max()})
        runtime.shared["windows"] = batch

    def _emit(self, runtime: KeyedRuntime, final: bool) -> pd.DataFrame | None:
        table = runtime.shared.get("windows")
        if table is None or not len(table):
            return None
        keys = table.index.get_level_values(0)
        ends = table.index.get_level_values(1).to_numpy(dtype=np.float64) + self.size_units
        if final:
            due = np.ones(len(table), dtype=bool)
        else:
            listed = keys.tolist()
            highs = np.array([runtime.key_high.get(k, -math.inf) for k in listed])
            watermark = highs - runtime.delay
            seen = np.array([runtime.last_seen.get(k, -math.inf) for k in listed])
            idle = runtime.partition_high - seen > runtime.idle_timeout
            watermark = np.where(idle, runtime.partition_high - runtime.delay, watermark)
            due = ends <= watermark
            for k in set(keys[due & idle].tolist()):  # idle keys follow the partition
                runtime.key_high[k] = max(runtime.key_high.get(k, -math.inf),
                                          runtime.partition_high)
        if not due.any():
            return None
        done = table[due]
        runtime.shared["windows"] = table[~due]
        return self._rows(done)

    def _rows(self, done: pd.DataFrame) -> pd.DataFrame:
        starts = done.index.get_level_values(1).to_numpy(dtype=np.float64)
        out = pd.DataFrame({self.key_column: done.index.get_level_values(0).to_numpy()})
        out["window_start"] = self._bound(starts)
        out["window_end"] = self._bound(starts + self.size_units)
        nn = done["nn"].to_numpy()
        for agg in self.aggs:
            if agg == "count":
                out["count"] = done["count"].to_numpy(dtype=np.int64)
            elif agg == "mean":
                out["mean"] = np.where(nn > 0, done["sum"].to_numpy() / np.maximum(nn, 1), np.nan)
            else:
                out[agg] = done[agg].to_numpy(dtype=np.float64)
        return out

    def _bound(self, units: Any) -> Any:
        if self.time_kind == "timestamp":
            return pd.to_datetime(np.rint(units).astype(np.int64), unit="us", utc=True)
        if self.time_kind == "integral":
            return np.rint(units).astype(np.int64)
        return units

    def finish_batch(self, runtime: KeyedRuntime) -> list[Output]:
        return [self._emit(runtime, final=True)]

    def open_windows(self, runtime: KeyedRuntime) -> int:
        """Windows held in ``runtime`` now (for tests and state-size measurements)."""
        table = runtime.shared.get("windows")
        return 0 if table is None else len(table)
