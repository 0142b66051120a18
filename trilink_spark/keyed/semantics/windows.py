"""Tumbling event-time windows per key, closed by the key's own watermark.

:class:`KeyedWindowAggregate` (the Trilink paper, §4.1) is the built-in
:class:`~trilink_spark.KeyedWatermarkProcessFunction`: it emits a key's window
``[start, start + size)`` as soon as *that key's* watermark reaches the window end, instead of
waiting for a global watermark. It is vectorised over every key of a partition (Arrow's hash
aggregation and numpy; no Python call per key or row) through the vectorised hooks
``process_rows`` and ``on_watermark``: the runtime judges lateness and applies the idle rule,
exactly as for per-key processors (:mod:`trilink_spark.keyed.semantics.process`); the aggregate
only keeps its open windows, in one
:class:`~trilink_spark.keyed.semantics.tables.KeyedColumns` per partition, a row per
``(key, window start)``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from ...columns import quoted, require_columns
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ...eventtime import MAX_EXACT, SPARK_TIME_TYPES, delay_in_units, from_units
from .process import KeyedRows, KeyedContext, KeyedRuntime
from .process import KeyedWatermarkProcessFunction, Output
from .keys import NAN_KEY, object_array
from .tables import KeyedColumns

__all__ = ["KeyedWindowAggregate", "WINDOW_AGGS", "WindowAgg"]

#: Aggregates :class:`KeyedWindowAggregate` computes.
WINDOW_AGGS: tuple[str, ...] = ("count", "sum", "min", "max", "mean")
#: What an open window keeps per value column (``count``, of rows, once per window).
_PER_VALUE = ("nn", "sum", "min", "max")


@dataclass(frozen=True)
class WindowAgg:
    """One output column of :class:`KeyedWindowAggregate`: ``func`` of ``column`` (``None``:
    ``count`` of rows) written as ``name``."""

    name: str
    func: str
    column: str | None


def accumulator(name: str, index: int) -> str:
    """The column of an open window holding accumulator ``name`` (``nn``, ``sum``, ``min``,
    ``max``) of value column ``index``: the first value column's are the bare names (the
    state layout of a single ``value``), the others' carry the index (``sum_1``)."""
    return name if index == 0 else f"{name}_{index}"


class KeyedWindowAggregate(KeyedWatermarkProcessFunction):
    """Tumbling windows per key with count, sum, min, max and mean.

    Parameters
    ----------
    size : str, float or datetime.timedelta
        Window length: an interval string (``"1 minute"``), seconds or a timedelta for
        timestamp event times; the column's unit for numeric ones.
    value : str, optional
        Column that sum, min, max and mean aggregate (nulls and NaN skipped).
    aggs : sequence of str, or mapping of str to (str, str or None)
        Any of :data:`WINDOW_AGGS`, applied to ``value``; ``count`` counts rows, like
        ``groupBy().count()``. Or, without ``value``, ``{name: (func, column)}`` for
        aggregates of several columns, as :func:`~trilink_spark.local_merge` takes them:
        ``{"n": ("sum", "n"), "low": ("min", "low")}`` merges Local Merge's partial rows in
        one keyed stage; ``("count", None)`` counts rows, ``("count", column)`` its non-null
        values.

    Notes
    -----
    Output rows: the key, ``window_start``, ``window_end`` (the event time's type), then one
    column per aggregate (``count`` bigint, the others double; null when the window had no
    non-null value). Late rows (below the key's watermark, as the runtime judges them) are
    dropped and counted; rows with a null event time belong to no window. An idle key's
    windows close on the partition's watermark (the runtime's idle rule). State: one row per
    open window (one count, and four numbers per value column) plus what the runtime keeps per
    key; a window's row is removed
    when it is emitted. With bounded input every window is emitted at the end. Null and NaN
    keys are keys like any other (as in Spark's ``groupBy``): their rows are kept, each in
    its own group.

    Cost per batch: a hash group-by of the batch's on-time rows, a numpy merge with the open
    windows (a lexsort of the touched ones) and one vectorised watermark look-up over them.

    Examples
    --------
    >>> agg = KeyedWindowAggregate(10.0, value="volts", aggs=("count", "mean"))
    >>> out = tl.keyed_process(readings, "sensor", "ts", agg, delay=2.0)  # doctest: +SKIP
    >>> merged = KeyedWindowAggregate(10.0, aggs={"n": ("sum", "n"), "low": ("min", "low")})
    """

    def __init__(
        self,
        size: str | float | timedelta,
        value: str | None = None,
        aggs: Sequence[str] | Mapping[str, tuple[str, str | None]] = ("count",),
    ) -> None:
        self.size = size
        self.value = value
        self.specs = _specs(value, aggs)
        self._mapped = isinstance(aggs, Mapping)
        self.aggs = tuple(spec.name for spec in self.specs)
        #: The value columns, in order of first use (their accumulators' indexes).
        self.values: tuple[str, ...] = tuple(dict.fromkeys(
            spec.column for spec in self.specs if spec.column is not None))
        self.size_units = math.nan
        self.key_column = ""
        self.time_kind = ""

    def bind(self, schema: Any, key: str, event_time: str, time_kind: str) -> None:
        """Check the call against the frame's ``schema`` and derive the output schema.

        Raises
        ------
        InvalidArgumentTypeError
            A value column that holds no numbers (a date, timestamp, interval, binary or nested
            one).
        InvalidArgumentError
            A window size that is not positive, or beyond 2**53 units of an integral or
            timestamp event time (its window bounds would not be exact, nor beyond 2**63 fit
            a long); output columns named alike, ignoring case as Spark resolves names.
        """
        from pyspark.sql.types import BooleanType, NullType, NumericType, StringType

        require_columns(schema, list(self.values), "value column")
        for column in self.values:
            dtype = schema[column].dataType
            if not isinstance(dtype, (NumericType, BooleanType, StringType, NullType)):
                raise InvalidArgumentTypeError(
                    f"value column {column!r} is {dtype.simpleString()}; KeyedWindowAggregate "
                    "aggregates numbers (a numeric or boolean column, or strings holding "
                    "numbers): cast it first")
        size = delay_in_units(self.size, time_kind, "window size")
        if size <= 0:
            raise InvalidArgumentError(f"window size must be > 0, got {self.size!r}")
        if time_kind != "fractional" and size > MAX_EXACT:
            unit = "microseconds" if time_kind == "timestamp" else "units"
            raise InvalidArgumentError(
                f"window size must be at most 2**53 {unit} for a {time_kind} event time (a "
                "window bound beyond it is not exact in a double, nor beyond 2**63 a long), "
                f"got {self.size!r}")
        _check_names(key, self.aggs)
        self.size_units = size
        self.key_column = key
        self.time_kind = time_kind
        bound = SPARK_TIME_TYPES[time_kind]
        fields = [f"{quoted(key)} {schema[key].dataType.simpleString()}",
                  f"window_start {bound}", f"window_end {bound}"]
        fields += [f"{quoted(spec.name)} {'bigint' if spec.func == 'count' else 'double'}"
                   for spec in self.specs]
        self.output_schema = ", ".join(fields)

    def state_config(self) -> dict[str, Any]:
        """The configuration a stream stores with its state (a restart with another one is
        refused): the public settings, as before the mapping form came for the single-value
        form, whose state layout is unchanged (so state written by earlier versions restarts);
        the mapping form adds ``values``, the value columns in the order their accumulators
        are stored (another column, or another order, is another state).

        Notes
        -----
        O(settings), on the driver.

        Examples
        --------
        >>> sorted(KeyedWindowAggregate(10.0, value="v", aggs=("count", "sum")).state_config())
        ['aggs', 'key_column', 'size', 'size_units', 'time_kind', 'value']
        """
        config = super().state_config()
        if not self._mapped:
            config.pop("values", None)
        return config

    def input_columns(self) -> list[str]:
        """Only the value columns (if any): the other columns never cross the exchange."""
        return list(self.values)

    def process_on_time(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        raise NotImplementedError("KeyedWindowAggregate runs vectorised (process_rows)")

    # ------------------------------------------------------------------ vectorised hooks
    def process_rows(self, batch: KeyedRows, runtime: KeyedRuntime) -> Output:
        """Add the batch's on-time rows to their windows (the runtime judged lateness).

        Rows with a null event time belong to no window. Cost: one Arrow group-by over the
        batch's on-time rows and one merge with the open windows.
        """
        keep = batch.on_time & ~np.isnan(batch.event_time)
        values = [_numbers(column, batch.rows[column].to_numpy()[keep])
                  for column in self.values]
        keys = batch.key_array if batch.key_array is not None else object_array(batch.keys)
        self._accumulate(runtime, keys, batch.codes[keep], batch.event_time[keep], values)
        return None

    def on_watermark(self, runtime: KeyedRuntime) -> Output:
        """Emit every open window whose end its key's watermark reached (all of them once
        input ended). Cost: one :meth:`~trilink_spark.keyed.semantics.process.KeyedRuntime.watermarks`
        call over the open windows."""
        table = _open(runtime, len(self.values))
        if table is None or not len(table):
            return None
        ends = np.asarray(table.columns["s"], dtype=np.float64) + self.size_units
        due = runtime.watermarks(table.keys, ends).due
        if not due.any():
            return None
        runtime.shared["windows"] = table.take(~due)
        return self._rows(table.take(due))

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
                    values: list[Any]) -> None:
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
        # no value column (count only): one column of zeros keeps the state's layout
        columns = values if values else [np.zeros(len(codes))]
        arrays = {"c": pa.array(np.asarray(codes, dtype=np.int64)), "s": starts}
        steps: list[tuple[Any, ...]] = []
        for j, column in enumerate(columns):
            v = pa.array(np.asarray(column, dtype=np.float64), from_pandas=True)  # NaN: none
            arrays[f"v{j}"] = v
            if j == 0:
                arrays["r"] = v
                steps.append(("r", "count", pc.CountOptions(mode="all")))
            steps += [(f"v{j}", "count"), (f"v{j}", "sum"), (f"v{j}", "min"), (f"v{j}", "max")]
        grouped = pa.table(arrays).group_by(["c", "s"], use_threads=False).aggregate(steps)
        data: dict[str, Any] = {"s": grouped["s"].to_numpy(),
                                "count": grouped["r_count"].to_numpy()}
        for j in range(len(columns)):
            data[accumulator("nn", j)] = grouped[f"v{j}_count"].to_numpy()
            for agg in ("sum", "min", "max"):  # null: NaN
                data[accumulator(agg, j)] = grouped[f"v{j}_{agg}"].to_numpy(zero_copy_only=False)
        batch = KeyedColumns(keys[grouped["c"].to_numpy()], data, ("k", "s"))
        table = _open(runtime, len(self.values))
        if table is not None and len(table):
            batch = _merge(table.concat(batch), len(columns))
        runtime.shared["windows"] = batch

    def _rows(self, done: KeyedColumns) -> pd.DataFrame:
        starts = np.asarray(done.columns["s"], dtype=np.float64)
        keys = done.keys.copy()  # the table stays as it is (it is immutable)
        # the NaN key as the key column holds it (the null key: NaN)
        keys[keys == NAN_KEY] = math.nan
        out = pd.DataFrame({self.key_column: keys})
        out["window_start"] = from_units(starts, self.time_kind)
        out["window_end"] = from_units(starts + self.size_units, self.time_kind)
        for spec in self.specs:
            if spec.column is None:
                out[spec.name] = np.asarray(done.columns["count"], dtype=np.int64)
                continue
            j = self.values.index(spec.column)
            nn = np.asarray(done.columns[accumulator("nn", j)])
            if spec.func == "count":
                out[spec.name] = nn.astype(np.int64)
            elif spec.func == "mean":
                out[spec.name] = np.where(nn > 0, done.columns[accumulator("sum", j)]
                                          / np.maximum(nn, 1), np.nan)
            else:
                out[spec.name] = np.asarray(done.columns[accumulator(spec.func, j)],
                                            dtype=np.float64)
        return out

    def open_windows(self, runtime: KeyedRuntime) -> int:
        """Windows held in ``runtime`` now (for tests and state-size measurements)."""
        table = runtime.shared.get("windows")
        return 0 if table is None else len(table)


def _open(runtime: KeyedRuntime, n_values: int) -> KeyedColumns | None:
    """The partition's open windows; state stored as a DataFrame (before the columnar form)
    is taken over once, O(its rows).

    Raises
    ------
    StateCorruptError
        The stored windows lack an accumulator of ``n_values`` value columns, or hold one that
        is not numeric.
    """
    table = runtime.shared.get("windows")
    if table is None:
        return None
    if isinstance(table, pd.DataFrame):
        table = KeyedColumns.from_frame(table)
    if not isinstance(table, KeyedColumns):
        raise StateCorruptError(f"the stored open windows are a {type(table).__name__}, not "
                                "a keyed table")
    # O(columns) a batch: a damaged or foreign table is refused before any arithmetic on it
    wanted = ["s", "count"] + [accumulator(a, j) for j in range(max(n_values, 1))
                               for a in _PER_VALUE]
    bad = [c for c in wanted if c not in table.columns
           or np.asarray(table.columns[c]).dtype.kind not in "biuf"]
    if bad:
        raise StateCorruptError(
            f"the stored open windows lack numeric columns {bad} (they hold "
            f"{list(table.columns)}); the state path is damaged or was written by another "
            "processor: restore it, or start from a new one")
    runtime.shared["windows"] = table
    return table


def _merge(both: KeyedColumns, n_values: int) -> KeyedColumns:
    """Open windows merged with a batch's: one row per (key, window start), in numpy (a
    lexsort and one reduce per accumulator, O(rows log rows)).

    A sum is NaN only when its window has no value (``nn`` 0) or when a part of it is NaN
    although it had values (``inf - inf``): such a NaN stays, whatever the batches were.
    """
    order, starts = both.groups("s")
    cols = both.columns
    first = order[starts]
    out: dict[str, Any] = {"s": np.asarray(cols["s"])[first],
                           "count": np.add.reduceat(np.asarray(cols["count"])[order], starts)}
    for j in range(n_values):
        nn = np.asarray(cols[accumulator("nn", j)])[order]
        total = np.add.reduceat(nn, starts)
        sums = np.asarray(cols[accumulator("sum", j)], dtype=np.float64)[order]
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, kept
            summed = np.add.reduceat(np.where(nn == 0, 0.0, sums), starts)
            summed[total == 0] = np.nan
            out[accumulator("nn", j)] = total
            out[accumulator("sum", j)] = summed
            out[accumulator("min", j)] = np.fmin.reduceat(
                np.asarray(cols[accumulator("min", j)], dtype=np.float64)[order], starts)
            out[accumulator("max", j)] = np.fmax.reduceat(
                np.asarray(cols[accumulator("max", j)], dtype=np.float64)[order], starts)
    return KeyedColumns(both.keys[first], out, both.levels)


def _check_names(key: str, aggs: Sequence[str]) -> None:
    """Refuse output columns named alike: the key, the window bounds and the aggregates,
    compared ignoring case as Spark resolves names (two columns that differ only in case
    make a frame where neither can be selected). O(aggregates)."""
    outputs = ["window_start", "window_end", *aggs]
    if key.lower() in {name.lower() for name in outputs}:
        raise InvalidArgumentError(
            f"key column {key!r} has the name of an output column of KeyedWindowAggregate "
            "(window_start, window_end and the aggregates; names compared ignoring case, as "
            "Spark resolves them); rename it first"
        )
    clash = sorted(a for a in aggs if a.lower() in ("window_start", "window_end"))
    if clash:
        raise InvalidArgumentError(
            f"aggregate(s) {clash} would take the name of a window bound (names compared "
            "ignoring case, as Spark resolves them); rename them")
    seen: dict[str, str] = {}
    for name in aggs:
        if name.lower() in seen:
            raise InvalidArgumentError(
                f"aggregates {seen[name.lower()]!r} and {name!r} would write columns Spark "
                "cannot tell apart (it compares names ignoring case); rename one of them")
        seen[name.lower()] = name


def _numbers(column: str, values: Any) -> Any:
    """A value column's rows as float64 (null: NaN). Strings are parsed; one that holds no
    number is an :class:`~trilink_spark.errors.InvalidArgumentError` naming it (found by a
    second pass, only then). O(rows), vectorised."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        for v in values:
            try:
                if v is not None:
                    float(v)
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"value column {column!r} holds {v!r:.80}, not a number; cast or clean "
                    "it first") from None
        raise


def _specs(value: str | None, aggs: Any) -> tuple[WindowAgg, ...]:
    """The output columns of a :class:`KeyedWindowAggregate`: ``aggs`` names applied to
    ``value`` (``count`` counts rows), or a mapping ``{name: (func, column)}``."""
    if isinstance(aggs, Mapping):
        if value is not None:
            raise InvalidArgumentError(
                "give value= with aggs as names, or aggs as {name: (func, column)} without "
                "value=, not both")
        if not aggs:
            raise InvalidArgumentTypeError("aggs must not be empty")
        specs = []
        for name, spec in aggs.items():
            if (not isinstance(name, str) or not isinstance(spec, tuple) or len(spec) != 2
                    or not (spec[1] is None or isinstance(spec[1], str))):
                raise InvalidArgumentTypeError(
                    f"aggs as a mapping must be {{name: (func, column)}}, got {name!r}: "
                    f"{spec!r}")
            func, column = spec
            if func not in WINDOW_AGGS:
                raise InvalidArgumentError(
                    f"unknown aggregate {func!r} for {name!r}; choose from {WINDOW_AGGS}")
            if column is None and func != "count":
                raise InvalidArgumentError(f"{func} ({name!r}) needs a column")
            specs.append(WindowAgg(name, func, column))
        return tuple(specs)
    if isinstance(aggs, str) or not aggs:
        raise InvalidArgumentTypeError("aggs must be a non-empty sequence of aggregate names")
    unknown = [a for a in aggs if a not in WINDOW_AGGS]
    if unknown:
        raise InvalidArgumentError(f"unknown aggregate(s) {unknown}; choose from {WINDOW_AGGS}")
    if len(set(aggs)) < len(aggs):
        raise InvalidArgumentError(f"aggs names an aggregate twice: {list(aggs)}")
    if value is None and any(a != "count" for a in aggs):
        raise InvalidArgumentError("sum, min, max and mean need value=<column>")
    return tuple(WindowAgg(a, a, None if a == "count" else value) for a in aggs)
