"""Keyed aggregation and grouped-map with rows placed by a strategy: ``groupBy`` that keeps
keys whole and balanced.

Both place the rows with :func:`~trilink_spark.key_by` (one exchange) and then group by
``(partition, key)``, which the placement already satisfies, so Spark adds no second exchange.
On a frame declared with :func:`~trilink_spark.keyed_by_source` they run inside each input
partition with no exchange at all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..columns import PARTITION_COL
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..partitioners import Partitioner
from .key_by import key_by
from .source import is_keyed_by_source, source_agg, source_apply

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["keyed_agg", "keyed_apply"]


def keyed_agg(
    df: DataFrame,
    key: str,
    *exprs: Column,
    strategy: str | Partitioner = "auto",
    num_partitions: int | None = None,
    **placement: Any,
) -> DataFrame:
    """``df.groupBy(key).agg(*exprs)``, with the rows placed by ``strategy``.

    Parameters
    ----------
    df, key, strategy, num_partitions, **placement
        As :func:`key_by`.
    *exprs : Column
        Aggregate expressions, as for ``GroupedData.agg``.

    Returns
    -------
    pyspark.sql.DataFrame
        One row per key: the key column, then one column per expression, exactly as
        ``groupBy(key).agg`` returns; partition ``i`` holds the keys the strategy placed on ``i``.

    Notes
    -----
    Cost: the one shuffle of :func:`key_by`; the aggregation groups by ``(partition, key)``, which
    the placement already satisfies, so Spark adds no second exchange. On a frame declared with
    :func:`~trilink_spark.keyed_by_source` there is no shuffle at all: the strategy is not used
    and each input partition is aggregated where it is (see
    :func:`~trilink_spark.placement.source.source_agg` for the functions supported there). A key's
    aggregate is computed whole on its partition: choose a balanced strategy when keys are
    skewed.

    Examples
    --------
    >>> from pyspark.sql import functions as F  # doctest: +SKIP
    >>> tl.keyed_agg(df, "user", F.sum("amount").alias("total"), strategy="hash")  # doctest: +SKIP
    """
    if not exprs:
        raise InvalidArgumentError("keyed_agg needs at least one aggregate expression")
    if is_keyed_by_source(df, key):
        return source_agg(df, key, exprs)
    placed = key_by(df, key, strategy, num_partitions, **placement)
    return placed.groupBy(PARTITION_COL, key).agg(*exprs).drop(PARTITION_COL)


def keyed_apply(
    df: DataFrame,
    key: str,
    func: Callable[..., Any],
    schema: StructType | str,
    *,
    strategy: str | Partitioner = "auto",
    num_partitions: int | None = None,
    **placement: Any,
) -> DataFrame:
    """``df.groupBy(key).applyInPandas(func, schema)``, with the rows placed by ``strategy``.

    ``func`` receives each key's rows as a pandas DataFrame with ``df``'s columns (the partition
    column removed), or ``(key_tuple, pdf)`` when it takes two arguments, as in PySpark.

    Notes
    -----
    Cost: the one shuffle of :func:`key_by`, then Arrow batches to Python workers as in
    ``applyInPandas``; every row of a key is in memory at once on one worker (PySpark's own
    warning for grouped-map skew applies: a balanced strategy spreads heavy keys apart). On a
    frame declared with :func:`~trilink_spark.keyed_by_source`: no shuffle, each input
    partition is grouped where it is.

    Examples
    --------
    >>> def top(pdf):  # doctest: +SKIP
    ...     return pdf.nlargest(1, "amount")
    >>> tl.keyed_apply(df, "user", top, df.schema, strategy="least_count")  # doctest: +SKIP
    """
    if not callable(func):
        raise InvalidArgumentTypeError(f"func must be callable, got {type(func).__name__}")
    if is_keyed_by_source(df, key):
        return source_apply(df, key, func, schema)
    takes_key = len(inspect.signature(func).parameters) == 2
    placed = key_by(df, key, strategy, num_partitions, **placement)

    def grouped(key_tuple: tuple[Any, ...], pdf: Any) -> Any:
        pdf = pdf.drop(columns=[PARTITION_COL])
        return func(key_tuple[1:], pdf) if takes_key else func(pdf)

    return placed.groupBy(PARTITION_COL, key).applyInPandas(grouped, schema)
