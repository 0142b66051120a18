"""Global Merge: no keyed exchange at all (seed 002 §4.3 (2), Figure 11 (c)).

Every partition aggregates its own rows and merges the resulting partials (deltas) into one
global result. With the embedded ``store="driver"`` the deltas are collected by the driver
(Arrow) and merged there; only one partial row per key, partition and flush crosses the
network, and the plan has no shuffle exchange. The modes of
:func:`~trilink_spark.local_merge` decide how often a partition flushes its deltas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidArgumentError, InvalidArgumentTypeError
from .local_merge import SLOT, local_merge
from .partials import finalize_frame, merge_partial_frames, parse_aggs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["global_merge", "GLOBAL_STORES"]

#: Global stores built in.
GLOBAL_STORES: tuple[str, ...] = ("driver",)
_CONST_TIME = "_tl_gm_time"


def global_merge(
    df: DataFrame,
    key: str,
    aggs: Any,
    store: str = "driver",
    mode: str = "quantity",
    batch_id: int | None = None,
    *,
    quantity: int = 10_000,
    event_time: str | None = None,
    delay: Any = None,
    punctuation: str | None = None,
) -> DataFrame:
    """Aggregate per key without a keyed exchange: local partials merged into a global store.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    aggs
        As for :func:`~trilink_spark.local_merge`.
    store : {"driver"}
        Where deltas are merged (embedded default: the driver).
    mode, quantity, delay, punctuation
        When a partition flushes its deltas (see :func:`~trilink_spark.local_merge`);
        ``periodic`` and ``punctuation`` need ``event_time``.
    batch_id : int, optional
        The micro-batch id when called from ``foreachBatch`` (recorded; the driver store keeps
        nothing between calls, so every call is its own exactly-once unit).
    event_time : str, optional
        Event-time column for the periodic mode (and the result's ``event_time`` column).

    Returns
    -------
    pyspark.sql.DataFrame
        One row per key: the key, then one column per aggregate, as ``groupBy(key).agg``.

    Notes
    -----
    Cost: one Spark job with no shuffle (each partition aggregates in Python, Arrow in and out),
    the partials collected to the driver (memory O(keys x partitions x flushes)), merged with
    pandas, and the result turned back into a DataFrame. Suited where the result is small
    compared with the input (few keys); for many keys use ``keyed_agg``.

    Examples
    --------
    >>> totals = tl.global_merge(df, "sensor", {"n": ("count", None)})  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    if store not in GLOBAL_STORES:
        raise InvalidArgumentError(f"store must be one of {GLOBAL_STORES}, got {store!r}")
    if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int)):
        raise InvalidArgumentTypeError(f"batch_id must be an int, got {type(batch_id).__name__}")
    specs = parse_aggs(aggs, df.columns)
    if event_time is None:
        if mode == "periodic":
            raise InvalidArgumentError("periodic mode needs event_time=<column>")
        source = df.withColumn(_CONST_TIME, F.lit(0).cast("long"))
        time_name = _CONST_TIME
    else:
        source, time_name = df, event_time
    slot = 2**62  # one slot: the whole input
    partials = local_merge(source, key, time_name, slot, aggs, mode, quantity=quantity,
                           delay=delay, punctuation=punctuation)
    table = partials.toArrow()
    frame = table.to_pandas()
    groups = [key]
    if len(frame):
        merged = merge_partial_frames(frame.drop(columns=[SLOT]), groups, specs, time_name)
        result = finalize_frame(merged, groups, specs)
    else:
        result = frame[[key]].assign(**{s.name: np.nan for s in specs})
    schema = _result_schema(df, key, specs)
    spark = df.sparkSession
    if not len(result):
        return spark.createDataFrame([], schema)
    return spark.createDataFrame(result[[key] + [s.name for s in specs]], schema)


def _result_schema(df: DataFrame, key: str, specs: list[Any]) -> str:
    fields = [f"`{key}` {df.schema[key].dataType.simpleString()}"]
    for spec in specs:
        if spec.func == "count":
            dtype = "bigint"
        elif spec.func in ("sum", "mean"):
            dtype = "double"
        elif hasattr(spec.func, "dtype"):
            dtype = spec.func.dtype
        else:
            dtype = df.schema[spec.column].dataType.simpleString()
        fields.append(f"`{spec.name}` {dtype}")
    return ", ".join(fields)
