"""Tumbling event-time windows per key, closed by the key's own watermark.

:class:`KeyedWindowAggregate` (the Trilink paper, §4.1) is the built-in
:class:`~trilink_spark.KeyedWatermarkProcessFunction`: it emits a key's window
``[start, start + size)`` as soon as *that key's* watermark reaches the window end, instead of
waiting for a global watermark. It is vectorised over every key of a partition (pandas
group-bys; no Python call per key or row) through the vectorised hooks ``process_rows`` and
``on_watermark``: the runtime judges lateness and applies the idle rule, exactly as for per-key
processors (:mod:`trilink_spark.keyed.process`); the aggregate only keeps its open windows, in
one table per partition keyed by ``(key, window start)``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from ..columns import quoted, require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..eventtime import SPARK_TIME_TYPES, delay_in_units, from_units
from .process import KeyedBatch, KeyedContext, KeyedRuntime
from .process import KeyedWatermarkProcessFunction, Output
from .snapshot import NAN_KEY, NULL_KEY, object_array

__all__ = ["KeyedWindowAggregate", "WINDOW_AGGS"]

#: Aggregates :class:`KeyedWindowAggregate` computes.
WINDOW_AGGS: tuple[str, ...] = ("count", "sum", "min", "max", "mean")
_ACC = ("count", "nn", "sum", "min", "max")


class KeyedWindowAggregate(KeyedWatermarkProcessFunction):
    """Tumbling windows per key with count, sum, min, max and mean.

    Parameters
    ----------
    size : str, float or datetime.timedelta
        Window length: an interval string (``"1 minute"``), seconds or a timedelta for
        timestamp event times; the column's unit for numeric ones.
    value : str, optional
        Column that sum, min, max and mean aggregate (nulls skipped, as in Spark).
    aggs : sequence of str
        Any of :data:`WINDOW_AGGS`; ``count`` counts rows, like ``groupBy().count()``.

    Notes
    -----
    Output rows: the key, ``window_start``, ``window_end`` (the event time's type), then one
    column per aggregate (``count`` bigint, the others double; null when the window had no
    non-null value). Late rows (below the key's watermark, as the runtime judges them) are
    dropped and counted; rows with a null event time belong to no window. An idle key's
    windows close on the partition's watermark (the runtime's idle rule). State: one row per
    open window (five numbers) plus what the runtime keeps per key; a window's row is removed
    when it is emitted. With bounded input every window is emitted at the end. Null and NaN
    keys are keys like any other (as in Spark's ``groupBy``): their rows are kept, each in
    its own group.

    Cost per batch: a group-by of the batch's on-time rows, a merge with the open windows and
    one vectorised watermark look-up over them.

    Examples
    --------
    >>> agg = KeyedWindowAggregate(10.0, value="volts", aggs=("count", "mean"))
    >>> out = tl.keyed_process(readings, "sensor", "ts", agg, delay=2.0)  # doctest: +SKIP
    """

    def __init__(
        self,
        size: str | float | timedelta,
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
        require_columns(schema, [self.value], "value column")
        size = delay_in_units(self.size, time_kind, "window size")
        if size <= 0:
            raise InvalidArgumentError(f"window size must be > 0, got {self.size!r}")
        taken = {"window_start", "window_end", *self.aggs} & {key}
        if taken:
            raise InvalidArgumentError(
                f"key column {key!r} has the name of an output column of KeyedWindowAggregate "
                "(window_start, window_end and the aggregates); rename it first"
            )
        self.size_units = size
        self.key_column = key
        self.time_kind = time_kind
        bound = SPARK_TIME_TYPES[time_kind]
        fields = [f"{quoted(key)} {schema[key].dataType.simpleString()}",
                  f"window_start {bound}", f"window_end {bound}"]
        fields += [f"{quoted(a)} {'bigint' if a == 'count' else 'double'}" for a in self.aggs]
        self.output_schema = ", ".join(fields)

    def input_columns(self) -> list[str]:
        """Only ``value`` (if any): the other columns never cross the exchange."""
        return [] if self.value is None else [self.value]

    def process_on_time(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        raise NotImplementedError("KeyedWindowAggregate runs vectorised (process_rows)")

    # ------------------------------------------------------------------ vectorised hooks
    def process_rows(self, batch: KeyedBatch, runtime: KeyedRuntime) -> Output:
        """Add the batch's on-time rows to their windows (the runtime judged lateness).

        Rows with a null event time belong to no window. Cost: one pandas group-by over the
        batch's on-time rows and one merge with the open windows.
        """
        keep = batch.on_time & ~np.isnan(batch.event_time)
        values = batch.rows[self.value].to_numpy()[keep] if self.value else None
        keys = batch.key_array if batch.key_array is not None else object_array(batch.keys)
        self._accumulate(runtime, keys, batch.codes[keep], batch.event_time[keep], values)
        return None

    def on_watermark(self, runtime: KeyedRuntime) -> Output:
        """Emit every open window whose end its key's watermark reached (all of them once
        input ended). Cost: one :meth:`~trilink_spark.keyed.process.KeyedRuntime.watermarks`
        call over the open windows."""
        table = runtime.shared.get("windows")
        if table is None or not len(table):
            return None
        ends = table.index.get_level_values(1).to_numpy(dtype=np.float64) + self.size_units
        due = runtime.watermarks(table.index.get_level_values(0), ends).due
        if not due.any():
            return None
        runtime.shared["windows"] = table[~due]
        return self._rows(table[due])

    def state_wake(self, table: Any) -> Any:
        """The end of each stored key's earliest open window (``inf``: none open): before
        it, the key's state is not needed without its rows. Vectorised, O(open windows)."""
        import pyarrow.compute as pc

        out = np.full(table.num_rows, np.inf)
        column = "shared:windows"
        if column not in table.column_names or not table.num_rows:
            return out
        lists = table.column(column).combine_chunks()
        flat = pc.list_flatten(lists)
        if len(flat):
            starts = np.asarray(pc.struct_field(flat, "s").to_numpy(zero_copy_only=False),
                                dtype=np.float64)
            np.minimum.at(out, pc.list_parent_indices(lists).to_numpy(), starts + self.size_units)
        return out

    def _accumulate(self, runtime: KeyedRuntime, keys: Any, codes: Any, et: Any,
                    values: Any) -> None:
        """Add rows (``codes`` index the distinct ``keys``) to their open windows: Arrow's
        hash aggregation over (key code, window start), then one merge per window with the
        open ones (pandas, O(groups))."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if len(codes) == 0:
            return
        # + 0.0: a -0.0 start (event time -0.0) is the window 0.0, as Spark's floor makes it;
        # Arrow's hash grouping, unlike pandas', would keep the two apart
        starts = np.floor(et / self.size_units) * self.size_units + 0.0
        vals = (np.asarray(values, dtype=np.float64) if values is not None
                else np.zeros(len(codes)))
        v = pa.array(vals, from_pandas=True)  # NaN: no value
        rows = pa.table({"c": pa.array(np.asarray(codes, dtype=np.int64)), "s": starts,
                         "r": v, "v": v})
        grouped = rows.group_by(["c", "s"], use_threads=False).aggregate(
            [("r", "count", pc.CountOptions(mode="all")), ("v", "count"), ("v", "sum"),
             ("v", "min"), ("v", "max")])
        # an object level: pandas would infer int64 and give the null key back as a float
        index = pd.MultiIndex.from_arrays(
            [pd.Index(keys[grouped["c"].to_numpy()], dtype=object), grouped["s"].to_numpy()],
            names=["k", "s"])
        batch = pd.DataFrame({
            "count": grouped["r_count"].to_numpy(), "nn": grouped["v_count"].to_numpy(),
            **{agg: grouped[f"v_{agg}"].to_numpy(zero_copy_only=False)  # null: NaN
               for agg in ("sum", "min", "max")}}, index=index)
        table = runtime.shared.get("windows")
        if table is not None and len(table):
            both = pd.concat([table, batch])
            # a NaN sum of a window with values is inf - inf, not "no value": it stays NaN
            # (pandas' sum would skip it, so the result would depend on the batches)
            both["inf_inf"] = both["sum"].isna().to_numpy() & (both["nn"].to_numpy() > 0)
            # grouped by the key level's codes, not its values: a group-by on a level that
            # holds the null key (a missing value) turns integer keys into floats, inexact
            # beyond 2**53; -1 is the null key's code
            codes = both.index.codes[0]
            merged = both.reset_index(drop=True).groupby(
                [codes, both.index.get_level_values(1).to_numpy()], sort=False)
            batch = pd.DataFrame({"count": merged["count"].sum(), "nn": merged["nn"].sum(),
                                  "sum": merged["sum"].sum(min_count=1),
                                  "min": merged["min"].min(), "max": merged["max"].max()})
            batch["sum"] = batch["sum"].mask(merged["inf_inf"].any())
            at = batch.index.get_level_values(0).to_numpy()
            found = np.asarray(both.index.levels[0], dtype=object)[np.maximum(at, 0)]
            found[at < 0] = NULL_KEY
            batch.index = pd.MultiIndex.from_arrays(
                [pd.Index(found, dtype=object), batch.index.get_level_values(1)],
                names=["k", "s"])
        runtime.shared["windows"] = batch

    def _rows(self, done: pd.DataFrame) -> pd.DataFrame:
        starts = done.index.get_level_values(1).to_numpy(dtype=np.float64)
        keys = done.index.get_level_values(0).to_numpy()
        if keys.dtype == object:  # the NaN key as the key column holds it (the null key: NaN)
            keys = keys.copy()
            keys[keys == NAN_KEY] = math.nan
        out = pd.DataFrame({self.key_column: keys})
        out["window_start"] = from_units(starts, self.time_kind)
        out["window_end"] = from_units(starts + self.size_units, self.time_kind)
        nn = done["nn"].to_numpy()
        for agg in self.aggs:
            if agg == "count":
                out["count"] = done["count"].to_numpy(dtype=np.int64)
            elif agg == "mean":
                out["mean"] = np.where(nn > 0, done["sum"].to_numpy() / np.maximum(nn, 1), np.nan)
            else:
                out[agg] = done[agg].to_numpy(dtype=np.float64)
        return out

    def open_windows(self, runtime: KeyedRuntime) -> int:
        """Windows held in ``runtime`` now (for tests and state-size measurements)."""
        table = runtime.shared.get("windows")
        return 0 if table is None else len(table)
