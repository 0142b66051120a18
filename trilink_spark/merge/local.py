"""Local Merge: time-slot pre-aggregation on the map side, before the keyed exchange.

Seed 002 §4.3 (1), Figure 11 (b), Table 7. Within each input partition, rows of one key in
one time slot are merged into one partial row (see :mod:`~trilink_spark.merge.algebra`) before
anything is shuffled. A merged row carries the largest event time of its rows, so watermarks
downstream stay right, and a flush emits its slots in time order. When a buffer is flushed
depends on the mode:

============== ================================================ =======================
mode           flush when                                       suits (Table 7)
============== ================================================ =======================
quantity       ``quantity`` rows were merged                    throughput
periodic       the oldest buffered row is ``delay`` older than  low latency
               the newest one seen
punctuation    a row matches ``punctuation`` (flushed with it)  window boundaries
============== ================================================ =======================

Every mode also flushes at the end of the partition. Merging the output with
:func:`~trilink_spark.merge_partials` gives exactly what aggregating the raw rows gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..columns import ET_COL, ORDER_COL, POS_COL, PUNCT_COL, SLOT_COL, require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..eventtime import SPARK_TIME_TYPES, delay_in_units, event_time_micros, from_units
from .algebra import AggSpec, parse_aggs, partial_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["local_merge", "MERGE_MODES", "flush_bounds", "plan_merge", "MergePlan",
           "partition_flushes"]

#: Flush modes of seed 002 Table 7.
MERGE_MODES: tuple[str, ...] = ("quantity", "periodic", "punctuation")
#: Output column: the start of each partial row's time slot.
SLOT = "slot_start"


def flush_bounds(
    et: np.ndarray, mode: str, quantity: int, delay: float, punct: np.ndarray | None
) -> list[int]:
    """End positions (exclusive) of the flushes of one partition's rows, in arrival order.

    Examples
    --------
    >>> flush_bounds(np.arange(5.0), "quantity", 2, 0.0, None)
    [2, 4, 5]
    >>> flush_bounds(np.array([0.0, 1, 5, 6, 20]), "periodic", 0, 4.0, None)
    [2, 4, 5]
    """
    n = len(et)
    if n == 0:
        return []
    if mode == "quantity":
        bounds = list(range(quantity, n, quantity))
    elif mode == "punctuation":
        bounds = [int(i) + 1 for i in np.flatnonzero(punct) if i + 1 < n] if punct is not None else []
    else:
        bounds, start = [], 0
        filled = np.where(np.isnan(et), -np.inf, et)
        while start < n:
            seg = filled[start:]
            spread = np.maximum.accumulate(seg) - np.minimum.accumulate(
                np.where(np.isinf(seg), np.inf, seg))
            over = np.flatnonzero(spread > delay)
            if not len(over):
                break
            start += int(over[0])
            bounds.append(start)
    return bounds + [n]


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


def partition_flushes(
    rows: pd.DataFrame, plan: MergePlan, keep_tail: bool = False
) -> Iterator[pd.DataFrame]:
    """One input partition's rows (arrival order) to its flushes of partial rows.

    With ``keep_tail`` the rows after the last flush point are not flushed (a streaming
    buffer keeps them for the next micro-batch; see :func:`buffered_rows`).
    """
    if not len(rows):
        return
    for start, end in _segments(rows, plan, keep_tail):
        part = rows.iloc[start:end]
        part = part[part[ET_COL].notna()]
        if not len(part):
            continue
        part = part.assign(**{SLOT: part[SLOT_COL]})
        out = partial_frame(part, [plan.key, SLOT], plan.specs, ET_COL, POS_COL)
        out = out.sort_values(SLOT, kind="stable")
        out[plan.time_name] = from_units(out[ET_COL].to_numpy(), plan.time_kind)
        out[SLOT] = from_units(out[SLOT].to_numpy(dtype=np.float64), plan.time_kind)
        yield out[plan.names]


def _segments(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool) -> list[tuple[int, int]]:
    et = rows[ET_COL].to_numpy(dtype=np.float64)
    punct = rows[PUNCT_COL].fillna(False).to_numpy(dtype=bool) if PUNCT_COL in rows else None
    bounds = flush_bounds(et, plan.mode, plan.quantity, plan.delay, punct)
    if keep_tail:
        bounds = bounds[:-1]  # the last bound is the end of the rows: keep that tail
        if plan.mode == "punctuation" and punct is not None and len(punct) and punct[-1]:
            bounds.append(len(rows))  # a punctuation row ends the input: nothing is left
    starts = [0] + bounds[:-1]
    return list(zip(starts, bounds))


def buffered_rows(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """The rows :func:`partition_flushes` with ``keep_tail`` leaves for the next batch."""
    segments = _segments(rows, plan, True) if len(rows) else []
    last = segments[-1][1] if segments else 0
    return rows.iloc[last:]


def read_partition(batches: Iterator[Any]) -> pd.DataFrame:
    """A partition's Arrow batches as one pandas frame (empty frame when none)."""
    import pyarrow as pa

    received = list(batches)
    return pa.Table.from_batches(received).to_pandas() if received else pd.DataFrame()


def _merge_partition(plan: MergePlan) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for out in partition_flushes(read_partition(batches), plan):
            table = pa.Table.from_pandas(out, schema=plan.arrow_schema, preserve_index=False)
            yield from table.to_batches()

    return run


def local_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = "quantity",
    *,
    quantity: int = 10_000,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
) -> DataFrame:
    """Pre-aggregate rows per key and time slot inside each input partition (no shuffle).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    event_time : str
        Timestamp or numeric event-time column.
    slot : float or datetime.timedelta
        Slot length (seconds or a timedelta for timestamps; the column's unit otherwise).
    aggs : mapping or sequence
        ``{name: (func, column)}``; funcs: count, sum, min, max, mean, first, last or a
        :class:`~trilink_spark.Combine` (module docs of :mod:`~trilink_spark.merge.algebra`).
    mode : {"quantity", "periodic", "punctuation"}
        When buffers flush (module docs).
    quantity : int
        Quantity mode: rows merged per flush.
    delay : float or timedelta
        Periodic mode: how much older than the newest row the oldest buffered row may be.
    punctuation : str
        Punctuation mode: a boolean column; a row where it is true flushes the buffer with it.
    order_by : str, optional
        Arrival order within a partition (default: the input order).

    Returns
    -------
    pyspark.sql.DataFrame
        Partial rows: ``key``, ``slot_start``, ``event_time`` (the largest of the merged rows,
        same name and type), then the partial columns of each aggregate. Rows with a null
        event time are not merged (they have no slot).

    Notes
    -----
    Cost: one pass per input partition in Python (only the key, event time and aggregated
    columns travel; a partition's rows are held until its last flush), no shuffle. The output
    has at most one row per key, slot and flush: with few keys per slot it is a small fraction
    of the input, which is what the keyed exchange after it then carries.

    Examples
    --------
    >>> aggs = {"n": ("count", None), "volts": ("mean", "volts")}
    >>> partial = tl.local_merge(df, "sensor", "ts", 60.0, aggs)  # doctest: +SKIP
    >>> tl.merge_partials(partial, "sensor", aggs)  # doctest: +SKIP
    """
    src, plan = plan_merge(df, key, event_time, slot, aggs, mode, quantity=quantity, delay=delay,
                           punctuation=punctuation, order_by=order_by)
    result: DataFrame = src.mapInArrow(_merge_partition(plan), plan.out_schema)
    return result


def plan_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = "quantity",
    *,
    quantity: int = 10_000,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
) -> tuple[DataFrame, MergePlan]:
    """Validate a merge; returns its narrow source DataFrame and plan (see :func:`local_merge`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    require_columns(df, [key], "key column")
    if mode not in MERGE_MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MERGE_MODES)}, got {mode!r}")
    specs = parse_aggs(aggs, df.columns)
    et_col, kind = event_time_micros(df, event_time)
    slot_units = delay_in_units(slot, kind)
    if slot_units <= 0:
        raise InvalidArgumentError(f"slot must be > 0, got {slot!r}")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity < 1:
        raise InvalidArgumentTypeError(f"quantity must be an int >= 1, got {quantity!r}")
    delay_units = 0.0
    if mode == "periodic":
        if delay is None:
            raise InvalidArgumentError("periodic mode needs delay=...")
        delay_units = delay_in_units(delay, kind)
    if mode == "punctuation":
        if punctuation is None or punctuation not in df.columns:
            raise InvalidArgumentError("punctuation mode needs punctuation=<boolean column of df>")
    require_columns(df, [order_by], "order_by column")
    values = sorted({s.column for s in specs if s.column is not None} - {key})
    cols = [F.col(key), *[F.col(c) for c in values], F.monotonically_increasing_id().alias(POS_COL),
            et_col.alias(ET_COL), (F.floor(et_col / slot_units) * slot_units).alias(SLOT_COL)]
    if mode == "punctuation":
        cols.append(F.col(str(punctuation)).cast("boolean").alias(PUNCT_COL))
    if order_by is not None:
        cols.append(F.col(order_by).alias(ORDER_COL))
    src = df.select(*cols)
    if order_by is not None:
        src = src.sortWithinPartitions(ORDER_COL, POS_COL)
    time_type = SPARK_TIME_TYPES[kind]
    fields = [f"`{key}` {df.schema[key].dataType.simpleString()}", f"{SLOT} {time_type}",
              f"`{event_time}` {time_type}"]
    names = [key, SLOT, event_time]
    for spec in specs:
        value_type = (df.schema[spec.column].dataType.simpleString()
                      if spec.column is not None else "bigint")
        for col, dtype in zip(spec.partial_columns, spec.partial_types(value_type)):
            fields.append(f"`{col}` {dtype}")
            names.append(col)
    out_schema = StructType.fromDDL(", ".join(fields))
    if not isinstance(out_schema, StructType):  # pragma: no cover - fromDDL of fields is a struct
        raise InvalidArgumentTypeError("internal: partial schema is not a struct")
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_schema, timezone=timezone)
    plan = MergePlan(key, specs, mode, quantity, delay_units, kind, event_time, names,
                     out_schema, arrow_schema)
    return src, plan
