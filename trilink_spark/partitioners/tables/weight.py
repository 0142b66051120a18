"""Weight: per-partition weights summing to 100 (Trilink paper, §4.2.1 (4), Algorithm 2).

``[0, 100)`` is cut into consecutive intervals, one per partition, as long as its weight. A key
lands on the interval containing its point: in ``mode="hash"`` the point is derived from Spark's
Murmur3 hash of the key, so every task computes it alone; in ``mode="random"`` the coordinator
draws it once from a seeded generator and remembers the result (history map). The interval is
found by binary search over the prefix sums, O(log n) (the paper's optimisation of its line 4-6
loop).

Use it when executors differ in speed: give a faster executor a larger weight, and measure the
result with ``balance_degree(loads, weights=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt

from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ..core.keys import DEFAULT_NULL_POLICY, Key, KeyArray, normalize_key, to_counts
from ..core.base import column_key_type
from ..core.hash import spark_hash_array, spark_hash_of
from .table import TablePartitioner, least_units

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["WeightPartitioner", "check_weights"]

WEIGHT_MODES: tuple[str, ...] = ("hash", "random")
_TWO32 = 4294967296.0


def check_weights(weights: Any, num_partitions: int | None = None) -> npt.NDArray[np.float64]:
    """Validate weights: finite, non-negative, summing to 100 (within 1e-6), right length."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, (Sequence, np.ndarray)):
        raise InvalidArgumentTypeError(
            f"weights must be a sequence of numbers summing to 100, got {type(weights).__name__}"
        )
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentTypeError("weights must be numbers summing to 100") from None
    if w.ndim != 1 or w.size == 0:
        raise InvalidArgumentError("weights must be a non-empty flat sequence, one per partition")
    if num_partitions is not None and w.size != num_partitions:
        raise InvalidArgumentError(
            f"weights has {w.size} entries but num_partitions is {num_partitions}; "
            "give one weight per partition"
        )
    if not np.all(np.isfinite(w)):
        raise InvalidArgumentError("weights must be finite numbers (no NaN or infinity)")
    if np.any(w < 0):
        raise InvalidArgumentError(f"weights must be non-negative, got {w.tolist()}")
    if not math.isclose(float(w.sum()), 100.0, rel_tol=0.0, abs_tol=1e-6):
        raise InvalidArgumentError(f"weights must sum to 100, they sum to {float(w.sum())!r}")
    return w


def _boundaries(weights: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Upper interval bounds; everything past the last positive weight goes to that partition."""
    bounds = np.cumsum(weights)
    last = int(np.flatnonzero(weights > 0)[-1])
    bounds[last:] = np.inf
    return bounds


def _hash_points(hashes: npt.NDArray[np.int32]) -> npt.NDArray[np.float64]:
    return hashes.view(np.uint32).astype(np.float64) * 100.0 / _TWO32


class WeightPartitioner(TablePartitioner):
    """Weighted placement for executors of unequal speed (Trilink paper, Algorithm 2).

    Parameters
    ----------
    weights : sequence of float
        One non-negative weight per partition, summing to 100. ``num_partitions`` is its length.
    mode : {"hash", "random"}
        ``"hash"``: the point in ``[0, 100)`` is ``unsigned(murmur3(key)) * 100 / 2**32``,
        stateless and computed by Spark in a DataFrame. ``"random"``: drawn once per new key
        by the coordinator from ``numpy.random.PCG64(seed)`` and remembered (even for skewed
        key values; same cost and memory as LeastKey).
    seed : int
        Seed of the random mode.
    num_partitions : int, optional
        If given, must equal ``len(weights)``.
    key_type : {"auto", "int", "long", "string", "binary"}
        Spark key type for the hash mode, as for :class:`~trilink_spark.HashPartitioner` (in
        a DataFrame a key of type ``"int"`` or ``"long"`` is cast to it before hashing).
    null_policy : {"group", "error", "partition0"}

    Notes
    -----
    Cost: O(log n) per key (binary search over prefix sums). Partitions with weight 0 receive
    nothing.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> p = tl.WeightPartitioner([20, 50, 30])
    >>> p.num_partitions
    3
    >>> p.assign(list(range(10_000))).tolist().count(1) > 4000
    True
    """

    strategy_name = "weight"
    learned_fields = ("table", "rng_state", "groups", "group_loads")

    def __init__(
        self,
        weights: Sequence[float] | npt.NDArray[np.float64],
        mode: str = "hash",
        *,
        seed: int = 0,
        num_partitions: int | None = None,
        key_type: str = "auto",
        null_policy: str = DEFAULT_NULL_POLICY,
        max_keys: int | None = None,
    ) -> None:
        w = check_weights(weights, num_partitions)
        super().__init__(int(w.size), key_type=key_type, null_policy=null_policy,
                         max_keys=max_keys)
        if mode not in WEIGHT_MODES:
            raise InvalidArgumentError(f"mode must be 'hash' or 'random', got {mode!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise InvalidArgumentTypeError(f"seed must be an int, got {type(seed).__name__}")
        self._weights = w
        self._bounds = _boundaries(w)
        self._mode = mode
        self._seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self._seed))

    @property
    def weights(self) -> list[float]:
        """The weights, one per partition."""
        return self._weights.tolist()  # type: ignore[no-any-return]

    @property
    def mode(self) -> str:
        """``"hash"`` or ``"random"``."""
        return self._mode

    @property
    def is_stateful(self) -> bool:
        return self._mode == "random"

    def column_key_type(self, kind: str | None) -> str | None:
        """As :meth:`~trilink_spark.Partitioner.column_key_type`. The hash mode hashes the
        key column itself in the JVM (``"auto"`` is the column's own type); the random mode
        is a table, whose fallback hashes an int column as ``long``. O(1)."""
        if self._mode != "hash" or kind is None:
            return super().column_key_type(kind)
        return column_key_type(self._key_type, kind, "int", type(self).__name__)

    def _locate(self, points: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
        return np.searchsorted(self._bounds, points, side="right").astype(np.int32)

    def _partition(self, key: Key) -> int:
        if self._mode == "hash":
            point = _hash_points(np.asarray([spark_hash_of(key, self._key_type)], np.int32))
            return int(self._locate(point)[0])
        return super()._partition(key)

    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]:
        if self._mode == "hash":
            return self._locate(_hash_points(spark_hash_array(keys, self._key_type)))
        return super()._assign(keys)

    def _place_new(self, keys: list[Key]) -> list[int]:
        pids = self._locate(self._rng.random(len(keys)) * 100.0).tolist()
        for key, pid in zip(keys, pids):
            self._record(key, pid)
        return pids  # type: ignore[no-any-return]

    def fit(self, keys_or_counts: Any) -> Self:
        """Random mode: draw a point for every key not yet placed (bounded: the keys with
        most records draw the entries left, the other keys go by key group, the groups
        placed heaviest first where records over weight are least). Hash mode: validate
        only."""
        keys, counts, _ = to_counts(keys_or_counts, self._null_policy)
        if self._mode == "random":
            self.fit_loads(keys.arrow, counts)
        return self

    def _make_bounded(self, keys: list[Key], counts: npt.NDArray[np.float64],
                      rows: npt.NDArray[np.float64], nkeys: npt.NDArray[np.float64]) -> None:
        pids = np.asarray(self._place_new(keys), dtype=np.int64)
        loads = np.bincount(pids, weights=counts, minlength=self._num_partitions)
        self._set_groups(least_units(loads.astype(np.float64), rows, self._weights), rows)

    def spark_column(self, key: Column) -> Column:
        """Hash mode: ``CASE WHEN point < b0 THEN 0 ...`` over the prefix sums, in the JVM."""
        if self._mode != "hash":
            return super().spark_column(key)
        from pyspark.sql import functions as F

        if self._key_type in ("int", "long"):  # hashed as the key type assign() hashes
            key = key.cast("int" if self._key_type == "int" else "bigint")
        unsigned = F.hash(key).cast("bigint").bitwiseAND(F.lit(0xFFFFFFFF))
        point = unsigned.cast("double") * F.lit(100.0) / F.lit(_TWO32)
        expr = None
        for pid, bound in enumerate(self._bounds.tolist()):
            if math.isinf(bound):
                tail = F.lit(pid)
                return tail if expr is None else expr.otherwise(tail)
            cond = point < F.lit(bound)
            expr = F.when(cond, F.lit(pid)) if expr is None else expr.when(cond, F.lit(pid))
        raise AssertionError("unreachable: the last positive weight has an infinite bound")

    def _params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "weights": self.weights,
            "mode": self._mode,
            "seed": self._seed,
            "key_type": self._key_type,
        }
        if self._mode == "random":
            out.update(self._table_params())
            out["rng_state"] = self._rng.bit_generator.state
        return out

    @classmethod
    def _from_params(cls, num_partitions: int, null_policy: str, params: dict[str, Any]) -> Self:
        params = dict(params)
        table = params.pop("table", [])
        rng_state = params.pop("rng_state", None)
        bounded = {k: params.pop(k) for k in cls.BOUNDED_FIELDS if k in params}
        self = cls(num_partitions=num_partitions or None, null_policy=null_policy, **params)
        self._load_table(table)
        self._load_bounded(bounded)
        if rng_state is not None:
            self._rng.bit_generator.state = rng_state
        return self

    def __repr__(self) -> str:
        return f"WeightPartitioner(weights={self.weights}, mode={self._mode!r})"
