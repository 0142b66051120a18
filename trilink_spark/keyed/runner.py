"""Run a keyed process function with Spark: on a batch DataFrame or a streaming query.

:func:`keyed_process` places the rows with :func:`~trilink_spark.key_by` (one shuffle), sorts
each partition in arrival order and runs the processor over every partition (``mapInArrow``).

:func:`keyed_foreach_batch` does the same for each micro-batch of a Structured Streaming query
and keeps each partition's state (watermarks, timers, window accumulators, user state) between
micro-batches in a :class:`~trilink_spark.KeyedStateStore`, versioned by batch id.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..columns import EVENT_TIME_COL, PARTITION_COL, POS_COL, check_user_columns
from ..columns import check_atomic_key, column_of, require_columns
from .._internal.spark.compat import num_partitions, streaming_query_id
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ..errors import StateOwnershipError, TrilinkError
from ..eventtime import delay_in_units, event_time_micros
from .._internal.optiming import OperatorTimer, Stopwatch, operator_timer
from ..partitioners import BlockPartitioner, Partitioner
from ..placement.key_by import place_rows, resolve_strategy
from ..placement.source import check_source_layout, is_keyed_by_source
from ..state.store import KEY_FIELD, KeyedStateStore, StatefulBatchFunction
from .process import KeyedRuntime, KeyedWatermarkProcessFunction
from .snapshot import PartitionState, decode_state, encode_state, merge_in, read_counters
from .snapshot import split_out
from .swap import SwapReport, SwapRequest, plan_swap, write_segments

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["keyed_process", "keyed_foreach_batch", "KeyedBatchFunction", "StateIO"]

logger = logging.getLogger(__name__)


def _outputs_to_batches(outs: list[Any], arrow_schema: Any) -> Iterator[Any]:
    """The processor's outputs, in order, as Arrow batches of ``arrow_schema``.

    Row outputs (iterables of tuples) are gathered across calls and converted once per run of
    consecutive row outputs, not once per call: a per-key conversion costs about a
    millisecond, which on a thousand keys was most of a batch. Cost: O(output rows).
    """
    import pandas as pd
    import pyarrow as pa

    names = arrow_schema.names
    rows: list[Any] = []

    def convert(frame: pd.DataFrame) -> Iterator[Any]:
        if not len(frame):
            return
        missing = [n for n in names if n not in frame.columns]
        if missing:
            raise InvalidArgumentError(f"processor output lacks column(s) {missing}")
        try:
            table = pa.Table.from_pandas(frame[names], schema=arrow_schema,
                                         preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError,
                OverflowError) as err:
            raise InvalidArgumentError(
                f"processor output does not fit its output_schema {names} "
                f"({type(err).__name__}: {err})") from None
        yield from table.to_batches()

    for out in outs:
        if out is None:
            continue
        if isinstance(out, pd.DataFrame):
            if rows:
                yield from convert(_rows_frame(rows, arrow_schema))
                rows = []
            yield from convert(out)
        else:
            rows.extend(out)
    if rows:
        yield from convert(_rows_frame(rows, arrow_schema))


def _rows_frame(rows: list[Any], arrow_schema: Any) -> Any:
    """The row outputs of several processor calls as one frame, as each call's own frame
    would have held them: each row is a sequence of exactly one value per column (or a dict
    by column name), and an integer column stays exact where pandas would turn a mix of ints
    and nulls from different calls into floats. O(rows x columns)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    names = arrow_schema.names
    width = len(names)
    if any(isinstance(row, dict) for row in rows):
        rows = [tuple(row.get(n) for n in names) if isinstance(row, dict) else row
                for row in rows]
    for row in rows:
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != width:
            shown = repr(row)[:80]
            raise InvalidArgumentError(
                f"processor output row {shown} does not hold one value per column of "
                f"output_schema {names} ({width} values)")
    frame = pd.DataFrame(rows, columns=names)
    for i, field in enumerate(arrow_schema):
        if pa.types.is_integer(field.type) and frame[names[i]].dtype.kind not in "iu":
            values = [row[i] for row in rows]
            if all(v is None or isinstance(v, (int, np.integer))
                   or (isinstance(v, float) and (math.isnan(v) or v.is_integer()))
                   for v in values):
                try:
                    frame[names[i]] = pd.array(values, dtype="Int64")
                except (TypeError, ValueError, OverflowError):
                    pass  # beyond a long: left to the conversion, which refuses it
    return frame


@dataclass(frozen=True)
class StateIO:
    """What a task of a stateful batch needs to load and save its partition's state
    (picklable; shipped with the task).

    Attributes
    ----------
    store : KeyedStateStore
    batch_id : int
        The version the task writes.
    prev : int or None
        The version it starts from (None: empty state).
    prev_partitions : int
        Partitions that existed at ``prev``; a task of a partition at or above starts empty.
    swap : bool
        Whether ``batch_id`` has a swap plan: then the task drops its outgoing keys and takes
        in its incoming segments.
    key_type, value_type : pyarrow.DataType or None
        The key column's type and the processor's declared ``state_schema``.
    blocks : BlockPartitioner or None
        The placement when it is a block table: each task then counts its rows per block,
        and stores the counts with its timing (:meth:`KeyedStateStore.save_timing`).
    """

    store: KeyedStateStore
    batch_id: int
    prev: int | None
    prev_partitions: int
    swap: bool
    key_type: Any
    value_type: Any
    blocks: BlockPartitioner | None = None

    def load(self, pid: int) -> Any:
        """The state table partition ``pid`` starts this batch from (None: empty)."""
        import pyarrow.compute as pc

        table = None
        if self.prev is not None and pid < self.prev_partitions:
            table = self.store.load_table(pid, self.prev)
        if not self.swap:
            return table
        moves = self.store.load_moves(self.batch_id)
        if table is not None:
            leaving = moves.filter(pc.equal(moves.column("from"), pid))
            table, _ = split_out(table, leaving.column(KEY_FIELD).combine_chunks())
        arriving = moves.filter(pc.equal(moves.column("to"), pid))
        sources = sorted(set(arriving.column("from").to_pylist()))
        incoming = [self.store.load_segment(self.batch_id, s, pid) for s in sources]
        for source, segment in zip(sources, incoming):
            expected = arriving.filter(pc.equal(arriving.column("from"), source))
            if not _holds_exactly(segment, expected.column(KEY_FIELD)):
                raise StateCorruptError(
                    f"{self.store.segment_path(self.batch_id, source)}: its segment for "
                    f"partition {pid} holds {segment.num_rows} rows, not the "
                    f"{expected.num_rows} keys batch {self.batch_id}'s plan moves from "
                    f"partition {source} to {pid} (each once); it is not this swap's segment")
        return merge_in(table, incoming)

    def carry_forward(self, pid: int) -> None:
        """Write ``pid``'s version as it stands (no task ran for it: an empty micro-batch)."""
        table = self.load(pid)
        if table is None:
            table = encode_state(PartitionState(), self.key_type, self.value_type)
        self.store.save_table(pid, self.batch_id, table)

    def save(self, pid: int, state: PartitionState, timing: dict[str, Any] | None = None
             ) -> None:
        """Write ``pid``'s version, and the task's ``timing`` in a file beside it
        (:meth:`KeyedStateStore.save_timing`). The state is the batch's result; the timing is
        a measurement, so failing to write it (a junk file in its place, a full disk) is
        logged and never fails the task."""
        self.store.save_table(pid, self.batch_id, encode_state(state, self.key_type,
                                                               self.value_type))
        if timing is not None:
            try:
                self.store.save_timing(pid, self.batch_id, timing)
            except (TrilinkError, OSError, ValueError, TypeError) as err:
                logger.warning("partition %d, batch %d: timing not written (%s: %s)", pid,
                               self.batch_id, type(err).__name__, err)

    def block_rows(self, keys: Any) -> dict[str, list[int]] | None:
        """Rows per block of ``keys`` (sparse: the blocks that got rows), or None without a
        block placement. O(rows), vectorised."""
        if self.blocks is None:
            return None
        if len(keys) == 0:
            return {"blocks": [], "rows": []}
        try:
            blocks = self.blocks.blocks(keys)
        except (TrilinkError, ValueError, TypeError, OverflowError) as err:
            # a measurement never fails the batch: the placement itself ran already
            logger.warning("rows per block not counted (%s: %s)", type(err).__name__, err)
            return None
        counts = np.bincount(blocks[blocks >= 0], minlength=self.blocks.num_blocks)  # no nulls
        used = np.flatnonzero(counts)
        return {"blocks": used.tolist(), "rows": counts[used].tolist()}


def _holds_exactly(segment: Any, keys: Any) -> bool:
    """Whether ``segment``'s key column holds exactly ``keys``, each once (a null key
    included). O(rows), vectorised."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if segment.num_rows != len(keys) or KEY_FIELD not in segment.column_names:
        return False
    if not segment.num_rows:
        return True
    held = segment.column(KEY_FIELD)
    try:
        wanted = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        if wanted.type != held.type:
            wanted = wanted.cast(held.type)
        distinct = pc.count_distinct(held, mode="all").as_py()
        found = pc.all(pc.is_in(held, value_set=wanted)).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return bool(distinct == segment.num_rows and found)


def _value_fields(value_type: Any) -> dict[str, Any] | None:
    if value_type is None:
        return None
    return {f.name: f.type for f in value_type}


def _partition_function(
    processor: KeyedWatermarkProcessFunction,
    key: str,
    delay: float,
    idle_timeout: float,
    arrow_schema: Any,
    io: StateIO | None,
    timer: OperatorTimer | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    value_type = None if io is None else io.value_type
    fields = _value_fields(value_type)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        pid = context.partitionId() if context is not None else 0
        started = time.perf_counter()
        watch = Stopwatch()
        received = list(watch.pull(batches))
        frame = (_in_arrival_order(pa.Table.from_batches(received)).to_pandas()
                 if received else None)
        if frame is not None and not len(frame):
            frame = None
        previous = None
        if io is not None:
            table = io.load(pid)
            where = f"state of partition {pid} before batch {io.batch_id}"
            previous = None if table is None else decode_state(table, where)
        runtime = KeyedRuntime(processor, key, delay, idle_timeout, previous, fields)
        processor.open(pid)
        outs = [] if frame is None else runtime.process(frame)
        if io is None:
            outs += runtime.finish()
        processor.close()
        batches_out = list(_outputs_to_batches(outs, arrow_schema))
        if io is not None:
            state = runtime.snapshot()
            timing: dict[str, Any] = {
                "rows": 0 if frame is None else len(frame),
                "process_ms": round((time.perf_counter() - started) * 1000.0, 3),
            }
            per_block = io.block_rows([] if frame is None else frame[key].to_numpy())
            if per_block is not None:
                timing["block_rows"] = per_block
            io.save(pid, state, timing)
        yield from watch.emit(batches_out)
        if timer is not None:
            timer.write(rows_in=0 if frame is None else len(frame),
                        rows_out=sum(b.num_rows for b in batches_out),
                        busy_ms=watch.busy_ms(), wait_ms=watch.wait_ms)

    return run


def _prepare(
    df: DataFrame,
    key: str,
    event_time: str,
    processor: KeyedWatermarkProcessFunction,
    delay: Any,
    order_by: str | None,
    idle_timeout: Any,
) -> tuple[DataFrame, float, float, Any, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    if not isinstance(processor, KeyedWatermarkProcessFunction):
        raise InvalidArgumentTypeError(
            f"processor must be a KeyedWatermarkProcessFunction, got {type(processor).__name__}"
        )
    require_columns(df, [key], "key column")
    require_columns(df, [order_by], "order_by column")
    check_user_columns(df)
    check_atomic_key(df, key)
    et_col, kind = event_time_micros(df, event_time)
    delay_units = delay_in_units(delay, kind)
    if idle_timeout is None:
        idle_units = 4 * delay_units if delay_units > 0 else math.inf
    else:
        idle_units = (delay_in_units(idle_timeout, kind, "idle_timeout")
                      if idle_timeout != math.inf else math.inf)
    processor.bind(df.schema, key, event_time, kind)
    if processor.output_schema is None:
        raise InvalidArgumentError(f"{type(processor).__name__} has no output_schema")
    schema = processor.output_schema
    parsed = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    if not isinstance(parsed, StructType):
        raise InvalidArgumentTypeError(f"output_schema must describe a struct, got {schema!r}")
    out_schema = parsed
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_schema, timezone=timezone)
    wanted = processor.input_columns()
    if wanted is None:  # the hooks may read any column
        carried = [F.col("*")]
    else:  # only what the processor reads crosses the exchange and into Python
        listed = (None if isinstance(wanted, (str, bytes)) or not isinstance(wanted, Iterable)
                  else list(wanted))  # read once: a generator would be empty the 2nd time
        if listed is None or not all(isinstance(c, str) for c in listed):
            raise InvalidArgumentTypeError(
                f"{type(processor).__name__}.input_columns() must return a list of column "
                f"names or None, got {wanted!r:.80}")
        wanted = listed
        require_columns(df, wanted, "input column")
        names = list(dict.fromkeys([key, *wanted, *([order_by] if order_by else [])]))
        carried = [column_of(c) for c in names]
    tagged = df.select(*carried, F.monotonically_increasing_id().alias(POS_COL),
                       et_col.alias(EVENT_TIME_COL))
    return tagged, delay_units, idle_units, out_schema, arrow_schema


def _arrival_order(placed: DataFrame, order_by: str | None) -> DataFrame:
    """``placed`` without the placement's column, in arrival order within each partition.

    With ``order_by``, Spark sorts each partition by (``order_by``, arrival position) and the
    position stays behind. Without it, the arrival position (:data:`POS_COL`) crosses into
    Python instead and the task puts its rows in that order (:func:`_in_arrival_order`):
    after the exchange a partition holds one increasing run of positions per map task, which
    a stable numpy sort merges in O(rows log runs), where Spark's sort of the whole rows cost
    about a fifth of the keyed job (benches/RESULTS.md, §18)."""
    if order_by is None:
        keep = [column_of(c) for c in placed.columns if c != PARTITION_COL]
        return placed.select(*keep)
    ordered = placed.sortWithinPartitions(order_by, POS_COL)
    keep = [column_of(c) for c in placed.columns if c not in (PARTITION_COL, POS_COL)]
    return ordered.select(*keep)


def _in_arrival_order(table: Any) -> Any:
    """A partition's Arrow table in arrival order, without :data:`POS_COL` (a table without
    it is already in order: Spark sorted it). O(rows log runs) for rows that arrive as a few
    increasing runs of positions, O(rows log rows) at worst."""
    if POS_COL not in table.column_names:
        return table
    positions = table[POS_COL].to_numpy()
    rest = table.drop_columns([POS_COL])
    if len(positions) < 2 or bool(np.all(positions[1:] > positions[:-1])):
        return rest
    return rest.take(np.argsort(positions, kind="stable"))


def _in_place(declared: DataFrame, key: str, tagged: DataFrame) -> DataFrame:
    """Ahead KeyBy: ``tagged`` stays where it was read; its partition id is the input one."""
    from pyspark.sql import functions as F

    check_source_layout(declared, key)
    placed: DataFrame = tagged.withColumn(PARTITION_COL, F.spark_partition_id())
    return placed


def keyed_process(
    df: DataFrame,
    key: str,
    event_time: str,
    processor: KeyedWatermarkProcessFunction,
    delay: Any,
    order_by: str | None = None,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    *,
    idle_timeout: Any = None,
) -> DataFrame:
    """Run a keyed process function over a bounded DataFrame.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key, event_time : str
        Key and event-time (timestamp or numeric) columns.
    processor : KeyedWatermarkProcessFunction
        E.g. :class:`~trilink_spark.KeyedWindowAggregate`.
    delay : str, float or datetime.timedelta
        Allowed lateness: an interval string (``"10 seconds"``), seconds or a timedelta for
        timestamps; the column's unit otherwise.
    order_by : str, optional
        Arrival order; default the input order.
    strategy, num_partitions
        Placement, as in :func:`~trilink_spark.key_by`.
    idle_timeout : str, float or timedelta, optional
        When a key counts as idle (an interval string such as ``"2 minutes"`` too) (module docs of :mod:`~trilink_spark.keyed.process`);
        default 4 x ``delay``; ``math.inf`` never.

    Returns
    -------
    pyspark.sql.DataFrame
        The rows the hooks returned, with the processor's ``output_schema``. The input is
        bounded: when it ends every key's watermark goes to infinity, so all timers fire.

    Notes
    -----
    Cost: the one shuffle of ``key_by`` (none on a frame declared with
    :func:`~trilink_spark.keyed_by_source`: each input partition is processed where it is),
    a sort of each partition by arrival, then one Python
    task per partition holding that partition's rows in memory (as ``applyInPandas`` does
    per group). Per-key hooks cost one Python call per key and hook; ``KeyedWindowAggregate``
    is vectorised over all keys.

    Examples
    --------
    >>> counts = tl.keyed_process(df, "sensor", "ts", tl.KeyedWindowAggregate(60.0),
    ...                           delay=5.0)  # doctest: +SKIP
    """
    tagged, delay_units, idle_units, out_schema, arrow_schema = _prepare(
        df, key, event_time, processor, delay, order_by, idle_timeout
    )
    if is_keyed_by_source(df, key):
        placed = _in_place(df, key, tagged)
    else:
        placed = place_rows(tagged, key, strategy, num_partitions)
    placed = _arrival_order(placed, order_by)
    fn = _partition_function(processor, key, delay_units, idle_units, arrow_schema, None,
                             operator_timer(df.sparkSession, "keyed"))
    return placed.mapInArrow(fn, out_schema)


@dataclass(frozen=True)
class _Placed:
    """The placement of one batch (:meth:`KeyedBatchFunction._placement`)."""

    strategy: Partitioner
    prev_partitions: int  # partitions at the version the batch starts from
    plan: dict[str, Any] | None  # the swap plan, when the batch moves state
    moves: Any  # its moves table (key, from, to)
    new: bool  # the placement starts at this batch


def _query_id(batch_df: DataFrame) -> str | None:
    """The streaming query running this batch (None outside one, or on Spark Connect)."""
    return streaming_query_id(batch_df)


def _normalised(value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return out


class KeyedBatchFunction(StatefulBatchFunction):
    """The ``foreachBatch`` callable of :func:`keyed_foreach_batch`.

    Attributes
    ----------
    swaps : list of SwapReport
        One report per batch that moved state (:meth:`request_swap`).
    """

    def __init__(self, func: Callable[[DataFrame, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        super().__init__(func, store, options)
        self.token = uuid.uuid4().hex
        self.swaps: list[SwapReport] = []
        #: ``(batch_id, decision)`` of every batch the rebalancer judged, each batch once.
        self.rebalances: list[tuple[int, Any]] = []
        self._rebalanced_through: int | None = None  # the last batch the rebalancer saw
        self._request: SwapRequest | None = None
        self._lock = threading.Lock()
        self._checked = False
        self._types: tuple[Any, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ swaps
    def request_swap(self, strategy: str | Partitioner | None = None, *,
                     num_partitions: int | None = None, refit: str = "minimal",
                     mode: str = "sync", max_keys_per_batch: int | None = None) -> None:
        """Change the placement (strategy or partition count) at the next micro-batch.

        Parameters
        ----------
        strategy : str or Partitioner, optional
            The new placement; default the current one, re-fitted.
        num_partitions : int, optional
            The new partition count (a rescale).
        refit : {"minimal", "none"}
            ``"minimal"`` (default): :func:`~trilink_spark.rebalance_minimal` from the current
            (or given) placement, with the stored keys' row counts as loads, so only the keys
            needed for balance move. ``"none"``: the given strategy as it is (a table
            strategy without a table is fitted on the stored keys' counts).
        mode : {"sync", "fluid"}
            ``"sync"`` moves every key at the next batch. ``"fluid"`` moves at most
            ``max_keys_per_batch`` per batch, heaviest first, until done.
        max_keys_per_batch : int, optional
            Required for ``"fluid"``.

        Raises
        ------
        InvalidArgumentError
            Bad arguments, or a fluid swap still under way.

        Notes
        -----
        Nothing happens until the next batch: then the driver plans the swap from the stored
        keys (O(keys)), one small Spark job writes the moved keys' state as segments, and
        each task of the batch starts from its own state minus outgoing keys plus incoming
        ones. Only moved keys' state is rewritten; the query never stops. A report is
        appended to :attr:`swaps`.

        Examples
        --------
        >>> run.request_swap(num_partitions=8)  # doctest: +SKIP
        >>> run.request_swap("least_count", mode="fluid", max_keys_per_batch=1000)  # doctest: +SKIP
        """
        request = SwapRequest.checked(strategy, num_partitions, refit, mode, max_keys_per_batch)
        manifest = self.store.read_manifest()
        committed = [] if manifest is None else manifest.get("committed", [])
        last = self.store.load_plan(int(committed[-1])) if committed else None
        if last is not None and not last["complete"]:
            raise InvalidArgumentError(
                "a fluid swap is under way; request another once run.swaps[-1].complete is "
                "True (or call run.cancel_swap() to drop a pending request)")
        with self._lock:
            self._request = request

    def cancel_swap(self) -> SwapRequest | None:
        """Drop the swap requested for the next batch (one under way goes on); returns it."""
        with self._lock:
            request, self._request = self._request, None
        return request

    @property
    def pending_swap(self) -> SwapRequest | None:
        """The swap requested for the next batch, if any."""
        return self._request

    # ------------------------------------------------------------------ the batch
    def _config(self, delay_units: float, idle_units: float, value_type: Any) -> dict[str, Any]:
        o = self.options
        processor = o["processor"]
        return _normalised({
            "key": o["key"], "event_time": o["event_time"], "order_by": o["order_by"],
            "delay": delay_units, "idle_timeout": idle_units,
            "processor": f"{type(processor).__module__}.{type(processor).__qualname__}",
            "processor_config": processor.state_config(),
            "state_schema": None if value_type is None else str(value_type),
        })

    def _claim(self, manifest: dict[str, Any] | None, query: str | None,
               config: dict[str, Any]) -> None:
        """Refuse a second writer and a changed configuration (checked at each batch)."""
        if manifest is None:
            return
        owner = manifest.get("owner") or {}
        ours = owner.get("token") == self.token or (query is not None
                                                    and owner.get("query") == query)
        if owner and not ours and not self.options["takeover"]:
            raise StateOwnershipError(
                f"state at {self.store.path} is written by another runner (query "
                f"{owner.get('query') or 'none'}, runner {owner.get('token')}); this is query "
                f"{query or 'none'}, runner {self.token}. One writer per state path: give this "
                "query its own state_path, or pass takeover=True once the other has stopped "
                "for good"
            )
        stored = manifest.get("config")
        if stored is not None and json.dumps(stored, sort_keys=True) != json.dumps(
                config, sort_keys=True):
            changed = sorted(k for k in set(stored) | set(config)
                             if stored.get(k) != config.get(k))
            raise InvalidArgumentError(
                f"state at {self.store.path} was written with another configuration "
                f"({', '.join(f'{k}: {stored.get(k)!r} -> {config.get(k)!r}' for k in changed)})"
                "; restore the original settings or start from a new state_path"
            )

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        o = self.options
        tagged, delay_units, idle_units, out_schema, arrow_schema = _prepare(
            batch_df, o["key"], o["event_time"], o["processor"], o["delay"], o["order_by"],
            o["idle_timeout"],
        )
        if self._types is None:  # a stream's schema is fixed: parse the state types once
            self._types = _state_types(batch_df, o["key"], o["processor"])
        key_type, value_type = self._types
        config = self._config(delay_units, idle_units, value_type)
        query = _query_id(batch_df)
        manifest = self.store.read_manifest()
        self._claim(manifest, query, config)
        committed = [] if manifest is None else [int(c) for c in manifest.get("committed", [])]
        if committed and batch_id < committed[-1]:
            raise StateCorruptError(
                f"state at {self.store.path} is at batch {committed[-1]}, ahead of batch "
                f"{batch_id}: the query's checkpoint is older than its state; restore the "
                "checkpoint or start from a new state_path")
        earlier = [c for c in committed if c < batch_id]
        prev = earlier[-1] if earlier else None
        source = is_keyed_by_source(batch_df, o["key"])
        swap_plan: dict[str, Any] | None = None
        moved_bytes = 0
        if source:
            placed, partitions = self._source_placed(batch_df, tagged, prev)
            prev_partitions = partitions
            new_placement = prev is None
            if new_placement:
                self.store.save_placement(batch_id, None, partitions)
        else:
            chosen = self._placement(batch_df, batch_id, prev)
            prev_partitions, swap_plan, new_placement = (chosen.prev_partitions, chosen.plan,
                                                         chosen.new)
            placed = place_rows(tagged, o["key"], chosen.strategy, fit="none")
            partitions = chosen.strategy.num_partitions
            if swap_plan is not None:
                planned = time.perf_counter()
                moved_bytes = write_segments(batch_df.sparkSession, self.store, batch_id,
                                             int(swap_plan["prev"]), chosen.moves)
                logger.info("batch %d: swap planned in %.3f s, segments written in %.3f s",
                            batch_id, planned - started, time.perf_counter() - planned)
        blocks = None if source else chosen.strategy
        io = StateIO(self.store, batch_id, prev, prev_partitions, swap_plan is not None,
                     key_type, value_type,
                     blocks if isinstance(blocks, BlockPartitioner) else None)
        placed = _arrival_order(placed, o["order_by"])
        fn = _partition_function(o["processor"], o["key"], delay_units, idle_units,
                                 arrow_schema, io,
                                 operator_timer(batch_df.sparkSession, "keyed"))
        out = placed.mapInArrow(fn, out_schema)
        self.func(out, batch_id)
        listed = self._ensure_written(out, batch_id, partitions, fill=io.carry_forward)
        self._commit(batch_id, prev, query, config, new_placement)
        self.store.prune(partitions, batch_id, keep_from=prev, listed=listed)
        if o.get("rebalancer") is not None and not source:
            self._rebalance(batch_id, chosen.strategy, partitions)
        if swap_plan is not None:
            self.swaps.append(SwapReport(
                batch_id=batch_id, mode=str(swap_plan["mode"]),
                partitions_before=int(swap_plan["partitions_before"]),
                partitions_after=int(swap_plan["partitions_after"]),
                keys_total=int(swap_plan["keys_total"]),
                moved_keys=int(swap_plan["moved_keys"]), moved_bytes=moved_bytes,
                complete=bool(swap_plan["complete"]),
                seconds=time.perf_counter() - started))

    def _commit(self, batch_id: int, prev: int | None, query: str | None,
                config: dict[str, Any], new_placement: bool) -> None:
        """Record the batch as committed (after every partition wrote it)."""
        manifest = self.store.read_manifest() or {}
        self._claim(manifest or None, query, config)
        placements = sorted(set(manifest.get("placements", [])) | (
            {batch_id} if new_placement else set()))
        manifest.update({
            "owner": {"token": self.token, "query": query},
            "config": config,
            "committed": [c for c in (prev, batch_id) if c is not None],
            "placements": placements,
        })
        self.store.write_manifest(manifest)
        self._checked = True

    def _placement(self, batch_df: DataFrame, batch_id: int, prev: int | None) -> _Placed:
        """The placement of ``batch_id``, and the swap plan when it moves state. A new
        placement (the first batch's, or a swap's) is stored before any task runs."""
        plan = self.store.load_plan(batch_id)
        if plan is not None:  # decided by an earlier attempt of this batch: never re-decide
            _, before = self.store.placement_at(int(plan["prev"]))
            return _Placed(Partitioner.from_dict(plan["placement"]), before, plan,
                           self.store.load_moves(batch_id), True)
        if prev is None:
            return _Placed(self._first_placement(batch_df, batch_id), 0, None, None, True)
        current, prev_partitions = self.store.placement_at(prev)
        if current is None:
            raise InvalidArgumentError(
                f"state at {self.store.path} was placed by keyed_by_source; a key_by stream "
                "needs its own state_path")
        last = self.store.load_plan(prev)
        unfinished = last if last is not None and not last["complete"] else None
        request, target = self._pending(batch_df, batch_id, current, unfinished)
        if request is None:
            return _Placed(current, prev_partitions, None, None, False)
        try:
            plan, moves, placement = plan_swap(self.store, batch_id, prev, current, request,
                                               target)
            self.store.save_placement(batch_id, placement, placement.num_partitions)
            self.store.save_plan(batch_id, plan, moves)
        finally:  # planned or not, a request is used once: it never blocks later batches
            with self._lock:
                if self._request is request:
                    self._request = None
        logger.info("batch %d: swap %s, %d of %d keys move, %d -> %d partitions", batch_id,
                    plan["mode"], plan["moved_keys"], plan["keys_total"],
                    plan["partitions_before"], plan["partitions_after"])
        return _Placed(placement, prev_partitions, plan, moves, True)

    def _first_placement(self, batch_df: DataFrame, batch_id: int) -> Partitioner:
        """The first batch's placement: decided once (an earlier attempt's is reused)."""
        o = self.options
        stored, _ = self.store.load_placement(batch_id, missing_ok=True)
        if stored is not None:
            return stored
        if self.store.load_strategy() is not None:
            raise StateCorruptError(
                f"state at {self.store.path} has a strategy.json but no manifest: it was "
                "written by an older trilink-spark; start from a new state_path")
        configured = o["strategy"]
        if isinstance(configured, Partitioner) and configured.unwrap() is not configured:
            configured.before_batch(batch_df, o["key"], batch_id)  # adaptive: decide
            configured = configured.unwrap().copy()
        strategy = resolve_strategy(batch_df, o["key"], configured,
                                    o["num_partitions"]).partitioner
        self.store.save_placement(batch_id, strategy, strategy.num_partitions)
        return strategy

    def _pending(self, batch_df: DataFrame, batch_id: int, current: Partitioner,
                 unfinished: dict[str, Any] | None
                 ) -> tuple[SwapRequest | None, Partitioner | None]:
        """The swap to run now, and the target it resumes: an unfinished fluid swap, else a
        request (an adaptive strategy's switch included), else a changed ``num_partitions``
        given at a restart."""
        if unfinished is not None:
            if self._request is not None:
                raise InvalidArgumentError(
                    "a fluid swap is under way; request another once run.swaps[-1].complete "
                    "is True")
            resume = SwapRequest(None, None, "none", "fluid", unfinished.get("max_keys_per_batch"))
            return resume, Partitioner.from_dict(unfinished["target"])
        self._adapt(batch_df, batch_id, current)
        with self._lock:
            request = self._request
        if request is None and not self._checked:
            wanted = self.options["num_partitions"]
            if wanted is not None and wanted != current.num_partitions:
                logger.info("state at %s has %d partitions; num_partitions=%d: swapping",
                            self.store.path, current.num_partitions, wanted)
                request = SwapRequest.checked(None, wanted, "minimal", "sync", None)
        return request, None

    def _adapt(self, batch_df: DataFrame, batch_id: int, current: Partitioner) -> None:
        """An adaptive strategy decides before each new batch; a switch becomes a request."""
        configured = self.options["strategy"]
        if not isinstance(configured, Partitioner) or configured.unwrap() is configured \
                or self._request is not None:
            return
        configured.before_batch(batch_df, self.options["key"], batch_id)
        wanted = configured.unwrap()
        if type(wanted) is type(current) and wanted.num_partitions == current.num_partitions:
            return
        logger.info("batch %d: the adaptive strategy switched to %s; swapping state",
                    batch_id, type(wanted).__name__)
        with self._lock:
            self._request = SwapRequest(wanted.copy(), None, "none", "sync", None)

    def _source_placed(self, batch_df: DataFrame, tagged: DataFrame,
                       prev: int | None) -> tuple[DataFrame, int]:
        """Ahead KeyBy: each input (Kafka) partition keeps its rows and its own state."""
        placed = _in_place(batch_df, self.options["key"], tagged)
        partitions = num_partitions(batch_df)  # Spark Connect: one Spark job
        if prev is None:
            return placed, partitions
        stored, stored_partitions = self.store.placement_at(prev)
        if stored is not None:
            raise InvalidArgumentError(
                f"state at {self.store.path} was placed by key_by; a keyed_by_source stream "
                "needs its own state_path"
            )
        if partitions != stored_partitions:
            raise InvalidArgumentError(
                f"state at {self.store.path} has {stored_partitions} partitions, but this "
                f"micro-batch has {partitions} input partitions; the topic's partition count "
                "changed, which would strand that state"
            )
        return placed, partitions

    def _rebalance(self, batch_id: int, current: Partitioner, partitions: int) -> None:
        """Show the rebalancer this batch's figures; a decision with moves becomes a swap
        at the next batch (only the moved blocks' state travels).

        Each batch is shown once: a replayed batch (the same ``batch_id`` again) is not
        measured twice. A measurement never fails the batch, which is committed already:
        missing or malformed figures, and any error of the rebalancer, are logged and
        nothing is decided."""
        if self._rebalanced_through is not None and batch_id <= self._rebalanced_through:
            logger.info("batch %d: replayed; the rebalancer saw it already", batch_id)
            return
        self._rebalanced_through = batch_id
        try:
            self._rebalance_batch(batch_id, current, partitions)
        except Exception as err:  # noqa: BLE001 - a measurement never fails the query
            logger.warning("batch %d: rebalancer skipped (%s: %s)", batch_id,
                           type(err).__name__, err)

    def _rebalance_batch(self, batch_id: int, current: Partitioner, partitions: int) -> None:
        rebalancer = self.options["rebalancer"]
        if not isinstance(current, BlockPartitioner):
            logger.warning("batch %d: the rebalancer needs a BlockPartitioner placement, the "
                           "state is placed by %s; nothing decided", batch_id,
                           type(current).__name__)
            return
        timings = [self.store.timing(p, batch_id) for p in range(partitions)]
        if any(t is None for t in timings):
            logger.warning("batch %d: no timing from partition(s) %s; nothing decided",
                           batch_id, [p for p, t in enumerate(timings) if t is None])
            return
        latency = [float(t["process_ms"]) for t in timings if t is not None]
        sizes = np.zeros(current.num_blocks, dtype=np.float64)
        for p, t in enumerate(timings):
            per_block = None if t is None else t.get("block_rows")
            if per_block is None:
                continue
            blocks = np.asarray(per_block["blocks"], dtype=np.int64)
            if blocks.size and int(blocks.max()) >= current.num_blocks:
                logger.warning("batch %d: partition %d's timing counts rows of block %d, but "
                               "the placement has %d blocks (not this batch's record); "
                               "nothing decided", batch_id, p, int(blocks.max()),
                               current.num_blocks)
                return
            np.add.at(sizes, blocks, np.asarray(per_block["rows"], dtype=np.float64))
        rebalancer.observe(latency, sizes, current)
        decision = rebalancer.decide()
        self.rebalances.append((batch_id, decision))
        logger.info("batch %d: rebalancer: %s", batch_id, decision.reason)
        if not decision.moves:
            return
        last = self.store.load_plan(batch_id)
        if self._request is not None or (last is not None and not last["complete"]):
            logger.info("batch %d: a swap is pending or under way; the moves wait", batch_id)
            return
        target = rebalancer.apply(current, decision)
        self.request_swap(target, refit="none")

    def task_timings(self, version: int | None = None) -> Any:
        """What each task of a committed batch measured of its own work.

        Parameters
        ----------
        version : int, optional
            A committed batch (the newest by default; the state keeps the newest two).

        Returns
        -------
        pandas.DataFrame
            One row per partition: ``partition``, ``rows`` (rows it processed),
            ``process_ms`` (its keyed work: load state, run the hooks, encode state) and
            ``blocks`` (how many blocks it got rows of, -1 without a block placement). A
            partition without a record (carried forward: no task ran) has ``-1`` figures.

        Raises
        ------
        InvalidArgumentTypeError
            ``version`` is not an int.
        InvalidArgumentError
            ``version`` is not a committed batch (the committed ones are named).

        Notes
        -----
        Reads each partition's timing file, beside its state version (O(partitions)); no
        Spark job, no listener.

        Examples
        --------
        >>> run.task_timings()  # doctest: +SKIP
           partition  rows  process_ms  blocks
        0          0  2000       412.5      31
        1          1  1990       130.2      33
        """
        import pandas as pd

        if version is not None and (isinstance(version, bool)
                                    or not isinstance(version, (int, np.integer))):
            raise InvalidArgumentTypeError(
                f"version must be an int (a committed batch id) or None, got "
                f"{type(version).__name__}")
        manifest = self.store.read_manifest() or {}
        committed = [int(c) for c in manifest.get("committed") or []]
        if version is not None and int(version) not in committed:
            raise InvalidArgumentError(
                f"batch {version} is not a committed version of {self.store.path}; the "
                f"committed ones are {committed}")
        if not committed:
            return pd.DataFrame({"partition": [], "rows": [], "process_ms": [], "blocks": []})
        at, partitions = self.store.committed_layout(None if version is None else int(version))
        rows = []
        for p in range(partitions):
            t = self.store.timing(p, at)
            if t is None:
                rows.append((p, -1, -1.0, -1))
                continue
            per_block = t.get("block_rows")
            rows.append((p, int(t["rows"]), float(t["process_ms"]),
                         -1 if per_block is None else len(per_block["blocks"])))
        return pd.DataFrame(rows, columns=["partition", "rows", "process_ms", "blocks"])

    def counters(self) -> dict[str, int]:
        """Rows, late rows (key watermark) and late rows by the partition watermark, summed
        over the partitions' latest committed state."""
        total = {"rows": 0, "late": 0, "late_partition": 0}
        if not (self.store.read_manifest() or {}).get("committed"):
            return total
        version, partitions = self.store.committed_layout()
        for p in range(partitions):
            counters = read_counters(self.store.load_table(p, version),
                                     self.store.version_path(p, version))
            for name in total:
                total[name] += counters.get(name, 0)
        return total

    def owners(self, version: int | None = None) -> dict[Any, int]:
        """``{key: partition}`` of the newest (or a given) committed version."""
        return self.store.owners(version)

    def state_values(self, version: int | None = None) -> dict[Any, dict[str, Any]]:
        """Every key's stored values (``ctx.set_state``) in the newest (or a given) committed
        version: ``{key: {name: value}}``.

        Raises
        ------
        StateCorruptError
            A key is stored in two partitions, or a file is missing or corrupt.

        Notes
        -----
        Cost: reads the version's state files once more (O(state)); for inspection and tests.

        Examples
        --------
        >>> run.state_values()  # doctest: +SKIP
        {'u0001': {'n': 412}, 'u0002': {'n': 97}}
        """
        owners = self.store.owners(version)
        manifest = self.store.read_manifest() or {}
        at = int(manifest["committed"][-1]) if version is None else version
        out: dict[Any, dict[str, Any]] = {}
        for p in sorted(set(owners.values())):
            where = self.store.version_path(p, at)
            out.update(decode_state(self.store.load_table(p, at), where).values)
        return out


def _state_types(df: DataFrame, key: str, processor: KeyedWatermarkProcessFunction
                 ) -> tuple[Any, Any]:
    """The key's Arrow type and the processor's declared ``state_schema`` as an Arrow struct."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    try:
        key_type = to_arrow_type(df.schema[key].dataType)
    except (TypeError, ValueError, NotImplementedError):
        key_type = None
    ddl = getattr(processor, "state_schema", None)
    if ddl is None:
        return key_type, None
    if not isinstance(ddl, (str, StructType)):
        raise InvalidArgumentTypeError(
            f"state_schema must be a Spark DDL string or a StructType, got {type(ddl).__name__}")
    try:
        parsed = ddl if isinstance(ddl, StructType) else StructType.fromDDL(ddl)
    except Exception as err:
        raise InvalidArgumentError(f"state_schema {ddl!r} is not a Spark DDL struct ({err})") \
            from None
    value_type = to_arrow_type(parsed)
    if not pa.types.is_struct(value_type):
        raise InvalidArgumentError(f"state_schema {ddl!r} must describe a struct")
    return key_type, value_type


def keyed_foreach_batch(
    func: Callable[[DataFrame, int], Any],
    key: str,
    event_time: str,
    processor: KeyedWatermarkProcessFunction,
    delay: Any,
    state_path: str,
    *,
    order_by: str | None = None,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    idle_timeout: Any = None,
    filesystem: Any = None,
    keep_versions: int = 10,
    takeover: bool = False,
    rebalancer: Any = None,
) -> KeyedBatchFunction:
    """A ``foreachBatch`` function running ``processor`` with state kept across micro-batches.

    Parameters
    ----------
    func : callable
        ``func(output_df, batch_id)``: ``output_df`` holds what the hooks emitted for the batch.
    key, event_time, processor, delay, order_by, idle_timeout
        As :func:`keyed_process`.
    state_path : str
        Directory (local path or URI such as ``s3://bucket/prefix``) of the state.
    strategy, num_partitions
        Placement, decided at the first batch and stored with the state (table strategies
        with their table). It changes only through a swap (:meth:`KeyedBatchFunction.request_swap`);
        a restart with another ``num_partitions`` swaps to it at its first batch. An
        :class:`~trilink_spark.AdaptivePartitioner` executes its switches as swaps.
    filesystem : pyarrow.fs.FileSystem, optional
        Default: inferred from ``state_path``.
    keep_versions : int
        State versions kept per partition (older ones are deleted; what a replay of the
        newest batch needs is always kept).
    takeover : bool
        Take over a state path another runner wrote (it must have stopped for good). Without
        it a second writer is refused with :class:`~trilink_spark.StateOwnershipError`; a
        restarted query (same query id) is the same writer.
    rebalancer : LoadAwareRebalancer, optional
        Moves key blocks from slow partitions to fast ones (needs ``strategy`` to be a
        :class:`~trilink_spark.BlockPartitioner`). After every batch it sees each task's own
        timing and rows per block (:meth:`KeyedBatchFunction.task_timings`); a decision
        with moves becomes a swap at the next batch, in which only the moved blocks' state
        travels. Every decision is logged and kept in ``run.rebalances``.

    Returns
    -------
    KeyedBatchFunction

    Notes
    -----
    Guarantees. Each task loads its partition's state as of the last committed batch (the
    manifest says which), processes the batch, and writes version ``batch_id`` (an Arrow table
    with one row per key, written to a temporary file, then renamed). The batch is committed
    in the manifest once every partition wrote it. Replaying a batch id (a retried task, a
    restarted query re-running its last batch) starts again from the same committed version,
    so it produces the same state and output: with an idempotent or transactional sink the
    pipeline is exactly once. A missing version is an error (never a silent restart from an
    older one), as are a second writer and a restart with another configuration (key, event
    time, delay, processor settings). If ``func`` does not compute the output, it is computed
    once more (to a no-op sink) so the state still advances.

    Swaps: :meth:`KeyedBatchFunction.request_swap` changes the strategy or partition count at
    the next batch boundary, moving only the keys whose partition changes, with their state,
    exactly once (module :mod:`trilink_spark.keyed.swap`).

    Ahead KeyBy: when the stream's key column is declared with
    :func:`~trilink_spark.keyed_by_source` (a ``trilink-kafka`` read of a topic written with
    :func:`~trilink_spark.ahead_key_by`), every micro-batch is processed where it was read, with
    no shuffle, and each Kafka partition keeps its own state; ``strategy`` is not used. A
    change in the topic's partition count is refused rather than stranding state.

    Examples
    --------
    >>> run = tl.keyed_foreach_batch(write, "sensor", "ts", tl.KeyedWindowAggregate(10.0),
    ...                              delay=2.0, state_path="/tmp/state")  # doctest: +SKIP
    >>> stream.writeStream.foreachBatch(run).start()  # doctest: +SKIP
    """
    if not callable(func):
        raise InvalidArgumentTypeError(f"func must be callable, got {type(func).__name__}")
    if not isinstance(processor, KeyedWatermarkProcessFunction):
        raise InvalidArgumentTypeError(
            f"processor must be a KeyedWatermarkProcessFunction, got {type(processor).__name__}"
        )
    if rebalancer is not None:
        missing = [m for m in ("observe", "decide", "apply")
                   if not callable(getattr(rebalancer, m, None))]
        if missing:
            raise InvalidArgumentTypeError(
                f"rebalancer must have observe, decide and apply (a tl.LoadAwareRebalancer); "
                f"{type(rebalancer).__name__} lacks {', '.join(missing)}")
        if not isinstance(strategy, BlockPartitioner):
            raise InvalidArgumentError(
                "a rebalancer moves key blocks: pass strategy=tl.BlockPartitioner(n), got "
                f"{strategy if isinstance(strategy, str) else type(strategy).__name__!r}")
    store = KeyedStateStore(state_path, filesystem=filesystem, keep_versions=keep_versions)
    options = {
        "key": key, "event_time": event_time, "processor": processor, "delay": delay,
        "order_by": order_by, "strategy": strategy, "num_partitions": num_partitions,
        "idle_timeout": idle_timeout, "takeover": bool(takeover), "rebalancer": rebalancer,
    }
    return KeyedBatchFunction(func, store, options)
