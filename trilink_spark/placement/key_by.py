"""Placement: put every row on the partition its strategy gives, with one shuffle done by Spark.

``key_by`` computes a partition id column in the JVM and calls
``DataFrame.repartitionById(n, pid)``, Spark's one exchange that sends row to partition ``pid``
(under ``"hash"``, Spark's ``repartition(n, key)``, which sends every row to the same place).
A frame that Spark already lays out by ``repartition(n, key)`` is not shuffled again under
``"hash"`` with ``n`` partitions (:func:`already_placed`): that layout is the strategy's.
Grouping afterwards by ``(pid, key)`` reuses that layout, so :func:`keyed_agg` and
:func:`keyed_apply` add no second exchange (grouping by ``key`` alone would shuffle again).

How the id is computed, per strategy:

- Hash: ``pmod(hash(key), n)``, Spark's own placement; Modulo: ``pmod(key, n)``; hash-mode
  Weight: a ``CASE`` over the prefix sums of the weights. All in the JVM.
- Table strategies (LeastKey, LeastCount, random Weight): the driver plays the paper's
  coordinator. It learns the keys (``fit``, below, on the executors:
  :func:`~trilink_spark.placement.fit.fit_table`), and the table ``{key: pid}`` (at most
  ``max_keys`` entries) is joined to the rows with a broadcast hash join (a broadcast, not a
  shuffle). Keys the table does not know get Spark's hash placement ``pmod(hash(key), n)``,
  or, once the table is bounded, their key group's partition: one JVM expression over the
  group table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .._internal.spark.frames import Projection
from .._internal.validation import check_num_partitions
from .._internal.validation import choice, refuse_streaming
from ..columns import COMPACTED_META, NUM_PARTITIONS_META, PARTITION_COL, TABLE_KEY_COL
from ..columns import TABLE_PID_COL
from ..columns import SLOT_ID_COL, SLOT_PID_COL, check_user_columns
from ..columns import column_of, quoted, require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidKeyTypeError
from ..errors import ReservedColumnError
from ..partitioners.core.keys import DEFAULT_NULL_POLICY, NULL_POLICIES, check_null_policy
from ..partitioners.core.keys import null_key_error, null_partition
from ..partitioners import HashPartitioner, Partitioner, TablePartitioner
from ..partitioners.core.base import resolve_strategy_name
from ..partitioners.tables.overlay import OverlayPartitioner
from ..partitioners.choosing.catalogue import build, default_candidates
from ..partitioners.tables.table import DEFAULT_MAX_KEYS, check_max_keys
from ..partitioners.choosing.evaluation import StrategyScore, choose_best, evaluate_strategies
from ..partitioners.core.balance import keyed_bound_of
from .._internal.spark.compat import frame_of_arrow
from .._internal.spark.session import conf_count, conf_get
from .plans import PartitionPlan, key_kind, partition_plan_of, table_frame, table_frame_of
from .fit import FIT_HOWS, fit_table, key_counts, key_head, scan_sample

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = [
    "PARTITION_COL",
    "FIT_MODES",
    "check_fit",
    "KeyedStrategy",
    "key_kind",
    "key_counts",
    "fit_table",
    "FIT_HOWS",
    "table_max_keys",
    "null_policy_of",
    "refuse_null_keys",
    "resolve_strategy",
    "key_by",
    "place_rows",
    "already_placed",
    "hashes_as_spark",
    "with_partition_id",
    "COMPACT_ABOVE",
    "COMPACT_MODES",
]

logger = logging.getLogger(__name__)

#: How table strategies learn keys in :func:`key_by`.
FIT_MODES: tuple[str, ...] = ("full", "sample", "none")


def check_fit(fit: Any, name: str = "fit") -> str:
    """``fit`` when it is one of :data:`FIT_MODES`: the one check of a fit mode, for
    :func:`key_by` and every call that hands one on to it. O(1).

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        Another string, or not a string (the message lists :data:`FIT_MODES`).

    Examples
    --------
    >>> check_fit("sample")
    'sample'
    """
    return choice(fit, name, FIT_MODES)


@dataclass(frozen=True)
class KeyedStrategy:
    """A strategy resolved for one DataFrame: what :func:`key_by` will place with.

    Attributes
    ----------
    partitioner : Partitioner
        The strategy, fitted as ``fit`` says.
    scores : list of StrategyScore
        For ``strategy="auto"``: every candidate's score on the sample (else empty).
    sample_rows : int
        Rows the choice was based on (0 when no sampling happened).
    """

    partitioner: Partitioner
    scores: list[StrategyScore]
    sample_rows: int


def null_policy_of(df: DataFrame, strategy: Any = None, null_policy: str | None = None) -> str:
    """The null policy a keyed call on ``df`` places with: ``null_policy`` when given; else a
    strategy object's own (its constructor's ``null_policy``); else the conf
    ``spark.trilink.nullPolicy``; else ``"group"``.

    Raises :class:`~trilink_spark.errors.InvalidArgumentError` for a policy that is not one
    of ``"group"``, ``"error"``, ``"partition0"`` (naming the conf when the conf holds it).
    O(1): one conf read at most.

    Examples
    --------
    >>> null_policy_of(df, "hash", None)  # doctest: +SKIP
    'group'
    """
    if null_policy is not None:
        return check_null_policy(null_policy)
    if isinstance(strategy, Partitioner):
        return strategy.null_policy
    # a bad conf value is named as the conf, with the values it may take
    return choice(conf_get(df.sparkSession, "nullPolicy", DEFAULT_NULL_POLICY),
                  "spark.trilink.nullPolicy (the default of null_policy)", NULL_POLICIES)


def refuse_null_keys(df: DataFrame, key: str, null_policy: str) -> DataFrame:
    """``df`` that fails, when an action reads a null ``key`` under the null policy
    ``"error"``, with the :class:`~trilink_spark.errors.NullKeyError` message (named in the
    Spark error); ``df`` itself under the other policies or for a non-nullable column.

    A filter that keeps every row: no job now, no exchange; the key column, its type and
    metadata unchanged. For the plans that place no row themselves (Spark's map-side combine,
    a keyed_by_source frame). O(1) to build; one predicate per row when it runs.
    """
    from pyspark.sql import functions as F

    if check_null_policy(null_policy) != "error" or not df.schema[key].nullable:
        return df
    column = column_of(key)
    return df.where(F.when(column.isNull(), F.raise_error(F.lit(_jvm_null_message(key))))
                    .otherwise(F.lit(True)))


def _jvm_null_message(key: str) -> str:
    """The message a Spark job fails with on a null key under ``"error"``: the name of the
    exception first, so :func:`_used_partitions` and users can tell it apart."""
    return f"trilink_spark.errors.NullKeyError: {null_key_error(f'column {key!r} has null keys')}"


def _check_strategy_for(p: Partitioner, kind: str | None, dtype: DataType, key: str) -> None:
    if p.strategy_name == "modulo" and kind not in ("int", "long"):
        raise InvalidKeyTypeError(
            f"Modulo needs an integer key column; {key!r} is {dtype.simpleString()}"
        )
    if kind is None and (p.is_stateful or p.strategy_name != "hash"):
        raise InvalidKeyTypeError(
            f"key column {key!r} is {dtype.simpleString()}; {p.strategy_name} supports int, "
            "long, string (UTF8_BINARY collation) and binary keys (hash supports every type "
            "Spark hashes)"
        )


def resolve_strategy(
    df: DataFrame,
    key: str,
    strategy: str | Partitioner = "auto",
    num_partitions: int | None = None,
    *,
    null_policy: str | None = None,
    fit: str | None = None,
    sample_rate: float | None = None,
    min_sample: int | None = None,
    seed: int = 0,
    min_gain: float = 0.01,
) -> KeyedStrategy:
    """Turn a strategy name or object into the fitted strategy :func:`key_by` would use.

    Same arguments as :func:`key_by`. Call it to inspect ``"auto"``'s choice and scores, then
    pass ``result.partitioner`` with ``fit="none"`` to :func:`key_by` to place with it.

    Notes
    -----
    ``"auto"`` samples the key column (Bernoulli, ``sample_rate``, seeded) and scores every
    candidate (hash, modulo for integer keys, least_key, least_count; the table strategies
    bounded at ``spark.trilink.table.maxKeys``) from at most two Spark jobs over the sample.
    The first (:func:`~trilink_spark.placement.fit.key_head`) brings at most ``maxKeys`` + 2
    keys with their counts; when the sample has no more distinct keys than that, those are
    all of them. Otherwise a second
    (:func:`~trilink_spark.placement.fit.scan_sample`) aggregates the sample's keys once and
    returns the heaviest ``maxKeys`` keys with exact counts, every key group's rows and keys,
    and each stateless candidate's rows per partition. The driver never holds every sampled
    key: memory O(``maxKeys`` + 4,096 groups). When the sample has fewer than ``min_sample``
    rows the jobs run again over every row.

    - At most ``maxKeys`` distinct sampled keys: those are every key, and the candidates are
      scored on their counts on the driver, the tables one entry per key, exactly as the
      paper's algorithms.
    - More: each table candidate is fitted on the job's result as
      :func:`~trilink_spark.placement.fit.fit_table` (``how="aggregate"``) fits it, and
      scored by the rows it gives each partition: its keys by name, every other key by its
      group. These are the sample's real loads (as :func:`key_by` would place the sample),
      so stateless and table strategies are judged alike.

    :func:`~trilink_spark.partitioners.choose_best` picks one: a table strategy only if it
    beats the best stateless one by more than ``min_gain``.

    A strategy object samples nothing and, with ``fit="none"``, runs no job: it costs the
    schema of ``df`` and at most one conf read (``spark.trilink.fit`` when ``fit`` is not
    given); ``spark.trilink.sampleRate`` and ``minSample`` are read only where a sample is
    taken.
    """
    from pyspark.sql import DataFrame

    if not isinstance(df, DataFrame):
        raise InvalidArgumentTypeError(f"expected a DataFrame, got {type(df).__name__}")
    kind, dtype = key_kind(df, key)
    spark = df.sparkSession
    policy = null_policy_of(df, strategy, null_policy)
    fit_mode = check_fit(fit or conf_get(spark, "fit", "full"))

    def sampling_rate() -> float:  # the confs are read only where a sample is taken
        rate = float(sample_rate if sample_rate is not None
                     else conf_get(spark, "sampleRate", "0.01"))
        if not 0.0 < rate <= 1.0:
            raise InvalidArgumentError(f"sample_rate must be in (0, 1], got {rate}")
        return rate

    if sample_rate is not None:
        sampling_rate()

    if isinstance(strategy, Partitioner):
        if num_partitions is not None and num_partitions != strategy.num_partitions:
            raise InvalidArgumentError(
                f"num_partitions={num_partitions} differs from the strategy's "
                f"{strategy.num_partitions}; omit num_partitions or make them agree"
            )
        p: Partitioner = strategy.unwrap(refit=fit_mode == "full")
        # an object keeps its own null policy unless the argument says otherwise (a copy)
        p = p if null_policy is None else p.with_null_policy(policy)
        policy = p.null_policy
        scores: list[StrategyScore] = []
        sample_rows, counted_all = 0, False
    elif isinstance(strategy, str):
        n = check_num_partitions(
            num_partitions
            if num_partitions is not None
            else int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
        )
        if strategy.lower() == "auto":
            floor = int(min_sample if min_sample is not None
                        else conf_get(spark, "minSample", "10000"))
            p, scores, sample_rows, counted_all = _choose_auto(
                df, key, kind, n, sampling_rate(), floor, seed, policy, min_gain
            )
        else:
            name = resolve_strategy_name(strategy)
            p = build(name, n, key_type=kind or "auto", null_policy=policy,
                      max_keys=table_max_keys(spark))
            scores, sample_rows, counted_all = [], 0, False
    else:
        raise InvalidArgumentTypeError(
            f"strategy must be a name or a Partitioner, got {type(strategy).__name__}"
        )
    _check_strategy_for(p, kind, dtype, key)
    if isinstance(p, TablePartitioner) and p.is_stateful and fit_mode != "none":
        if not scores:
            fraction = 1.0 if fit_mode == "full" else sampling_rate()
            fit_table(df, key, p, fraction, seed)
        elif fit_mode == "full" and not counted_all:
            # auto chose a table strategy on a sample: learn every key of the data instead
            refit = p.fresh(policy)
            if isinstance(refit, TablePartitioner):
                fit_table(df, key, refit, 1.0, seed)
            p = refit
    return KeyedStrategy(p, scores, sample_rows)


def table_max_keys(spark: Any) -> int:
    """The conf ``spark.trilink.table.maxKeys``: the entries a table strategy built by name
    holds at most (default
    :data:`~trilink_spark.partitioners.tables.table.DEFAULT_MAX_KEYS`). One conf read.

    Raises
    ------
    InvalidArgumentError
        The conf is not a whole number in ``[1, 16,777,216]`` (named).
    """
    return check_max_keys(conf_count(spark, "table.maxKeys", DEFAULT_MAX_KEYS),
                          "spark.trilink.table.maxKeys")


def _choose_auto(
    df: DataFrame,
    key: str,
    kind: str | None,
    n: int,
    rate: float,
    floor: int,
    seed: int,
    policy: str,
    min_gain: float,
) -> tuple[Partitioner, list[StrategyScore], int, bool]:
    """``"auto"``'s choice on a ``rate`` sample of ``df[key]`` (:func:`resolve_strategy`):
    the scores, the sampled rows, and whether every row was counted."""
    if kind is None:
        logger.info("auto: key %r is not int/long/string/binary; using hash placement", key)
        return HashPartitioner(n, null_policy=policy), [], 0, False
    limit = table_max_keys(df.sparkSession)
    counted_all = rate >= 1.0
    src = df.select(column_of(key))
    sample = src if counted_all else src.sample(fraction=rate, seed=seed)
    head = key_head(sample, key, limit)
    names = default_candidates(kind)
    built = [build(name, n, key_type=kind, null_policy=policy, seed=seed, max_keys=limit)
             for name in names]
    scan = None
    if not head.complete:  # more than maxKeys sampled keys: one scan for every score
        tables = [p for p in built if isinstance(p, TablePartitioner) and p.is_stateful]
        stateless = [p for p in built if not p.is_stateful]
        scan = scan_sample(sample, key, tables[0], [_placement_of(p, policy) for p in stateless])
    rows, nulls = (head.total, head.nulls) if scan is None else (scan.rows, scan.nulls)
    if not counted_all and rows < floor:
        return _choose_auto(df, key, kind, n, 1.0, floor, seed, policy, min_gain)
    if nulls and check_null_policy(policy) == "error":
        raise null_key_error(f"column {key!r} has null keys")
    if scan is None:  # every sampled key: scored one by one, as ever
        if not len(head.keys):  # no key, or the null key alone: nothing to weigh
            return HashPartitioner(n, key_type=kind, null_policy=policy), [], 0, counted_all
        mapping = dict(zip(head.keys.to_pylist() + [None] * bool(nulls),
                           head.rows.tolist() + [float(nulls)] * bool(nulls)))
        scores = evaluate_strategies(mapping, n, key_type=kind, seed=seed, null_policy=policy,
                                     max_keys=limit)
    else:  # the bounded tables fitted on the scan, every load from the same job
        bound = keyed_bound_of(scan.rows, scan.heaviest, n)
        loads = iter(scan.loads)
        scores = [StrategyScore(name, p, scan.fit(p) if isinstance(p, TablePartitioner)
                                and p.is_stateful else next(loads), bound)
                  for name, p in zip(names, built)]
    best = choose_best(scores, min_gain)
    logger.info(
        "auto: %s chosen on %d sampled rows (balance degree %.3f; %s)",
        best.name,
        rows,
        best.balance_degree,
        ", ".join(f"{s.name}={s.balance_degree:.3f}" for s in scores),
    )
    return best.partitioner, scores, rows, counted_all


def _placement_of(p: Partitioner, policy: str) -> Callable[[Column], Column]:
    """A stateless strategy's partition of a key column, the null key's as its policy says
    (``-1`` under ``"error"``, where the driver refuses it)."""
    from pyspark.sql import functions as F

    null_pid = -1 if policy == "error" else null_partition(policy, p.num_partitions)

    def place(col: Column) -> Column:
        return F.when(col.isNull(), F.lit(null_pid)).otherwise(p.spark_column(col))
    return place


def _null_guard(pid: Column, key_col: Column, policy: str, nullable: bool, key: str,
                n: int) -> Column:
    """The null key's partition (:func:`~trilink_spark.partitioners.core.keys.null_partition`),
    one rule for every strategy, or the JVM's refusal under ``"error"``."""
    from pyspark.sql import functions as F

    if not nullable:
        return pid
    if policy != "error":
        return F.when(key_col.isNull(), F.lit(null_partition(policy, n))).otherwise(pid)
    return F.when(key_col.isNull(), F.raise_error(F.lit(_jvm_null_message(key)))).otherwise(pid)


def key_by(
    df: DataFrame,
    key: str,
    strategy: str | Partitioner = "auto",
    num_partitions: int | None = None,
    *,
    null_policy: str | None = None,
    fit: str | None = None,
    sample_rate: float | None = None,
    min_sample: int | None = None,
    seed: int = 0,
    min_gain: float = 0.01,
    compact: str | None = None,
) -> DataFrame:
    """Place every row on the partition its strategy gives: one shuffle, done by Spark.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
        Key column: int/long/string/binary for every strategy; any hashable type for Hash.
    strategy : str or Partitioner
        ``"auto"`` (default), a strategy name (``"hash"``, ``"modulo"``, ``"least_key"``,
        ``"least_count"``) or a strategy object (e.g. a fitted ``LeastCountPartitioner`` or a
        ``WeightPartitioner``).
    num_partitions : int, optional
        Defaults to the strategy's own, else ``spark.sql.shuffle.partitions``.
    null_policy : {"group", "error", "partition0"}, optional
        What a null key is. ``"group"``: a key of its own, as in Spark's ``groupBy``, on
        partition ``pmod(42, n)``, where Spark's own hash partitioning puts it (Spark's
        Murmur3 of null is its seed, 42), whatever the strategy; a table strategy counts its
        rows there when it learns loads. ``"error"``: a null key fails the job with a
        message naming ``NullKeyError`` (raised on the driver when the keys were counted).
        ``"partition0"``: on partition 0. Default: a strategy object's own null policy (its
        constructor's ``null_policy``), else the conf ``spark.trilink.nullPolicy``, else
        ``"group"``; given, it overrides a strategy object's (placed with a copy).
    fit : {"full", "sample", "none"}, optional
        How table strategies learn the keys of ``df`` (default ``spark.trilink.fit``, ``"full"``):
        ``"full"`` counts every key with one Spark aggregation and places the new ones (keys
        already in the table stay); ``"sample"`` counts a ``sample_rate`` sample; ``"none"``
        uses the table as it is. Keys the table does not know are placed by Spark's hash.
    sample_rate, min_sample, seed, min_gain
        Sampling for ``"auto"`` and ``fit="sample"`` (see :func:`resolve_strategy`).
    compact : {"auto", "always", "never"}, optional
        Whether empty partitions may go without a Spark task (default
        ``spark.trilink.compactPartitions``, ``"auto"``). Spark runs one task per partition
        even when it is empty, about 1-3 ms each, so 10,000 partitions over 100 rows cost
        10,000 tasks per action. ``"auto"``: above :data:`COMPACT_ABOVE` partitions, one job
        finds the partitions that hold rows and, if at most half of them do, the frame gets
        one Spark partition per *non-empty* strategy partition. ``"always"``: the same at any
        partition count, whenever a partition is empty. ``"never"``: always
        ``num_partitions`` Spark partitions. Bounded inputs only; a streaming ``df`` is never
        compacted. An empty ``df`` compacts to one empty Spark partition. The partitions that
        hold rows are found when ``key_by`` is called: should the input gain rows on other
        partitions before an action (a table appended to meanwhile, a nondeterministic key),
        those rows are kept, sharing Spark partition ``pid mod slots`` with another
        partition's rows.

    Returns
    -------
    pyspark.sql.DataFrame
        ``df`` plus the int column :data:`PARTITION_COL`, the strategy's partition of each row
        in ``[0, num_partitions)``. Every Spark partition holds the rows of exactly one
        strategy partition, and a strategy partition's rows are never split. Not compacted
        (the usual case), row ``r`` is in Spark partition ``r[PARTITION_COL]``; compacted, the
        non-empty strategy partitions are numbered densely in ascending order.
        :func:`~trilink_spark.partition_balance` reports strategy partitions either way.

    Raises
    ------
    ReservedColumnError
        ``df`` has a column named like an internal one (``_tl_...``, e.g. the
        :data:`PARTITION_COL` of an earlier ``key_by``): drop or rename it first.

    Notes
    -----
    Cost: at most one shuffle exchange carrying every row (``repartitionById``; under
    ``"hash"`` hashing the key as its own column type, Spark's ``repartition(n, key)``, the
    same partitions), and one task per Spark partition in every later stage. **None** when
    ``df`` is laid out by ``repartition(n, key)`` already, with projections, filters and
    sorts within partitions above it, and the strategy is ``"hash"`` with ``n`` partitions
    (:func:`already_placed`; the driver plans ``df`` once to see it): the rows are where the
    strategy puts them, and only the partition id column is added. A ``key_by`` output under
    ``"hash"`` is such a frame once its partition id column is dropped, so a later keyed
    operator on it shuffles nothing. Compaction adds one aggregation job over the
    placed rows (O(rows), at most one row per strategy partition reaches the driver) and a
    broadcast of the ``{partition: slot}`` table, and then runs one task per non-empty
    partition: cost in proportion to the data, not to ``num_partitions``. A compacted frame
    is partitioned by that slot, so a later ``groupBy(PARTITION_COL, ...)`` adds an exchange
    (:func:`keyed_agg` places its rows uncompacted for this reason). Table strategies
    add a broadcast of their entries (at most ``max_keys``, default 65,536, whatever the
    number of distinct keys) and, with ``fit="full"``, one aggregation job over the key column
    before placement (:func:`~trilink_spark.placement.fit.fit_table`: driver memory
    O(``max_keys`` + 4,096 groups)); ``"auto"`` adds one job over a sample. Row order inside a partition is not preserved across the shuffle.
    Unlike ``groupBy``, rows are not pre-aggregated before the shuffle: the placement is exact,
    so a heavy key still lands whole on one partition.

    Driver cost per call (the plan, before any job): reading ``df``'s schema, then building
    the placement. A stream that places each micro-batch with the same strategy object and
    ``fit="none"`` (or a ``"full"`` fit that finds no new key) reuses what the previous batch
    built (:mod:`~trilink_spark.placement.plans`): the expressions and the table strategy's
    broadcast frame, about 15 Py4J calls a batch whatever the table's size. The first batch,
    and any batch after the table changed (a new key placed, a swap's new table), turn the
    table into a DataFrame again: O(entries) on the driver, about 0.1-0.4 s at 100,000
    entries (a bounded table: at most ``max_keys``, and keys placed by group change no
    entry). Each job broadcasts the entries to the executors (O(entries) per job).

    Examples
    --------
    >>> import trilink_spark as tl  # doctest: +SKIP
    >>> placed = df.transform(tl.key_by, "user", "least_count", 8)  # doctest: +SKIP
    >>> tl.partition_balance(placed).balance_degree  # doctest: +SKIP
    0.99
    """
    check_user_columns(df)
    return place_rows(df, key, strategy, num_partitions, null_policy=null_policy, fit=fit,
                      sample_rate=sample_rate, min_sample=min_sample, seed=seed,
                      min_gain=min_gain, compact=compact)


def place_rows(
    df: DataFrame,
    key: str,
    strategy: str | Partitioner = "auto",
    num_partitions: int | None = None,
    *,
    null_policy: str | None = None,
    fit: str | None = None,
    sample_rate: float | None = None,
    min_sample: int | None = None,
    seed: int = 0,
    min_gain: float = 0.01,
    compact: str | None = "never",
    reuse: bool = True,
) -> DataFrame:
    """:func:`key_by` for frames that carry the library's own internal columns (the keyed
    runners tag rows with their arrival position before placing them). Same arguments, result
    and cost; user frames go through :func:`key_by`, which refuses reserved column names.
    ``compact`` defaults to ``"never"`` here: the keyed runners keep state per Spark
    partition, so their partitions must be the strategy's. ``reuse=False`` leaves out the
    look at ``df``'s schema and plan (:func:`already_placed`) and always places by partition
    id, for callers whose frames are never placed already (a stream's micro-batches) and
    whose driver time per call counts."""
    resolved = resolve_strategy(
        df,
        key,
        strategy,
        num_partitions,
        null_policy=null_policy,
        fit=fit,
        sample_rate=sample_rate,
        min_sample=min_sample,
        seed=seed,
        min_gain=min_gain,
    )
    p = resolved.partitioner
    placed, pid = _with_partition_id(df, key, p)
    n = p.num_partitions
    mode = _compact_mode(df, compact)
    compactable = mode != "never" and not df.isStreaming and (mode == "always"
                                                               or n > COMPACT_ABOVE)
    if compactable:
        used = _used_partitions(placed, key)
        if len(used) < n and (mode == "always" or 2 * len(used) <= n):
            logger.info("key_by: %d of %d partitions hold rows; one task each", len(used), n)
            return _compacted(placed, used, n)
    if reuse and hashes_as_spark(df, key, p):
        if already_placed(df, key, p):
            logger.info("placement: the frame is already hash-partitioned by %r into %d "
                        "partitions; no exchange added", key, n)
            return placed
        # Spark's own exchange gives the same partitions, and leaves a plan that a later
        # keyed operator recognises as placed (hash_partitions_of)
        return _with_partition_id(df.repartition(n, column_of(key)), key, p)[0]
    return placed.repartitionById(n, pid)


def already_placed(df: DataFrame, key: str, p: Partitioner) -> bool:
    """Whether every row of ``df`` already sits in the Spark partition ``p`` gives it.

    True for a :class:`~trilink_spark.HashPartitioner` of ``n`` partitions (Spark's Murmur3,
    hashing the column as its own type) on a bounded frame that Spark lays out by
    ``repartition(n, key)`` (:func:`~trilink_spark._internal.spark.plan.hash_partitions_of`),
    when the null key goes where Spark's hash puts it too (``null_policy`` ``"group"`` or
    ``"error"``, or a key column that cannot be null). Spark partition ``i`` of such a frame
    holds exactly the rows ``p`` places on ``i``, so :func:`place_rows` adds no exchange.

    Notes
    -----
    Cost: O(1) for any other strategy or a streaming frame; else Spark plans ``df`` once on
    the driver (no job runs).
    """
    if not hashes_as_spark(df, key, p):
        return False
    from .._internal.spark.plan import hash_partitions_of

    return hash_partitions_of(df, key) == p.num_partitions


def hashes_as_spark(df: DataFrame, key: str, p: Partitioner) -> bool:
    """Whether ``p`` puts every row of ``df`` where Spark's ``repartition(n, key)`` does: a
    :class:`~trilink_spark.HashPartitioner` with Spark's Murmur3, hashing the column as its
    own type, on a bounded frame, with the null key where Spark's hash puts it (or refused,
    or impossible). O(1): the frame's schema only."""
    from pyspark.sql import types as T

    if type(p) is not HashPartitioner or p.hash_function != "murmur3" or df.isStreaming:
        return False
    if key not in df.columns:  # a nested field, or a name in another case: not looked into
        return False
    field = df.schema[key]
    cast_to = {"int": T.IntegerType, "long": T.LongType}.get(p.key_type)
    if cast_to is not None and not isinstance(field.dataType, cast_to):
        return False  # the strategy hashes the key as another type than Spark's exchange
    n = p.num_partitions
    return not (field.nullable and p.null_policy != "error"
                and null_partition(p.null_policy, n) != null_partition("group", n))


#: ``compact="auto"`` looks for empty partitions only above this many partitions.
COMPACT_ABOVE = 1024
#: Values of ``key_by(compact=...)`` and ``spark.trilink.compactPartitions``.
COMPACT_MODES: tuple[str, ...] = ("auto", "always", "never")


def _compact_mode(df: DataFrame, compact: str | None) -> str:
    mode = compact if compact is not None else conf_get(df.sparkSession, "compactPartitions",
                                                        "auto")
    return choice(mode, "compact", COMPACT_MODES)


def _used_partitions(placed: DataFrame, key: str) -> list[int]:
    """The strategy partitions that hold rows, ascending (one Spark job). A null key under
    ``null_policy="error"`` fails that job: raised as :class:`NullKeyError`."""
    try:
        rows = placed.select(PARTITION_COL).distinct().collect()
    except Exception as err:
        if "trilink_spark.errors.NullKeyError" in str(err):
            raise null_key_error(f"column {key!r} has null keys") from None
        raise
    return sorted(int(r[0]) for r in rows if r[0] is not None)


def _compacted(placed: DataFrame, used: list[int], n: int) -> DataFrame:
    """One Spark partition per non-empty strategy partition, numbered densely.

    A row whose partition is not in ``used`` (the input changed since ``used`` was found)
    is kept, in slot ``pid mod len(used)``: the slot table is joined on the left, never
    inner. No row is ever dropped. An empty ``used`` gives one empty Spark partition.
    """
    from pyspark.sql import functions as F

    slots_n = max(1, len(used))
    slots = placed.sparkSession.createDataFrame(
        pa.table({SLOT_PID_COL: pa.array(used, pa.int32()),
                  SLOT_ID_COL: pa.array(range(len(used)), pa.int32())}).to_pandas(),
        schema=f"{SLOT_PID_COL} int, {SLOT_ID_COL} int")
    joined = placed.join(F.broadcast(slots), placed[PARTITION_COL] == slots[SLOT_PID_COL],
                         "left")
    slot = F.coalesce(slots[SLOT_ID_COL], F.pmod(placed[PARTITION_COL], F.lit(slots_n)))
    moved = joined.repartitionById(slots_n, slot)
    meta = {NUM_PARTITIONS_META: n, COMPACTED_META: True}
    result: DataFrame = moved.select(
        *[placed[quoted(c)] if c != PARTITION_COL else placed[c].alias(c, metadata=meta)
          for c in placed.columns])
    return result


def with_partition_id(df: DataFrame, key: str, p: Partitioner) -> DataFrame:
    """``df`` plus :data:`PARTITION_COL`, the partition ``p`` gives each row (no shuffle).

    Computed in the JVM: the strategy's column expression, or a broadcast join of a table
    strategy's ``{key: partition}`` with Spark's hash placement for keys it does not know.

    Notes
    -----
    Driver cost: reading ``df``'s schema (one analysis), then the plan. What the plan is made
    of, the expressions and a table strategy's broadcast frame, is kept between calls with
    the same strategy object while its table is unchanged
    (:mod:`~trilink_spark.placement.plans`): a micro-batch placed with the strategy of the
    one before costs a few Py4J calls, whatever the table's size. A new or changed table is
    turned into a DataFrame again: O(distinct keys) in Python and an Arrow transfer.
    """
    return _with_partition_id(df, key, p)[0]


def _with_partition_id(df: DataFrame, key: str, p: Partitioner) -> tuple[DataFrame, Column]:
    """:func:`with_partition_id` and the column :data:`PARTITION_COL` by name."""
    kind, dtype = key_kind(df, key)
    nullable = df.schema[key].nullable
    columns = tuple(c for c in df.columns if c != PARTITION_COL)
    # an overlay over a table strategy: the table's join, with the overrides laid over it
    base = p.table_base() if isinstance(p, OverlayPartitioner) else p
    table = base if isinstance(base, TablePartitioner) and base.is_stateful else None
    joined = table is not None and kind is not None and len(table) > 0
    if joined:  # the join's columns are named: the frame's must not collide with df's
        taken = {c.lower() for c in columns} & {TABLE_KEY_COL.lower(), TABLE_PID_COL.lower()}
        if taken:
            raise ReservedColumnError(
                f"column {sorted(taken)[0]!r} is a name trilink-spark reserves for a table "
                "strategy's join; rename it first (df.withColumnRenamed)")
    spark = df.sparkSession
    plan = partition_plan_of(
        spark, p, (key, kind, dtype.json(), nullable, columns, joined),
        lambda: _partition_plan(key, p, kind, nullable, columns, joined))
    if plan.condition is None or table is None or kind is None:
        return plan.projection(df), plan.partition
    joined_kind, joined_table = kind, table
    frame = table_frame_of(spark, table, (kind, dtype.json()),
                           lambda: table_frame(spark, joined_table, joined_kind, dtype))
    return plan.projection(df.join(frame, plan.condition, "left")), plan.partition


def _partition_plan(key: str, p: Partitioner, kind: str | None, nullable: bool,
                    columns: tuple[str, ...], joined: bool) -> PartitionPlan:
    """The expressions of :func:`with_partition_id` (all by column name, so that one plan
    serves every frame of these columns); ``joined``: whether the table frame is joined."""
    from pyspark.sql import functions as F

    key_col = column_of(key)
    table = p.table_base() if isinstance(p, OverlayPartitioner) else p
    n = table.num_partitions if table is not None else p.num_partitions
    fallback = F.pmod(F.hash(key_col), F.lit(n))
    if isinstance(table, TablePartitioner) and kind is not None:
        # the fallback hashes as the strategy's key type, as partition() and assign() do
        hashed_as = table.fallback_type(kind)
        if hashed_as == "int" and kind == "long":
            raise InvalidKeyTypeError(
                f"{type(table).__name__} hashes unknown keys as Spark int, but key column "
                f"{key!r} is bigint; use a strategy of key_type 'long' (or 'auto') for it"
            )
        spark_type = {"int": "int", "long": "bigint"}.get(hashed_as)
        if spark_type is not None:
            fallback = F.pmod(F.hash(key_col.cast(spark_type)), F.lit(n))
        groups = table.group_placement(kind)
        if groups is not None:  # bounded: a key without an entry goes by its key group
            fallback = groups.spark_column(key_col)
    condition = None
    if isinstance(table, TablePartitioner) and table.is_stateful:
        if kind is None:  # pragma: no cover - _check_strategy_for refused it already
            raise InvalidKeyTypeError(f"key column {key!r} cannot be placed through a table")
        if not joined:  # an empty table
            pid = fallback
        else:
            condition = key_col == F.col(TABLE_KEY_COL)
            pid = F.coalesce(F.col(TABLE_PID_COL), fallback)
        if isinstance(p, OverlayPartitioner):  # its overrides over its table
            overrides = p.overrides_column(key_col)
            pid = pid if overrides is None else F.coalesce(overrides, pid)
    else:
        pid = p.spark_column(key_col)
    pid = _null_guard(pid, key_col, p.null_policy, nullable, key, p.num_partitions)
    meta = {NUM_PARTITIONS_META: p.num_partitions}
    select = (*[column_of(c) for c in columns],
              pid.cast("int").alias(PARTITION_COL, metadata=meta))
    return PartitionPlan(condition, select, F.col(PARTITION_COL), Projection(select))
