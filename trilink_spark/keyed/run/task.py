"""The Python task of a keyed run: one partition through the processor, out as Arrow.

:func:`partition_function` builds the ``mapInArrow`` function both runners use
(:func:`~trilink_spark.keyed_process` and :func:`~trilink_spark.keyed_foreach_batch`);
:func:`outputs_to_batches` turns the hooks' outputs into Arrow batches of the output schema.
:class:`StateIO` travels with each task of a stateful run: it loads the partition's version the
batch starts from (minus the keys a swap moves out, plus the segments it moves in), saves the
new version with the task's timing, and counts rows per block for a rebalancer;
:func:`state_types` gives the Arrow types the state is encoded with.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._internal.memory import release_unused_memory
from ..._internal.optiming import OperatorTimer, Stopwatch
from ..._internal.spark.frames import task_batch_values
from ..._internal.spark.locality import task_executor
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ...errors import StateStoreError
from ...errors import TrilinkError
from ...partitioners import BlockPartitioner
from ...state.formats import TASK_PHASES
from ...state.store import KEY_FIELD, KeyedStateStore
from ...state.changelog import changelog_table
from ...state.local import SETTLE_WRITTEN_BYTES, LocalState
from ...state.sweep import mark, sweep
from ..records.history import key_profile
from ..swaps.units import UnitRows
from ..durable.local_sync import (MAX_CHAIN_INTERVALS, LocalConfig, SwapIn, load_touched,
                                  local_root, save_touched, sync)
from ..durable.manifest import check_not_rolled_back
from .prepare import in_arrival_order
from ..semantics.process import KeyedRuntime, KeyedWatermarkProcessFunction
from ..semantics.keys import PartitionState
from ..durable.codec import add_counters, decode_state, encode_state, merge_in
from ..durable.codec import split_out

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["partition_function", "outputs_to_batches", "StateIO", "state_types",
           "run_without_rows", "runtime_frame", "run_batch"]

logger = logging.getLogger(__name__)


def outputs_to_batches(outs: list[Any], arrow_schema: Any) -> Iterator[Any]:
    """The processor's outputs, in order, as Arrow batches of ``arrow_schema``.

    Row outputs (iterables of tuples) are gathered across calls and converted once per run of
    consecutive row outputs, not once per call: a per-key conversion costs about a
    millisecond, which on a thousand keys was most of a batch. Cost: O(output rows).

    Parameters
    ----------
    outs : list
        What the hooks returned, call by call: None, a pandas DataFrame, or an iterable of
        rows (tuples with one value per column, or dicts by column name).
    arrow_schema : pyarrow.Schema

    Raises
    ------
    InvalidArgumentError
        An output lacks a column, a row does not hold one value per column, or a value
        does not fit its column's type.
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


def runtime_frame(table: Any, key: str) -> Any:
    """A task's rows as pandas, with the key column exact for the runtime: an integer column
    holding a null as pandas' nullable ``Int64`` (and so on), not floats (which would merge
    keys beyond 2**53 and give the hooks ``1.0`` for ``1``), and a floating column as nullable
    ``Float64``, where a null and a NaN are two keys, as in Spark's ``groupBy``. Every other
    column as ``Table.to_pandas`` gives it. Cost: ``to_pandas``, plus the key column once
    more when it is converted."""
    import pandas as pd
    import pyarrow as pa

    frame = table.to_pandas()
    column = table.column(key)
    masked = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(),
              pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
              pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
              pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(),
              pa.float32(): pd.Float32Dtype(), pa.float64(): pd.Float64Dtype()}
    dtype = masked.get(column.type)
    if dtype is not None and (column.null_count or pa.types.is_floating(column.type)):
        frame[key] = column.to_pandas(types_mapper={column.type: dtype}.get).array
    return frame


def _value_fields(value_type: Any) -> dict[str, Any] | None:
    """The declared state fields by name (None: no ``state_schema``, any value)."""
    if value_type is None:
        return None
    return {f.name: f.type for f in value_type}


def partition_function(
    processor: KeyedWatermarkProcessFunction,
    key: str,
    delay: float,
    idle_timeout: float,
    arrow_schema: Any,
    io: StateIO | None,
    timer: OperatorTimer | None = None,
    aliases: dict[str, str] | None = None,
    batch_token: str | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that runs ``processor`` over one partition.

    Parameters
    ----------
    processor, key
        The process function and the key column.
    delay, idle_timeout : float
        In the event-time column's units (:func:`~trilink_spark.keyed.run.prepare.tag_plan`).
    arrow_schema : pyarrow.Schema
        The processor's ``output_schema``.
    io : StateIO or None
        None for a bounded run: the task starts empty and ends with every key's watermark
        at infinity (all timers fire). Otherwise the task loads its partition's state,
        and saves the new version with its timing, through ``io``.
    timer : OperatorTimer, optional
        Where the task writes its rows in and out and its busy and waiting time.
    aliases : dict, optional
        ``{alias: column}`` of the input columns that crossed into Python under an internal
        name (:func:`~trilink_spark.columns.python_input`): renamed back before the hooks run.
    batch_token : str, optional
        The function serves every batch of a run: each task reads its batch's values
        (:meth:`StateIO.batch_values`, and the timer's run) from the local property this
        token names (:func:`~trilink_spark._internal.spark.frames.task_batch_values`), and
        ``io`` and ``timer`` give the rest.

    Returns
    -------
    callable
        ``run(batches) -> batches``. Each task puts its rows in arrival order
        (:func:`~trilink_spark.keyed.run.prepare.in_arrival_order`), runs the hooks through a
        :class:`~trilink_spark.keyed.semantics.process.KeyedRuntime` and converts what they returned
        (:func:`outputs_to_batches`). Cost: the partition's rows and outputs in memory.
    """
    value_type = None if io is None else io.value_type
    fields = _value_fields(value_type)
    shared_io, shared_timer = io, timer

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        io, timer = shared_io, shared_timer
        if batch_token is not None:
            values = task_batch_values(batch_token)
            io = None if io is None else io.for_batch(values)
            timer = None if timer is None else replace(timer, run=str(values.get("timer")))
        context = TaskContext.get()
        pid = context.partitionId() if context is not None else 0
        started = time.perf_counter()
        watch = Stopwatch()
        received = list(watch.pull(batches))
        table = in_arrival_order(pa.Table.from_batches(received)) if received else None
        if table is not None and aliases:
            table = table.rename_columns([aliases.get(n, n) for n in table.column_names])
        frame = None if table is None or not table.num_rows else runtime_frame(table, key)
        keys = None if table is None or frame is None else table.column(key)
        if io is not None and io.local is not None:
            batches_out, extra, upkeep_ms = _run_local(io, pid, frame, keys, processor, key,
                                                       delay, idle_timeout, fields,
                                                       arrow_schema)
            io.save_timing(pid, _timing(io, keys, started, extra, upkeep_ms))
        else:
            previous = None
            if io is not None:
                table = io.load(pid)
                where = f"state of partition {pid} before batch {io.batch_id}"
                previous = None if table is None else decode_state(table, where)
            runtime = KeyedRuntime(processor, key, delay, idle_timeout, previous, fields,
                                   None if io is None or io.local is None
                                   else io.local.batch_time)
            batches_out, late = run_batch(runtime, pid, frame, arrow_schema,
                                          bounded=io is None)
            if io is not None:
                io.save(pid, runtime.snapshot(), _timing(io, keys, started, late))
        yield from watch.emit(batches_out)
        if timer is not None:
            timer.write(rows_in=0 if frame is None else len(frame),
                        rows_out=sum(b.num_rows for b in batches_out),
                        busy_ms=watch.busy_ms(), wait_ms=watch.wait_ms)

    def run_and_release(batches: Iterator[Any]) -> Iterator[Any]:
        yield from run(batches)  # its frame, and the partition's objects, are gone after it
        release_unused_memory()  # so a reused worker does not keep this task's peak

    return run_and_release


def run_batch(runtime: KeyedRuntime, pid: int, frame: Any, arrow_schema: Any,
              bounded: bool = False) -> tuple[list[Any], dict[str, int]]:
    """One partition's batch through its runtime, as every keyed task runs it.

    The processor's ``open(pid)``, the batch's rows (:meth:`KeyedRuntime.process`; none when
    ``frame`` is None), for bounded input the end of input (:meth:`KeyedRuntime.finish`: every
    watermark at infinity), ``close()``, then what the hooks returned as Arrow batches of
    ``arrow_schema`` (:func:`outputs_to_batches`). The caller loads the runtime's state before
    and stores its :meth:`~KeyedRuntime.snapshot` after.

    Parameters
    ----------
    runtime : KeyedRuntime
        The partition's runtime, with the state the batch starts from.
    pid : int
        The partition id ``open`` gets.
    frame : pandas.DataFrame or None
        The batch's rows in arrival order, with the key exact (:func:`runtime_frame`) and
        :data:`~trilink_spark.columns.EVENT_TIME_COL`; None: the partition got no rows.
    arrow_schema : pyarrow.Schema
        The processor's ``output_schema``.
    bounded : bool
        Whether the input ends with this batch (:func:`~trilink_spark.keyed_process`).

    Returns
    -------
    batches : list of pyarrow.RecordBatch
    late : dict
        The rows this batch found late (:func:`late_since`).

    Notes
    -----
    Cost: the hooks', plus O(output rows) to convert what they returned.
    """
    processor = runtime.processor
    processor.open(pid)
    late_before = late_counts(runtime)
    outs = [] if frame is None else runtime.process(frame)
    late = late_since(runtime, late_before)
    if bounded:
        outs += runtime.finish()
    processor.close()
    return list(outputs_to_batches(outs, arrow_schema)), late


def run_without_rows(spark: Any, io: StateIO, partitions: list[int],
                     processor: KeyedWatermarkProcessFunction, key: str, delay: float,
                     idle_timeout: float, arrow_schema: Any) -> None:
    """Write the batch's version of ``partitions``, which no task of the batch ran for (an
    empty micro-batch), as their tasks would have with no rows, on the local store
    (:func:`_run_local`): a key whose processing-time TTL ran out by the batch's time expires
    (it reads only the expiring keys), and in a swap batch the leaving keys go and the
    arriving ones come in (it reads only those), so the copies stay current. One small
    Spark job, one task per partition, each with its timing.
    """
    fields = _value_fields(io.value_type)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for i in batch.column(0).to_pylist():
                pid = partitions[int(i)]
                started = time.perf_counter()
                _, extra, upkeep_ms = _run_local(io, pid, None, None, processor, key, delay,
                                                 idle_timeout, fields, arrow_schema)
                io.save_timing(pid, _timing(io, None, started, extra, upkeep_ms))
                yield pa.RecordBatch.from_pydict({"partition": [pid]},
                                                 schema=pa.schema([("partition", pa.int32())]))

    ids = spark.range(0, len(partitions), 1, len(partitions))
    ids.mapInArrow(run, "partition int").collect()
    logger.info("batch %d: %d partitions without rows run on their local copies",
                io.batch_id, len(partitions))


def _timing(io: StateIO, keys: Any, started: float, extra: dict[str, Any],
            upkeep_ms: float = 0.0) -> dict[str, Any]:
    """What a task measured of its own work (:meth:`KeyedStateStore.save_timing`); ``keys``:
    the batch's key column as Arrow (None: no rows). ``process_ms`` leaves out the local
    copy's upkeep (``upkeep_ms``: starting a snapshot, waiting for a compaction): periodic
    work of the whole copy, not load that moving keys spreads, which the rebalancer would
    read as skew."""
    elapsed = (time.perf_counter() - started) * 1000.0
    timing: dict[str, Any] = {
        "rows": 0 if keys is None else len(keys),
        "process_ms": round(max(elapsed - upkeep_ms, 0.001), 3), **extra}
    per_block = io.block_rows([] if keys is None else keys)
    if per_block is not None:
        timing["block_rows"] = per_block
    if keys is not None:  # the batch's heaviest keys and a sample, for the run's history
        timing["keys"] = key_profile(keys, seed=io.batch_id)
    return timing


def late_counts(runtime: KeyedRuntime) -> tuple[int, int]:
    """The runtime's late-row counters (key watermark, partition watermark) as they stand."""
    return runtime.counters.late, runtime.counters.late_partition


def late_since(runtime: KeyedRuntime, before: tuple[int, int]) -> dict[str, int]:
    """The rows this batch found late, by key and by partition watermark: what a task's
    timing record keeps (:func:`late_counts` before the batch)."""
    late, by_partition = late_counts(runtime)
    return {"late": late - before[0], "late_partition": by_partition - before[1]}


def _run_local(io: StateIO, pid: int, frame: Any, keys: Any,
               processor: KeyedWatermarkProcessFunction, key: str, delay: float, idle_timeout: float, fields: dict[str, Any] | None,
               arrow_schema: Any) -> tuple[list[Any], dict[str, Any], float]:
    """One task on the executor-local store: only the batch's and the due keys' state is
    read, decoded and written (:mod:`~trilink_spark.keyed.durable.local_sync`). Returns the output
    batches, what the timing record adds (``sync``, ``keys_read``, ``snapshot``) and the
    milliseconds of the copy's upkeep (:func:`_timing`)."""
    config = io.local
    if config is None:  # pragma: no cover - the caller checked
        raise InvalidArgumentError("no local store configured")
    target = io.prev if pid < io.prev_partitions else None
    where = f"state of partition {pid} before batch {io.batch_id}"
    moved = io.moved(pid) if io.swap else None
    phases = dict.fromkeys(TASK_PHASES, 0.0)
    at = time.perf_counter()
    local = LocalState.open(local_root(config), config.store_id, pid)
    done = False
    try:
        check_not_rolled_back(local, io.store, pid, target, io.batch_id)
        for attempt in (1, 2):
            try:
                synced = sync(local, io.store, config, pid, target, processor, delay,
                              idle_timeout)
                at = _lap(phases, "sync", at)
                previous, before = load_touched(local, config, frame, key, io.key_type, where,
                                                keys, moved)
                at = _lap(phases, "read", at)
                break
            except StateCorruptError as err:  # the local copy is a cache: never trusted
                if attempt == 2:
                    raise  # the state path itself is damaged
                logger.warning("partition %d, batch %d: %s; rebuilding the local copy from "
                               "%s", pid, io.batch_id, err, io.store.path)
                local.reset()
        runtime = KeyedRuntime(processor, key, delay, idle_timeout, previous, fields,
                               config.batch_time)
        batches_out, late = run_batch(runtime, pid, frame, arrow_schema)
        at = _lap(phases, "hooks", at)
        written, snapshot_ms = save_touched(
            local, io.store, config, pid, io.batch_id, target, runtime.snapshot(), before,
            io.key_type, io.value_type, processor, delay, idle_timeout, lambda: io.fence(pid),
            None if moved is None else moved.leaving)
        started = _lap(phases, "write", at, less=(snapshot_ms or 0.0) / 1000.0)
        if not config.keep_open or written > SETTLE_WRITTEN_BYTES:
            local.settle()  # the copy's compaction runs while it is open
        done = True
    finally:  # held open for this worker's next task of the partition, or closed
        held = _released(local, done and config.keep_open, done, pid, io.batch_id)
    _upkeep(config, pid, io.batch_id)
    settled = time.perf_counter() - started
    logger.debug("partition %d, batch %d: %s local state, %d keys read, %d bytes logged%s%s",
                 pid, io.batch_id, synced, len(before), written,
                 "" if snapshot_ms is None else ", a snapshot started",
                 ", held open" if held else "")
    upkeep_ms = (snapshot_ms or 0.0) + settled * 1000.0
    extra = {"sync": synced, "keys_read": len(before), "snapshot": snapshot_ms is not None,
             "upkeep_ms": round(upkeep_ms, 3), **late,
             "phases_ms": {name: round(ms, 3) for name, ms in phases.items()}}
    ran_on = task_executor()  # known when the stage asked for its copies' executors
    if ran_on is not None:
        extra["executor"] = ran_on.executor
        extra["host"] = ran_on.host
    return batches_out, extra, upkeep_ms


def _lap(phases: dict[str, float], name: str, since: float, less: float = 0.0) -> float:
    """Add the milliseconds from ``since`` to now (less ``less`` seconds) to ``phases[name]``
    (a retried step adds up); returns now."""
    now = time.perf_counter()
    phases[name] += max(now - since - less, 0.0) * 1000.0
    return now


def _upkeep(config: LocalConfig, pid: int, batch_id: int) -> None:
    """After a task committed ``batch_id``: mark its copy's version, and in one batch of
    every ``drop_after`` (by partition) drop the copies here that no task updated for more
    than ``drop_after`` batches (:mod:`~trilink_spark.state.sweep`). O(1), and O(copies
    here) in a sweep."""
    root = local_root(config)
    mark(root, config.store_id, pid, batch_id)
    if config.drop_after > 0 and (batch_id + pid) % config.drop_after == 0:
        sweep(root, config.store_id, pid, batch_id, config.drop_after)


def _released(local: LocalState, keep: bool, done: bool, pid: int, batch_id: int) -> bool:
    """:meth:`LocalState.release` at the end of a task; whether the copy is held. When the
    task failed (not ``done``), a copy that then fails to close too (a disk that filled up
    says "Writer has previous error") is logged, so the task's own error is what the batch
    fails with; after a task that succeeded, a failed close is the batch's error."""
    try:
        return local.release(keep=keep)
    except TrilinkError as err:
        if done:
            raise
        logger.warning("partition %d, batch %d: the local copy did not close after the task "
                       "failed (%s)", pid, batch_id, err)
        return False


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
    blocks : BlockPartitioner, UnitRows or None
        The placement when it is a block table: each task then counts its rows per block,
        and stores the counts with its timing (:meth:`KeyedStateStore.save_timing`); for a
        bounded table under a rebalancer, its units
        (:class:`~trilink_spark.keyed.swaps.units.UnitRows`: groups and named keys).
    carried : dict or None
        The counters of the partitions the swap removes, which partition 0 adds to its own
        (from the plan, so a replay adds them once again to the same starting version).
    owner : str or None
        The runner's owner token: before it writes, each task checks that the manifest
        still names it (:meth:`KeyedStateStore.check_owner`; one small read), so a runner
        whose path was taken over writes nothing. None: no check.
    local : LocalConfig or None
        The executor-local store (:mod:`~trilink_spark.keyed.durable.local_sync`): a task of a batch
        without a swap reads and writes only the keys it touches, and writes a changelog.
        None: each task reads and writes its partition's whole state (a snapshot).
    """

    store: KeyedStateStore
    batch_id: int
    prev: int | None
    prev_partitions: int
    swap: bool
    key_type: Any
    value_type: Any
    blocks: BlockPartitioner | UnitRows | None = None
    carried: dict[str, int] | None = None
    owner: str | None = None
    local: LocalConfig | None = None

    def batch_values(self) -> dict[str, Any]:
        """What changes from batch to batch, as JSON values (:meth:`for_batch` reads them)."""
        local = self.local
        return {"batch_id": self.batch_id, "prev": self.prev,
                "prev_partitions": self.prev_partitions, "swap": self.swap,
                "carried": self.carried,
                "batch_time": None if local is None else local.batch_time,
                "ttl_since": None if local is None else local.ttl_since}

    def without_batch(self) -> StateIO:
        """These settings without their batch's (:meth:`batch_values`): equal for two
        batches of one run that differ only there (:meth:`same_run`)."""
        local = self.local
        return replace(self, batch_id=-1, prev=None, prev_partitions=0, swap=False,
                       carried=None, local=None if local is None
                       else replace(local, batch_time=None, ttl_since=None))

    def same_run(self, other: StateIO) -> bool:
        """Whether ``other`` has these settings but for its batch's: the same store and
        table objects, equal types and local settings (a local copy's blocks by layout)."""
        a, b = self.without_batch(), other.without_batch()
        if not (a.store is b.store and a.blocks is b.blocks and a.owner == b.owner
                and a.key_type == b.key_type and a.value_type == b.value_type):
            return False
        if a.local is None or b.local is None:
            return a.local is b.local
        return (a.local.layout == b.local.layout
                and replace(a.local, blocks=None) == replace(b.local, blocks=None))

    def for_batch(self, values: dict[str, Any]) -> StateIO:
        """These settings for the batch ``values`` describes (:meth:`batch_values`).

        Raises
        ------
        StateStoreError
            ``values`` is not what :meth:`batch_values` gives."""
        try:
            batch_id, prev = int(values["batch_id"]), values["prev"]
            carried, at, since = values["carried"], values["batch_time"], values["ttl_since"]
            io = replace(self, batch_id=batch_id, prev=None if prev is None else int(prev),
                         prev_partitions=int(values["prev_partitions"]),
                         swap=bool(values["swap"]),
                         carried=None if carried is None
                         else {str(k): int(v) for k, v in dict(carried).items()})
            if io.local is not None:
                io = replace(io, local=replace(
                    io.local, batch_time=None if at is None else float(at),
                    ttl_since=None if since is None else float(since)))
        except (KeyError, TypeError, ValueError) as err:
            raise StateStoreError(f"a keyed task's batch values are malformed ({err!r:.200})"
                                  ) from err
        return io

    def load(self, pid: int) -> Any:
        """The state table partition ``pid`` starts this batch from (None: empty)."""
        table = None
        if self.prev is not None and pid < self.prev_partitions:
            table = self.store.load_table(pid, self.prev)
        if not self.swap:
            return table
        moved = self.moved(pid)
        if table is not None:
            table, _ = split_out(table, moved.leaving)
        merged = merge_in(table, list(moved.incoming))
        if moved.carried:
            if merged is None:
                merged = encode_state(PartitionState(), self.key_type, self.value_type)
            merged = add_counters(merged, moved.carried,
                                  f"state of partition 0 before batch {self.batch_id}")
        return merged

    def moved(self, pid: int) -> SwapIn:
        """What this swap batch moves for partition ``pid``: the keys that leave it, the
        segments that arrive (each checked against the plan) and, for partition 0, the
        removed partitions' counters. O(moves + the arriving segments' bytes).

        Raises
        ------
        StateCorruptError
            A segment does not hold exactly the keys the plan moves from its source to ``pid``.
        """
        import pyarrow.compute as pc

        moves = self.store.load_moves(self.batch_id)
        leaving = moves.filter(pc.equal(moves.column("from"), pid))
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
        return SwapIn(leaving.column(KEY_FIELD).combine_chunks(), incoming,
                      self.carried if pid == 0 else None)

    def carry_forward(self, pid: int) -> None:
        """Write ``pid``'s version as it stands (no task ran for it: an empty micro-batch):
        with the local store, an empty changelog that keeps the partition-wide values (O(1)
        and one listing), but a snapshot once its last one is
        :data:`~trilink_spark.keyed.durable.local_sync.MAX_CHAIN_INTERVALS` snapshot intervals old,
        so that a partition without rows keeps its chain of changelogs bounded; else the
        whole state again."""
        if self.local is not None and not self.swap and not self._chain_too_long(pid):
            empty = encode_state(PartitionState(), self.key_type, self.value_type)
            prev = self.prev if pid < self.prev_partitions else None
            log = changelog_table(empty, empty.column(KEY_FIELD).combine_chunks(), prev,
                                  f"carried:{uuid.uuid4().hex}", inherit=True)
            self.fence(pid)
            self.store.save_changelog(pid, self.batch_id, log)
            return
        table = self.load(pid)
        if table is None:
            table = encode_state(PartitionState(), self.key_type, self.value_type)
        self.fence(pid)
        self.store.delete_changelog(pid, self.batch_id)
        self.store.save_table(pid, self.batch_id, table)

    def _chain_too_long(self, pid: int) -> bool:
        """Whether ``pid``'s changelogs since its last snapshot reach the bound
        (:meth:`carry_forward`). One listing."""
        if self.local is None or self.prev is None or pid >= self.prev_partitions:
            return False
        snapshots, _ = self.store.listing(pid)
        last = max((s for s in snapshots if s <= self.prev), default=-1)
        return self.batch_id - last >= MAX_CHAIN_INTERVALS * self.local.snapshot_interval

    def fence(self, pid: int) -> None:
        """StateOwnershipError unless this runner still owns the path (``owner``)."""
        if self.owner is not None:
            self.store.check_owner(self.owner, f"partition {pid}'s state of batch "
                                               f"{self.batch_id}")

    def save(self, pid: int, state: PartitionState, timing: dict[str, Any] | None = None
             ) -> None:
        """Write ``pid``'s version, and the task's ``timing`` in a file beside it
        (:meth:`KeyedStateStore.save_timing`). The state is the batch's result; the timing is
        a measurement, so failing to write it (a junk file in its place, a full disk) is
        logged and never fails the task. Refused (StateOwnershipError) when another runner
        owns the path now."""
        table = encode_state(state, self.key_type, self.value_type)
        self.fence(pid)
        self.store.delete_changelog(pid, self.batch_id)  # an earlier attempt's, if any
        self.store.save_table(pid, self.batch_id, table)
        if timing is not None:
            self.save_timing(pid, timing)

    def save_timing(self, pid: int, timing: dict[str, Any]) -> None:
        """Write the task's timing beside its version: a measurement, so a failure is logged,
        never raised."""
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
            if isinstance(self.blocks, UnitRows):
                return self.blocks.rows(keys)
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


def state_types(df: DataFrame, key: str, processor: KeyedWatermarkProcessFunction
                ) -> tuple[Any, Any]:
    """The key's Arrow type and the processor's declared ``state_schema`` as an Arrow struct.

    Returns
    -------
    key_type : pyarrow.DataType or None
        None when Arrow has no type for the key's Spark type.
    value_type : pyarrow.StructType or None
        None when the processor declares no ``state_schema``.

    Raises
    ------
    InvalidArgumentTypeError, InvalidArgumentError
        A ``state_schema`` that is not a DDL string or a StructType, or not a struct.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    try:  # a timestamp travels in Arrow with the session's time zone, as Spark sends it
        zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
        key_type = to_arrow_type(df.schema[key].dataType, timezone=zone)
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
