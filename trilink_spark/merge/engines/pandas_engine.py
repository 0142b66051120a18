"""The pandas engine of Local Merge: a partition's rows, held, cut at the flush bounds.

:func:`partition_partials` merges one input partition's rows (arrival order) into the partial
rows of all its flushes with ONE pandas group-by over (flush, key, slot), every mode and every
aggregate (:func:`~trilink_spark.merge.algebra.partials.partial_groups`); :func:`merge_partition` is
its partition function, which the Arrow engine falls back to. Also the conversions the merges
read and write Arrow batches with (:func:`read_partition`, :func:`arrow_to_pandas`,
:func:`to_arrow`) and each row's arrival position and slot (:func:`source_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ...columns import ET_COL, POS_COL, PUNCT_COL, SLOT_COL
from ..._internal.optiming import OperatorTimer, Stopwatch, task_identity
from ...eventtime import from_units
from .bounds import flush_bounds
from ..algebra.partials import partial_groups
from .plan import SLOT, UNTIMED_SLOT, MergePlan, slot_starts

__all__ = ["Flushes", "arrow_to_pandas", "buffered_rows", "merge_partition", "partition_flushes",
           "partition_partials", "read_partition", "source_rows", "to_arrow"]


def source_rows(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """A partition's source rows with arrival positions (the rows arrive in arrival order,
    sorted by ``order_by`` in the JVM when given; numbered as Spark's
    ``monotonically_increasing_id``, the partition id in the upper bits, so first and last
    compare across partitions as before) and each row's slot start
    (:data:`~trilink_spark.merge.engines.plan.UNTIMED_SLOT` for rows without a finite event time),
    computed as Spark's ``et - pmod(et, slot)`` in doubles. Rows that have both are returned as
    they are; else a shallow copy with the columns added (the caller's frame is not changed).
    O(rows), vectorised."""
    if POS_COL in rows.columns and (SLOT_COL in rows.columns or ET_COL not in rows.columns):
        return rows
    rows = rows.copy(deep=False)
    if POS_COL not in rows.columns:
        partition = task_identity()[1]
        rows[POS_COL] = (np.int64(partition) << np.int64(33)) + np.arange(len(rows),
                                                                          dtype=np.int64)
    if SLOT_COL not in rows.columns and ET_COL in rows.columns:
        rows[SLOT_COL] = slot_starts(_floats(rows[ET_COL]), float(plan.slot_units))
    return rows


def _user_columns(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """``rows`` of the merge's source with the user's column names (see ``plan.aliases``)."""
    return rows.rename(columns=plan.aliases) if plan.aliases else rows


class Flushes(NamedTuple):
    """The partial rows of every flush of one partition (see :func:`partition_partials`).

    ``frame`` has the columns of the plan's output, flushes in order and each flush's rows in
    slot order; ``flush`` numbers each row's flush (0, 1, ... over the flushes that have rows);
    ``consumed`` is how many leading input rows were flushed (the rest is a kept tail).
    """

    frame: pd.DataFrame
    flush: np.ndarray
    consumed: int

    def pieces(self) -> Iterator[pd.DataFrame]:
        """One frame per flush, in order (slices of ``frame``; O(flushes))."""
        if not len(self.frame):
            return
        cuts = (np.flatnonzero(np.diff(self.flush)) + 1).tolist()
        for start, end in zip([0, *cuts], [*cuts, len(self.frame)]):
            yield self.frame.iloc[start:end]


def partition_partials(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool = False) -> Flushes:
    """One input partition's rows (arrival order) to the partial rows of all its flushes.

    With ``keep_tail`` the rows after the last flush point are not flushed (a streaming
    buffer keeps them for the next micro-batch; see :func:`buffered_rows`).

    Notes
    -----
    Cost: the flush bounds (:func:`~trilink_spark.merge.engines.bounds.flush_bounds`, O(n)), then ONE
    pandas group-by over (flush, key, slot) for every flush together and one stable sort of the
    groups into flush then slot order: O(n log n) vectorised, whatever the number of flushes.

    Examples
    --------
    >>> flushed = partition_partials(rows, plan)  # doctest: +SKIP
    >>> [len(piece) for piece in flushed.pieces()]  # doctest: +SKIP
    [3, 2]
    """
    rows = source_rows(rows, plan)
    if not len(rows):
        return Flushes(pd.DataFrame(columns=plan.names), np.zeros(0, dtype=np.int64), 0)
    rows = _user_columns(rows, plan)
    ends = _flush_ends(rows, plan, keep_tail)
    consumed = ends[-1] if ends else 0
    part = rows.iloc[:consumed]
    flush_of_row = np.repeat(np.arange(len(ends)), np.diff([0, *ends]))
    timed = part[ET_COL].notna().to_numpy()
    timed |= _floats(part[SLOT_COL]) == UNTIMED_SLOT  # rows without a time: the null slot
    if not timed.all():
        part, flush_of_row = part[timed], flush_of_row[timed]
    if not len(part):
        return Flushes(pd.DataFrame(columns=plan.names), np.zeros(0, dtype=np.int64), consumed)
    # rows without an event time have a null slot: a group of its own (dropna=False)
    out = partial_groups(part, [flush_of_row, plan.key, SLOT_COL], plan.specs, ET_COL, POS_COL)
    flush = out.index.get_level_values(0).to_numpy(dtype=np.int64)
    slot = _floats(out.index.get_level_values(2))
    slot[slot == UNTIMED_SLOT] = np.nan
    order = np.argsort(slot, kind="stable")  # within a flush: slot order, then first seen
    order = order[np.argsort(flush[order], kind="stable")]
    out = out.iloc[order]
    flush = flush[order]
    frame = out.reset_index(drop=True)
    keys = out.index.get_level_values(1)
    if len(keys) and keys.isna().all():  # pandas makes an all-null level float: keep None
        keys = pd.Index(np.full(len(keys), None, dtype=object))
    elif pd.api.types.is_float_dtype(keys.dtype):  # Spark's key of -0.0 and 0.0 is 0.0
        keys = keys + 0.0
    frame[plan.key] = keys
    frame[plan.time_name] = _times(_floats(frame[ET_COL]), plan.time_kind)
    frame[SLOT] = _times(slot[order], plan.time_kind)
    numbers = np.zeros(len(flush), dtype=np.int64)  # dense: flushes with no rows get none
    numbers[1:] = np.cumsum(flush[1:] != flush[:-1])
    return Flushes(frame[plan.names], numbers, consumed)


def _floats(values: Any) -> np.ndarray:
    """Numbers (any numeric pandas dtype, nulls included) as float64, NaN for null."""
    if isinstance(values, (pd.Series, pd.Index)):
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(values, dtype=np.float64)


def _times(units: np.ndarray, kind: str) -> Any:
    """:func:`~trilink_spark.eventtime.from_units`, null where ``units`` is NaN."""
    missing = np.isnan(units)
    if not missing.any():
        return from_units(units, kind)
    values = from_units(np.where(missing, 0.0, units), kind)
    if kind == "timestamp":
        return pd.Series(values).mask(missing).to_numpy()
    if kind == "integral":
        return pd.arrays.IntegerArray(np.asarray(values, dtype=np.int64), missing)
    return pd.arrays.FloatingArray(np.where(missing, 0.0, units), missing)


def partition_flushes(
    rows: pd.DataFrame, plan: MergePlan, keep_tail: bool = False
) -> Iterator[pd.DataFrame]:
    """One input partition's rows (arrival order) to its flushes of partial rows.

    With ``keep_tail`` the rows after the last flush point are not flushed (a streaming
    buffer keeps them for the next micro-batch; see :func:`buffered_rows`).

    Notes
    -----
    Cost: :func:`partition_partials` (one group-by for every flush), then one slice per
    flush. Callers that need no per-flush pieces use ``partition_partials`` directly.
    """
    yield from partition_partials(rows, plan, keep_tail).pieces()


def _flush_ends(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool) -> list[int]:
    et = rows[ET_COL].to_numpy(dtype=np.float64)
    punct = rows[PUNCT_COL].fillna(False).to_numpy(dtype=bool) if PUNCT_COL in rows else None
    groups: np.ndarray | None = None
    if plan.mode == "groups":
        codes = rows.groupby([plan.key, SLOT_COL], sort=False, dropna=False).ngroup()
        groups = codes.to_numpy(dtype=np.int64)
    bounds = flush_bounds(et, plan.mode, plan.quantity, plan.delay, punct, groups,
                          plan.max_groups)
    if keep_tail:
        bounds = bounds[:-1]  # the last bound is the end of the rows: keep that tail
        if plan.mode == "punctuation" and punct is not None and len(punct) and punct[-1]:
            bounds.append(len(rows))  # a punctuation row ends the input: nothing is left
    return bounds


def buffered_rows(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """The rows :func:`partition_flushes` with ``keep_tail`` leaves for the next batch."""
    ends = (_flush_ends(_user_columns(source_rows(rows, plan), plan), plan, True)
            if len(rows) else [])
    last = ends[-1] if ends else 0
    return rows.iloc[last:]


def _nullable_dtype(arrow_type: Any) -> Any:
    """pandas' nullable dtype for an Arrow integer, float or boolean type (else None)."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        return pd.api.types.pandas_dtype(str(arrow_type).capitalize().replace("Uint", "UInt"))
    if pa.types.is_float32(arrow_type):
        return pd.Float32Dtype()
    if pa.types.is_float64(arrow_type):
        return pd.Float64Dtype()
    if pa.types.is_boolean(arrow_type):
        return pd.BooleanDtype()
    return None


def arrow_to_pandas(table: Any) -> pd.DataFrame:
    """An Arrow table as pandas with nullable dtypes for integers, floats and booleans.

    Integers stay exact (not float64 because of a null) and NaN stays a value distinct from
    null, as Spark keeps them; the internal event-time and slot columns, if there, become
    float64 with NaN for null. Cost: one Arrow conversion, O(rows).
    """
    frame: pd.DataFrame = table.to_pandas(types_mapper=_nullable_dtype)
    for col in (ET_COL, SLOT_COL):
        if col in frame.columns:
            frame[col] = _floats(frame[col])
    return frame


def to_arrow(frame: pd.DataFrame, schema: Any) -> Any:
    """``frame`` as an Arrow table of ``schema`` (no index).

    A column pandas made float64 only because all its values are null (an all-null group
    level, a reindexed reduction) is given as nulls to a non-numeric field, instead of having
    Arrow reinterpret its bytes. Cost: one Arrow conversion, O(rows).
    """
    import pyarrow as pa

    fixed = {}
    for field in schema:
        values = frame[field.name]
        numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
        if not numeric and values.dtype == np.float64:
            fixed[field.name] = pd.Series(np.full(len(values), None, dtype=object),
                                          index=values.index).where(values.isna(), values)
    if fixed:
        frame = frame.assign(**fixed)
    return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)


def read_partition(batches: Iterator[Any]) -> pd.DataFrame:
    """A partition's Arrow batches as one pandas frame (empty frame when none); see
    :func:`arrow_to_pandas` for the dtypes."""
    import pyarrow as pa

    received = list(batches)
    return arrow_to_pandas(pa.Table.from_batches(received)) if received else pd.DataFrame()


def merge_partition(plan: MergePlan, timer: OperatorTimer | None = None) -> Any:
    """The pandas engine's partition function of :func:`~trilink_spark.local_merge`: the
    partition's rows read whole, then :func:`partition_partials` (every mode and aggregate);
    with ``timer``, one timing record per task (rows in and out, its own milliseconds)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        watch = Stopwatch()
        rows = source_rows(read_partition(watch.pull(batches)), plan)
        flushed = partition_partials(rows, plan)
        out = 0
        if len(flushed.frame):
            table = to_arrow(flushed.frame, plan.arrow_schema)
            out = table.num_rows
            yield from watch.emit(table.to_batches())
        if timer is not None:
            timer.write(rows_in=len(rows), rows_out=out, busy_ms=watch.busy_ms(),
                        wait_ms=watch.wait_ms)

    return run
