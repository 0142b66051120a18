"""Bounded keyed windows planned in Spark: :class:`~trilink_spark.KeyedWindowAggregate` with no
Python worker.

On a bounded DataFrame, :func:`~trilink_spark.keyed_process` with the built-in
:class:`~trilink_spark.KeyedWindowAggregate` gives the same rows from a Spark plan as from the
Python runtime, because on bounded input every step of the runtime's semantics
(:mod:`trilink_spark.keyed.semantics.process`) is a column expression:

- a row's key watermark is the running maximum of its key's earlier rows in arrival order minus
  ``delay``: a window function (:func:`~trilink_spark.keyed.run.watermark.key_watermark_of`, the rule
  :func:`~trilink_spark.keyed_watermark` applies with ``n_keys=1``, one watermark per key, which
  is what the runtime keeps);
- on-time rows with a known event time then aggregate by ``(key, window start)`` with Spark's
  hash aggregation, which needs no second exchange: the rows are already placed by key;
- the idle rule holds as it is: a bounded run gives each partition's rows to its runtime as one
  batch, and the runtime applies the idle rule only after every row of that batch was judged,
  so an idle key's advanced watermark judges no row (it only closes windows, and at the end of
  bounded input every window closes anyway).

The rows are placed exactly as the Python runtime places them (:func:`~trilink_spark.key_by`
with the same strategy, partition count and null policy), so partition ``i`` of the result
holds the windows of the keys the strategy put on ``i`` either way.

:func:`explain_keyed_process` says which engine a call takes, and why; nothing runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._internal.spark.session import conf_get
from ...columns import EVENT_TIME_COL, PARTITION_COL, POS_COL, WATERMARK_COL, column_of
from ...columns import require_columns
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ...placement.source import is_keyed_by_source
from ..._internal.validation import choice, refuse_streaming
from .prepare import KEYED_STREAM_ROUTE, check_processor
from ..semantics.process import KeyedWatermarkProcessFunction
from .watermark import key_watermark_of, late_against
from ..semantics.windows import KeyedWindowAggregate

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["KEYED_ENGINES", "KEYED_ENGINE_CONF", "KeyedProcessPlan", "choose_keyed_engine",
           "explain_keyed_process", "log_choice", "spark_window_aggregate"]

logger = logging.getLogger(__name__)

#: Engines of :func:`~trilink_spark.keyed_process`: ``"auto"`` (Spark's plan where it gives the
#: runtime's rows exactly, else the Python runtime), ``"spark"`` or ``"python"``.
KEYED_ENGINES: tuple[str, ...] = ("auto", "spark", "python")
#: ``spark.trilink.keyedEngine``: the engine :func:`~trilink_spark.keyed_process` uses when
#: its ``engine`` is ``"auto"``; ``"spark"`` where the call cannot run there takes Python.
KEYED_ENGINE_CONF = "keyedEngine"
#: Beyond this magnitude a double is a whole number (2**52): its floor is itself.
_WHOLE = float(2**52)


@dataclass(frozen=True)
class KeyedProcessPlan:
    """How :func:`~trilink_spark.keyed_process` runs a call (see :func:`explain_keyed_process`).

    Attributes
    ----------
    engine : str
        ``"spark"``: a Spark plan with no Python worker (placement, a running maximum per key,
        hash aggregation); ``"python"``: the keyed runtime in one Python task per partition.
    reason : str
        Why, in words.
    """

    engine: str
    reason: str


def choose_keyed_engine(df: DataFrame, key: str, processor: KeyedWatermarkProcessFunction,
                        engine: str = "auto") -> KeyedProcessPlan:
    """The engine a bounded keyed run of ``processor`` on ``df`` takes, and why: the one rule
    of :func:`~trilink_spark.keyed_process` and :func:`explain_keyed_process`.

    The Spark plan runs the built-in :class:`~trilink_spark.KeyedWindowAggregate` (not a
    subclass, whose hooks may differ) with a numeric ``value`` column (or none), on a frame
    that is not declared ``keyed_by_source`` (there the runtime processes each input
    partition where it is, with no exchange, which the plan would add). ``engine="spark"`` for
    a call it cannot run is an :class:`~trilink_spark.errors.InvalidArgumentError` saying why;
    ``engine="auto"`` follows ``spark.trilink.keyedEngine`` (default ``auto``), whose
    ``spark`` falls back to Python where the plan cannot run.

    Notes
    -----
    O(1) on the driver: one conf read and the frame's schema; no job.
    """
    from pyspark.sql.types import NumericType

    if not isinstance(engine, str) or engine not in KEYED_ENGINES:
        error = InvalidArgumentError if isinstance(engine, str) else InvalidArgumentTypeError
        raise error(f"engine must be one of {', '.join(KEYED_ENGINES)}, got {engine!r}")
    explicit = engine != "auto"
    chosen = engine
    if not explicit:
        chosen = choice(conf_get(df.sparkSession, KEYED_ENGINE_CONF, "auto"),
                        f"spark.trilink.{KEYED_ENGINE_CONF}", KEYED_ENGINES)
    if chosen == "python":
        where = "engine='python'" if explicit else f"spark.trilink.{KEYED_ENGINE_CONF}=python"
        return KeyedProcessPlan("python", f"{where} asks for the Python runtime")
    why = None
    if type(processor) is not KeyedWindowAggregate:
        why = (f"the processor is a {type(processor).__name__}: only the built-in "
               "KeyedWindowAggregate has a Spark plan (a subclass may change its hooks)")
    elif is_keyed_by_source(df, key):
        why = ("the frame is declared keyed_by_source: the runtime processes each input "
               "partition where it was read, with no exchange, where the plan would add one")
    elif isinstance(processor, KeyedWindowAggregate):
        for name in processor.values:
            dtype = df.schema[name].dataType
            if not isinstance(dtype, NumericType):
                why = f"value column {name!r} is {dtype.simpleString()}, not a number"
                break
    if why is None:
        reason = ("KeyedWindowAggregate on a bounded DataFrame: each key's watermark is a "
                  "running maximum over its earlier rows (a window function) and the on-time "
                  "rows aggregate by key and window in Spark, with no Python worker")
        return KeyedProcessPlan("spark", reason)
    if explicit:
        raise InvalidArgumentError(f"engine='spark' cannot run this call: {why}; use "
                                   "engine='auto' or 'python'")
    return KeyedProcessPlan("python", why)


def spark_window_aggregate(placed: DataFrame, key: str, processor: KeyedWindowAggregate,
                           order_by: str | None, delay: float) -> DataFrame:
    """:class:`~trilink_spark.KeyedWindowAggregate` over placed rows, in Spark.

    Parameters
    ----------
    placed : pyspark.sql.DataFrame
        Rows tagged by :func:`~trilink_spark.keyed.run.prepare.prepare` and placed by
        :func:`~trilink_spark.placement.key_by.place_rows`: the key, the value, ``order_by``,
        :data:`~trilink_spark.columns.POS_COL`, :data:`~trilink_spark.columns.EVENT_TIME_COL`
        and :data:`~trilink_spark.columns.PARTITION_COL`.
    key : str
    processor : KeyedWindowAggregate
        Bound to the frame (``processor.bind``, done by ``prepare``).
    order_by : str or None
        Arrival order (ties by input position); None: the input position.
    delay : float
        Allowed lateness in internal units.

    Returns
    -------
    pyspark.sql.DataFrame
        The processor's output rows and schema, as the Python runtime gives them: NaN values
        count as none, a NaN result (``inf - inf``) is null.

    Notes
    -----
    Cost: no exchange beyond the placement's (the window and the aggregation group by the
    placement's partition too, which the placement satisfies), one sort of each partition by
    key and arrival, a running maximum and a hash aggregation, all in the JVM. O(n log n).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    arrival = ([column_of(order_by)] if order_by is not None else []) + [F.col(POS_COL)]
    # the placement's column in the window's partitioning: the placement satisfies it, so
    # Spark adds no exchange; the key first, so the sort compares keys, not a constant
    window = (Window.partitionBy(column_of(key), F.col(PARTITION_COL)).orderBy(*arrival)
              .rowsBetween(Window.unboundedPreceding, -1))
    et = F.col(EVENT_TIME_COL)
    # the watermark a column first: the verdict reads it twice, which would compute the
    # window twice
    marked = placed.withColumn(WATERMARK_COL, key_watermark_of(et, window, delay))
    size = float(processor.size_units)
    units = et / F.lit(size)
    # floor in doubles, as numpy's: a whole double (and +-inf) is its own floor
    start = F.when(F.abs(units) < F.lit(_WHOLE), F.floor(units).cast("double")) \
        .otherwise(units) * F.lit(size)
    columns = [column_of(key).alias("k"), F.col(PARTITION_COL), start.alias("s")]
    for j, name in enumerate(processor.values):
        value = column_of(name).cast("double")
        columns.append(F.when(~F.isnan(value), value).alias(f"v{j}"))  # NaN: no value
    judged = marked.select(*columns, late_against(et, F.col(WATERMARK_COL)).alias("late"))
    # a null verdict is a row without a known event time: in no window
    on_time = judged.where(F.col("late") == F.lit(False))
    aggs: list[Column] = [F.count(F.lit(1)).alias("count")]
    for j in range(len(processor.values)):
        v = F.col(f"v{j}")
        aggs += [F.count(v).alias(f"nn{j}"), F.sum(v).alias(f"sum{j}"),
                 F.min(v).alias(f"min{j}"), F.max(v).alias(f"max{j}")]
    grouped = on_time.groupBy("k", PARTITION_COL, "s").agg(*aggs)
    out = [F.col("k").alias(key), _time(F.col("s"), processor.time_kind).alias("window_start"),
           _time(F.col("s") + F.lit(size), processor.time_kind).alias("window_end")]
    for spec in processor.specs:
        if spec.column is None:
            out.append(F.col("count").alias(spec.name))
            continue
        j = processor.values.index(spec.column)
        if spec.func == "count":
            out.append(F.col(f"nn{j}").alias(spec.name))
            continue
        result = (F.when(F.col(f"nn{j}") > 0, F.col(f"sum{j}") / F.col(f"nn{j}"))
                  if spec.func == "mean" else F.col(f"{spec.func}{j}"))
        out.append(F.when(~F.isnan(result), result).alias(spec.name))  # NaN: null, as in Arrow
    return grouped.select(*out)


def _time(units: Column, kind: str) -> Column:
    """Internal units back to the event time's type, as
    :func:`~trilink_spark.eventtime.from_units` does (rounded half to even)."""
    from pyspark.sql import functions as F

    if kind == "timestamp":
        return F.timestamp_micros(F.rint(units).cast("long"))
    if kind == "integral":
        return F.rint(units).cast("bigint")
    return units


def explain_keyed_process(df: DataFrame, key: str, processor: KeyedWatermarkProcessFunction,
                          *, engine: str = "auto") -> KeyedProcessPlan:
    """The engine :func:`~trilink_spark.keyed_process` takes for ``processor`` on ``df``, and
    why (nothing runs).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    processor : KeyedWatermarkProcessFunction
    engine : {"auto", "spark", "python"}
        As given to ``keyed_process``.

    Returns
    -------
    KeyedProcessPlan

    Raises
    ------
    InvalidArgumentError
        ``engine="spark"`` for a call the Spark plan cannot run (the message says why), or an
        unknown engine.
    StreamingNotSupportedError
        ``df`` is a streaming DataFrame, as ``keyed_process`` refuses it.

    Notes
    -----
    Cost: O(1), a conf read and the frame's schema; no job.

    Examples
    --------
    >>> explain_keyed_process(df, "sensor", tl.KeyedWindowAggregate(60.0))  # doctest: +SKIP
    KeyedProcessPlan(engine='spark', reason='KeyedWindowAggregate on a bounded DataFrame: ...')
    """
    refuse_streaming(df, "explain_keyed_process", "keyed_process runs bounded input only: "
                     "its timers and idle rule need every key's watermark kept from one "
                     "micro-batch to the next", KEYED_STREAM_ROUTE)
    check_processor(processor)
    require_columns(df, [key], "key column")
    if isinstance(processor, KeyedWindowAggregate):
        require_columns(df, list(processor.values), "value column")
    return choose_keyed_engine(df, key, processor, engine)


def log_choice(plan: KeyedProcessPlan) -> None:
    """Log the engine a call took and why (INFO)."""
    logger.info("keyed_process: the %s engine: %s", plan.engine, plan.reason)

