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

:func:`explain_keyed_process` says which engine a call takes, and why; nothing runs. It and
``keyed_process`` check a call with one function (:func:`keyed_process_options`) and choose
its engine with one rule (:func:`choose_keyed_engine`: the engine ladder every operator with
engines walks, :mod:`trilink_spark._internal.engines`, with :data:`KEYED_LADDER`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._internal.engines import EngineLadder, EnginePlan, EngineRequest, log_engine
from ..._internal.engines import request_engine, resolve_engine
from ...columns import EVENT_TIME_COL, PARTITION_COL, POS_COL, WATERMARK_COL, column_of
from ...columns import require_columns
from ...partitioners import Partitioner
from ...placement.keyed import check_placement
from ...placement.key_by import refuse_null_keys
from ...placement.source import is_keyed_by_source
from ..._internal.spark.plan import hash_partitions_of
from ..._internal.validation import refuse_streaming
from .prepare import KEYED_STREAM_ROUTE, check_processor, tag_plan
from ..semantics.process import KeyedWatermarkProcessFunction
from .watermark import key_watermark_of, late_against
from ..semantics.windows import KeyedWindowAggregate

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["KEYED_ENGINES", "KEYED_ENGINE_CONF", "KEYED_LADDER", "KeyedProcessPlan",
           "KeyedProcessOptions", "Prepared", "keyed_process_options", "choose_keyed_engine",
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

#: :func:`~trilink_spark.keyed_process`'s candidates on the engine ladder
#: (:func:`~trilink_spark._internal.engines.resolve_engine`).
KEYED_LADDER = EngineLadder(
    operator="keyed_process", argument="engine", choices=KEYED_ENGINES,
    engines={"spark": "spark", "python": "python"}, preferred="spark", fallback="python",
    runs={"python": "the keyed runtime in one Python task per partition",
          "spark": ("a Spark plan with no Python worker (placement, a running maximum per "
                    "key, hash aggregation)")},
    scope=("the built-in KeyedWindowAggregate with numeric value columns (or none) on a "
           "frame not declared keyed_by_source"),
    conf=KEYED_ENGINE_CONF)
#: Why the Spark plan runs a call it allows, in words.
_SPARK_RUNS = ("KeyedWindowAggregate on a bounded DataFrame: each key's watermark is a running "
               "maximum over its earlier rows (a window function) and the on-time rows "
               "aggregate by key and window in Spark, with no Python worker")
#: Why :func:`~trilink_spark.keyed_process` refuses a stream.
_STREAM_WHY = ("its timers and idle rule need every key's watermark and its partition's "
               "progress kept from one micro-batch to the next, and bounded input (at its end "
               "every timer fires)")

#: How :func:`~trilink_spark.keyed_process` runs a call (see :func:`explain_keyed_process`):
#: the :class:`~trilink_spark._internal.engines.EnginePlan` every operator's explain returns,
#: under the name it had. ``engine``: ``"spark"`` (a Spark plan with no Python worker:
#: placement, a running maximum per key, hash aggregation) or ``"python"`` (the keyed
#: runtime in one Python task per partition); ``reason``: why, in words.
KeyedProcessPlan = EnginePlan


class Prepared(NamedTuple):
    """What :func:`~trilink_spark.keyed.run.prepare.tag_plan` made of a call: the tagged rows,
    the delay and idle timeout in the event time's units, the output schema (Spark and
    Arrow)."""

    tagged: DataFrame
    delay_units: float
    idle_units: float
    out_schema: Any
    arrow_schema: Any


@dataclass(frozen=True)
class KeyedProcessOptions:
    """A :func:`~trilink_spark.keyed_process` call's arguments, checked: what it runs and
    what :func:`explain_keyed_process` describes (both build it with
    :func:`keyed_process_options`).

    Attributes
    ----------
    key : str
    processor : KeyedWatermarkProcessFunction
    order_by : str or None
    strategy : str or Partitioner
    num_partitions : int or None
    null_policy : str or None
        As given (None: the strategy's own, else ``spark.trilink.nullPolicy``).
    request : EngineRequest
        The engine asked for, ``spark.trilink.keyedEngine`` read for ``"auto"``.
    prepared : Prepared or None
        The event time, delay and idle timeout checked and the rows tagged
        (:func:`~trilink_spark.keyed.run.prepare.tag_plan`); None when no ``event_time`` was
        given (:func:`explain_keyed_process` without it).
    """

    key: str
    processor: KeyedWatermarkProcessFunction
    order_by: str | None
    strategy: str | Partitioner
    num_partitions: int | None
    null_policy: str | None
    request: EngineRequest
    prepared: Prepared | None


def keyed_process_options(
    df: DataFrame,
    key: str,
    processor: KeyedWatermarkProcessFunction,
    *,
    event_time: str | None = None,
    delay: Any = None,
    order_by: str | None = None,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    idle_timeout: Any = None,
    null_policy: str | None = None,
    engine: str = "auto",
) -> KeyedProcessOptions:
    """Check :func:`~trilink_spark.keyed_process`'s arguments: the one check of
    ``keyed_process`` and :func:`explain_keyed_process`, so both refuse the same arguments
    with the same error.

    Refuses a stream, then checks the processor, the key, ``order_by`` and value columns,
    the engine (and its conf), the placement arguments (as :func:`~trilink_spark.key_by`
    would refuse them), then, with ``event_time``, the event time, ``delay`` and
    ``idle_timeout``, tagging the rows (:func:`~trilink_spark.keyed.run.prepare.tag_plan`).

    Raises
    ------
    StreamingNotSupportedError
        ``df`` is a streaming DataFrame (the message names ``keyed_process`` and the route).
    InvalidArgumentError, InvalidArgumentTypeError, MissingColumnError, ReservedColumnError
        What ``keyed_process`` raises when called.

    Notes
    -----
    Cost: the frame's schema and a conf read; with ``event_time`` one query plan built and
    the processor bound to the frame. No job.
    """
    refuse_streaming(df, "keyed_process", _STREAM_WHY, KEYED_STREAM_ROUTE)
    check_processor(processor)
    require_columns(df, [key], "key column")
    require_columns(df, [order_by], "order_by column")
    if isinstance(processor, KeyedWindowAggregate):
        require_columns(df, list(processor.values), "value column")
    request = request_engine(KEYED_LADDER, df.sparkSession, engine)
    check_placement(strategy, num_partitions, {"null_policy": null_policy}, "keyed_process")
    prepared = None
    if event_time is not None:
        plan = tag_plan(df, key, event_time, processor, delay, order_by, idle_timeout)
        prepared = Prepared(plan.tag(df), plan.delay_units, plan.idle_units, plan.out_schema,
                            plan.arrow_schema)
    return KeyedProcessOptions(key, processor, order_by, strategy, num_partitions,
                               null_policy, request, prepared)


def choose_keyed_engine(df: DataFrame, key: str, processor: KeyedWatermarkProcessFunction,
                        engine: str | EngineRequest = "auto") -> EnginePlan:
    """The engine a bounded keyed run of ``processor`` on ``df`` takes, and why: the one rule
    of :func:`~trilink_spark.keyed_process` and :func:`explain_keyed_process`, the engine
    ladder (:func:`~trilink_spark._internal.engines.resolve_engine`) with
    :data:`KEYED_LADDER`.

    The Spark plan runs the built-in :class:`~trilink_spark.KeyedWindowAggregate` (not a
    subclass, whose hooks may differ) with a numeric ``value`` column (or none), on a frame
    that is not declared ``keyed_by_source`` (there the runtime processes each input
    partition where it is, with no exchange, which the plan would add). ``engine="spark"`` for
    a call it cannot run is an :class:`~trilink_spark.errors.InvalidArgumentError` saying why;
    ``engine="auto"`` follows ``spark.trilink.keyedEngine`` (default ``auto``), whose
    ``spark`` falls back to Python where the plan cannot run.

    Notes
    -----
    O(1) on the driver: one conf read (none for an :class:`EngineRequest` already read) and
    the frame's schema; no job.
    """
    from pyspark.sql.types import NumericType

    request = (engine if isinstance(engine, EngineRequest)
               else request_engine(KEYED_LADDER, df.sparkSession, engine))

    def allows() -> tuple[bool, str]:
        if type(processor) is not KeyedWindowAggregate:
            return False, (f"a {type(processor).__name__} processor (only the built-in "
                           "KeyedWindowAggregate has a Spark plan: a subclass may change its "
                           "hooks)")
        if is_keyed_by_source(df, key):
            return False, ("a frame declared keyed_by_source (the runtime processes each "
                           "input partition where it was read, with no exchange, where the "
                           "plan would add one)")
        for name in processor.values:
            dtype = df.schema[name].dataType
            if not isinstance(dtype, NumericType):
                return False, f"value column {name!r} of type {dtype.simpleString()} (not a number)"
        return True, _SPARK_RUNS

    return resolve_engine(KEYED_LADDER, request, allows)


def spark_window_aggregate(placed: DataFrame, key: str, processor: KeyedWindowAggregate,
                           order_by: str | None, delay: float, null_policy: str) -> DataFrame:
    """:class:`~trilink_spark.KeyedWindowAggregate` over placed rows, in Spark.

    Parameters
    ----------
    placed : pyspark.sql.DataFrame
        Rows tagged by :func:`~trilink_spark.keyed.run.prepare.tag_plan` and placed by
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
    null_policy : str
        The placement's null policy, resolved: under ``"error"`` a null key still fails the
        job where the plan no longer reads the placement's column (which holds that check).

    Returns
    -------
    pyspark.sql.DataFrame
        The processor's output rows and schema, as the Python runtime gives them: NaN values
        count as none, a NaN result (``inf - inf``) is null.

    Notes
    -----
    Cost: no exchange beyond the placement's (the window and the aggregation group by the
    key alone on rows Spark laid out by the key's hash, else by the placement's partition
    too, which the placement satisfies), one sort of each partition by key and arrival, a
    running maximum and a hash aggregation, all in the JVM. O(n log n). On the driver, one
    planning of ``placed`` (no job) to see its layout.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType, IntegralType

    arrival = ([column_of(order_by)] if order_by is not None else []) + [F.col(POS_COL)]
    # rows laid out by Spark's hash of the key (the hash strategy) satisfy a window and an
    # aggregation by the key alone; any other placement is a layout Spark cannot see, and
    # the placement's column in both groupings is what it satisfies. Either way no
    # exchange; the key first, so the sort compares keys, not a constant
    by_key = hash_partitions_of(placed, key) is not None
    groups = [column_of(key)] if by_key else [column_of(key), F.col(PARTITION_COL)]
    if by_key:
        placed = refuse_null_keys(placed, key, null_policy)
    window = (Window.partitionBy(*groups).orderBy(*arrival)
              .rowsBetween(Window.unboundedPreceding, -1))
    et = F.col(EVENT_TIME_COL)
    if processor.time_kind == "fractional":
        # a NaN time is a time not known, as null is, in the watermark, the verdict and the
        # window: made null once, so no guard is needed where it is read
        placed = placed.withColumn(EVENT_TIME_COL, F.when(~F.isnan(et), et))
    # the watermark a column first: the verdict reads it twice, which would compute the
    # window twice
    marked = placed.withColumn(WATERMARK_COL, key_watermark_of(et, window, delay, nan=False))
    size = float(processor.size_units)
    units = et / F.lit(size)
    # floor in doubles, as numpy's: a whole double (and +-inf) is its own floor
    start = F.when(F.abs(units) < F.lit(_WHOLE), F.floor(units).cast("double")) \
        .otherwise(units) * F.lit(size)
    kept = ["k"] if by_key else ["k", PARTITION_COL]
    columns = [column_of(key).alias("k"), *map(F.col, kept[1:]), start.alias("s")]
    schema = placed.schema
    for j, name in enumerate(processor.values):
        value = column_of(name).cast("double")
        if not isinstance(schema[name].dataType, (IntegralType, DecimalType)):
            value = F.when(~F.isnan(value), value)  # NaN: no value (never in an integer)
        columns.append(value.alias(f"v{j}"))
    # no NaN time is left, and a delay is finite (delay_in_units): no NaN watermark either
    judged = marked.select(*columns, late_against(et, F.col(WATERMARK_COL), nan=False)
                           .alias("late"))
    # a null verdict is a row without a known event time: in no window
    on_time = judged.where(F.col("late") == F.lit(False))
    # only the partial aggregates the specs read: each one more is a column per group
    # carried through the aggregation's hash map and exchange
    needs = {"count": ("nn",), "mean": ("nn", "sum"), "sum": ("sum",), "min": ("min",),
             "max": ("max",)}
    made = {("count" if spec.column is None else part, spec.column)
            for spec in processor.specs for part in needs[spec.func]}
    partials = {"nn": F.count, "sum": F.sum, "min": F.min, "max": F.max}
    aggs: list[Column] = [F.count(F.lit(1)).alias("count")]
    for j, name in enumerate(processor.values):
        v = F.col(f"v{j}")
        aggs += [partials[part](v).alias(f"{part}{j}") for part in partials
                 if (part, name) in made]
    grouped = on_time.groupBy(*kept, "s").agg(*aggs)
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


def explain_keyed_process(
    df: DataFrame,
    key: str,
    processor: KeyedWatermarkProcessFunction,
    *,
    event_time: str | None = None,
    delay: Any = None,
    order_by: str | None = None,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    idle_timeout: Any = None,
    null_policy: str | None = None,
    engine: str = "auto",
) -> EnginePlan:
    """The engine :func:`~trilink_spark.keyed_process` takes for ``processor`` on ``df``, and
    why (nothing runs).

    The arguments are ``keyed_process``'s, checked by the same function
    (:func:`keyed_process_options`: the same errors); all but ``df``, ``key`` and
    ``processor`` are keyword-only, ``order_by`` as in ``keyed_process``. Without
    ``event_time`` the event time, ``delay`` and ``idle_timeout`` are not checked (they do
    not change the engine); with it, everything ``keyed_process`` checks when called is.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    processor : KeyedWatermarkProcessFunction
    event_time, delay, order_by, strategy, num_partitions, idle_timeout, null_policy
        As given to ``keyed_process``.
    engine : {"auto", "spark", "python"}
        As given to ``keyed_process``.

    Returns
    -------
    EnginePlan
        ``engine`` (``"spark"`` or ``"python"``) and ``reason`` (in words, starting with what
        asked: ``engine='auto'``, the conf); also named :data:`KeyedProcessPlan`.

    Raises
    ------
    InvalidArgumentError
        ``engine="spark"`` for a call the Spark plan cannot run (the message says why), an
        unknown engine, and whatever else ``keyed_process`` refuses when called.
    StreamingNotSupportedError
        ``df`` is a streaming DataFrame, as ``keyed_process`` refuses it (the same message).

    Notes
    -----
    Cost: O(1), a conf read and the frame's schema; with ``event_time`` one query plan built
    (the rows tagged, the processor bound). No job.

    Examples
    --------
    >>> explain_keyed_process(df, "sensor", tl.KeyedWindowAggregate(60.0))  # doctest: +SKIP
    EnginePlan(engine='spark', reason="engine='auto': KeyedWindowAggregate on a bounded ...")
    """
    options = keyed_process_options(
        df, key, processor, event_time=event_time, delay=delay, order_by=order_by,
        strategy=strategy, num_partitions=num_partitions, idle_timeout=idle_timeout,
        null_policy=null_policy, engine=engine)
    return choose_keyed_engine(df, options.key, options.processor, options.request)


def log_choice(plan: EnginePlan, key: str) -> None:
    """Log the engine a call on ``key`` took and why (INFO): ``"keyed_process on '<key>':
    the <engine> engine (<reason>)"``. O(1)."""
    log_engine(logger, KEYED_LADDER, key, plan)
