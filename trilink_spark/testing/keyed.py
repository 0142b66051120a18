"""A keyed process function run over pandas frames in one process, without Spark.

:class:`KeyedTester` is to :func:`~trilink_spark.keyed_foreach_batch` what PySpark's
``TwsTester`` is to ``transformWithStateInPandas``: it runs a
:class:`~trilink_spark.KeyedWatermarkProcessFunction` batch after batch, as one partition of a
stream, and returns each batch's output as a pandas DataFrame. It is not a second
implementation: each batch goes through what a runner's task runs
(:func:`~trilink_spark.keyed.run.task.run_batch` over a
:class:`~trilink_spark.keyed.semantics.process.KeyedRuntime`), the arguments are checked by
the runners' own checks, a key's state expires by the local store's rule
(:func:`~trilink_spark.keyed.durable.local_sync.expire`), and between batches the partition's
state is encoded into the stored Arrow table and decoded from it
(:mod:`~trilink_spark.keyed.durable.codec`), so a value the store cannot hold fails here
with the :class:`~trilink_spark.errors.StateTypeError` a stream would raise, and a value
that comes back changed (a tuple as a list) comes back changed here too.

What the driver of a stream does with Spark is done here in Python:

- each frame becomes Arrow (``pyarrow.Table.from_pandas``, as ``spark.createDataFrame``
  converts pandas: NaN in a float64 column is null; timestamps are UTC microseconds, naive
  ones taken as UTC; categoricals their values), and its Spark schema is derived from Arrow,
  for the checks and the processor's ``bind``;
- the ``output_schema`` and ``state_schema`` DDL strings are read by
  :func:`~trilink_spark.testing.ddl.struct_of` (PySpark's own parser needs a JVM);
- every batch gets a fresh copy of the processor, as Spark ships one to the batch's task:
  it must pickle with PySpark's cloudpickle (one that does not is refused), and the copy is
  made through the pickle protocol (``copy.deepcopy``: ``__reduce_ex__``, ``__getstate__``),
  so what a hook keeps on ``self`` is lost between batches here as in a stream (keep it in
  ``ctx`` state or ``runtime.shared``).

The first batch fixes the frame's schema, as a stream's is fixed: a later batch's columns are
cast to the types the first one had (a column of ints that holds a null arrives from pandas as
float64 and is cast back), and one that does not cast is refused. What a batch fixes (the
schema, the key type, the event time's kind and units, the TTL's units, the processing-time
clock) is fixed only once the batch succeeded: a batch that raises, the first one included,
leaves the tester as it was, as a failed micro-batch commits nothing.
"""

from __future__ import annotations

import copy
import math
import pickle
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd

from .._internal.locking import PicklableLock
from .._internal.validation import number, seconds
from ..columns import EVENT_TIME_COL, check_atomic_key, check_user_columns, require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, TrilinkError
from ..eventtime import MAX_EXACT, delay_in_units, time_kind
from ..keyed.durable.codec import decode_state, encode_state, read_counters
from ..keyed.durable.local_sync import LocalConfig, expire, expire_processed
from ..keyed.durable.manifest import processing_time_after
from ..keyed.records.state_reader import STATE_COLUMNS, as_timestamps, state_rows
from ..keyed.run.prepare import carried_columns, check_processor, units
from ..keyed.run.streaming import check_ttl, check_ttl_time
from ..keyed.run.task import run_batch, runtime_frame
from ..keyed.semantics.process import KeyedRuntime, KeyedWatermarkProcessFunction
from ..partitioners.core.keys import check_null_policy, null_key_error
from ..keyed.semantics.keys import PartitionState
from ..state.local import LOCAL_KEY_TYPES, supports_key_type
from .ddl import struct_of

__all__ = ["KeyedTester", "STATE_FRAME_COLUMNS"]

#: The columns :meth:`KeyedTester.state` returns before the declared state values, those of
#: :func:`~trilink_spark.read_state`
#: (:data:`~trilink_spark.keyed.records.state_reader.STATE_COLUMNS`).
STATE_FRAME_COLUMNS: tuple[str, ...] = STATE_COLUMNS
#: The time zone output timestamps are given in (Arrow keeps instants; this labels them).
OUTPUT_TIMEZONE = "UTC"


@dataclass(frozen=True)
class _Described:
    """A batch's Spark schema in the shape the runners' column checks read a DataFrame:
    ``columns`` and ``schema``."""

    schema: Any

    @property
    def columns(self) -> list[str]:
        names: list[str] = self.schema.names
        return names


@dataclass(frozen=True)
class _Pending:
    """What one batch would fix, held apart until the batch succeeded (module docs): the
    task's rows (None: no rows), the batch's processing time (ms, None without a
    processing-time TTL) and the tester's clock after it, and the schema, key type, event-time
    kind, units, state type, TTL units and output schema the tester has after it."""

    rows: Any
    at: float | None
    clock: tuple[float, float] | None
    schema: Any
    key_type: Any
    kind: str
    units: tuple[float, float]
    value_type: Any
    ttl_units: float
    processing_ttl_ms: float
    arrow_out: Any


def _ship(processor: KeyedWatermarkProcessFunction) -> KeyedWatermarkProcessFunction:
    """The copy of ``processor`` a batch's task gets (module docs): refused unless PySpark's
    cloudpickle pickles it, as Spark must to ship it, then copied through the pickle protocol
    (``copy.deepcopy``). O(size of the processor)."""
    from pyspark import cloudpickle

    try:
        cloudpickle.dumps(processor)  # type: ignore[no-untyped-call]
        shipped = copy.deepcopy(processor)
    except (pickle.PicklingError, TypeError, AttributeError, ValueError, RecursionError,
            ImportError) as err:
        raise InvalidArgumentTypeError(
            f"processor {type(processor).__name__} does not pickle ({type(err).__name__}: "
            f"{err}); Spark ships it to every task of every batch, so its attributes must "
            "pickle (keep per-key data in ctx state, per-partition data in runtime.shared)"
        ) from None
    if not isinstance(shipped, KeyedWatermarkProcessFunction):  # pragma: no cover - __reduce__
        raise InvalidArgumentTypeError(
            f"processor {type(processor).__name__} copies as {type(shipped).__name__}")
    return shipped


def _processing_ms(value: Any) -> float:
    """``processing_time`` (seconds since the epoch, or a datetime; naive: UTC) in ms."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return moment.timestamp() * 1000.0
    return number(value, "processing_time") * 1000.0


class KeyedTester(PicklableLock):
    """Run a keyed process function over pandas frames, batch after batch, without Spark.

    One tester is one partition of a :func:`~trilink_spark.keyed_foreach_batch` stream (all
    keys in one process): :meth:`run` processes one micro-batch and returns what the hooks
    emitted; :meth:`state` shows the stored state, one row per key;
    :meth:`finish` ends bounded input, as :func:`~trilink_spark.keyed_process` does at the
    end of its frame (module docs: what runs as in the runners, and what stands in for Spark).

    Parameters
    ----------
    processor : KeyedWatermarkProcessFunction
        E.g. :class:`~trilink_spark.KeyedWindowAggregate`, or a subclass of your own.
    key, event_time : str
        The key column and the event-time column (a timestamp or a number) of the frames.
    delay : str, float or datetime.timedelta
        Allowed lateness: an interval string (``"10 seconds"``), seconds or a timedelta for a
        timestamp event time; the column's unit for a numeric one.
    order_by : str, optional
        The column giving each batch's arrival order (ascending, nulls first, ties in frame
        order); default the frame's row order.
    idle_timeout : str, float or timedelta, optional
        When a key counts as idle; default 4 x ``delay`` (``math.inf``: never).
    state_ttl : str, float or timedelta, optional
        Delete the state of a key that got no row for this long (after its due timers fired),
        by event time or, with ``state_ttl_time="processing"``, by processing time (seconds;
        each batch's time is the ``processing_time`` given to :meth:`run`, else the clock).
    state_ttl_time : {"event", "processing"}
        The clock of ``state_ttl``.
    null_policy : {"group", "error", "partition0"}, optional
        ``"error"`` refuses a batch with a null key (:class:`~trilink_spark.errors.NullKeyError`);
        otherwise the null key is a key of its own (the default, ``"group"``).

    Raises
    ------
    InvalidArgumentTypeError, InvalidArgumentError
        A processor that is not a ``KeyedWatermarkProcessFunction``, column names that are not
        strings, a delay, idle timeout, TTL or null policy that the runners refuse.

    Notes
    -----
    Cost per batch: what a task of the stream costs for the same rows, O(rows log rows) (the
    runtime's sort of the rows by key) plus the hooks, and the state encoded and decoded whole
    (O(keys + timers + open windows)), as the file store reads and writes it. The state is held
    in memory, as one Arrow table. No Spark session, no JVM: ``pyspark`` is imported for its
    types and its cloudpickle only.

    Thread-safe: calls are serialised. :meth:`run`, :meth:`finish`, :meth:`state` and
    :meth:`counters` hold one lock of the tester while they run, so batches run from several
    threads run one after another (as a stream runs one micro-batch at a time) and none is
    lost; their order is the order the threads get the lock. The lock is left out when the
    tester pickles or is copied, and the copy gets a lock of its own.

    Examples
    --------
    Count each key's rows, and its late ones:

    >>> import pandas as pd
    >>> import trilink_spark as tl
    >>> class Count(tl.KeyedWatermarkProcessFunction):
    ...     output_schema = "k string, n long, late long"
    ...     state_schema = "n long, late long"
    ...     def process_on_time(self, key, rows, ctx):
    ...         ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
    ...         return [(key, ctx.get_state("n"), ctx.get_state("late", 0))]
    ...     def process_late(self, key, rows, ctx):
    ...         ctx.set_state("late", ctx.get_state("late", 0) + len(rows))
    >>> tester = KeyedTester(Count(), key="k", event_time="t", delay=2)
    >>> tester.run(pd.DataFrame({"k": ["a", "b", "a"], "t": [10, 4, 12]}))
       k  n  late
    0  a  2     0
    1  b  1     0
    >>> tester.run(pd.DataFrame({"k": ["a", "a"], "t": [5, 11]}))  # 5 < a's watermark 10
       k  n  late
    0  a  3     1
    >>> tester.state()[["key", "watermark", "rows", "n", "late"]]
      key  watermark  rows  n  late
    0   a       10.0     4  3   1.0
    1   b        2.0     1  1   NaN
    """

    def __init__(
        self,
        processor: KeyedWatermarkProcessFunction,
        key: str,
        event_time: str,
        delay: Any,
        *,
        order_by: str | None = None,
        idle_timeout: Any = None,
        state_ttl: Any = None,
        state_ttl_time: str = "event",
        null_policy: str | None = None,
    ) -> None:
        check_processor(processor)
        for name, value in (("key", key), ("event_time", event_time)):
            if not isinstance(value, str):
                raise InvalidArgumentTypeError(
                    f"{name} must be a column name (str), got {type(value).__name__}")
        if order_by is not None and not isinstance(order_by, str):
            raise InvalidArgumentTypeError(
                f"order_by must be a column name (str) or None, got {type(order_by).__name__}")
        # what does not depend on the event time's kind is checked now; the units at the
        # first batch, as a runner converts them once it knows the column's type
        delay_in_units(delay, "timestamp" if _is_duration(delay) else "integral")
        if idle_timeout is not None and idle_timeout != math.inf:
            delay_in_units(idle_timeout,
                           "timestamp" if _is_duration(idle_timeout) else "integral",
                           "idle_timeout")
        self.processor = processor
        self.key = key
        self.event_time = event_time
        self.delay = delay
        self.order_by = order_by
        self.idle_timeout = idle_timeout
        self.state_ttl = check_ttl(state_ttl)
        self.state_ttl_time = check_ttl_time(state_ttl_time, state_ttl)
        self.null_policy = "group" if null_policy is None else check_null_policy(null_policy)
        #: Batches run so far (the next batch's id).
        self.batches = 0
        self._table: Any = None  # the partition's stored state, as encode_state wrote it
        self._schema: Any = None  # the first batch's Arrow schema (fixed, as a stream's)
        self._kind = ""
        self._units = (0.0, math.inf)  # delay and idle timeout in the event time's units
        self._ttl_units = math.inf
        self._processing_ttl_ms = math.inf
        self._key_type: Any = None
        self._value_type: Any = None
        self._arrow_out: Any = None
        self._clock: tuple[float, float] | None = None  # the last batch's time, the first's
        self._ended = False
        self._lock: Any = threading.Lock()  # serialises the calls (class docs)

    # ------------------------------------------------------------------ batches
    def run(self, frame: pd.DataFrame, *, processing_time: Any = None) -> pd.DataFrame:
        """Process one micro-batch and return what the hooks emitted for it.

        Parameters
        ----------
        frame : pandas.DataFrame
            The batch's rows, in arrival order (or ``order_by``'s), with the key, event-time
            and any other columns; no internal column. An empty frame is a batch without
            rows: ``open`` and ``close`` run, no hook does (as a task without rows).
        processing_time : float or datetime, optional
            With ``state_ttl_time="processing"``: the batch's processing time, seconds since
            the epoch (a naive datetime is UTC); default the clock now. A batch's time never
            goes below the last batch's, as in a stream.

        Returns
        -------
        pandas.DataFrame
            The processor's ``output_schema`` columns (an empty frame with those columns when
            nothing was emitted), as Arrow gives them to pandas: timestamps as UTC.

        Raises
        ------
        InvalidArgumentTypeError, InvalidArgumentError
            Not a DataFrame, a column name that is not a str, a column whose type differs
            from the first batch's and does not cast to it, an event time that is not a
            timestamp or a number or is beyond 2**53 units, a key that is not atomic, a
            processor without an ``output_schema``, an output that does not fit it, or
            ``finish()`` called before.
        MissingColumnError, ReservedColumnError
            A key, event-time, ``order_by`` or input column missing; a ``_tl_`` column.
        NullKeyError
            A null key under ``null_policy="error"``.
        StateTypeError
            A state value that the store cannot hold (as ``ctx.set_state`` or the codec
            refuses it in a stream).

        Notes
        -----
        A batch that raises leaves the tester as it was, as a failed micro-batch commits
        nothing: the state, the processing-time clock and, for a first batch, the schema it
        would have fixed; running it again replays it. Calls from several threads run one
        at a time (class docs). Cost: O(rows log rows) plus the hooks, and
        O(state) to decode and encode the state.
        """
        with self._lock:
            return self._run(frame, processing_time)

    def _run(self, frame: pd.DataFrame, processing_time: Any) -> pd.DataFrame:
        """:meth:`run`, under the lock: nothing is fixed on ``self`` before the batch's hooks
        and its state's encoding succeeded."""
        if self._ended:
            raise InvalidArgumentError(
                "the input ended (finish() was called): make a new KeyedTester for more batches")
        if processing_time is not None and self.state_ttl_time != "processing":
            raise InvalidArgumentError(
                "processing_time is the clock of state_ttl_time='processing'; this tester has "
                "no processing-time TTL, so pass none")
        table, schema = self._batch_table(frame)
        pending = self._prepare(table, schema, processing_time)
        runtime = self._runtime(pending.at, pending.units, pending.value_type)
        batches, _ = run_batch(runtime, 0, pending.rows, pending.arrow_out)
        state = runtime.snapshot()
        expire(state, pending.ttl_units)  # as the local store does before it writes the batch
        if pending.at is not None and pending.clock is not None:
            expire_processed(state, LocalConfig(
                "", "", 1, pending.ttl_units, None, pending.processing_ttl_ms, pending.at,
                pending.clock[1]))  # the TTL and the batch's clock; nothing is written
        stored = encode_state(state, pending.key_type, pending.value_type)
        output = self._output(batches, pending.arrow_out)
        # the batch succeeded: what it fixes is fixed now, as a micro-batch commits
        self._table = stored
        self._schema, self._key_type, self._arrow_out = (
            pending.schema, pending.key_type, pending.arrow_out)
        self._kind, self._units, self._value_type = (
            pending.kind, pending.units, pending.value_type)
        self._ttl_units, self._processing_ttl_ms = pending.ttl_units, pending.processing_ttl_ms
        self._clock = pending.clock
        self.batches += 1
        return output

    def finish(self) -> pd.DataFrame:
        """End of bounded input: every key's watermark goes to infinity, so every timer fires
        and every window is emitted, then ``on_end`` runs for every key with state and
        ``on_watermark`` once more (as :func:`~trilink_spark.keyed_process` ends its frame).

        Returns
        -------
        pandas.DataFrame
            What the hooks emitted, as :meth:`run` returns it. Before any batch: an empty
            frame of the ``output_schema`` (which must then be declared, not derived).

        Raises
        ------
        InvalidArgumentError
            Called twice, or before any batch on a processor whose ``output_schema`` comes
            from ``bind`` (it is derived from the frame's columns).

        Notes
        -----
        Cost: the remaining timers and ``on_end`` hooks, plus O(state) to decode and encode.
        """
        with self._lock:
            if self._ended:
                raise InvalidArgumentError("finish() was called already: the input ended")
            arrow_out = self._arrow_out
            if arrow_out is None:
                if self.processor.output_schema is None:
                    raise InvalidArgumentError(
                        f"finish() before any batch: {type(self.processor).__name__} has no "
                        "output_schema yet (its bind derives it from a batch's columns)")
                arrow_out = self._output_schema()
            runtime = self._runtime(None, self._units, self._value_type)
            batches, _ = run_batch(runtime, 0, None, arrow_out, bounded=True)
            stored = encode_state(runtime.snapshot(), self._key_type, self._value_type)
            output = self._output(batches, arrow_out)
            # only once it ran: a finish() that raised changed nothing and can run again
            self._table, self._arrow_out, self._ended = stored, arrow_out, True
            return output

    end = finish

    # ------------------------------------------------------------------ state
    def state(self) -> pd.DataFrame:
        """One row per key of the stored state, as :func:`~trilink_spark.read_state` reads a
        stream's.

        Returns
        -------
        pandas.DataFrame
            ``key`` (exact: an integer key column with a null as pandas' ``Int64``, a
            floating one as ``Float64``, where the null key and the NaN key are two rows),
            ``partition`` (0), ``block`` (null: no block placement), ``watermark`` (the
            key's highest event time less the delay: a timestamp for a timestamp event time,
            else in its unit; null before its first on-time row), ``last_seen``, ``rows``, then one
            column per field of the ``state_schema`` (a field named like a column before it
            as ``state_<name>``), or ``values`` (each key's values as JSON text) without one.

        Notes
        -----
        Cost: O(keys), vectorised over the stored Arrow table.
        """
        with self._lock:
            table = self._table if self._table is not None else encode_state(
                PartitionState(), self._key_type, self._value_type)
            delay, kind = self._units[0], self._kind
        out = state_rows(table, delay)  # as read_state reads a stream's
        if kind == "timestamp":
            out = as_timestamps(out)
        frame: pd.DataFrame = runtime_frame(out, "key")
        return frame

    def counters(self) -> dict[str, int]:
        """Rows, late rows (key watermark) and the rows a partition watermark would have
        called late, over every batch so far (``run.counters()`` of a stream). O(1)."""
        total = {"rows": 0, "late": 0, "late_partition": 0}
        with self._lock:
            table = self._table
        if table is not None:
            found = read_counters(table, "the tester's state")
            total.update({k: found.get(k, 0) for k in total})
        return total

    # ------------------------------------------------------------------ the driver's part
    def _batch_table(self, frame: Any) -> tuple[Any, Any]:
        """The batch as Arrow, as Spark would hold it (module docs), schema checked, and the
        schema fixed after it (the first batch's: this one's)."""
        import pyarrow as pa

        if not isinstance(frame, pd.DataFrame):
            raise InvalidArgumentTypeError(
                f"frame must be a pandas DataFrame, got {type(frame).__name__}")
        bad = [c for c in frame.columns if not isinstance(c, str)]
        if bad:
            raise InvalidArgumentTypeError(
                f"column names must be str, got {bad[0]!r} ({type(bad[0]).__name__})")
        if frame.columns.has_duplicates:
            twice = sorted(set(frame.columns[frame.columns.duplicated()]))
            raise InvalidArgumentError(f"columns {twice} appear more than once in the frame")
        require_columns(frame, [self.key], "key column")
        require_columns(frame, [self.event_time], "event time column")
        require_columns(frame, [self.order_by], "order_by column")
        check_user_columns(frame)
        try:
            table = pa.Table.from_pandas(frame, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                ValueError, OverflowError) as err:
            raise InvalidArgumentTypeError(
                f"the frame does not convert to Arrow, as Spark would need it "
                f"({type(err).__name__}: {err})") from None
        table = table.replace_schema_metadata(None)
        table = pa.table([_as_spark_holds(table.column(i)) for i in range(table.num_columns)],
                         names=table.column_names)
        return (table, table.schema) if self._schema is None else self._fixed(table)

    def _fixed(self, table: Any) -> tuple[Any, Any]:
        """``table`` with the first batch's column types (module docs), and the fixed schema
        after it: a column the first batch knew no type of (all null) takes this one's. The
        tester's is left as it is (it is fixed once the batch succeeded)."""
        import pyarrow as pa

        fixed = self._schema
        columns, names = [], []
        for name in table.column_names:
            column = table.column(name)
            want = fixed.field(name).type if name in fixed.names else None
            if want is not None and pa.types.is_null(want) and not pa.types.is_null(
                    column.type):  # the first batch knew no type: this one's stands
                fixed = fixed.set(fixed.get_field_index(name), pa.field(name, column.type))
            elif want is not None and column.type != want:
                try:
                    column = column.cast(want)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
                    raise InvalidArgumentTypeError(
                        f"column {name!r} is {column.type} in batch {self.batches}, but the "
                        f"first batch fixed it as {want} (a stream's schema is fixed) and it "
                        f"does not cast ({err})") from None
            columns.append(column)
            names.append(name)
        return pa.table(columns, names=names), fixed

    def _prepare(self, table: Any, schema_after: Any, processing_time: Any) -> _Pending:
        """What a runner's driver and task do before the hooks: the schema checks, the
        processor's ``bind``, the state's types, the units; then the rows in arrival order,
        with their event times, as the task's frame, and the batch's processing time. All
        of it is returned, none set on the tester (``schema_after``: the schema fixed after
        this batch)."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        try:
            schema = from_arrow_schema(table.schema)
        except (TypeError, ValueError, NotImplementedError) as err:
            raise InvalidArgumentTypeError(
                f"the frame's columns have no Spark type ({type(err).__name__}: {err})") from None
        described: Any = _Described(schema)  # what the runners' checks read of a DataFrame
        kind = time_kind(described, self.event_time)
        check_atomic_key(described, self.key)
        if self._kind and kind != self._kind:  # pragma: no cover - the first batch fixed it
            raise InvalidArgumentTypeError(
                f"event time column {self.event_time!r} is {kind} in batch {self.batches}, "
                f"{self._kind} before")
        converted = self._units if self._kind else units(self.delay, self.idle_timeout, kind)
        self.processor.bind(schema, self.key, self.event_time, kind)
        arrow_out = self._output_schema()
        key_type = self._key_type
        if key_type is None and not pa.types.is_null(table.schema.field(self.key).type):
            key_type = table.schema.field(self.key).type
        value_type, ttl_units, processing_ms = (
            (self._value_type, self._ttl_units, self._processing_ttl_ms) if self._kind
            else self._first(kind, key_type))
        fixed = table.schema
        table = table.append_column(EVENT_TIME_COL, _event_units(
            table.column(self.event_time), kind, self.event_time))
        table = table.select([*carried_columns(self.processor, fixed, self.key, self.order_by),
                              EVENT_TIME_COL])
        if self.order_by is not None and table.num_rows > 1:
            table = table.take(_arrival(table.column(self.order_by)))
        if self.null_policy == "error" and table.column(self.key).null_count:
            raise null_key_error(f"column {self.key!r} has null keys")
        at, clock = self._batch_time(processing_time, processing_ms)
        return _Pending(runtime_frame(table, self.key) if table.num_rows else None, at, clock,
                        schema_after, key_type, kind, converted, value_type, ttl_units,
                        processing_ms, arrow_out)

    def _first(self, kind: str, key_type: Any) -> tuple[Any, float, float]:
        """After the first batch's ``bind``, as a runner's first micro-batch fixes them: the
        declared state's Arrow type, and the TTL in event-time units or in milliseconds of
        processing time."""
        value_type = self._state_type()
        ttl_units = processing_ms = math.inf
        if self.state_ttl_time == "processing":
            processing_ms = seconds(self.state_ttl, "state_ttl") * 1000.0
        elif self.state_ttl is not None:
            ttl_units = delay_in_units(self.state_ttl, kind, "state_ttl")
            if not ttl_units > 0:
                raise InvalidArgumentError(
                    f"state_ttl must be a positive duration, got {self.state_ttl!r}")
        if self.state_ttl is not None and key_type is not None \
                and not supports_key_type(key_type):
            raise InvalidArgumentError(
                "state_ttl needs the local state store (a key column of an integer, float, "
                f"boolean, string, binary, date or timestamp type: {', '.join(LOCAL_KEY_TYPES)}"
                f"); this key column is {key_type}")
        return value_type, ttl_units, processing_ms

    def _output_schema(self) -> Any:
        """The processor's ``output_schema`` as Arrow (UTC timestamps)."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        declared = self.processor.output_schema
        if declared is None:
            raise InvalidArgumentError(f"{type(self.processor).__name__} has no output_schema")
        parsed = struct_of(declared, "output_schema")
        if not isinstance(parsed, StructType):  # pragma: no cover - struct_of gives structs
            raise InvalidArgumentTypeError(f"output_schema must describe a struct, got "
                                           f"{declared!r}")
        try:
            return to_arrow_schema(parsed, timezone=OUTPUT_TIMEZONE)
        except (TypeError, ValueError, NotImplementedError) as err:
            raise InvalidArgumentTypeError(
                f"output_schema {declared!r} has no Arrow type ({err})") from None

    def _state_type(self) -> Any:
        """The declared ``state_schema`` as an Arrow struct, None without one (the checks of
        :func:`~trilink_spark.keyed.run.task.state_types`)."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        ddl = getattr(self.processor, "state_schema", None)
        if ddl is None:
            return None
        parsed = struct_of(ddl, "state_schema")
        try:
            value_type = to_arrow_type(parsed)
        except (TypeError, ValueError, NotImplementedError) as err:
            raise InvalidArgumentTypeError(
                f"state_schema {ddl!r} has no Arrow type ({err})") from None
        if not pa.types.is_struct(value_type):  # pragma: no cover - struct_of gives structs
            raise InvalidArgumentError(f"state_schema {ddl!r} must describe a struct")
        return value_type

    def _batch_time(self, processing_time: Any, processing_ttl_ms: float
                    ) -> tuple[float | None, tuple[float, float] | None]:
        """The batch's processing time in whole ms (None without a processing-time TTL):
        never below the last batch's; the first batch's is the TTL's ``since``; and the clock
        after the batch (the batch's time, the first's), which the tester takes once the
        batch succeeded."""
        if not math.isfinite(processing_ttl_ms):
            return None, self._clock
        now = _processing_ms(time.time() if processing_time is None else processing_time)
        last, since = self._clock if self._clock is not None else (None, None)
        at = processing_time_after(now, [] if last is None else [last])
        return at, (at, at if since is None else since)

    def _runtime(self, at: float | None, delay_idle: tuple[float, float],
                 value_type: Any) -> KeyedRuntime:
        """The partition's runtime for the next batch: the shipped processor and the state
        decoded from the stored table, with the batch's units and state type."""
        previous = None if self._table is None else decode_state(
            self._table, f"the tester's state before batch {self.batches}")
        fields = None if value_type is None else {f.name: f.type for f in value_type}
        delay, idle = delay_idle
        return KeyedRuntime(_ship(self.processor), self.key, delay, idle, previous, fields, at)

    def _output(self, batches: list[Any], schema: Any) -> pd.DataFrame:
        """The batch's output batches as one pandas frame of the output ``schema``."""
        import pyarrow as pa

        try:
            table = pa.Table.from_batches(
                [pa.RecordBatch.from_arrays(b.columns, schema=schema) for b in batches],
                schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:  # pragma: no cover - converted
            raise TrilinkError(f"output batches do not match the output schema ({err})") \
                from None
        frame: pd.DataFrame = table.to_pandas()
        return frame


def _is_duration(value: Any) -> bool:
    """Whether ``value`` is a duration only a timestamp event time takes (a string or a
    timedelta)."""
    from datetime import timedelta

    return isinstance(value, (str, timedelta))


def _as_spark_holds(column: Any) -> Any:
    """A column as Spark would hand it to a task: timestamps as UTC microseconds (naive
    ones taken as UTC, nanoseconds truncated), dictionaries (pandas categoricals) as their
    values. O(rows) for those columns; others as they are."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_timestamp(column.type) and (column.type.unit != "us"
                                               or column.type.tz != "UTC"):
        column = column.cast(pa.timestamp("us", tz="UTC"), safe=False)
    return column


def _arrival(column: Any) -> Any:
    """Row positions sorted by ``column`` as Spark's ``sortWithinPartitions`` orders them
    ascending: nulls first, NaN after every number; ties keep their order (a stable sort).
    O(rows log rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    nulls = pc.invert(pc.is_null(values)).cast(pa.int8())  # 0 for a null: first
    keys = {"present": nulls}
    if pa.types.is_floating(values.type):
        nan = pc.fill_null(pc.is_nan(values), False)
        keys["nan"] = nan.cast(pa.int8())  # NaN after every number
        values = pc.if_else(nan, pa.scalar(None, values.type), values)
    keys["value"] = values
    order = pc.sort_indices(pa.table(keys), sort_keys=[(n, "ascending") for n in keys])
    return order


def _event_units(column: Any, kind: str, name: str) -> Any:
    """The event time in internal units (float64, NaN for null): microseconds for a timestamp
    column, the column's own unit otherwise; a value beyond 2**53 of a timestamp or integral
    column is refused, as the runners refuse it (:func:`~trilink_spark.eventtime.event_time_whole`).
    O(rows), vectorised."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if kind == "timestamp":
        values = values.cast(pa.int64())
    if kind != "fractional":
        beyond = pc.or_(pc.greater(values, MAX_EXACT), pc.less(values, -MAX_EXACT))
        if pc.any(beyond).as_py():
            unit = "microseconds" if kind == "timestamp" else "units"
            raise InvalidArgumentError(
                f"event time column {name!r} has a value beyond +-2**53 {unit}, which cannot "
                "be represented exactly; convert it first (for nanosecond epochs: a timestamp "
                "column, or the value divided by 1000 as microseconds)")
    units = pc.fill_null(values.cast(pa.float64(), safe=False), math.nan)
    return pa.array(np.asarray(units.to_numpy(zero_copy_only=False), dtype=np.float64))
