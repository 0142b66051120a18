"""Local Merge: time-slot pre-aggregation on the map side, before the keyed exchange.

Trilink paper, §4.3 (1), Figure 11 (b), Table 7. Within each input partition, rows of one key
in one time slot are merged into one partial row (see :mod:`~trilink_spark.merge.algebra.aggregates`)
before anything is shuffled. A merged row carries the largest event time of its rows, so watermarks
downstream stay right, and a flush emits its slots in time order. When a buffer is flushed
depends on the mode:

============== ================================================ =======================
mode           flush when                                       suits (Table 7)
============== ================================================ =======================
groups         the buffer would hold more than ``max_groups``   batch DataFrames: the
               (key, slot) groups                               fewest partial rows
quantity       ``quantity`` rows were merged                    throughput
periodic       the oldest buffered row is ``delay`` older than  low latency
               the newest one seen
punctuation    a row matches ``punctuation`` (flushed with it)  window boundaries
============== ================================================ =======================

In the groups and quantity modes with count, sum, min, max and mean, the Arrow batches are
aggregated by Arrow's hash aggregation as they arrive, in chunks of 262,144 rows
(:class:`~trilink_spark.merge.engines.arrow_engine.ArrowMerge`), and only partial rows are held; a
groups-mode buffer is flushed before the batch whose groups would pass
``max_groups`` (batch by batch, where the pandas pass cuts at the row). Every mode also flushes
at the end of the partition. The default, ``mode="auto"``, takes the mode its arguments ask
for (``punctuation=``, ``delay=`` or ``quantity=`` given), else ``"groups"`` for a batch
DataFrame (with the default ``max_groups`` of 1,000,000, each key's
rows of one slot in a partition become one partial row unless the partition has more groups
than that) and ``"quantity"`` (the paper's) for a streaming one. ``max_groups`` bounds what
costs memory in a buffer, its groups (one partial row each, whatever the rows merged into
them); ``quantity`` bounds rows instead, so with many keys it flushes a slot in several
pieces. Merging the output with
:func:`~trilink_spark.merge_partials` gives exactly what aggregating the raw rows gives.

Two engines compute the partial rows (:mod:`~trilink_spark.merge.engines.engine`). The Python engine
runs everything above inside each input partition, with no exchange. The Spark engine has
Spark's own partial aggregation compute the same partial rows, one per (input partition, key,
slot), in the JVM: no row crosses into Python, at the price of one exchange of the partial
rows (batch DataFrames, groups mode, no ``order_by``, count, sum, min, max and mean). The
default, ``engine="auto"``, takes the Spark engine wherever it runs the call and the Python
engine elsewhere; :func:`explain_local_merge` says which, and why.

Rows whose event time is null, NaN or infinite are kept: they go to a slot of their own,
``slot_start`` null, with a null event time, and they move nothing that depends on time (no
flush bound, no slot, no watermark downstream). Null and NaN keys are keys like any other
(Spark's ``groupBy`` semantics: null and NaN are two keys, ``-0.0`` and ``0.0`` one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ...columns import CONST_TIME_COL, ET_COL, ORDER_COL, POS_COL, PUNCT_COL
from ...columns import check_atomic_key, check_user_columns, require_columns
from ...columns import column_of, python_aliases, quoted
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ..._internal.optiming import operator_timer
from ..._internal.spark.executors import ensure_executors
from ...eventtime import SPARK_TIME_TYPES, delay_in_units, event_time_micros
from .arrow_engine import arrow_merge_partition
from .bounds import DEFAULT_MAX_GROUPS, DEFAULT_QUANTITY, MERGE_MODES
from ..algebra.expressions import AggSpec, parse_aggs
from .plan import SLOT, MergePlan
from .engine import AUTO_ENGINE, MERGE_LADDER, EnginePlan, EngineRequest
from .engine import choose_local_engine, engine_request
from ..._internal.engines import log_engine
from ..._internal.validation import choice

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["local_merge", "explain_local_merge", "python_partials", "AUTO_MODE", "plan_merge",
           "check_merge_names", "LocalMergeOptions", "local_merge_options"]

logger = logging.getLogger(__name__)

#: ``mode="auto"``: ``"groups"`` for a batch DataFrame, ``"quantity"`` for a streaming one.
AUTO_MODE = "auto"


def local_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = AUTO_MODE,
    *,
    quantity: int | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
    engine: str | None = AUTO_ENGINE,
) -> DataFrame:
    """Pre-aggregate rows per key and time slot inside each input partition (no shuffle).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    event_time : str
        Timestamp or numeric event-time column.
    slot : str, float or datetime.timedelta
        Slot length: an interval string (``"60 seconds"``), seconds or a timedelta for
        timestamps; the column's unit otherwise.
    aggs : Column, sequence or mapping
        Spark Column aggregates (``[F.sum("v").alias("s"), F.count("*")]``), Spark's dict
        form (``{"v": "sum"}``) or ``{name: (func, column)}``; funcs: count, sum, min, max,
        mean (avg), first, last or a :class:`~trilink_spark.merge.Combine` (see
        :func:`~trilink_spark.merge.algebra.expressions.parse_aggs`).
    mode : {"auto", "groups", "quantity", "periodic", "punctuation"}
        When buffers flush (module docs). ``"auto"``: the mode the arguments ask for
        (``punctuation`` given: punctuation; ``delay``: periodic; ``quantity``: quantity),
        else ``"groups"`` for a batch DataFrame and ``"quantity"`` for a streaming one.
    quantity : int, optional
        Quantity mode: rows merged per flush (default 10,000).
    max_groups : int
        Groups mode: the most (key, slot) groups a partition's buffer holds before it flushes
        (default 1,000,000).
    delay : str, float or timedelta
        Periodic mode: how much older than the newest row the oldest buffered row may be
        (``"30 seconds"``, seconds, or a timedelta for timestamps).
    punctuation : str
        Punctuation mode: a boolean column; a row where it is true flushes the buffer with it.
    order_by : str, optional
        Arrival order within a partition (default: the input order).
    engine : {"auto", "python", "spark"}
        ``"python"``: the merge runs inside each input partition, as described above (no
        exchange). ``"spark"``: Spark's own partial aggregation computes the partial rows,
        one per (input partition, key, slot), ``groupBy(spark_partition_id(), key, slot)``
        in the JVM, so no row crosses into Python; the partial rows (not the input rows) then
        cross one exchange and leave their input partition. Only for batch DataFrames in the
        groups mode, without ``order_by``, with count, sum, min, max and mean (decimals
        included); Spark bounds its memory by spilling, so ``max_groups`` does not apply.
        ``"auto"`` (default; None means the same): the Spark engine where the call allows
        it, the Python engine otherwise (a stream, the quantity, periodic or punctuation
        mode, ``order_by``, first, last, a Combine), unless the conf
        ``spark.trilink.mergeEngine`` says ``python`` (``spark``: as ``auto``). The choice
        and its reason are logged (INFO) and given by :func:`explain_local_merge`.

    Returns
    -------
    pyspark.sql.DataFrame
        Partial rows: ``key``, ``slot_start``, ``event_time`` (the largest of the merged rows,
        same name and type), then the partial columns of each aggregate. Rows whose event
        time is null, NaN or +-inf are kept, merged per key into a slot of their own
        (``slot_start`` and the event time null), so ``merge_partials`` still equals
        aggregating the raw rows; null and NaN keys and values follow Spark (see
        :mod:`~trilink_spark.merge.algebra.aggregates`: NaN is a value, ``max`` NaN-first, sums with
        ``inf`` are ``inf``).

    Raises
    ------
    InvalidArgumentError
        An aggregate named like the key, the event time or ``slot_start``, or a bad mode or
        slot; ``engine="spark"`` for a call it cannot run (the message says why); a bad
        ``engine`` or ``spark.trilink.mergeEngine`` value;
        :class:`~trilink_spark.errors.ReservedColumnError` for a column or aggregate named
        ``_tl_*``.
    InvalidArgumentTypeError
        ``sum`` or ``mean`` of a non-numeric column (the message names it and its type).
    InvalidKeyTypeError
        A struct, array or map key.
    ArithmeticOverflowError
        From the job: an integral ``sum`` beyond 64 bits (Spark's ANSI overflow).

    Notes
    -----
    Cost, Python engine: one vectorised pass per input partition, O(n log n) in every mode and
    whatever the arrival order, no shuffle; only the key, event time and aggregated columns
    travel. Groups and quantity modes with count, sum, min, max and mean: Arrow's hash
    aggregation per arriving batch, O(n), holding only the buffered partial rows. Otherwise
    (periodic, punctuation, float keys, first, last, Combine, decimal sums and means): the
    flush bounds in O(n), then one pandas group-by for all flushes, a partition's rows held
    until its last flush. The output has at most one row per key, slot and flush: with
    few keys per slot it is a small fraction of the input, which is what the keyed exchange
    after it then carries. With ``spark.trilink.operatorTiming`` set, each task also writes
    one timing record (:mod:`~trilink_spark._internal.optiming`: rows in and out, its own
    milliseconds).

    Spark engine: Spark's hash aggregation in the JVM (partial, then final after the
    exchange), O(rows); one exchange carrying the partial rows; no operator timing records.
    With the Python engine every input row crosses from the JVM to a Python worker, which
    costs about what Spark's whole native aggregation costs: the Python engine costs up to
    5.8x Spark's own ``groupBy(key, slot).agg``, the Spark engine 1.3-1.7x
    (benches/RESULTS.md, §18).

    Examples
    --------
    >>> aggs = {"n": ("count", None), "volts": ("mean", "volts")}
    >>> partial = tl.local_merge(df, "sensor", "ts", 60.0, aggs)  # doctest: +SKIP
    >>> tl.merge_partials(partial, "sensor", aggs)  # doctest: +SKIP
    >>> inside = tl.local_merge(df, "sensor", "ts", 60.0, aggs, engine="python")  # doctest: +SKIP
    """
    options = local_merge_options(df, key, event_time, slot, aggs, mode, quantity=quantity,
                                  delay=delay, punctuation=punctuation, order_by=order_by,
                                  max_groups=max_groups, engine=engine)
    choice, native = choose_local_engine(df, options.plan, options.request, options.order_by)
    log_engine(logger, MERGE_LADDER, key, choice)
    if native is not None:
        return native
    return python_partials(options.source, options.plan)


@dataclass(frozen=True)
class LocalMergeOptions:
    """A :func:`local_merge` call's arguments, checked: what it runs and what
    :func:`explain_local_merge` describes (both build it with :func:`local_merge_options`).

    Attributes
    ----------
    source : pyspark.sql.DataFrame
        The narrow frame the Python engine reads (:func:`plan_merge`).
    plan : MergePlan
        The validated merge, the mode resolved.
    order_by : str or None
        The arrival order asked for.
    request : EngineRequest
        The engine asked for, the conf ``spark.trilink.mergeEngine`` read for ``"auto"``.
    """

    source: DataFrame
    plan: MergePlan
    order_by: str | None
    request: EngineRequest


def local_merge_options(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = AUTO_MODE,
    *,
    quantity: int | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
    engine: str | None = AUTO_ENGINE,
) -> LocalMergeOptions:
    """Check :func:`local_merge`'s arguments (:func:`plan_merge`, then the engine and its
    conf): the one check of :func:`local_merge` and :func:`explain_local_merge`, so both
    refuse the same arguments with the same error.

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError, MissingColumnError, ReservedColumnError
        What :func:`local_merge` raises before a job.

    Notes
    -----
    Cost: the frame's schema, the aggregates and a conf read (no job).
    """
    src, plan = plan_merge(df, key, event_time, slot, aggs, mode, quantity=quantity, delay=delay,
                           punctuation=punctuation, order_by=order_by, max_groups=max_groups)
    return LocalMergeOptions(src, plan, order_by, engine_request(df.sparkSession, engine))


def python_partials(src: DataFrame, plan: MergePlan) -> DataFrame:
    """The Python engine of :func:`local_merge`: ``src`` and ``plan`` of :func:`plan_merge`
    merged inside each input partition (``mapInArrow``, no exchange). A plan, no job; on a
    cluster, the executors' environment is checked once (:func:`ensure_executors`)."""
    ensure_executors(src.sparkSession)  # a cluster's executors must import the package
    timer = operator_timer(src.sparkSession, "local_merge")
    result: DataFrame = src.mapInArrow(arrow_merge_partition(plan, timer), plan.out_schema)
    return result


def explain_local_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = AUTO_MODE,
    *,
    quantity: int | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
    engine: str | None = AUTO_ENGINE,
) -> EnginePlan:
    """The engine :func:`local_merge` runs with these arguments, and why (nothing runs).

    The arguments are :func:`local_merge`'s, checked by the same function
    (:func:`local_merge_options`: the same errors).
    ``engine="auto"`` (the default) takes the Spark engine, Spark's own partial aggregation
    in the JVM, for a batch DataFrame in the groups mode (the ``"auto"`` mode of a batch
    DataFrame) without ``order_by`` whose aggregates are all count, sum, min, max or mean
    (decimals included); the Python engine otherwise: a streaming DataFrame, the quantity,
    periodic or punctuation mode, ``order_by``, first, last or a Combine. The conf
    ``spark.trilink.mergeEngine`` decides when ``engine`` is ``"auto"``: ``python`` always
    the Python engine, ``spark`` as ``auto``. The reason names what decided; the same rule
    decides for :func:`local_merge` (:func:`~trilink_spark.merge.engines.engine.choose_local_engine`),
    which logs it.

    Returns
    -------
    EnginePlan
        ``engine`` (``"spark"`` or ``"python"``) and ``reason`` (in words, starting with what
        asked: ``engine='auto'``, the conf).

    Raises
    ------
    InvalidArgumentError
        What :func:`local_merge` raises before a job: a bad mode, slot or aggregate, an
        explicit ``engine="spark"`` the call cannot use, a bad engine or conf value.

    Notes
    -----
    Cost: the checks of :func:`local_merge` (the frame's schema, the aggregates) and one
    query plan built, no job; on Spark Connect a few analysis round trips.

    Examples
    --------
    >>> from trilink_spark import merge  # doctest: +SKIP
    >>> count = {"n": ("count", None)}
    >>> merge.explain_local_merge(df, "sensor", "ts", 60.0, count)  # doctest: +SKIP
    EnginePlan(engine='spark', reason="engine='auto': a batch DataFrame in the groups ...")
    >>> first = {"f": ("first", "v")}
    >>> merge.explain_local_merge(df, "sensor", "ts", 60.0, first).engine  # doctest: +SKIP
    'python'
    """
    options = local_merge_options(df, key, event_time, slot, aggs, mode, quantity=quantity,
                                  delay=delay, punctuation=punctuation, order_by=order_by,
                                  max_groups=max_groups, engine=engine)
    return choose_local_engine(df, options.plan, options.request, options.order_by)[0]


def check_merge_names(specs: list[AggSpec], key: str, others: list[str]) -> None:
    """Refuse aggregates whose output or partial columns are named like the key or one of
    ``others`` (the event time, ``slot_start``): InvalidArgumentError. O(aggregates)."""
    # Spark resolves names case-insensitively by default: 'K' is the key 'k' too
    taken = {key.lower(): ("the key", key),
             **{name.lower(): ("a column of the output", name) for name in others}}
    for spec in specs:
        for column in [spec.name, *spec.partial_columns]:
            if column.lower() in taken:
                what, name = taken[column.lower()]
                raise InvalidArgumentError(
                    f"aggregate {spec.name!r} would write column {column!r}, which is "
                    f"{what} ({name!r}); rename the aggregate"
                )


def plan_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = AUTO_MODE,
    *,
    quantity: int | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
) -> tuple[DataFrame, MergePlan]:
    """Validate a merge; returns its narrow source DataFrame and plan (see :func:`local_merge`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    require_columns(df, [key], "key column")
    check_atomic_key(df, key)
    if mode == AUTO_MODE:  # the mode the arguments ask for, else by the kind of frame
        if punctuation is not None:
            mode = "punctuation"
        elif delay is not None:
            mode = "periodic"
        elif quantity is not None or df.isStreaming:
            mode = "quantity"
        else:
            mode = "groups"
    if quantity is None:
        quantity = DEFAULT_QUANTITY
    mode = choice(mode, "mode", (AUTO_MODE, *MERGE_MODES))
    if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1:
        raise InvalidArgumentTypeError(f"max_groups must be an int >= 1, got {max_groups!r}")
    specs = parse_aggs(aggs, df.columns, df)
    # Global Merge adds CONST_TIME_COL itself (and checks the user's columns before)
    check_user_columns(SimpleNamespace(columns=[c for c in df.columns if c != CONST_TIME_COL]),
                       [c for s in specs for c in s.partial_columns])
    check_merge_names(specs, key, [event_time, SLOT])
    et_col, kind = event_time_micros(df, event_time)
    slot_units = delay_in_units(slot, kind, "slot")
    if slot_units <= 0:
        raise InvalidArgumentError(f"slot must be > 0, got {slot!r}")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity < 1:
        raise InvalidArgumentTypeError(f"quantity must be an int >= 1, got {quantity!r}")
    delay_units = 0.0
    if mode == "periodic":
        if delay is None:
            raise InvalidArgumentError("periodic mode needs delay=...")
        delay_units = delay_in_units(delay, kind)
    if mode == "punctuation":
        if punctuation is None or punctuation not in df.columns:
            raise InvalidArgumentError("punctuation mode needs punctuation=<boolean column of df>")
    require_columns(df, [order_by], "order_by column")
    for spec in specs:  # refuse non-numeric sums and means before the job
        if spec.column is not None:
            spec.partial_types(df.schema[spec.column].dataType.simpleString())
    values = sorted({s.column for s in specs if s.column is not None} - {key})
    # non-finite times (NaN, +-inf) count as none; slots are computed in doubles (no cast
    # that could overflow for huge times)
    finite = F.when(~F.isnan(et_col) & (F.abs(et_col) < F.lit(float("inf"))), et_col)
    # PySpark's mapInArrow cannot take input columns whose names hold a dot or a backtick:
    # such columns travel under internal names, given back inside each partition
    aliases = python_aliases([key, *values])
    inside = {name: alias for alias, name in aliases.items()}
    # only what the merge needs crosses into Python: the key, the aggregated columns and the
    # event time; arrival positions and slots are computed inside the partition
    # (source_rows), which costs less than carrying two more columns over Arrow
    cols = [column_of(c).alias(inside.get(c, c)) for c in [key, *values]] + [
            finite.alias(ET_COL)]
    if mode == "punctuation":
        cols.append(column_of(str(punctuation)).cast("boolean").alias(PUNCT_COL))
    if order_by is not None:
        cols += [column_of(order_by).alias(ORDER_COL),
                 F.monotonically_increasing_id().alias(POS_COL)]
    src = df.select(*cols)
    if order_by is not None:  # arrival order is the sorted order; the sort keys stay behind
        src = src.sortWithinPartitions(ORDER_COL, POS_COL).drop(ORDER_COL, POS_COL)
    time_type = SPARK_TIME_TYPES[kind]
    fields = [f"{quoted(key)} {df.schema[key].dataType.simpleString()}",
              f"{SLOT} {time_type}", f"{quoted(event_time)} {time_type}"]
    names = [key, SLOT, event_time]
    for spec in specs:
        value_type = (df.schema[spec.column].dataType.simpleString()
                      if spec.column is not None else "bigint")
        for col, dtype in zip(spec.partial_columns, spec.partial_types(value_type)):
            fields.append(f"{quoted(col)} {dtype}")
            names.append(col)
    out_schema = StructType.fromDDL(", ".join(fields))
    if not isinstance(out_schema, StructType):  # pragma: no cover - fromDDL of fields is a struct
        raise InvalidArgumentTypeError("internal: partial schema is not a struct")
    for spec in specs:  # what merge_partials needs to know of the input (a decimal's precision)
        if spec.column is not None:
            value_type = df.schema[spec.column].dataType.simpleString()
            for col, meta in spec.aggregate.partial_metadata(value_type).items():
                out_schema[col].metadata = meta
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_schema, timezone=timezone)
    plan = MergePlan(key, specs, mode, quantity, delay_units, kind, event_time, names,
                     out_schema, arrow_schema, max_groups, aliases, slot_units=slot_units)
    return src, plan
