"""Run a keyed process function over a bounded DataFrame.

:func:`keyed_process` places the rows with :func:`~trilink_spark.key_by` (one shuffle), sorts
each partition in arrival order and runs the processor over every partition (``mapInArrow``);
the built-in :class:`~trilink_spark.KeyedWindowAggregate` runs as a Spark plan instead
(:mod:`~trilink_spark.keyed.run.window_plan`). The streaming runner is
:mod:`trilink_spark.keyed.run.streaming`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._internal.optiming import operator_timer
from ..._internal.spark.executors import ensure_executors
from ...partitioners import Partitioner
from ...placement.key_by import null_policy_of, place_rows, refuse_null_keys
from ...placement.source import is_keyed_by_source
from ...columns import python_input
from ...errors import InvalidArgumentTypeError
from .prepare import arrival_order
from ...placement.source import in_place
from ..semantics.process import KeyedWatermarkProcessFunction
from .task import partition_function
from .window_plan import choose_keyed_engine, keyed_process_options, log_choice
from .window_plan import spark_window_aggregate
from ..semantics.windows import KeyedWindowAggregate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["keyed_process"]


def keyed_process(
    df: DataFrame,
    key: str,
    event_time: str,
    processor: KeyedWatermarkProcessFunction,
    delay: Any,
    *,
    order_by: str | None = None,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    idle_timeout: Any = None,
    null_policy: str | None = None,
    engine: str = "auto",
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
        Arrival order; default the input order. Keyword-only, as in
        :func:`~trilink_spark.keyed_foreach_batch` (so are the arguments after it).
    strategy, num_partitions
        Placement, as in :func:`~trilink_spark.key_by`.
    idle_timeout : str, float or timedelta, optional
        When a key counts as idle (an interval string such as ``"2 minutes"`` too) (module docs of :mod:`~trilink_spark.keyed.semantics.process`);
        default 4 x ``delay``; ``math.inf`` never.
    null_policy : {"group", "error", "partition0"}, optional
        As in :func:`~trilink_spark.key_by`: by default the null key is a key of its own.
    engine : {"auto", "spark", "python"}
        ``"auto"``: the built-in :class:`~trilink_spark.KeyedWindowAggregate` runs as a Spark
        plan with no Python worker, giving the Python runtime's rows exactly
        (:mod:`~trilink_spark.keyed.run.window_plan`); any other processor, a subclass, a
        non-numeric ``value`` or a ``keyed_by_source`` frame runs in the Python runtime.
        :func:`~trilink_spark.keyed.explain_keyed_process` says which and why, and the choice
        is logged. ``spark.trilink.keyedEngine=python`` forces the runtime for ``"auto"``
        calls. ``"spark"`` / ``"python"`` force one (``"spark"`` for a call the plan cannot
        run is an error saying why).

    Returns
    -------
    pyspark.sql.DataFrame
        The rows the hooks returned, with the processor's ``output_schema``. The input is
        bounded: when it ends every key's watermark goes to infinity, so all timers fire.

    Raises
    ------
    StreamingNotSupportedError
        ``df`` is a streaming DataFrame, refused when the call is made: timers and the idle
        rule need each key's watermark and its partition's progress kept across micro-batches.
        Run the same processor with :func:`~trilink_spark.keyed_foreach_batch` in
        ``writeStream.foreachBatch``.

    Notes
    -----
    Cost, Spark plan: the one shuffle of ``key_by`` (none on a frame already laid out by
    ``repartition(n, key)`` under ``"hash"``: :func:`~trilink_spark.placement.already_placed`), a sort of each partition by key and
    arrival, a running maximum per key and Spark's hash aggregation of the on-time rows, all
    in the JVM (benches/RESULTS.md, §18). Python runtime: the one shuffle of ``key_by`` (none on a frame declared with
    :func:`~trilink_spark.placement.keyed_by_source`: each input partition is processed where it
    is), a sort of each partition by arrival, then one Python task per partition holding that
    partition's rows in memory (as ``applyInPandas`` does per group). Per-key hooks cost one Python
    call per key and hook; ``KeyedWindowAggregate`` is vectorised over all keys.

    Examples
    --------
    >>> counts = tl.keyed_process(df, "sensor", "ts", tl.KeyedWindowAggregate(60.0),
    ...                           delay=5.0)  # doctest: +SKIP
    """
    options = keyed_process_options(
        df, key, processor, event_time=event_time, delay=delay, order_by=order_by,
        strategy=strategy, num_partitions=num_partitions, idle_timeout=idle_timeout,
        null_policy=null_policy, engine=engine)
    if options.prepared is None:  # no event time to check: event_time=None
        raise InvalidArgumentTypeError("event_time must be the name of a timestamp or numeric "
                                       "column, got None")
    tagged, delay_units, idle_units, out_schema, arrow_schema = options.prepared
    plan = choose_keyed_engine(df, key, processor, options.request)
    log_choice(plan, key)
    if plan.engine == "spark" and isinstance(processor, KeyedWindowAggregate):
        placed = place_rows(tagged, key, strategy, num_partitions, null_policy=null_policy)
        return spark_window_aggregate(placed, key, processor, order_by, delay_units,
                                      null_policy_of(df, strategy, null_policy))
    if is_keyed_by_source(df, key):
        placed = in_place(df, key, refuse_null_keys(
            tagged, key, null_policy_of(df, strategy, null_policy)))
    else:
        placed = place_rows(tagged, key, strategy, num_partitions, null_policy=null_policy)
    placed, aliases = python_input(arrival_order(placed, order_by))
    ensure_executors(df.sparkSession)  # a cluster's executors must import the package
    fn = partition_function(processor, key, delay_units, idle_units, arrow_schema, None,
                            operator_timer(df.sparkSession, "keyed"), aliases)
    return placed.mapInArrow(fn, out_schema)
