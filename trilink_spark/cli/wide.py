"""``trilink-spark balance`` on a key column with more keys than a table holds by name.

Up to ``spark.trilink.table.maxKeys`` distinct keys the command scores every strategy on
every key's count, on the driver, as :func:`~trilink_spark.evaluate_strategies` does. Past
that it never brings every key to the driver: :func:`wide_balance` fits each table strategy
on the executors (:func:`~trilink_spark.placement.fit.fit_table`, its bounded form) and counts
the rows every strategy puts on each partition in one Spark job over the full column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._internal.spark.executors import ensure_executors
from ..columns import PARTITION_COL, SCORE_KEY_COL, SCORE_PART_COL, SCORE_PID_COL
from ..columns import SCORE_ROWS_COL, column_of
from ..errors import InvalidArgumentError
from ..partitioners.choosing.catalogue import build, default_candidates
from ..partitioners.choosing.evaluation import StrategyScore
from ..partitioners.core.balance import keyed_bound_of
from ..partitioners.core.keys import check_null_policy, null_key_error, null_partition
from ..partitioners.tables.table import TablePartitioner
from ..placement.fit import fit_table
from ..placement.key_by import with_partition_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import DataFrame

__all__ = ["WideBalance", "wide_balance", "loads_balance"]

_KEY, _ROWS, _PART, _PID = SCORE_KEY_COL, SCORE_ROWS_COL, SCORE_PART_COL, SCORE_PID_COL
#: Part ids of the one result: the column's totals, Kafka's placement, then one per strategy.
_TOTALS, _KAFKA = -2, -1


@dataclass(frozen=True)
class WideBalance:
    """What :func:`wide_balance` counted on the executors.

    Attributes
    ----------
    records, distinct_keys, null_rows, sampled_records : int
        The column's rows, its distinct keys (the null key counted as one), the rows whose
        key is null and the rows the tables were fitted on.
    scores : list of StrategyScore
        Every strategy's rows per partition over the full column, the table strategies in
        their bounded form (``per_key_balance`` is None: one entry per key is not computed).
    kafka_loads : numpy.ndarray or None
        Rows per Kafka partition under Kafka's default partitioner (non-null keys).
    """

    records: int
    distinct_keys: int
    null_rows: int
    sampled_records: int
    scores: list[StrategyScore]
    kafka_loads: npt.NDArray[np.float64] | None


def wide_balance(df: DataFrame, key: str, kind: str, n: int, sample_rate: float, seed: int,
                 null_policy: str, max_keys: int, kafka: bool = False) -> WideBalance:
    """Score every strategy on ``df[key]`` without bringing every key to the driver.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        A batch frame (the caller refuses a stream).
    key, kind : str
        The key column and its kind (``"int"``, ``"long"``, ``"string"``, ``"binary"``).
    n : int
        Partitions.
    sample_rate : float
        The fraction of rows the table strategies are fitted on; every score is measured on
        every row.
    seed, null_policy, max_keys
        As :func:`~trilink_spark.key_by` and ``spark.trilink.table.maxKeys``.
    kafka : bool
        Also count Kafka's default placement (``toPositive(murmur2(str(key))) % n``).

    Notes
    -----
    Cost: one fit per table strategy (:func:`~trilink_spark.placement.fit.fit_table`: one or
    two jobs each), one count of the sampled rows, then one job: Spark's aggregation of the
    key column (map-side combined, its exchange reused by every part) and, per strategy, its
    partition of every distinct key (a table's broadcast join) summed per partition. Kafka's
    placement hashes each distinct key once in a Python worker. The driver holds at most
    ``max_keys`` keys per table and ``n`` loads per strategy: O(``max_keys`` + groups + n).

    Examples
    --------
    >>> got = wide_balance(df, "user", "long", 8, 0.1, 0, "group", 65_536)  # doctest: +SKIP
    >>> got.scores[0].name, got.distinct_keys  # doctest: +SKIP
    ('hash', 2000000)
    """
    from pyspark.sql import functions as F

    policy = check_null_policy(null_policy)
    names = default_candidates(kind)
    built = [build(name, n, key_type=kind, null_policy=policy, seed=seed, max_keys=max_keys)
             for name in names]
    sampled = (None if sample_rate >= 1.0
               else df.select(column_of(key)).sample(fraction=sample_rate, seed=seed).count())
    if sampled == 0:
        raise InvalidArgumentError(f"a {sample_rate} sample of column {key!r} has no rows; "
                                   "raise the sample rate (at most 1.0: every row)")
    for p in built:
        if isinstance(p, TablePartitioner) and p.is_stateful:
            fit_table(df, key, p, fraction=sample_rate, seed=seed)
    counted = df.select(column_of(key).alias(_KEY)).groupBy(_KEY).agg(
        F.count(F.lit(1)).alias(_ROWS))
    keyed = counted.where(F.col(_KEY).isNotNull())  # the null key is placed on the driver
    parts = [counted.agg(
        F.coalesce(F.sum(_ROWS), F.lit(0)).alias("a"), F.count(_KEY).alias("b"),
        F.coalesce(F.sum(F.when(F.col(_KEY).isNull(), F.col(_ROWS))), F.lit(0)).alias("c"),
        F.coalesce(F.max(F.when(F.col(_KEY).isNotNull(), F.col(_ROWS))), F.lit(0)).alias("d"),
    ).select(F.lit(_TOTALS).alias(_PART), F.explode(F.array(
        *(F.struct(F.lit(i).alias(_PID), F.col(c).cast("long").alias(_ROWS))
          for i, c in enumerate("abcd")))).alias("t")).select(_PART, f"t.{_PID}", f"t.{_ROWS}")]
    for i, p in enumerate(built):
        placed = with_partition_id(keyed, _KEY, p)
        parts.append(placed.groupBy(PARTITION_COL).agg(F.sum(_ROWS).alias(_ROWS)).select(
            F.lit(i).alias(_PART), F.col(PARTITION_COL).cast("long").alias(_PID),
            F.col(_ROWS).cast("long").alias(_ROWS)))
    if kafka:
        ensure_executors(df.sparkSession)  # the hashing tasks import the package
        parts.append(_kafka_part(keyed, n))
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    got = result.toArrow()
    part = got.column(_PART).to_numpy()
    pid = got.column(_PID).to_numpy()
    rows = got.column(_ROWS).to_numpy().astype(np.float64)
    totals = dict(zip(pid[part == _TOTALS].tolist(), rows[part == _TOTALS].tolist()))
    records, keys, nulls, heaviest = (int(totals.get(i, 0)) for i in range(4))
    if nulls and policy == "error":
        raise null_key_error(f"column {key!r} has null keys")

    def loads_of(which: int) -> npt.NDArray[np.float64]:
        mine = part == which
        return np.bincount(pid[mine], weights=rows[mine], minlength=n).astype(np.float64)

    bound = keyed_bound_of(records, max(heaviest, nulls), n)
    scores = []
    for i, (name, p) in enumerate(zip(names, built)):
        loads = loads_of(i)
        if nulls:
            loads[null_partition(policy, n)] += nulls
        scores.append(StrategyScore(name, p, loads, bound))
    return WideBalance(records, keys + bool(nulls), nulls,
                       records if sampled is None else int(sampled), scores,
                       loads_of(_KAFKA) if kafka else None)


def _kafka_part(keyed: DataFrame, n: int) -> DataFrame:
    """Rows per Kafka partition of ``keyed``'s distinct non-null keys, hashed in Python
    workers (vectorised murmur2 per Arrow batch)."""
    from pyspark.sql import functions as F

    def place(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from trilink_spark.partitioners.core.kafka_hash import kafka_default_partition

        for batch in batches:
            keys = batch.column(0).to_pylist()
            yield pa.RecordBatch.from_arrays(
                [pa.array(kafka_default_partition(keys, n).astype(np.int64)), batch.column(1)],
                names=[_PID, _ROWS])

    hashed = keyed.select(_KEY, F.col(_ROWS).cast("long").alias(_ROWS)).mapInArrow(
        place, f"{_PID} long, {_ROWS} long")
    return hashed.groupBy(_PID).agg(F.sum(_ROWS).alias(_ROWS)).select(
        F.lit(_KAFKA).alias(_PART), F.col(_PID), F.col(_ROWS).cast("long").alias(_ROWS))


def loads_balance(loads: npt.NDArray[np.float64]) -> dict[str, float]:
    """Balance degree and extra compute time of ``loads`` (the CLI's Kafka figures)."""
    from ..partitioners.core.balance import balance_degree, extra_compute_time

    return {"balance_degree": balance_degree(loads), "extra_compute_time": extra_compute_time(loads)}
