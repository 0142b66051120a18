"""Keyed watermarks for DataFrames (the Trilink paper, §3.2, §4.1).

Spark keeps one watermark per query: the largest event time seen minus the delay. When one
source's clock runs ahead, that watermark races ahead of every other source, and their rows,
perfectly in order per key, arrive "late" and are dropped. A keyed watermark is kept per key
(or per group of ``n_keys`` keys): a key's rows are judged only against that key's own past.

:func:`keyed_watermark` annotates every row with both views so they can be compared as the paper
does (Table 10):

- ``key_watermark``: the watermark of the row's key group just before the row arrived, that is
  the largest event time of the group's earlier rows minus ``delay`` (null for a group's first
  row);
- ``is_late``: ``event_time < key_watermark``;
- ``is_late_partition``: the same test against the watermark of the row's input partition
  (largest event time of all earlier rows of that partition minus ``delay``), which is what a
  partition- or query-level watermark would say.

**Arrival order** is ``order_by`` (ties broken by input position) or, without it, the input
order: partition by partition, row by row, as ``monotonically_increasing_id`` numbers them.

**Key groups** (``n_keys = N``): ``N = 1`` gives every key its own watermark. For ``N > 1`` the
distinct keys are counted and hashed into ``ceil(distinct / N)`` buckets with Spark's
``xxhash64``: a deterministic grouping in which each watermark is shared by ``N`` keys on
average (hash buckets, so not exactly ``N``).

**Streams.** A streaming DataFrame is refused when the call is made
(:class:`~trilink_spark.errors.StreamingNotSupportedError`): the arrival order, ``n_keys`` and
the partition view need the whole input. Per-key watermarks across micro-batches are kept by
:func:`~trilink_spark.keyed_foreach_batch` in ``writeStream.foreachBatch``, whose processor
gets every key's late rows in ``process_late`` (benches/RESULTS.md, section 20, measures the
alternative, Spark's ``transformWithState``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd

from ...columns import POS_COL, WATERMARK_COL, check_user_columns, column_of, require_columns
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ..._internal.spark.plan import hash_partitions_of
from ..._internal.validation import refuse_streaming
from .prepare import KEYED_STREAM_ROUTE
from ...eventtime import delay_in_units, event_time_micros

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.window import WindowSpec

__all__ = ["keyed_watermark", "key_watermark_of", "late_against"]

#: Why a streaming frame is refused (the message of StreamingNotSupportedError).
_NOT_ON_STREAMS = (
    "its arrival order numbers the rows of the whole input, n_keys > 1 counts the input's "
    "distinct keys and is_late_partition follows each input partition from its first row, "
    "none of which a stream has when the call is made; carrying the per-key watermarks "
    "through Spark's transformWithState instead measured 8-10x the cost of keyed_foreach_batch")


def _from_units(col: Column, kind: str, dtype: Any) -> Column:
    from pyspark.sql import functions as F

    if kind == "timestamp":
        out = F.timestamp_micros(col.cast("long"))
        return out.cast(dtype)
    return col.cast(dtype)


def _partition_lateness(delay: float) -> Any:
    """A scalar-iterator pandas UDF: is each row below the running maximum of its input
    partition (minus ``delay``)? It sees one partition's batches in order, so only the event
    time travels to Python, not the rows."""
    from pyspark.sql.pandas.functions import pandas_udf

    def late(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        import numpy as np

        high = -np.inf
        for et in batches:
            values = et.to_numpy(dtype=np.float64, na_value=np.nan)
            valid = ~np.isnan(values)
            running = np.maximum.accumulate(
                np.concatenate(([high], np.where(valid, values, -np.inf)))
            )
            high = running[-1]
            out = pd.Series(values < running[:-1] - delay, dtype="boolean")
            out[~valid] = pd.NA
            yield out

    # nondeterministic: the verdict depends on row order, so Spark must not move it past a shuffle
    return pandas_udf(late, "boolean").asNondeterministic()  # type: ignore[call-overload]


def keyed_watermark(
    df: DataFrame,
    key: str,
    event_time: str,
    delay: Any,
    order_by: str | None = None,
    n_keys: int = 1,
) -> DataFrame:
    """Mark late rows by a per-key watermark and, for comparison, by a per-partition one.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
        Key column (any type Spark can hash).
    event_time : str
        Timestamp or numeric event-time column.
    delay : str, float or datetime.timedelta
        Allowed lateness: an interval string (``"10 seconds"``), seconds or a timedelta for
        timestamps; the column's unit otherwise.
    order_by : str, optional
        Arrival-order column (e.g. ingestion time or Kafka offset); default the input order.
    n_keys : int
        Keys sharing one watermark (module docstring); 1 = one watermark per key.

    Returns
    -------
    pyspark.sql.DataFrame
        ``df``'s columns plus ``key_watermark`` (event time's type), ``is_late`` and
        ``is_late_partition`` (booleans; null where the event time is null or NaN). Rows with
        a null or NaN event time neither move a watermark nor count as late.

    Raises
    ------
    StreamingNotSupportedError
        ``df`` is a streaming DataFrame (module docs): use
        :func:`~trilink_spark.keyed_foreach_batch` in ``writeStream.foreachBatch``.

    Notes
    -----
    Cost: the partition-level view is a scalar-iterator pandas UDF over the event time only (a
    numpy running maximum per input partition, no shuffle; with ``order_by`` the partition is
    first sorted by it). The key-level
    view is one Spark window (running maximum over each key group in arrival order): one
    shuffle by key group and a sort, all in the JVM. A frame already hash-partitioned by
    ``key`` (``repartition(n, key)``, as :func:`~trilink_spark.placement.already_placed` sees
    it) is not shuffled: its window runs in place, then one more sort within partitions gives the
    partition-level view its arrival order. ``n_keys > 1`` adds a job counting the
    distinct keys. A group's rows are processed by one task, as any keyed operation's are.

    Examples
    --------
    >>> import trilink_spark as tl  # doctest: +SKIP
    >>> marked = tl.keyed_watermark(readings, "sensor", "ts", delay=2.0)  # doctest: +SKIP
    >>> marked.groupBy("is_late", "is_late_partition").count().show()  # doctest: +SKIP
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    refuse_streaming(df, "keyed_watermark", _NOT_ON_STREAMS, KEYED_STREAM_ROUTE)
    require_columns(df, [key], "key column")
    require_columns(df, [order_by], "order_by column")
    check_user_columns(df)
    if isinstance(n_keys, bool) or not isinstance(n_keys, int):
        raise InvalidArgumentTypeError(f"n_keys must be an int >= 1, got {type(n_keys).__name__}")
    if n_keys < 1:
        raise InvalidArgumentError(f"n_keys must be >= 1, got {n_keys}")
    taken = {"key_watermark", "is_late", "is_late_partition"} & set(df.columns)
    if taken:
        raise InvalidArgumentError(f"df already has column(s) {sorted(taken)}; rename them first")
    et_col, kind = event_time_micros(df, event_time)
    delay_units = delay_in_units(delay, kind)
    columns = list(df.columns)
    # the event time is recomputed where needed rather than shuffled as a column
    tagged = df.select("*", F.monotonically_increasing_id().alias(POS_COL))
    arrival = [column_of(order_by), F.col(POS_COL)] if order_by is not None else [F.col(POS_COL)]
    if order_by is not None:
        tagged = tagged.sortWithinPartitions(*arrival)
    if n_keys == 1:
        group = column_of(key)
    else:
        distinct = df.select(column_of(key)).distinct().count()
        buckets = max(1, math.ceil(distinct / n_keys))
        group = F.pmod(F.xxhash64(column_of(key)), F.lit(buckets))
    window = (
        Window.partitionBy(group)
        .orderBy(*arrival)
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    lateness = _partition_lateness(delay_units)
    # an integral or timestamp time is never NaN, and a delay is finite (delay_in_units):
    # the rule without its NaN guards
    nan_time = kind == "fractional"
    if n_keys == 1 and hash_partitions_of(df, key) is not None:
        # placed by the key already: the window runs in the input's partitions (no exchange;
        # Spark's Python node above would hide the placement), then the partition-level view
        # reads each partition back in arrival order (a sort within partitions)
        marked = (tagged.withColumn(WATERMARK_COL, key_watermark_of(et_col, window,
                                                                    delay_units, nan=nan_time))
                  .sortWithinPartitions(*arrival)
                  .withColumn("is_late_partition", lateness(et_col)))
    else:
        marked = (tagged.withColumn("is_late_partition", lateness(et_col))
                  .withColumn(WATERMARK_COL, key_watermark_of(et_col, window, delay_units,
                                                              nan=nan_time)))
    watermark = F.col(WATERMARK_COL)
    dtype = df.schema[event_time].dataType
    return marked.select(
        *[column_of(c) for c in columns],
        _from_units(watermark, kind, dtype).alias("key_watermark"),
        late_against(et_col, watermark, nan=nan_time).alias("is_late"),
        F.col("is_late_partition"),
    )


def key_watermark_of(event_time: Column, window: WindowSpec, delay: float, *,
                     nan: bool = True) -> Column:
    """A row's key watermark as a Spark column: the largest known event time among the rows
    ``window`` frames (a key group's earlier rows in arrival order: ``rowsBetween(
    unboundedPreceding, -1)``) minus ``delay``; null for a group's first row. Null and NaN
    event times move no watermark. With :func:`late_against`, the one keyed-watermark rule in
    Spark (the Python runtime's is :meth:`~trilink_spark.keyed.semantics.process.KeyedRuntime.judge`).

    Notes
    -----
    A column: one running maximum per key group when a plan uses it (a shuffle by the window's
    partition columns and a sort, unless the input is placed so already). ``nan=False``
    says that ``event_time`` is never NaN (an integral or timestamp column, or NaN already
    made null): the guard that keeps a NaN from moving the watermark is left out.

    Examples
    --------
    >>> from pyspark.sql import Window, functions as F  # doctest: +SKIP
    >>> w = Window.partitionBy("k").orderBy("pos").rowsBetween(
    ...     Window.unboundedPreceding, -1)  # doctest: +SKIP
    >>> marked = df.withColumn("wm", key_watermark_of(F.col("t").cast("double"), w, 2.0))  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    # NaN sorts above every number in Spark: a NaN time must neither move a watermark nor be
    # judged, exactly as a null time
    known = F.when(~F.isnan(event_time), event_time) if nan else event_time
    return F.max(known).over(window) - F.lit(delay)


def late_against(event_time: Column, watermark: Column, *, nan: bool = True) -> Column:
    """Whether a row is late: its event time is below its key's watermark
    (:func:`key_watermark_of`). Null where the event time is null or NaN (never judged);
    false before a group's first known time, and where the watermark is NaN (``inf - inf``:
    an infinite time with an infinite delay), as the Python runtime has it, where Spark would
    order NaN above every number.

    ``nan=False`` says that neither column is ever NaN: the event time is integral, a
    timestamp or NaN made null, and the delay is finite (so no ``inf - inf``); the NaN
    guards are left out and the verdict is the same.

    Notes
    -----
    A column expression; O(1) per row.

    Examples
    --------
    >>> df.where(late_against(F.col("t"), F.col("wm")))  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    if not nan:
        return F.when(event_time.isNotNull(), F.coalesce(event_time < watermark, F.lit(False)))
    known = F.when(~F.isnan(event_time), event_time)
    late = F.when(F.isnan(watermark), F.lit(False)).otherwise(known < watermark)
    return F.when(known.isNotNull(), F.coalesce(late, F.lit(False)))
