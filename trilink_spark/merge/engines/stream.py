"""Local Merge on a Structured Streaming query: buffers carried across micro-batches.

In a stream, a flush should not be forced at the end of every micro-batch: the rows after a
partition's last flush point stay buffered and are merged with the next micro-batch's rows of
the same input partition (stable with sources whose partitions are stable, such as Kafka).
Buffers live in a :class:`~trilink_spark.state.KeyedStateStore`, versioned by batch id, so a
replayed batch starts from the same buffer and gives the same output.

A buffer (a partition's *tail*: the rows after its last flush point, with the internal position,
event-time and slot columns) is stored as Arrow IPC bytes tagged ``merge-tail`` (see
:mod:`~trilink_spark._internal.io.arrowio`, :func:`encode_tail` and :func:`decode_tail`), never as
a pickle: stored bytes are data, and bytes that are not such a tail raise
:class:`~trilink_spark.errors.StateCorruptError` naming the partition and batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..._internal.io.arrowio import read_table, write_table
from ...columns import ET_COL, ORDER_COL, POS_COL, SLOT_COL
from ..._internal.spark.compat import num_partitions
from ..._internal.spark.executors import ensure_executors
from ...errors import InvalidArgumentTypeError, StateCorruptError
from ..._internal.optiming import OperatorTimer, Stopwatch, operator_timer
from ...state.foreach import StatefulBatchFunction
from ...state.store import KeyedStateStore
from .local import plan_merge
from .pandas_engine import partition_partials, read_partition, source_rows, to_arrow
from .plan import MergePlan
from ..._internal.validation import refuse_streaming_batch_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["local_merge_foreach_batch", "LocalMergeBatchFunction", "encode_tail", "decode_tail",
           "TAIL_KIND"]

_ROWS_PER_BATCH = 2**32
#: The :mod:`~trilink_spark._internal.io.arrowio` kind of a stored buffer tail.
TAIL_KIND = "merge-tail"
#: Columns of every stored tail that has columns (a partition's rows always carry them).
_TAIL_COLUMNS = (POS_COL, ET_COL, SLOT_COL)


def encode_tail(tail: pd.DataFrame) -> bytes:
    """A partition's buffered tail as the bytes the state store keeps (tagged Arrow IPC).

    Parameters
    ----------
    tail : pandas.DataFrame
        Rows of one partition after its last flush point (any number, zero included), with
        the dtypes :func:`~trilink_spark.merge.engines.pandas_engine.arrow_to_pandas` gives. Its index is
        not stored: it is positional (a slice of the partition's ``RangeIndex``) and every reader
        renumbers it (:func:`decode_tail` gives a fresh ``RangeIndex``).

    Returns
    -------
    bytes
        :func:`~trilink_spark._internal.io.arrowio.write_table` of the frame, kind
        :data:`TAIL_KIND`; the ``pandas`` schema metadata restores the exact dtypes (nullable
        integers, floats with NaN distinct from null, booleans, time zones).

    Raises
    ------
    InvalidArgumentTypeError
        ``tail``'s index is not a ``RangeIndex`` (an index that would carry meaning: this
        format does not keep it).

    Notes
    -----
    Cost: one Arrow conversion and one copy, O(rows).
    """
    if not isinstance(tail.index, pd.RangeIndex):
        raise InvalidArgumentTypeError(
            f"a merge tail has a positional RangeIndex, got {type(tail.index).__name__}; the "
            "stored tail does not keep an index")
    return write_table(pa.Table.from_pandas(tail, preserve_index=False), TAIL_KIND)


def _tail_table(data: bytes, where: str) -> pa.Table:
    """The stored tail as an Arrow table, its columns checked (no pandas conversion)."""
    table = read_table(data, TAIL_KIND, where)
    if table.num_columns == 0:
        if table.num_rows:
            raise StateCorruptError(
                f"{where} holds {table.num_rows} rows without columns; a merge tail with rows "
                "has the partition's columns")
        return table
    missing = [c for c in _TAIL_COLUMNS if c not in table.column_names]
    if missing:
        raise StateCorruptError(
            f"{where} lacks the internal column(s) {', '.join(missing)} every merge tail has "
            f"(it has {table.column_names})")
    return table


def decode_tail(data: bytes, where: str) -> pd.DataFrame:
    """The tail :func:`encode_tail` stored: same columns, dtypes and values, fresh index.

    Parameters
    ----------
    data : bytes
        Stored bytes (a missing tail, ``None``, is the caller's to handle: it means "no
        buffer yet", unlike a stored empty tail, which has the columns and no rows).
    where : str
        Which partition and batch the bytes are, for error messages.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    StateCorruptError
        The bytes are not a stored tail: a pickle (never unpickled), truncated, random, another
        program's Arrow file, another kind of trilink state, or a tail without the internal
        columns. The message starts with ``where``.

    Notes
    -----
    Nothing stored is executed. Cost: a zero-copy read, one validation pass and one pandas
    conversion, O(rows).
    """
    table = _tail_table(data, where)
    if table.num_columns == 0:
        return pd.DataFrame()
    try:
        frame: pd.DataFrame = table.to_pandas()
    except (pa.ArrowException, ValueError, TypeError, LookupError, ArithmeticError) as err:
        # the conversion follows the stored ``pandas`` metadata (JSON: names, dtypes), which
        # Arrow's validation does not check
        raise StateCorruptError(
            f"{where} does not convert to pandas ({type(err).__name__}: {err}); its pandas "
            "schema metadata is corrupt") from None
    return frame


def _tail_where(store: KeyedStateStore, partition: int, batch_id: int | None = None) -> str:
    which = "newest state" if batch_id is None else f"newest state before batch {batch_id}"
    return f"merge tail of partition {partition} ({which}) in state path {store.path}"


def _buffered_partition(plan: MergePlan, store: KeyedStateStore, batch_id: int,
                        timer: OperatorTimer | None = None) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        pid = context.partitionId() if context is not None else 0
        watch = Stopwatch()
        rows = read_partition(watch.pull(batches))
        received = len(rows)
        if len(rows):  # arrival positions that order this batch after the buffered rows
            rows[POS_COL] = batch_id * _ROWS_PER_BATCH + np.arange(len(rows), dtype=np.int64)
            rows = source_rows(rows, plan)
        previous = store.load_before(pid, batch_id)
        if previous is not None:
            where = _tail_where(store, pid, batch_id)
            held = decode_tail(previous, where)
            if ORDER_COL in held.columns and ORDER_COL not in rows.columns:
                # a tail written before order_by was sorted in the JVM carried its column:
                # its rows are already in arrival order, the column is no longer needed
                held = held.drop(columns=[ORDER_COL])
            if len(held.columns) and len(rows.columns) and set(held.columns) != set(rows.columns):
                raise StateCorruptError(
                    f"{where} has the columns {sorted(held.columns)}, but this query's rows "
                    f"have {sorted(rows.columns)}: the state path holds another query's "
                    "buffers; give each query its own state path")
            rows = pd.concat([held, rows], ignore_index=True) if len(rows) else held
        flushed = partition_partials(rows, plan, keep_tail=True)
        tail = rows.iloc[flushed.consumed:]
        store.save(pid, batch_id, encode_tail(tail))
        out = 0
        if len(flushed.frame):
            table = to_arrow(flushed.frame, plan.arrow_schema)
            out = table.num_rows
            yield from watch.emit(table.to_batches())
        if timer is not None:
            timer.write(rows_in=received, rows_out=out, busy_ms=watch.busy_ms(),
                        wait_ms=watch.wait_ms)

    return run


class LocalMergeBatchFunction(StatefulBatchFunction):
    """The ``foreachBatch`` callable of :func:`local_merge_foreach_batch`."""

    def __init__(self, func: Callable[[DataFrame, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        super().__init__(func, store, options)
        self._plan: MergePlan | None = None

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        refuse_streaming_batch_function(batch_df, "LocalMergeBatchFunction",
                                        "local_merge_foreach_batch")
        ensure_executors(batch_df.sparkSession, self.store.path, self.store.fs)
        o = self.options
        src, plan = plan_merge(batch_df, o["key"], o["event_time"], o["slot"], o["aggs"],
                               o["mode"], quantity=o["quantity"], delay=o["delay"],
                               punctuation=o["punctuation"], order_by=o["order_by"])
        self._plan = plan
        timer = operator_timer(batch_df.sparkSession, "local_merge")
        out = src.mapInArrow(_buffered_partition(plan, self.store, batch_id, timer),
                             plan.out_schema)
        self.func(out, batch_id)
        self._complete(out, batch_id, num_partitions(src))  # Spark Connect: one more job

    def buffered(self) -> int:
        """Rows held in the buffers now (over every partition's newest state).

        Raises :class:`~trilink_spark.errors.StateCorruptError` for a stored tail that is not one.
        Cost: per partition, one read and one validation of its Arrow data (row counts; no
        pandas conversion).
        """
        total = 0
        for p in self.store.partitions():
            data = self.store.latest(p)
            if data is not None:
                total += int(_tail_table(data, _tail_where(self.store, p)).num_rows)
        return total

    def flush_remaining(self) -> pd.DataFrame:
        """Partials of every buffered row (e.g. when the stream ends); the buffers stay as
        they are, so call it once, after the last batch."""
        if self._plan is None:
            return pd.DataFrame()
        parts = []
        for p in self.store.partitions():
            data = self.store.latest(p)
            if data is None:
                continue
            flushed = partition_partials(decode_tail(data, _tail_where(self.store, p)),
                                         self._plan)
            if len(flushed.frame):
                parts.append(flushed.frame)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def local_merge_foreach_batch(
    func: Callable[[DataFrame, int], Any],
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    state_path: str,
    mode: str = "quantity",
    *,
    quantity: int = 10_000,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    filesystem: Any = None,
    keep_versions: int = 10,
) -> LocalMergeBatchFunction:
    """A ``foreachBatch`` function running :func:`~trilink_spark.local_merge` with buffers
    carried across micro-batches.

    ``func(partials_df, batch_id)`` receives the partial rows flushed in the batch (merge them
    downstream with :func:`~trilink_spark.merge_partials`, ``keyed_agg`` or a keyed process
    function). Rows after a partition's last flush point wait for the next batch.

    Notes
    -----
    Guarantees as for :func:`~trilink_spark.keyed_foreach_batch`: each task starts from its
    partition's buffer as of the newest version before the batch, so a replayed batch id gives
    the same output and buffer. Cost per batch: the local_merge pass plus one buffer read and
    write per input partition (the buffer holds fewer rows than one flush).

    Examples
    --------
    >>> from trilink_spark.merge import local_merge_foreach_batch
    >>> run = local_merge_foreach_batch(write, "sensor", "ts", 60.0, aggs,
    ...                                    state_path="/tmp/merge-state")  # doctest: +SKIP
    >>> stream.writeStream.foreachBatch(run).start()  # doctest: +SKIP
    """
    if not callable(func):
        raise InvalidArgumentTypeError(f"func must be callable, got {type(func).__name__}")
    store = KeyedStateStore(state_path, filesystem=filesystem, keep_versions=keep_versions)
    options = {"key": key, "event_time": event_time, "slot": slot, "aggs": aggs, "mode": mode,
               "quantity": quantity, "delay": delay, "punctuation": punctuation,
               "order_by": order_by}
    return LocalMergeBatchFunction(func, store, options)
