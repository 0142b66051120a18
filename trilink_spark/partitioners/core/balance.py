"""Load balance metrics (Trilink paper, §3.3) and the measured balance of a DataFrame or RDD.

- balance degree = least-loaded partition / most-loaded partition, in [0, 1] (Eq. 1);
- extra compute time = (most-loaded - mean) / mean (Eq. 2);
- keyed bound: the best balance degree any placement that keeps keys whole can reach.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ..._internal.validation import check_num_partitions
from ..._internal.validation import refuse_streaming
from ..._internal.spark.compat import is_connect, num_partitions, partition_counts
from ..._internal.spark.executors import ensure_executors
from ...columns import PARTITION_COL, strategy_partitions

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame

__all__ = [
    "balance_degree",
    "extra_compute_time",
    "keyed_bound",
    "keyed_bound_of",
    "BalanceReport",
    "partition_balance",
]


def _loads_array(loads: Any) -> npt.NDArray[np.float64]:
    try:
        arr = np.asarray(loads, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentTypeError("loads must be a sequence of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidArgumentError("loads must be a non-empty flat sequence, one per partition")
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise InvalidArgumentError("loads must be finite and non-negative")
    return arr


def _weighted(loads: npt.NDArray[np.float64], weights: Any) -> npt.NDArray[np.float64]:
    if weights is None:
        return loads
    w = _loads_array(weights)
    if w.size != loads.size:
        raise InvalidArgumentError(f"{w.size} weights for {loads.size} loads")
    active = w > 0
    if not active.any():
        raise InvalidArgumentError("at least one weight must be positive")
    return loads[active] / w[active]


def balance_degree(loads: Any, weights: Any = None) -> float:
    """Least load over greatest load, in [0, 1]; 1.0 when every load is zero.

    Parameters
    ----------
    loads : sequence of number
        Records per partition.
    weights : sequence of number, optional
        Relative capacity of each partition (as for :class:`~trilink_spark.WeightPartitioner`):
        loads are divided by their weight first; zero-weight partitions are left out.

    Examples
    --------
    >>> balance_degree([50, 100, 75])
    0.5
    >>> balance_degree([20, 50, 30], weights=[20, 50, 30])
    1.0
    """
    arr = _weighted(_loads_array(loads), weights)
    top = float(arr.max())
    return 1.0 if top == 0 else float(arr.min()) / top


def extra_compute_time(loads: Any) -> float:
    """(greatest load - mean load) / mean load; 0.0 when every load is zero.

    Examples
    --------
    >>> extra_compute_time([50, 100, 150])
    0.5
    """
    arr = _loads_array(loads)
    mean = float(arr.mean())
    return 0.0 if mean == 0 else (float(arr.max()) - mean) / mean


def keyed_bound(counts: Any, n: int) -> float:
    """Upper bound on the balance degree of any placement that keeps every key whole.

    With total ``T``, heaviest key ``c_max`` and ``L = max(T / n, c_max)`` (no partition can carry
    less than ``L`` at the top), the other ``n - 1`` partitions share at most ``T - L``, so the
    least one has at most ``(T - L) / (n - 1)``. The bound is ``min(1, (T - L) / ((n - 1) L))``;
    1.0 for ``n = 1`` or no records.

    Parameters
    ----------
    counts : sequence of number or mapping of key to number
        Records per key.
    n : int
        Number of partitions.

    Examples
    --------
    >>> keyed_bound([10, 10, 10, 10], 4)
    1.0
    >>> keyed_bound({"hot": 70, "a": 20, "b": 10}, 2)
    0.42857142857142855
    """
    n = check_num_partitions(n, "n")
    values = counts.values() if isinstance(counts, Mapping) else counts
    arr = np.asarray(list(values) if isinstance(counts, Mapping) else values, dtype=np.float64)
    if arr.size == 0:
        return 1.0
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise InvalidArgumentError("counts must be finite and non-negative")
    return keyed_bound_of(float(arr.sum()), float(arr.max()), n)


def keyed_bound_of(total: float, heaviest: float, n: int) -> float:
    """:func:`keyed_bound` from the two numbers it depends on: the records ``total`` and the
    heaviest key's ``heaviest`` (what an aggregation on the executors returns). O(1).

    Examples
    --------
    >>> keyed_bound_of(100.0, 70.0, 2)
    0.42857142857142855
    """
    if n == 1 or total <= 0:
        return 1.0
    top = max(total / n, heaviest)
    return min(1.0, (total - top) / ((n - 1) * top))


@dataclass(frozen=True)
class BalanceReport:
    """Measured rows per partition and the paper's metrics over them.

    Attributes
    ----------
    loads : numpy.ndarray
        Rows on each partition, index = partition id.
    """

    loads: npt.NDArray[np.int64] = field(repr=False)

    @property
    def num_partitions(self) -> int:
        """Number of partitions measured (empty ones included)."""
        return int(self.loads.size)

    @property
    def total(self) -> int:
        """Rows over all partitions."""
        return int(self.loads.sum())

    @property
    def balance_degree(self) -> float:
        """min / max rows per partition."""
        return balance_degree(self.loads)

    @property
    def extra_compute_time(self) -> float:
        """(max - mean) / mean rows per partition."""
        return extra_compute_time(self.loads)

    @property
    def max_load(self) -> int:
        return int(self.loads.max())

    @property
    def min_load(self) -> int:
        return int(self.loads.min())

    @property
    def mean_load(self) -> float:
        return float(self.loads.mean())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary, loads included."""
        return {
            "num_partitions": self.num_partitions,
            "total": self.total,
            "balance_degree": self.balance_degree,
            "extra_compute_time": self.extra_compute_time,
            "max_load": self.max_load,
            "mean_load": self.mean_load,
            "min_load": self.min_load,
            "loads": self.loads.tolist(),
        }

    def __repr__(self) -> str:
        return (
            f"BalanceReport(num_partitions={self.num_partitions}, total={self.total}, "
            f"balance_degree={self.balance_degree:.4f}, "
            f"extra_compute_time={self.extra_compute_time:.4f})"
        )


def partition_balance(data: DataFrame | RDD[Any]) -> BalanceReport:
    """Rows per partition of a DataFrame or RDD, counted by Spark (no rows are collected).

    For a frame :func:`~trilink_spark.key_by` compacted (``compact=``), the loads are those
    of the strategy's ``num_partitions`` partitions, the empty ones included (counted by
    :data:`~trilink_spark.PARTITION_COL`). A frame whose partition column holds nulls or ids
    outside ``[0, num_partitions)`` (its metadata was copied onto another column) is counted
    per Spark partition instead, with a warning.

    Works on classic PySpark and on Spark Connect (DataFrames; RDDs exist in classic
    PySpark only). A DataFrame without any partition counts as one empty partition.

    Notes
    -----
    Cost: one Spark job over the DataFrame's own partitioning; one count per partition reaches
    the driver. Classic: ``groupBy(spark_partition_id()).count()`` in the JVM, plus
    ``df.rdd.getNumPartitions()`` for the empty partitions. Spark Connect (no RDDs):
    :func:`trilink_spark._internal.spark.compat.partition_counts`, a ``mapInArrow`` pass in which
    each partition streams only its row count to a Python worker. For an RDD each task counts its
    partition's records.

    Examples
    --------
    >>> import trilink_spark as tl  # doctest: +SKIP
    >>> tl.partition_balance(tl.key_by(df, "user", "least_key")).balance_degree  # doctest: +SKIP
    0.998
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    refuse_streaming(data, "partition_balance", "it counts the rows of every partition with a job")
    if isinstance(data, DataFrame):
        placed_on = strategy_partitions(data, compacted=True)
        if placed_on is not None and num_partitions(data) != placed_on:
            # a compacted key_by frame: count per strategy partition, empty ones included
            grouped = data.groupBy(PARTITION_COL).count().collect()
            ids = [r[PARTITION_COL] for r in grouped]
            if all(isinstance(i, int) and 0 <= i < placed_on for i in ids):
                loads = np.zeros(placed_on, dtype=np.int64)
                for r in grouped:
                    loads[int(r[PARTITION_COL])] += int(r["count"])
                return BalanceReport(loads=loads)
            logger.warning(
                "partition_balance: %s records %d strategy partitions, but holds ids outside "
                "[0, %d) or nulls; counting Spark partitions instead", PARTITION_COL,
                placed_on, placed_on)
        if is_connect(data):
            ensure_executors(data.sparkSession)  # the count's tasks import the package
            counted = partition_counts(data)
            loads = np.zeros(max(1, counted.size), dtype=np.int64)
            loads[: counted.size] = counted
            return BalanceReport(loads=loads)
        n = num_partitions(data)
        rows = (
            data.select(F.spark_partition_id().alias("pid")).groupBy("pid").count().collect()
        )
        pairs = [(int(r["pid"]), int(r["count"])) for r in rows]
    else:
        from pyspark import RDD

        if not isinstance(data, RDD):
            raise InvalidArgumentTypeError(
                f"partition_balance needs a DataFrame or RDD, got {type(data).__name__}"
            )
        n = data.getNumPartitions()
        pairs = data.mapPartitionsWithIndex(
            lambda i, it: [(i, sum(1 for _ in it))]
        ).collect()
    size = max([1, n] + [p + 1 for p, _ in pairs])
    loads = np.zeros(size, dtype=np.int64)
    for pid, count in pairs:
        loads[pid] += count
    return BalanceReport(loads=loads)
