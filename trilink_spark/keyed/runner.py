"""Run a keyed process function with Spark: on a batch DataFrame or a streaming query.

:func:`keyed_process` places the rows with :func:`~trilink_spark.key_by` (one shuffle), sorts
each partition in arrival order and runs the processor over every partition (``mapInArrow``).

:func:`keyed_foreach_batch` does the same for each micro-batch of a Structured Streaming query
and keeps each partition's state (watermarks, timers, window accumulators, user state) between
micro-batches in a :class:`~trilink_spark.KeyedStateStore`, versioned by batch id.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..columns import EVENT_TIME_COL, PARTITION_COL, POS_COL, check_user_columns
from ..columns import check_atomic_key, require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..eventtime import delay_in_units, event_time_micros
from ..partitioners import Partitioner
from ..placement.key_by import place_rows, resolve_strategy
from ..placement.source import check_source_layout, is_keyed_by_source
from ..state.store import KeyedStateStore, StatefulBatchFunction
from .process import KeyedRuntime, KeyedWatermarkProcessFunction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["keyed_process", "keyed_foreach_batch", "KeyedBatchFunction"]


def _outputs_to_batches(outs: list[Any], arrow_schema: Any) -> Iterator[Any]:
    import pandas as pd
    import pyarrow as pa

    names = arrow_schema.names
    for out in outs:
        if out is None:
            continue
        frame = out if isinstance(out, pd.DataFrame) else pd.DataFrame(list(out), columns=names)
        if not len(frame):
            continue
        missing = [n for n in names if n not in frame.columns]
        if missing:
            raise InvalidArgumentError(f"processor output lacks column(s) {missing}")
        table = pa.Table.from_pandas(frame[names], schema=arrow_schema, preserve_index=False)
        yield from table.to_batches()


def _partition_function(
    processor: KeyedWatermarkProcessFunction,
    key: str,
    delay: float,
    idle_timeout: float,
    arrow_schema: Any,
    store: KeyedStateStore | None,
    batch_id: int,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        pid = context.partitionId() if context is not None else 0
        received = list(batches)
        frame = pa.Table.from_batches(received).to_pandas() if received else None
        if frame is not None and not len(frame):
            frame = None
        previous = store.load_before(pid, batch_id) if store is not None else None
        runtime = KeyedRuntime(processor, key, delay, idle_timeout, previous)
        processor.open(pid)
        outs = [] if frame is None else runtime.process(frame.drop(columns=[PARTITION_COL, POS_COL]))
        if store is None:
            outs += runtime.finish()
        processor.close()
        batches_out = list(_outputs_to_batches(outs, arrow_schema))
        if store is not None:
            store.save(pid, batch_id, runtime.snapshot())
        yield from batches_out

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
        idle_units = delay_in_units(idle_timeout, kind) if idle_timeout != math.inf else math.inf
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
    tagged = df.select("*", F.monotonically_increasing_id().alias(POS_COL),
                       et_col.alias(EVENT_TIME_COL))
    return tagged, delay_units, idle_units, out_schema, arrow_schema


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
    delay : float or datetime.timedelta
        Allowed lateness (seconds or a timedelta for timestamps, the column's unit otherwise).
    order_by : str, optional
        Arrival order; default the input order.
    strategy, num_partitions
        Placement, as in :func:`~trilink_spark.key_by`.
    idle_timeout : float or timedelta, optional
        When a key counts as idle (module docs of :mod:`~trilink_spark.keyed.process`);
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
    arrival = [order_by, POS_COL] if order_by is not None else [POS_COL]
    placed = placed.sortWithinPartitions(*arrival)
    fn = _partition_function(processor, key, delay_units, idle_units, arrow_schema, None, -1)
    return placed.mapInArrow(fn, out_schema)


class KeyedBatchFunction(StatefulBatchFunction):
    """The ``foreachBatch`` callable of :func:`keyed_foreach_batch`."""

    def __init__(self, func: Callable[[DataFrame, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        super().__init__(func, store, options)
        self._strategy: Partitioner | None = None
        self._source_checked: int | None = None  # partition count the state was checked for

    def _placement(self, batch_df: DataFrame) -> Partitioner:
        """The placement of every batch: fixed, and kept with the state so restarts agree."""
        saved = self.store.load_strategy()
        if saved is not None:
            wanted = self.options["num_partitions"]
            if wanted is not None and wanted != saved.num_partitions:
                raise InvalidArgumentError(
                    f"state at {self.store.path} was written with {saved.num_partitions} "
                    f"partitions; num_partitions={wanted} would strand it"
                )
            return saved
        resolved = resolve_strategy(batch_df, self.options["key"], self.options["strategy"],
                                    self.options["num_partitions"])
        strategy = resolved.partitioner
        self.store.save_strategy(strategy)
        return strategy

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        o = self.options
        tagged, delay_units, idle_units, out_schema, arrow_schema = _prepare(
            batch_df, o["key"], o["event_time"], o["processor"], o["delay"], o["order_by"],
            o["idle_timeout"],
        )
        if is_keyed_by_source(batch_df, o["key"]):
            placed, partitions = self._source_placed(batch_df, tagged)
        else:
            if self._strategy is None:
                self._strategy = self._placement(batch_df)
            placed = place_rows(tagged, o["key"], self._strategy, fit="none")
            partitions = self._strategy.num_partitions
        arrival = [o["order_by"], POS_COL] if o["order_by"] is not None else [POS_COL]
        placed = placed.sortWithinPartitions(*arrival)
        fn = _partition_function(o["processor"], o["key"], delay_units, idle_units,
                                 arrow_schema, self.store, batch_id)
        out = placed.mapInArrow(fn, out_schema)
        self.func(out, batch_id)
        self._complete(out, batch_id, partitions)

    def _source_placed(self, batch_df: DataFrame, tagged: DataFrame) -> tuple[DataFrame, int]:
        """Ahead KeyBy: each input (Kafka) partition keeps its rows and its own state."""
        placed = _in_place(batch_df, self.options["key"], tagged)
        partitions = batch_df.rdd.getNumPartitions()
        # unchanged since the last check: only this function writes the state meanwhile
        if partitions == self._source_checked and self._strategy is None:
            return placed, partitions
        if self.store.load_strategy() is not None:
            raise InvalidArgumentError(
                f"state at {self.store.path} was placed by key_by; a keyed_by_source stream "
                "needs its own state_path"
            )
        stranded = [p for p in self.store.partitions() if p >= partitions]
        if stranded:
            raise InvalidArgumentError(
                f"state at {self.store.path} has partitions up to {max(stranded)}, but this "
                f"micro-batch has {partitions} input partitions; the topic's partition count "
                "changed, which would strand that state"
            )
        self._source_checked = partitions
        return placed, partitions

    def counters(self) -> dict[str, int]:
        """Rows, late rows (key watermark) and late rows by the partition watermark, summed
        over the partitions' latest state."""
        return self.store.counters()


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
        Placement. It is fixed at the first batch and stored with the state: the partition a
        key's state lives in never changes (table strategies are stored with their table).
    filesystem : pyarrow.fs.FileSystem, optional
        Default: inferred from ``state_path``.
    keep_versions : int
        State versions kept per partition (older ones are deleted).

    Returns
    -------
    KeyedBatchFunction

    Notes
    -----
    Guarantees. Each task loads its partition's state as of the newest version before the
    batch, processes the batch, and writes version ``batch_id`` (write to a temporary file,
    then rename). Replaying a batch id (a retried task, a restarted query re-running its last
    batch) starts again from the same previous version, so it produces the same state and
    output: with an idempotent or transactional sink the pipeline is exactly once. A restarted
    query resumes from the newest stored version. If ``func`` does not compute the output, it is
    computed once more (to a no-op sink) so the state still advances.

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
    store = KeyedStateStore(state_path, filesystem=filesystem, keep_versions=keep_versions)
    options = {
        "key": key, "event_time": event_time, "processor": processor, "delay": delay,
        "order_by": order_by, "strategy": strategy, "num_partitions": num_partitions,
        "idle_timeout": idle_timeout,
    }
    return KeyedBatchFunction(func, store, options)
