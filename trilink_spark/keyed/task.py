"""The Python task of a keyed run: one partition through the processor, out as Arrow.

:func:`partition_function` builds the ``mapInArrow`` function both runners use
(:func:`~trilink_spark.keyed_process` and :func:`~trilink_spark.keyed_foreach_batch`);
:func:`outputs_to_batches` turns the hooks' outputs into Arrow batches of the output schema.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._internal.optiming import OperatorTimer, Stopwatch
from ..errors import InvalidArgumentError
from .prepare import in_arrival_order
from .process import KeyedRuntime, KeyedWatermarkProcessFunction
from .snapshot import decode_state
from .stateio import StateIO

__all__ = ["partition_function", "outputs_to_batches"]


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
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that runs ``processor`` over one partition.

    Parameters
    ----------
    processor, key
        The process function and the key column.
    delay, idle_timeout : float
        In the event-time column's units (:func:`~trilink_spark.keyed.prepare.prepare`).
    arrow_schema : pyarrow.Schema
        The processor's ``output_schema``.
    io : StateIO or None
        None for a bounded run: the task starts empty and ends with every key's watermark
        at infinity (all timers fire). Otherwise the task loads its partition's state,
        and saves the new version with its timing, through ``io``.
    timer : OperatorTimer, optional
        Where the task writes its rows in and out and its busy and waiting time.

    Returns
    -------
    callable
        ``run(batches) -> batches``. Each task puts its rows in arrival order
        (:func:`~trilink_spark.keyed.prepare.in_arrival_order`), runs the hooks through a
        :class:`~trilink_spark.keyed.process.KeyedRuntime` and converts what they returned
        (:func:`outputs_to_batches`). Cost: the partition's rows and outputs in memory.
    """
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
        frame = (in_arrival_order(pa.Table.from_batches(received)).to_pandas()
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
        batches_out = list(outputs_to_batches(outs, arrow_schema))
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
