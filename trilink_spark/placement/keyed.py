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

from .._internal.engines import EngineLadder, EnginePlan, EngineRequest, log_engine
from .._internal.engines import request_engine, resolve_engine
from .._internal.validation import check_num_partitions, choice
from ..columns import PARTITION_COL, check_user_columns, column_of, python_input
from ..columns import require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..partitioners.core.keys import check_null_policy
from ..merge.algebra.expressions import combinable
from ..partitioners import Partitioner
from ..partitioners.core.base import resolve_strategy_name
from .key_by import check_fit, key_by, null_policy_of, refuse_null_keys
from .source import check_source_layout, is_keyed_by_source, source_agg, source_apply

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["keyed_agg", "keyed_apply", "explain_keyed_agg", "KeyedAggPlan", "COMBINE_CHOICES",
           "KEYED_AGG_LADDER", "KeyedAggOptions", "keyed_agg_options", "keyed_agg_plan",
           "check_placement"]

logger = logging.getLogger(__name__)

#: ``combine=`` of :func:`keyed_agg`.
COMBINE_CHOICES: tuple[str, ...] = ("auto", "always", "never")

#: :func:`keyed_agg`'s candidates on the engine ladder
#: (:func:`~trilink_spark._internal.engines.resolve_engine`): ``"combine"`` (Spark's own
#: ``groupBy(key).agg``, partial aggregation on the map side), ``"exact"`` (rows placed by the
#: strategy, each key aggregated whole) and, fixed by the input, ``"in_place"`` (a frame
#: declared ``keyed_by_source``, aggregated inside each input partition).
KEYED_AGG_LADDER = EngineLadder(
    operator="keyed_agg", argument="combine", choices=COMBINE_CHOICES,
    engines={"always": "combine", "never": "exact"}, preferred="combine", fallback="exact",
    runs={"combine": "Spark's partial aggregation, hash placement",
          "exact": "exact placement by the strategy",
          "in_place": "each input partition is aggregated where it is, with no exchange"},
    scope="Spark's groupBy(key).agg", forces=True,
    titles={"combine": "Spark's map-side combine", "exact": "exact placement",
            "in_place": "aggregated in place"})


class KeyedAggPlan(EnginePlan):
    """How :func:`keyed_agg` runs its aggregates (see :func:`explain_keyed_agg`): an
    :class:`~trilink_spark._internal.engines.EnginePlan`.

    Attributes
    ----------
    engine : str
        ``"combine"``: Spark's own ``groupBy(key).agg`` with map-side partial aggregation
        (Spark's hash placement of the partial results; the strategy is not used).
        ``"exact"``: exact placement by the strategy, every row shuffled, each key aggregated
        whole on its partition. ``"in_place"``: a frame declared ``keyed_by_source``, each
        input partition aggregated where it is, with no exchange.
    reason : str
        Why, in words, starting with what asked (``combine='auto'``, ...).
    combine : bool
        Whether the engine is ``"combine"`` (this plan's field before it had an engine).

    Examples
    --------
    >>> KeyedAggPlan("exact", "combine='never': exact placement by the strategy").combine
    False
    """

    @property
    def combine(self) -> bool:
        """True for Spark's map-side combine (``engine == "combine"``)."""
        return self.engine == "combine"


@dataclass(frozen=True)
class KeyedAggOptions:
    """A :func:`keyed_agg` call's arguments, checked: what it runs and what
    :func:`explain_keyed_agg` describes (both build it with :func:`keyed_agg_options`).

    Attributes
    ----------
    key : str
    exprs : tuple of Column
        The aggregates (at least one).
    strategy : str or Partitioner
    num_partitions : int or None
    placement : dict
        The other options of :func:`key_by` (each checked).
    request : EngineRequest
        What ``combine`` asks for.
    null_policy : str
        The null policy every plan applies (the argument, a strategy's own, else
        ``spark.trilink.nullPolicy``, else ``"group"``).
    in_place : bool
        The frame is declared ``keyed_by_source``.
    """

    key: str
    exprs: tuple[Column, ...]
    strategy: str | Partitioner
    num_partitions: int | None
    placement: dict[str, Any]
    request: EngineRequest
    null_policy: str
    in_place: bool


def keyed_agg_options(df: DataFrame, key: str, exprs: tuple[Column, ...], *,
                      strategy: str | Partitioner = "auto", num_partitions: int | None = None,
                      combine: str = "auto", placement: dict[str, Any] | None = None
                      ) -> KeyedAggOptions:
    """Check :func:`keyed_agg`'s arguments: the one check of :func:`keyed_agg` and
    :func:`explain_keyed_agg`, so both refuse the same arguments with the same error.

    Raises
    ------
    InvalidArgumentError
        No aggregate; a ``combine`` outside :data:`COMBINE_CHOICES`; what :func:`key_by`
        refuses of the placement arguments; a reserved column (exact and combine plans).
    InvalidArgumentTypeError
        A ``combine`` that is not a string; an unknown placement option, a bad strategy.
    MissingColumnError
        The key column is missing.
    StreamingNotSupportedError, KeysNotGroupedError
        A frame declared ``keyed_by_source`` that is a stream, or was shuffled since.

    Notes
    -----
    Cost: the frame's schema, a conf read or two; on a ``keyed_by_source`` frame one
    physical plan (its exchanges counted). No job.
    """
    placement = dict(placement or {})
    if not exprs:
        raise InvalidArgumentError("keyed_agg needs at least one aggregate expression")
    request = request_engine(KEYED_AGG_LADDER, df.sparkSession, combine)
    check_placement(strategy, num_partitions, placement)  # the same refusals on every plan
    require_columns(df, [key], "key column")
    policy = null_policy_of(df, strategy, placement.get("null_policy"))
    in_place = is_keyed_by_source(df, key)
    if in_place:
        check_source_layout(df, key)
    else:
        check_user_columns(df)  # the same refusals on both plans
    return KeyedAggOptions(key, tuple(exprs), strategy, num_partitions, placement, request,
                           policy, in_place)


def keyed_agg_plan(df: DataFrame, options: KeyedAggOptions) -> KeyedAggPlan:
    """The plan :func:`keyed_agg` runs for ``options``, and why: the engine ladder with
    :data:`KEYED_AGG_LADDER`. ``"auto"`` combines where :func:`~trilink_spark.merge.
    expressions.combinable` says Spark's combine gives ``groupBy``'s result and the null
    policy is not ``"partition0"`` (which only exact placement keeps); ``"always"`` and
    ``"never"`` force one; a ``keyed_by_source`` frame is aggregated in place whatever was
    asked. Cost: O(aggregates) plus one query plan for ``"auto"`` (no job)."""

    def allows() -> tuple[bool, str]:
        ok, why = combinable(options.exprs, df)
        if ok and options.null_policy == "partition0":
            return False, ("null_policy='partition0', which puts the null key's group on "
                           "partition 0, where Spark's combine does not")
        return ok, why

    settled = (("in_place", "a frame declared keyed_by_source") if options.in_place else None)
    plan = resolve_engine(KEYED_AGG_LADDER, options.request, allows, settled)
    return KeyedAggPlan(plan.engine, plan.reason)


def explain_keyed_agg(df: DataFrame, key: str, *exprs: Column,
                      strategy: str | Partitioner = "auto", num_partitions: int | None = None,
                      combine: str = "auto", **placement: Any) -> KeyedAggPlan:
    """The plan :func:`keyed_agg` picks for ``exprs``, and why (nothing runs).

    The arguments are :func:`keyed_agg`'s, checked by the same function
    (:func:`keyed_agg_options`: the same errors). ``"auto"`` combines when an aggregate is
    a sketch (percentile_approx,
    approx_count_distinct, count_min_sketch, HLL, KLL, theta, ...:
    :data:`~trilink_spark.merge.algebra.expressions.SPARK_SKETCHES`), also one inside an expression
    (``F.percentile_approx("v", 0.5) + 1``, ``F.when(...)``): its buffer is bounded and its
    result can depend on the order rows are merged, so only Spark's own plan gives exactly
    ``groupBy``'s result. Else it combines when every aggregate has a fixed-size partial
    buffer (count, sum, min, max, avg, first, last, stddev, ...:
    :data:`~trilink_spark.merge.algebra.expressions.SPARK_COMBINABLE`) and places exactly otherwise
    (collect_list, exact percentiles, DISTINCT aggregates, UDAFs): there a hot key's rows
    cannot be shrunk on the map side, and a balanced placement bounds the slowest task
    instead. A ``null_policy="partition0"`` places exactly (only exact placement puts the
    null group on partition 0); a ``keyed_by_source`` frame is aggregated in place. The
    reason names what decided.

    Returns
    -------
    KeyedAggPlan
        An :class:`~trilink_spark._internal.engines.EnginePlan`: ``engine`` (``"combine"``,
        ``"exact"`` or ``"in_place"``), ``reason``, and ``combine`` (True for the combine).

    Notes
    -----
    Cost: the checks of :func:`keyed_agg`, O(aggregates), plus one query plan (no job),
    whose aggregate node shows the sketches, Python UDAFs and DISTINCT aggregates; one more
    per aggregate when one is DISTINCT (to name it).

    Examples
    --------
    >>> placement.explain_keyed_agg(df, "k", F.sum("v"))  # doctest: +SKIP
    KeyedAggPlan(engine='combine', reason="combine='auto': every aggregate has a fixed-size ...")
    """
    options = keyed_agg_options(df, key, exprs, strategy=strategy,
                                num_partitions=num_partitions, combine=combine,
                                placement=placement)
    return keyed_agg_plan(df, options)


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
    input partition. Exact placement: the one shuffle of :func:`key_by` (every row; none on a
    frame already placed, :func:`~trilink_spark.placement.already_placed`); the
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
    options = keyed_agg_options(df, key, exprs, strategy=strategy,
                                num_partitions=num_partitions, combine=combine,
                                placement=placement)
    plan = keyed_agg_plan(df, options)
    log_engine(logger, KEYED_AGG_LADDER, key, plan)
    policy = options.null_policy
    if plan.engine == "in_place":
        return source_agg(_signed_zeros_as_one(refuse_null_keys(df, key, policy), key), key,
                          exprs)
    if plan.engine == "combine":
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


def check_placement(strategy: Any, num_partitions: Any, placement: dict[str, Any],
                    operator: str = "keyed_agg") -> None:
    """Refuse what :func:`key_by` would refuse of the placement arguments, without a job,
    so a typo fails whichever plan the operator (``keyed_agg``, ``keyed_process``) picks.

    Raises
    ------
    InvalidArgumentTypeError
        An option :func:`key_by` does not take (the message names ``operator`` and the
        options), a strategy that is neither a name nor a Partitioner.
    InvalidArgumentError, UnknownStrategyError
        An unknown strategy name, a bad ``num_partitions``, ``null_policy`` or ``fit``, a
        ``num_partitions`` that differs from the strategy's.

    Notes
    -----
    Cost: O(options).
    """
    options = [p.name for p in inspect.signature(key_by).parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(placement) - set(options))
    if unknown:
        raise InvalidArgumentTypeError(
            f"{operator} got unknown placement options {unknown}; key_by takes {options}")
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
    if placement.get("fit") is not None:
        check_fit(placement["fit"])


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
    Cost: the one shuffle of :func:`key_by` (none on a frame already placed,
    :func:`~trilink_spark.placement.already_placed`), then Arrow batches to Python workers as in
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
