"""Global Merge: no keyed exchange at all (Trilink paper, §4.3 (2), Figure 11 (c)).

Every partition aggregates its own rows and merges the resulting partials (deltas) into one
global result. With the embedded ``store="driver"`` the deltas are collected by the driver
(Arrow) and merged there; only one partial row per key, partition and flush crosses the
network, and the plan has no shuffle exchange. The modes of
:func:`~trilink_spark.local_merge` decide how often a partition flushes its deltas.

The engine follows the rule of Local Merge (:mod:`~trilink_spark.merge.engines.engine`), in
:func:`choose_global_engine`: with the driver store and only count, sum, min, max and mean,
Spark's own ``groupBy(key).agg`` computes the same merge in the JVM (partial aggregation in
each partition, one exchange of the partials, their merge); first, last and a Combine need
the Python engine, and a RedisStore's tasks apply their deltas in Python.
:func:`explain_global_merge` says which, and why.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from ...columns import CONST_TIME_COL, GROUP_COL, PARTITION_COL, check_atomic_key
from ...columns import check_user_columns, require_columns
from ...errors import ArithmeticOverflowError, InvalidArgumentError, InvalidArgumentTypeError
from ...errors import StoreUnavailableError
from ..engines.bounds import DEFAULT_MAX_GROUPS
from ..engines.engine import AUTO_ENGINE, MergeEnginePlan, choose_local_engine, engine_request
from ..engines.local import check_merge_names, plan_merge, python_partials
from ..engines.pandas_engine import (arrow_to_pandas, partition_flushes, partition_partials,
                                     read_partition)
from ..engines.pandas_engine import source_rows, to_arrow
from ..engines.plan import SLOT, MergePlan
from ..._internal.optiming import OperatorTimer, Stopwatch, operator_timer, task_identity
from ..._internal.spark.compat import frame_of_arrow
from ..._internal.spark.executors import ensure_executors
from .redis_store import RedisStore
from ..._internal.validation import choice, refuse_streaming
from ...columns import column_of, quoted
from ..algebra.expressions import AggSpec, parse_aggs, spark_aggregate
from ..algebra.partials import finalize_frame, merge_partial_frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["global_merge", "explain_global_merge", "choose_global_engine", "prepare_global",
           "native_driver_lacking", "GlobalInputs", "GlobalChoice", "GLOBAL_STORES",
           "APPLY_ON", "NATIVE_DRIVER_AGGS"]

_log = logging.getLogger(__name__)

#: Global stores built in.
GLOBAL_STORES: tuple[str, ...] = ("driver",)
#: Who applies the deltas to a RedisStore (``global_merge(..., apply_on=...)``).
APPLY_ON: tuple[str, ...] = ("tasks", "driver")
#: Columns the tasks of ``apply_on="driver"`` add to their partial rows: the partition id,
#: and the flush number (the flush is the group of rows a partial row comes from).
_PID_COL, _FLUSH_COL = PARTITION_COL, GROUP_COL


#: Where a streaming frame is sent instead (the message of the refusal).
STREAM_ROUTE = (
    "Merge each micro-batch into a RedisStore (it accumulates across batches, each batch id "
    "applied once): stream.writeStream.foreachBatch(lambda batch_df, batch_id: "
    "global_merge(batch_df, key, aggs, store=RedisStore(url), batch_id=batch_id, "
    "read=False)).start()")


def global_merge(
    df: DataFrame,
    key: str,
    aggs: Any,
    store: str | RedisStore = "driver",
    mode: str = "auto",
    batch_id: int | None = None,
    *,
    quantity: int | None = None,
    event_time: str | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    read: bool = True,
    max_groups: int = DEFAULT_MAX_GROUPS,
    apply_on: str = "tasks",
    engine: str | None = AUTO_ENGINE,
) -> DataFrame | None:
    """Aggregate per key without a keyed exchange: local partials merged into a global store.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    aggs
        As for :func:`~trilink_spark.local_merge`.
    store : "driver" or RedisStore
        Where deltas are merged: the driver (embedded default) or Redis, exactly once per
        ``(batch_id, partition, flush)`` (see :class:`~trilink_spark.merge.RedisStore`).
    mode, quantity, delay, punctuation, max_groups
        When a partition flushes its deltas (see :func:`~trilink_spark.local_merge`; the
        default ``"auto"`` flushes each partition once unless it holds more than
        ``max_groups`` keys); ``periodic`` and ``punctuation`` need ``event_time``.
    batch_id : int, optional
        The micro-batch id when called from ``foreachBatch``: with a RedisStore, replaying the
        same id applies nothing twice. Default: a fresh id per call (retried tasks of the
        call are still deduplicated).
    event_time : str, optional
        Event-time column for the periodic mode (and for first/last ordering).
    read : bool
        With a RedisStore: return the store's whole result (``store.read``); False returns
        None (streaming jobs that read the store elsewhere).
    apply_on : "tasks" or "driver"
        With a RedisStore, who writes the deltas. ``"tasks"`` (default): each task applies its
        own flushes (one round trip per flush that adds as integers), the driver records the
        metadata (one more). ``"driver"``: the tasks return their partials (one row per key,
        partition and flush, as the driver store collects them) and the driver applies every
        flush of the call, each still exactly once by its own ``(batch_id, partition, flush)``
        marker, with the metadata, in ONE round trip when the aggregates add as 64-bit
        integers (``count``: every partial a bigint), else two
        (:meth:`~trilink_spark.merge.RedisStore.apply_flushes`). Suits micro-batches whose partials
        are small (few keys): Redis round trips per batch no longer grow with partitions.
        The markers are those of ``"tasks"``, so a batch replayed in the other mode is still
        applied once. Ignored with ``store="driver"``.
    engine : {"auto", "python", "spark"}
        ``"auto"`` (default; None means the same): the Spark engine where the call allows it
        (the driver store, every aggregate count, sum, min, max or mean: Spark's own
        ``groupBy(key).agg``, whatever the mode, which only says how often the deltas that
        the driver merges are flushed), the Python engine otherwise (first, last, a Combine,
        a RedisStore), unless the conf ``spark.trilink.mergeEngine`` says ``python``.
        ``"python"``: each partition's partials computed in Python (Local Merge's Python
        engine) and merged on the driver. ``"spark"``: as ``"auto"``, but a call it cannot
        run is refused with the reason. An integral or decimal sum (or a decimal mean) with
        ``spark.sql.ansi.enabled=false`` takes the partials of Local Merge's rule (its Spark
        engine in the groups mode: exact, failing on overflow), merged on the driver. The
        choice and its reason are logged (INFO) and given by :func:`explain_global_merge`.

    Returns
    -------
    pyspark.sql.DataFrame or None
        One row per key: the key, then one column per aggregate, as ``groupBy(key).agg``.

    Raises
    ------
    InvalidArgumentError
        A bad store, mode, ``apply_on`` or aggregate; an explicit ``engine="spark"`` the call
        cannot use (a RedisStore, first, last, a Combine), a bad engine or conf value.
    StoreUnavailableError
        With a RedisStore: Redis cannot be reached, before the tasks or from one of them (each
        task stops its own partition's flushes at the first failure and reports it in its
        status row), or from the driver with ``apply_on="driver"``; the message names the
        batch id. Other task errors fail the job as usual.

    Notes
    -----
    Cost, Python engine: one Spark job with no shuffle (each partition aggregates in
    Python, Arrow in and out), the partials collected to the driver (memory O(keys x
    partitions x flushes)), merged with pandas, and the result turned back into a
    DataFrame. Spark engine (the driver store with only count, sum, min, max and mean:
    :data:`NATIVE_DRIVER_AGGS`): Spark computes the same merge itself, each partition's
    partial aggregate in the JVM, then an exchange of the partials only (one row per key and
    partition, what the driver would receive) and their merge; no row crosses into Python,
    which costs 2-7x more than the whole aggregation. Suited where the result is small
    compared with the input (few keys); for many keys use ``keyed_agg``. With
    ``spark.trilink.operatorTiming`` set, the flushes time themselves
    (:mod:`~trilink_spark._internal.optiming`, operator ``"global_merge"``: each Redis task, or the
    merge on the driver, with the partials' ``"local_merge"`` tasks).

    Examples
    --------
    >>> totals = tl.global_merge(df, "sensor", {"n": ("count", None)})  # doctest: +SKIP
    """
    inputs = prepare_global(df, key, aggs, store, mode, quantity=quantity,
                            event_time=event_time, delay=delay, punctuation=punctuation,
                            max_groups=max_groups)  # a stream is refused first
    if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int)):
        raise InvalidArgumentTypeError(f"batch_id must be an int, got {type(batch_id).__name__}")
    choice(apply_on, "apply_on", APPLY_ON)
    chosen = choose_global_engine(df, inputs, store, engine)
    _log.info("global_merge on %r: the %s engine (%s)", key, chosen.plan.engine,
              chosen.plan.reason)
    specs = inputs.plan.specs
    if isinstance(store, RedisStore):  # chosen.route == "redis"
        return _merge_into_redis(df, inputs, store, batch_id, read, apply_on)
    if chosen.route == "aggregate":
        return _native_driver_merge(df, key, specs)
    partials = chosen.partials if chosen.partials is not None else \
        python_partials(inputs.src, inputs.plan)
    time_name = inputs.plan.time_name
    frame = arrow_to_pandas(partials.toArrow())
    timer = operator_timer(df.sparkSession, "global_merge")
    watch = Stopwatch()
    groups = [key]
    schema = _result_schema(df, key, specs)
    spark = df.sparkSession
    if not len(frame):
        return spark.createDataFrame([], schema)
    merged = merge_partial_frames(frame.drop(columns=[SLOT]), groups, specs, time_name)
    result = finalize_frame(merged, groups, specs)
    if timer is not None:  # the merge on the driver: one "task"
        timer.write(rows_in=len(frame), rows_out=len(result), busy_ms=watch.busy_ms(),
                    partition=0)
    if pd.api.types.is_float_dtype(result[key].dtype):
        result[key] = result[key] + 0.0  # -0.0 and 0.0 are one key: Spark shows it as 0.0
    return frame_of_arrow(spark, _arrow_result(result[[key] + [s.name for s in specs]],
                                               schema, spark))


class GlobalInputs(NamedTuple):
    """A validated :func:`global_merge`: the aggregates as parsed (``resolved``, so they are
    analysed once) and the Local Merge of its partials: its input ``source`` (with a
    constant event time when the call gives none), and ``src`` and ``plan`` of
    :func:`~trilink_spark.merge.engines.local.plan_merge` (one slot, the whole input)."""

    resolved: list[tuple[str, Any, str | None]]
    source: DataFrame
    src: DataFrame
    plan: MergePlan


def prepare_global(
    df: DataFrame, key: str, aggs: Any, store: str | RedisStore, mode: str, *,
    quantity: int | None, event_time: str | None, delay: Any, punctuation: str | None,
    max_groups: int,
) -> GlobalInputs:
    """The checks of :func:`global_merge` that need no job (the streaming frame, the store,
    the key, the aggregates, the mode and its arguments, what a RedisStore cannot merge),
    and its inputs. A plan, no job."""
    from pyspark.sql import functions as F

    refuse_streaming(df, "global_merge", "it runs a job and merges what the tasks flushed into "
                     "the store before it returns", STREAM_ROUTE)
    if not isinstance(store, RedisStore):
        choice(store, "store", GLOBAL_STORES, also=" or a RedisStore")
    require_columns(df, [key], "key column")
    check_atomic_key(df, key)
    specs = parse_aggs(aggs, df.columns, df)
    check_user_columns(df, [c for s in specs for c in s.partial_columns])
    check_merge_names(specs, key, [SLOT] + ([event_time] if event_time is not None else []))
    if event_time is None:
        if mode == "periodic" or (mode == "auto" and delay is not None):
            raise InvalidArgumentError("periodic mode (delay=...) needs event_time=<column>")
        source = df.withColumn(CONST_TIME_COL, F.lit(0).cast("long"))
        time_name = CONST_TIME_COL
    else:
        source, time_name = df, event_time
    slot = 2**62  # one slot: the whole input
    resolved = [(s.name, s.func, s.column) for s in specs]  # parsed once: no second analysis
    src, plan = plan_merge(source, key, time_name, slot, resolved, mode, quantity=quantity,
                           delay=delay, punctuation=punctuation, max_groups=max_groups)
    if isinstance(store, RedisStore):
        store.ops(plan.specs)  # refuse what Redis cannot merge before any task runs
        partial = [c for spec in plan.specs for c in spec.partial_columns]
        if store.updated_field is not None and store.updated_field in partial:
            raise InvalidArgumentError(
                f"the store's updated_field {store.updated_field!r} is also a partial column "
                f"of the aggregates ({partial}); choose another name")
    return GlobalInputs(resolved, source, src, plan)


class GlobalChoice(NamedTuple):
    """How :func:`global_merge` runs: ``plan`` (the engine and why); ``route``:
    ``"redis"`` (Python tasks, or the driver, apply the deltas to a RedisStore),
    ``"aggregate"`` (the driver store by Spark's ``groupBy(key).agg``) or ``"partials"``
    (Local Merge partials merged on the driver); ``partials``: the Spark engine's partial
    rows on that route, None for the Python engine's."""

    plan: MergeEnginePlan
    route: str
    partials: DataFrame | None = None


def choose_global_engine(df: DataFrame, inputs: GlobalInputs, store: str | RedisStore,
                         engine: str | None) -> GlobalChoice:
    """The engine of a :func:`global_merge` of ``df`` (validated into ``inputs``), and why:
    the one rule for ``global_merge`` and :func:`explain_global_merge`.

    A RedisStore: the Python engine (tasks apply their flushes to Redis, each exactly once
    by its marker). The driver store: unless the Python engine is asked for (``engine`` or
    the conf ``spark.trilink.mergeEngine``), Spark's own ``groupBy(key).agg`` when every
    aggregate is count, sum, min, max or mean (:func:`native_driver_lacking`); whatever the
    mode, which only decides how often a partition flushes deltas that are all merged on
    the driver. Otherwise the partials of Local Merge's rule
    (:func:`~trilink_spark.merge.engines.engine.choose_local_engine`: the Spark engine, for a sum
    with ANSI mode off, in the groups mode; the Python engine for first, last, a Combine),
    merged on the driver.

    Raises
    ------
    InvalidArgumentError
        An explicit ``engine="spark"`` the call cannot use (a RedisStore; an aggregate with
        no Spark form), a bad engine or conf value.

    Notes
    -----
    Cost: O(aggregates), a conf read or two, and the Spark engine's query built (no job).

    Examples
    --------
    >>> choose_global_engine(df, inputs, "driver", "auto").route  # doctest: +SKIP
    'aggregate'
    """
    request = engine_request(df.sparkSession, engine)
    if isinstance(store, RedisStore):
        why = ("a RedisStore: each flush of deltas is applied to Redis, exactly once by its "
               "(batch, partition, flush) marker, from Python tasks (or the driver with "
               "apply_on='driver')")
        if request.engine == "spark" and request.explicit:
            raise InvalidArgumentError(f"engine='spark' cannot run {why}; use engine='auto' "
                                       "or engine='python'")
        if request.engine == "spark":
            return GlobalChoice(MergeEnginePlan(
                "python", f"{request.source} does not apply to {why}"), "redis")
        return GlobalChoice(MergeEnginePlan("python", f"{request.source}: {why}"), "redis")
    if request.engine == "python":
        return GlobalChoice(MergeEnginePlan(
            "python", f"{request.source}: each partition's partials computed in Python (Local "
                      "Merge's Python engine, no exchange), merged on the driver"), "partials")
    lacking = native_driver_lacking(df, inputs.plan.specs)
    if lacking is None:
        return GlobalChoice(MergeEnginePlan(
            "spark", f"{request.source}: the driver store with count, sum, min, max and mean "
                     "only: Spark's own groupBy(key) aggregation, partial in the JVM in each "
                     "partition, one exchange of the partials (one row per key and "
                     "partition) and their merge; no row crosses into Python"), "aggregate")
    local, native = choose_local_engine(inputs.source, inputs.plan, engine, None)
    return GlobalChoice(MergeEnginePlan(
        local.engine, f"{lacking}; the partials the driver merges: {local.reason}"),
        "partials", native)


def explain_global_merge(
    df: DataFrame,
    key: str,
    aggs: Any,
    store: str | RedisStore = "driver",
    mode: str = "auto",
    *,
    quantity: int | None = None,
    event_time: str | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
    engine: str | None = AUTO_ENGINE,
) -> MergeEnginePlan:
    """The engine :func:`global_merge` runs with these arguments, and why (nothing runs).

    The arguments are :func:`global_merge`'s less those that only matter to a run
    (``batch_id``, ``read``, ``apply_on``), checked as it checks them (the same errors).
    With the driver store and only count, sum, min, max and mean, Spark's own
    ``groupBy(key).agg`` computes the merge in the JVM (``"spark"``), whatever the mode; with
    first, last or a Combine the partitions' partials are computed in Python and merged on
    the driver (``"python"``), and an integral or decimal sum (or a decimal mean) with
    ``spark.sql.ansi.enabled=false`` takes Local Merge's rule for its partials
    (:func:`~trilink_spark.merge.explain_local_merge`). A RedisStore is always ``"python"``:
    its tasks apply their deltas to Redis. ``engine`` and the conf
    ``spark.trilink.mergeEngine`` act as for :func:`~trilink_spark.local_merge`.

    Returns
    -------
    MergeEnginePlan
        ``engine`` (``"spark"`` or ``"python"``) and ``reason`` (in words, naming what
        decided: the engine or conf, the store, an aggregate, the mode).

    Raises
    ------
    InvalidArgumentError
        What :func:`global_merge` raises before a job (a bad store, mode or aggregate, an
        explicit ``engine="spark"`` it cannot use, a bad engine or conf value).
    StreamingNotSupportedError
        A streaming DataFrame, as :func:`global_merge`.

    Notes
    -----
    Cost: the checks of :func:`global_merge` and a query plan or two built, no job, no
    Redis call.

    Examples
    --------
    >>> merge.explain_global_merge(df, "sensor", {"n": ("count", None)}).engine  # doctest: +SKIP
    'spark'
    """
    inputs = prepare_global(df, key, aggs, store, mode, quantity=quantity,
                            event_time=event_time, delay=delay, punctuation=punctuation,
                            max_groups=max_groups)
    return choose_global_engine(df, inputs, store, engine).plan


#: Aggregates whose merge of partials Spark's own partial aggregation computes exactly as the
#: algebra does (first and last depend on arrival order, which a shuffle does not keep).
NATIVE_DRIVER_AGGS = ("count", "sum", "min", "max", "mean")


def native_driver_lacking(df: DataFrame, specs: list[AggSpec]) -> str | None:
    """Why Spark's own ``groupBy(key).agg`` cannot be the driver store's merge of ``specs``
    (the first aggregate that needs the algebra, in words), or None when it computes exactly
    what the algebra does: count, sum, min, max and mean (:data:`NATIVE_DRIVER_AGGS`), but no
    integral or decimal sum or decimal mean with ``spark.sql.ansi.enabled=false``, where
    Spark's sum would wrap around or give null where the algebra fails. O(aggregates), one
    conf read."""
    ansi = str(df.sparkSession.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true"
    for spec in specs:
        if not isinstance(spec.func, str) or spec.func not in NATIVE_DRIVER_AGGS:
            what = "a Combine" if not isinstance(spec.func, str) else spec.func
            return (f"aggregate {spec.name!r} ({what}: Spark's groupBy merges only count, sum, "
                    "min, max and mean as the algebra does)")
        if spec.func in ("sum", "mean") and spec.column is not None and not ansi:
            kind = df.schema[spec.column].dataType.simpleString()
            if (spec.func == "sum" and kind not in ("float", "double")) or \
                    kind.startswith("decimal"):
                return (f"aggregate {spec.name!r} ({spec.func} of {kind} with "
                        "spark.sql.ansi.enabled=false: Spark's groupBy would not fail on "
                        "overflow as the algebra does)")
    return None


def _native_driver_merge(df: DataFrame, key: str, specs: list[AggSpec]) -> DataFrame:
    """A driver-store merge of Spark aggregates, computed by Spark: each partition's partial
    aggregate (in the JVM) is merged after an exchange of the partials only, one row per key
    and partition, which is what the driver would receive from the Python path. Only where
    :func:`native_driver_lacking` finds nothing (:func:`choose_global_engine` decides)."""
    from pyspark.errors import PySparkException

    spark = df.sparkSession
    schema = _result_schema(df, key, specs)
    types = [f.dataType for f in _struct(schema)]
    grouped = df.groupBy(column_of(key)).agg(
        *[spark_aggregate(str(s.func), s.column).alias(s.name) for s in specs])
    typed = grouped.select(*[column_of(name).cast(t) for name, t in
                             zip([key, *[s.name for s in specs]], types)])
    try:
        table = typed.toArrow()
    except PySparkException as err:
        text = str(err)
        if any(w in text for w in ("ARITHMETIC_OVERFLOW", "NUMERIC_VALUE_OUT_OF_RANGE")) or \
                "overflow" in text.lower():
            sums = [s.name for s in specs if s.func in ("sum", "mean")]
            raise ArithmeticOverflowError(
                f"the sum or mean of aggregate(s) {sums} overflows bigint (or its decimal "
                "type); Spark's sum and avg fail the same way in ANSI mode: cast the column "
                "to decimal(38,0) or double first") from err
        raise
    frame = arrow_to_pandas(table)
    if not len(frame):
        return spark.createDataFrame([], schema)
    if pd.api.types.is_float_dtype(frame[key].dtype):
        frame[key] = frame[key] + 0.0  # -0.0 and 0.0 are one key: Spark shows it as 0.0
    return frame_of_arrow(spark, _arrow_result(frame, schema, spark))


def _struct(ddl: str) -> Any:
    """``StructType.fromDDL(ddl)``, checked to be a struct."""
    from pyspark.sql.types import StructType

    struct = StructType.fromDDL(ddl)
    if not isinstance(struct, StructType):  # pragma: no cover - a DDL of fields
        raise InvalidArgumentTypeError("internal: result schema is not a struct")
    return struct


def _arrow_result(result: Any, ddl: str, spark: Any) -> Any:
    """The result frame as an Arrow table of the exact Spark schema ``ddl`` (so integers,
    decimals, NaN and null survive as they are)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = _struct(ddl)
    timezone = spark.conf.get("spark.sql.session.timeZone")
    return to_arrow(result, to_arrow_schema(struct, timezone=timezone))


def _result_schema(df: DataFrame, key: str, specs: list[AggSpec]) -> str:
    fields = [f"{quoted(key)} {df.schema[key].dataType.simpleString()}"]
    for spec in specs:
        value_type = (df.schema[spec.column].dataType.simpleString()
                      if spec.column is not None else "bigint")
        fields.append(f"{quoted(spec.name)} {spec.final_type(value_type)}")
    return ", ".join(fields)


#: One row per partition from the tasks of a Redis global merge; ``error`` is the message of a
#: :class:`~trilink_spark.errors.StoreUnavailableError` that stopped the partition, else null.
STATUS_SCHEMA = "partition int, flushes int, applied int, error string"


def _merge_into_redis(df: DataFrame, inputs: GlobalInputs, store: RedisStore,
                      batch_id: int | None, read: bool, apply_on: str = "tasks",
                      ) -> DataFrame | None:
    import pyarrow as pa

    src, plan, aggs, key = inputs.src, inputs.plan, inputs.resolved, inputs.plan.key
    ensure_executors(df.sparkSession)  # a cluster's executors must import the package
    partial = [c for spec in plan.specs for c in spec.partial_columns]
    schema = pa.schema([plan.arrow_schema.field(c) for c in [key, *partial]])
    store.bind_schema(schema, _result_schema(df, key, plan.specs))
    run_id = str(batch_id) if batch_id is not None else f"run-{uuid.uuid4().hex}"
    timer = operator_timer(df.sparkSession, "global_merge")
    key_type = df.schema[key].dataType.simpleString()
    if apply_on == "driver":
        _apply_on_driver(src, plan, store, schema, run_id, key_type, timer, read)
        return store.read(df.sparkSession, aggs, key) if read else None
    store.set_meta(key, key_type, plan.specs)
    status = src.mapInArrow(_apply_partition(plan, store, run_id, timer),
                            STATUS_SCHEMA).collect()
    failed = [row for row in status if row["error"] is not None]
    if failed:
        partitions = ", ".join(str(row["partition"]) for row in failed)
        raise StoreUnavailableError(
            f"Redis at {store!r} became unreachable during batch {run_id} (partition(s) "
            f"{partitions}: {failed[0]['error']}); the flushes applied so far stay applied "
            "once, and rerunning the same batch_id applies the rest"
        )
    return store.read(df.sparkSession, aggs, key) if read else None


def _apply_on_driver(src: DataFrame, plan: Any, store: RedisStore, schema: Any, run_id: str,
                     key_type: str, timer: OperatorTimer | None, read: bool) -> int:
    """``apply_on="driver"``: one Spark job returns every partition's flushes (partial rows
    tagged with their partition and flush), then the store applies them all, each by its own
    ``run_id:partition:flush`` marker, with the metadata (one round trip when they add as
    integers). An input without rows costs no round trip, unless the result is ``read``
    (the metadata is written first then). Returns the flushes applied now."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.types import IntegerType, StructField, StructType

    names = schema.names
    fields = [f for f in plan.out_schema.fields if f.name in names]
    out = StructType([*sorted(fields, key=lambda f: names.index(f.name)),
                      StructField(_PID_COL, IntegerType(), False),
                      StructField(_FLUSH_COL, IntegerType(), False)])
    table = src.mapInArrow(_partials_partition(plan, schema, timer), out).toArrow()
    meta = store.meta_fields(plan.key, key_type, plan.specs)
    flushes: list[tuple[str, Any]] = []
    if table.num_rows:
        table = table.sort_by([(_PID_COL, "ascending"), (_FLUSH_COL, "ascending")])
        pid = table.column(_PID_COL).to_numpy()
        flush = table.column(_FLUSH_COL).to_numpy()
        cuts = np.flatnonzero((pid[1:] != pid[:-1]) | (flush[1:] != flush[:-1])) + 1
        body = pa.Table.from_arrays([pc.cast(table.column(n), schema.field(n).type)
                                     for n in names], schema=schema)
        for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), table.num_rows]):
            flushes.append((f"{run_id}:{int(pid[start])}:{int(flush[start])}",
                            body.slice(start, end - start)))
    try:
        if not flushes:  # nothing to apply (an empty micro-batch): no round trip
            if read:  # but the store must describe its result to be read
                store.set_meta(plan.key, key_type, plan.specs)
            return 0
        applied = store.apply_flushes(flushes, plan.key, plan.specs, meta=meta)
    except StoreUnavailableError as err:
        raise StoreUnavailableError(
            f"Redis at {store!r} became unreachable during batch {run_id} ({err}); the "
            "flushes applied so far stay applied once, and rerunning the same batch_id "
            "applies the rest") from err
    _log.debug("global_merge batch %s: %d of %d flushes applied from the driver", run_id,
               applied, len(flushes))
    return applied


def _partials_partition(plan: Any, schema: Any, timer: OperatorTimer | None = None) -> Any:
    """The task of ``apply_on="driver"``: the partition's flushes as partial rows (the key and
    partial columns of ``schema``), each tagged with its partition id and flush number (the
    numbers :func:`_apply_partition` gives them)."""
    def run(batches: Any) -> Any:
        import pyarrow as pa

        watch = Stopwatch()
        rows = source_rows(read_partition(watch.pull(batches)), plan)
        flushed = partition_partials(rows, plan)
        out = 0
        if len(flushed.frame):
            table = to_arrow(flushed.frame, plan.arrow_schema).select(schema.names)
            out = table.num_rows
            pid = task_identity()[1]
            table = table.append_column(
                _PID_COL, pa.array(np.full(out, pid, dtype=np.int32))).append_column(
                _FLUSH_COL, pa.array(np.asarray(flushed.flush, dtype=np.int32)))
            yield from watch.emit(table.to_batches())
        if timer is not None:  # rows out: the partial rows sent to the driver
            timer.write(rows_in=len(rows), rows_out=out, busy_ms=watch.busy_ms(),
                        wait_ms=watch.wait_ms)

    return run


def _apply_partition(plan: Any, store: RedisStore, run_id: str,
                     timer: OperatorTimer | None = None) -> Any:
    """The task of a Redis global merge: one ``store.apply`` per flush, then a status row.

    A :class:`~trilink_spark.errors.StoreUnavailableError` stops the partition's flushes and is
    reported in the status row (the driver raises it); any other exception fails the task.
    """
    def run(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        pid = context.partitionId() if context is not None else 0
        flushes = applied = 0
        error: str | None = None
        watch = Stopwatch()
        rows = source_rows(read_partition(watch.pull(batches)), plan)
        for i, deltas in enumerate(partition_flushes(rows, plan)):
            flushes += 1
            try:
                applied += int(store.apply(deltas, plan.key, plan.specs, f"{run_id}:{pid}:{i}"))
            except StoreUnavailableError as err:
                _log.warning("partition %d of batch %s stopped at flush %d: %s", pid, run_id,
                             i, err)
                error = str(err)
                break
        if timer is not None:  # rows out: the flushes applied to the store
            timer.write(rows_in=len(rows), rows_out=applied, busy_ms=watch.busy_ms(),
                        wait_ms=watch.wait_ms)
        yield pa.RecordBatch.from_pydict(
            {"partition": [pid], "flushes": [flushes], "applied": [applied], "error": [error]},
            schema=pa.schema([("partition", pa.int32()), ("flushes", pa.int32()),
                              ("applied", pa.int32()), ("error", pa.string())]),
        )

    return run
