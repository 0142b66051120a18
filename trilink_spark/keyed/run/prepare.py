"""The driver side of a keyed run, shared by the batch and the streaming runner.

:func:`tag_plan` checks the arguments and plans the tagging of each row with its arrival position and event
time; :func:`arrival_order` and :func:`in_arrival_order` put each placed partition back in
arrival order (Spark side and Python side); :func:`in_place` keeps a frame declared with
:func:`~trilink_spark.placement.keyed_by_source` where it was read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._internal.spark.frames import Projection
from ...columns import EVENT_TIME_COL, PARTITION_COL, POS_COL, check_user_columns
from ...columns import check_atomic_key, column_of, require_columns
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ...eventtime import delay_in_units, event_time_micros
from ...placement.source import check_source_layout
from ..semantics.process import KeyedWatermarkProcessFunction

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["check_processor", "tag_plan", "TagPlan", "arrival_columns", "units", "carried_columns",
           "arrival_order", "in_arrival_order", "KEYED_STREAM_ROUTE"]

#: What a refused streaming frame is told to use instead (``keyed_watermark``,
#: ``keyed_process``): the runner that keeps keyed watermarks, timers and state across
#: micro-batches.
KEYED_STREAM_ROUTE = (
    "Keep keyed watermarks, timers and state across micro-batches with keyed_foreach_batch in "
    "writeStream.foreachBatch (late rows reach the processor's process_late): "
    "stream.writeStream.foreachBatch(tl.keyed_foreach_batch(sink, key, event_time, processor, "
    "delay, state_path)).start()")


def check_processor(processor: object) -> None:
    """Refuse a ``processor`` that is not a :class:`KeyedWatermarkProcessFunction`.

    Raises
    ------
    InvalidArgumentTypeError
        Naming the type given.
    """
    if not isinstance(processor, KeyedWatermarkProcessFunction):
        raise InvalidArgumentTypeError(
            f"processor must be a KeyedWatermarkProcessFunction, got {type(processor).__name__}"
        )


def units(delay: Any, idle_timeout: Any, kind: str) -> tuple[float, float]:
    """``delay`` and the idle timeout in the units of an event time of ``kind``.

    Parameters
    ----------
    delay : str, float or datetime.timedelta
        Allowed lateness, as :func:`~trilink_spark.eventtime.delay_in_units` reads it.
    idle_timeout : str, float, datetime.timedelta or None
        When a key counts as idle: None for the default, 4 x ``delay`` (never, ``math.inf``,
        for a zero delay); ``math.inf`` for never.
    kind : {"timestamp", "integral", "fractional"}
        The event-time column's kind (:func:`~trilink_spark.eventtime.time_kind`).

    Returns
    -------
    delay_units, idle_units : float
        Microseconds for a timestamp event time, the column's own unit otherwise.

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        A delay or idle timeout :func:`~trilink_spark.eventtime.delay_in_units` refuses.

    Notes
    -----
    O(1). :func:`tag_plan` and :class:`~trilink_spark.testing.KeyedTester` convert with it.

    Examples
    --------
    >>> units("10 seconds", None, "timestamp")
    (10000000.0, 40000000.0)
    >>> units(0, None, "integral")
    (0.0, inf)
    >>> units(5, 7, "integral")
    (5.0, 7.0)
    """
    delay_units = delay_in_units(delay, kind)
    if idle_timeout is None:
        return delay_units, 4 * delay_units if delay_units > 0 else math.inf
    if idle_timeout == math.inf:
        return delay_units, math.inf
    return delay_units, delay_in_units(idle_timeout, kind, "idle_timeout")


def carried_columns(processor: KeyedWatermarkProcessFunction, frame: Any, key: str,
                    order_by: str | None) -> list[str]:
    """The columns of a keyed run that reach the hooks, besides the event time.

    All of ``frame``'s columns when the processor's ``input_columns()`` is None (the hooks may
    read any column); else the key, the columns it lists and ``order_by``, each once, in that
    order.

    Parameters
    ----------
    processor : KeyedWatermarkProcessFunction
        Its ``input_columns()`` is called once (a generator it returns is read once).
    frame : pyspark.sql.DataFrame, pandas.DataFrame, StructType or pyarrow.Schema
        The frame, or its schema: anything with ``columns`` or ``names``.
    key : str
    order_by : str or None

    Returns
    -------
    list of str

    Raises
    ------
    InvalidArgumentTypeError
        ``input_columns()`` returned something that is not a list of column names or None.
    MissingColumnError
        A column it lists is not in ``frame``.

    Notes
    -----
    O(columns). :func:`tag_plan` and :class:`~trilink_spark.testing.KeyedTester` select with
    it.

    Examples
    --------
    >>> from trilink_spark import KeyedWatermarkProcessFunction
    >>> class Reads(KeyedWatermarkProcessFunction):
    ...     output_schema = "k string"
    ...     def input_columns(self):
    ...         return ["v"]
    ...     def process_on_time(self, key, rows, ctx):
    ...         return None
    >>> import pandas as pd
    >>> carried_columns(Reads(), pd.DataFrame(columns=["k", "t", "v", "w"]), "k", "w")
    ['k', 'v', 'w']
    >>> carried_columns(Reads(), pd.DataFrame(columns=["k", "t"]), "k", None)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.MissingColumnError: input column 'v' is not in the DataFrame; its columns are ['k', 't']
    """
    wanted = processor.input_columns()
    if wanted is None:
        return list(frame.columns if hasattr(frame, "columns") else frame.names)
    listed = (None if isinstance(wanted, (str, bytes)) or not isinstance(wanted, Iterable)
              else list(wanted))  # read once: a generator would be empty the 2nd time
    if listed is None or not all(isinstance(c, str) for c in listed):
        raise InvalidArgumentTypeError(
            f"{type(processor).__name__}.input_columns() must return a list of column "
            f"names or None, got {wanted!r:.80}")
    require_columns(frame, listed, "input column")
    return list(dict.fromkeys([key, *listed, *([order_by] if order_by else [])]))


@dataclass(frozen=True)
class TagPlan:
    """What :func:`tag_plan` makes of a frame's schema: the projection that tags its rows,
    and the run's units and output schema. Built once per schema (a stream's is fixed), it
    tags every micro-batch with one projection and no new column expression.

    Attributes
    ----------
    columns : list of Column
        The carried columns, the arrival position (:data:`POS_COL`) and the event time in
        the column's units (:data:`EVENT_TIME_COL`).
    delay_units, idle_units : float
    out_schema, arrow_schema
        The processor's output schema (Spark, Arrow).
    projection : Projection
        ``columns`` as one select (:mod:`~trilink_spark._internal.spark.frames`).
    """

    columns: list[Any]
    delay_units: float
    idle_units: float
    out_schema: Any
    arrow_schema: Any
    projection: Projection

    def tag(self, df: DataFrame) -> DataFrame:
        """``df``'s rows tagged for the placement (a projection, no job; one Py4J command
        after the first on a classic session, whose output's schema is known then, read
        from the first). ``df`` must have the schema the plan was built for."""
        return self.projection(df)


def tag_plan(
    df: DataFrame,
    key: str,
    event_time: str,
    processor: KeyedWatermarkProcessFunction,
    delay: Any,
    order_by: str | None,
    idle_timeout: Any,
) -> TagPlan:
    """Check a keyed run's arguments against ``df`` and plan the tagging of its rows for the
    placement: :meth:`TagPlan.tag` applies it (one projection).

    Returns
    -------
    TagPlan
        Its ``columns`` select the key, the columns the processor reads (all of them when
        its ``input_columns()`` is None) and ``order_by``, plus the arrival position
        (:data:`POS_COL`) and the event time in the column's units (:data:`EVENT_TIME_COL`);
        ``delay_units`` and ``idle_units`` are ``delay`` and the idle timeout (default 4 x
        ``delay``; ``math.inf`` never) in those units; ``out_schema`` is the processor's
        ``output_schema`` parsed, ``arrow_schema`` the same as Arrow in the session's time
        zone.

    Raises
    ------
    InvalidArgumentTypeError, InvalidArgumentError
        A processor of the wrong type or without an ``output_schema``, a bad delay or idle
        timeout.
    MissingColumnError, ReservedColumnError, InvalidKeyTypeError
        A missing or reserved column, a key that is not atomic.

    Notes
    -----
    Runs on the driver, once per run; a stream builds it once per schema and applies it to
    each micro-batch. Cost: the schema, a conf read and the column expressions (about 180
    Py4J calls on a classic session); binds the processor to the schema.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    check_processor(processor)
    require_columns(df, [key], "key column")
    require_columns(df, [order_by], "order_by column")
    check_user_columns(df)
    check_atomic_key(df, key)
    et_col, kind = event_time_micros(df, event_time)
    delay_units, idle_units = units(delay, idle_timeout, kind)
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
    # only what the processor reads crosses the exchange and into Python
    names = carried_columns(processor, df, key, order_by)
    carried = ([F.col("*")] if names == list(df.columns)
               else [column_of(c) for c in names])
    columns = [*carried, F.monotonically_increasing_id().alias(POS_COL),
               et_col.alias(EVENT_TIME_COL)]
    return TagPlan(columns, delay_units, idle_units, out_schema, arrow_schema,
                   Projection(columns, fixed_schema=True))


def arrival_order(placed: DataFrame, order_by: str | None,
                  col: Callable[[str], Column] = column_of) -> DataFrame:
    """``placed`` without the placement's column, in arrival order within each partition.

    With ``order_by``, Spark sorts each partition by (``order_by``, arrival position) and the
    position stays behind. Without it, the arrival position (:data:`POS_COL`) crosses into
    Python instead and the task puts its rows in that order (:func:`in_arrival_order`):
    after the exchange a partition holds one increasing run of positions per map task, which
    a stable numpy sort merges in O(rows log runs), where Spark's sort of the whole rows cost
    about a fifth of the keyed job (benches/RESULTS.md, §18). ``col`` builds each column
    (a stream passes a :class:`~trilink_spark.columns.ColumnCache`)."""
    keep = [col(c) for c in arrival_columns(placed.columns, order_by)]
    if order_by is None:
        return placed.select(*keep)
    return placed.sortWithinPartitions(col(order_by), POS_COL).select(*keep)


def arrival_columns(columns: Sequence[str], order_by: str | None) -> list[str]:
    """The columns of a placed frame (``columns``) that :func:`arrival_order` keeps: all but
    the placement's, and but the arrival position when Spark sorts by ``order_by``."""
    dropped = (PARTITION_COL,) if order_by is None else (PARTITION_COL, POS_COL)
    return [c for c in columns if c not in dropped]


def in_arrival_order(table: Any) -> Any:
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
