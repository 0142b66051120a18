"""Keyed aggregation and grouped-map with rows placed by a strategy: ``groupBy`` that keeps
keys whole and balanced.

Both place the rows with :func:`~trilink_spark.key_by` (one exchange) and then group by
``(partition, key)``, which the placement already satisfies, so Spark adds no second exchange.
On a frame declared with :func:`~trilink_spark.placement.keyed_by_source` they run inside each
input partition with no exchange at all.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._internal.validation import check_num_partitions
from ..columns import PARTITION_COL, column_of, python_input
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..partitioners.keys import check_null_policy
from ..merge.expressions import combinable
from ..partitioners import Partitioner
from ..partitioners.base import resolve_strategy_name
from .key_by import FIT_MODES, key_by, null_policy_of, refuse_null_keys
from .source import is_keyed_by_source, source_agg, source_apply

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["keyed_agg", "keyed_apply", "explain_keyed_agg", "KeyedAggPlan", "COMBINE_CHOICES"]

logger = logging.getLogger(__name__)

#: ``combine=`` of :func:`keyed_agg`.
COMBINE_CHOICES: tuple[str, ...] = ("auto", "always", "never")


@dataclass(frozen=True)
class KeyedAggPlan:
    """How :func:`keyed_agg` runs its aggregates (see :func:`explain_keyed_agg`).

    Attributes
    ----------
    combine : bool
        True: Spark's own ``groupBy(key).agg`` with map-side partial aggregation (Spark's hash
        placement of the partial results; the strategy is not used). False: exact placement by
        the strategy, every row shuffled, each key aggregated whole on its partition.
    reason : str
        Why, in words.
    """

    combine: bool
    reason: str


def explain_keyed_agg(df: DataFrame, key: str, *exprs: Column, combine: str = "auto"
                      ) -> KeyedAggPlan:
    """The plan :func:`keyed_agg` picks for ``exprs``, and why (nothing runs).

    ``"auto"`` combines when an aggregate is a sketch (percentile_approx,
    approx_count_distinct, count_min_sketch, HLL, KLL, theta, ...:
    :data:`~trilink_spark.merge.expressions.SPARK_SKETCHES`), also one inside an expression
    (``F.percentile_approx("v", 0.5) + 1``, ``F.when(...)``): its buffer is bounded and its
    result can depend on the order rows are merged, so only Spark's own plan gives exactly
    ``groupBy``'s result. Else it combines when every aggregate has a fixed-size partial
    buffer (count, sum, min, max, avg, first, last, stddev, ...:
    :data:`~trilink_spark.merge.expressions.SPARK_COMBINABLE`) and places exactly otherwise
    (collect_list, exact percentiles, DISTINCT aggregates, UDAFs): there a hot key's rows
    cannot be shrunk on the map side, and a balanced placement bounds the slowest task
    instead. The reason names the aggregate that decided.

    Notes
    -----
    Cost: O(aggregates), plus one query plan (no job), whose aggregate node shows the sketches,
    Python UDAFs and DISTINCT aggregates; one more per aggregate when one is DISTINCT (to
    name it).

    Examples
    --------
    >>> placement.explain_keyed_agg(df, "k", F.sum("v"))  # doctest: +SKIP
    KeyedAggPlan(combine=True, reason='every aggregate has a fixed-size partial buffer: ...')
    """
    if combine not in COMBINE_CHOICES:
        raise InvalidArgumentError(f"combine must be one of {COMBINE_CHOICES}, got {combine!r}")
    if is_keyed_by_source(df, key):
        return KeyedAggPlan(False, "the frame is declared keyed_by_source: each input partition "
                                   "is aggregated where it is, with no exchange")
    if combine == "always":
        return KeyedAggPlan(True, "combine='always': Spark's partial aggregation, hash placement")
    if combine == "never":
        return KeyedAggPlan(False, "combine='never': exact placement by the strategy")
    ok, why = combinable(exprs, df)
    return KeyedAggPlan(ok, why)


def keyed_agg(
    df: DataFrame,
    key: str,
    *exprs: Column,
    strategy: str | Partitioner = "auto",
    num_partitions: int | None = None,
    combine: str = "auto",
    **placement: Any,
) -> DataFrame:
    """``df.groupBy(key).agg(*exprs)``, on the cheaper plan: Spark's map-side combine for
    decomposable aggregates, rows placed by ``strategy`` for the others.

    Parameters
    ----------
    df, key, strategy, num_partitions, **placement
        As :func:`key_by`.
    *exprs : Column
        Aggregate expressions, as for ``GroupedData.agg``.
    combine : {"auto", "always", "never"}
        ``"auto"``: Spark's own ``groupBy(key).agg`` (partial aggregation on the map side,
        then a hash shuffle of partial results) when every aggregate has a fixed-size partial
        buffer, exact placement by ``strategy`` otherwise (collect_list, percentiles, DISTINCT
        aggregates, UDAFs); :func:`explain_keyed_agg` says which and why, and the choice is
        logged. ``"always"`` / ``"never"`` force one plan.

    Null keys follow ``null_policy`` (a keyword of ``**placement``, default as in
    :func:`key_by`: a strategy object's own, else ``spark.trilink.nullPolicy``, else
    ``"group"``) on every plan. ``"group"``: the null key's group is kept, exactly as
    ``groupBy`` keeps it (exact placement puts it on ``pmod(42, n)``, where Spark's combine
    puts it too). ``"error"``: a null key fails the job with a message naming
    ``NullKeyError``; on the combine plan (and on a ``keyed_by_source`` frame) the check is a
    JVM expression inside the plan, raised when the result is computed, with no extra job.
    ``"partition0"``: the null group on partition 0, which only exact placement does, so
    ``combine="auto"`` places exactly; ``combine="always"`` keeps Spark's combine, which
    places every group, the null one included, by Spark's hash (the strategy is not used).

    Returns
    -------
    pyspark.sql.DataFrame
        One row per key: the key column, then one column per expression, exactly as
        ``groupBy(key).agg`` returns. With exact placement, partition ``i`` holds the keys the
        strategy placed on ``i``; with the combine, Spark's hash placement.

    Notes
    -----
    Cost, combined: Spark's ``groupBy``: one shuffle of at most one partial row per key and
    input partition. Exact placement: the one shuffle of :func:`key_by` (every row); the
    aggregation groups by ``(partition, key)``, which
    the placement already satisfies, so Spark adds no second exchange. On a frame declared with
    :func:`~trilink_spark.placement.keyed_by_source` there is no shuffle at all: the strategy is
    not used and each input partition is aggregated where it is (see
    :func:`~trilink_spark.placement.source.source_agg` for the functions supported there). A key's
    aggregate is computed whole on its partition: choose a balanced strategy when keys are skewed.

    Examples
    --------
    >>> from pyspark.sql import functions as F  # doctest: +SKIP
    >>> tl.keyed_agg(df, "user", F.sum("amount").alias("total"), strategy="hash")  # doctest: +SKIP
    """
    if not exprs:
        raise InvalidArgumentError("keyed_agg needs at least one aggregate expression")
    if combine not in COMBINE_CHOICES:
        raise InvalidArgumentError(f"combine must be one of {COMBINE_CHOICES}, got {combine!r}")
    _check_placement(strategy, num_partitions, placement)  # the same refusals on every plan
    from ..columns import require_columns

    require_columns(df, [key], "key column")
    policy = null_policy_of(df, strategy, placement.get("null_policy"))
    if is_keyed_by_source(df, key):
        return source_agg(_signed_zeros_as_one(refuse_null_keys(df, key, policy), key), key,
                          exprs)
    plan = explain_keyed_agg(df, key, *exprs, combine=combine)
    if plan.combine and combine == "auto" and policy == "partition0":
        plan = KeyedAggPlan(False, "null_policy='partition0' puts the null key's group on "
                                   "partition 0, which Spark's combine does not: exact placement")
    logger.info("keyed_agg on %r: %s (%s)", key,
                "Spark's map-side combine" if plan.combine else "exact placement", plan.reason)
    if plan.combine:
        from ..columns import check_user_columns

        check_user_columns(df)  # the same refusals on both plans
        return refuse_null_keys(df, key, policy).groupBy(column_of(key)).agg(*exprs)
    # uncompacted: grouping by (PARTITION_COL, key) then reuses the exchange
    placed = key_by(df, key, strategy, num_partitions, **{"compact": "never", **placement})
    grouped = placed.groupBy(PARTITION_COL, column_of(key)).agg(*exprs)
    # drop the partition column by position: an aggregate may be named like it
    names = grouped.columns
    spare = PARTITION_COL
    while spare in names:
        spare += "_"
    return grouped.toDF(spare, *names[1:]).drop(spare)


def _check_placement(strategy: Any, num_partitions: Any, placement: dict[str, Any]) -> None:
    """Refuse what :func:`key_by` would refuse of the placement arguments, without a job,
    so a typo fails whichever plan :func:`keyed_agg` picks."""
    options = [p.name for p in inspect.signature(key_by).parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(placement) - set(options))
    if unknown:
        raise InvalidArgumentTypeError(
            f"keyed_agg got unknown placement options {unknown}; key_by takes {options}")
    if isinstance(strategy, str):
        if strategy.lower() != "auto":
            resolve_strategy_name(strategy)
    elif not isinstance(strategy, Partitioner):
        raise InvalidArgumentTypeError(
            f"strategy must be a name or a Partitioner, got {type(strategy).__name__}")
    if num_partitions is not None:
        check_num_partitions(num_partitions)
        if isinstance(strategy, Partitioner) and num_partitions != strategy.num_partitions:
            raise InvalidArgumentError(
                f"num_partitions={num_partitions} differs from the strategy's "
                f"{strategy.num_partitions}; omit num_partitions or make them agree")
    if placement.get("null_policy") is not None:
        check_null_policy(placement["null_policy"])
    if placement.get("fit") is not None and placement["fit"] not in FIT_MODES:
        raise InvalidArgumentError(
            f"fit must be one of {', '.join(FIT_MODES)}, got {placement['fit']!r}")


def _signed_zeros_as_one(df: DataFrame, key: str) -> DataFrame:
    """``df`` with a float key's -0.0 written 0.0 (Spark groups them as one key; the per
    partition aggregation of a keyed_by_source frame would not): a projection, no exchange,
    the key's metadata (the declaration) kept."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    field = df.schema[key]
    if not isinstance(field.dataType, (T.FloatType, T.DoubleType)):
        return df
    column = column_of(key)
    zero = F.lit(0.0).cast(field.dataType)
    fixed = F.when(column == zero, zero).otherwise(column)
    # withColumn takes the name as it is; withMetadata would parse it (``a.b``: a field)
    return df.withColumn(key, fixed.alias(key, metadata=field.metadata))


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
    Null keys follow ``null_policy`` (in ``**placement``), as in :func:`key_by`: by default
    the null key is one group of its own (``key_tuple`` ``(None,)``, for an integer column
    too, where PySpark's ``applyInPandas`` gives ``(nan,)``), as in ``groupBy``. For a
    floating key column ``key_tuple`` is PySpark's, ``(nan,)`` for the null key and for the
    NaN key alike (two groups, told apart by nothing pandas holds).

    Notes
    -----
    Cost: the one shuffle of :func:`key_by`, then Arrow batches to Python workers as in
    ``applyInPandas``; every row of a key is in memory at once on one worker (PySpark's own
    warning for grouped-map skew applies: a balanced strategy spreads heavy keys apart). On a
    frame declared with :func:`~trilink_spark.placement.keyed_by_source`: no shuffle, each input
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
        policy = null_policy_of(df, strategy, placement.get("null_policy"))
        return source_apply(refuse_null_keys(df, key, policy), key, func, schema)
    takes_key = len(inspect.signature(func).parameters) == 2
    # uncompacted: grouping by (PARTITION_COL, key) then reuses the exchange
    placed = key_by(df, key, strategy, num_partitions, **{"compact": "never", **placement})
    from pyspark.sql import types as T

    # PySpark gives an integer column's null key as NaN: it is None here, as everywhere
    integral = isinstance(placed.schema[key].dataType, T.IntegralType)

    # a column named with a dot or a backtick crosses into Python under an alias
    placed, aliases = python_input(placed)
    inside = {name: alias for alias, name in aliases.items()}

    def grouped(key_tuple: tuple[Any, ...], pdf: Any) -> Any:
        pdf = pdf.drop(columns=[PARTITION_COL])
        if aliases:
            pdf = pdf.rename(columns=aliases)
        if not takes_key:
            return func(pdf)
        value = key_tuple[1]
        return func((None,) if integral and value != value else key_tuple[1:], pdf)

    by = column_of(inside.get(key, key))
    return placed.groupBy(PARTITION_COL, by).applyInPandas(grouped, schema)
