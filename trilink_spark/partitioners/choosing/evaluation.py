"""What every strategy would give on a key distribution (Trilink paper, §4.2.2, Figure 15).

:func:`evaluate_strategies` fits a fresh copy of each candidate strategy on the keys (or on a
sample of them) and measures the records each partition would receive, the balance degree, the
extra compute time and the keyed bound. :func:`choose_best` picks one, preferring stateless
strategies unless a table strategy is clearly better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._internal.validation import check_num_partitions
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ..core.keys import DEFAULT_NULL_POLICY, to_counts
from ..core.balance import balance_degree, extra_compute_time, keyed_bound
from ..core.base import Partitioner
from .catalogue import build, candidate_names, default_candidates, fit_counts
from ..tables.table import MAX_TABLE_KEYS, TablePartitioner

__all__ = ["StrategyScore", "evaluate_strategies", "choose_best", "pick_best", "CANDIDATES"]

#: Every candidate name :func:`evaluate_strategies` knows, in report order (the catalogue's).
CANDIDATES: tuple[str, ...] = candidate_names()


@dataclass(frozen=True)
class StrategyScore:
    """The placement one strategy would give.

    Attributes
    ----------
    name : str
        Candidate name (see :data:`CANDIDATES`).
    partitioner : Partitioner
        The strategy, fitted as evaluated; ready to pass to :func:`trilink_spark.key_by`.
    loads : numpy.ndarray
        Records per partition.
    keyed_bound : float
        Best balance degree any key-preserving placement could reach on the same counts.
    """

    name: str
    partitioner: Partitioner = field(repr=False)
    loads: npt.NDArray[np.float64] = field(repr=False)
    keyed_bound: float
    capacity: npt.NDArray[np.float64] | None = field(default=None, repr=False)
    #: For a bounded table (more distinct keys than its ``max_keys``): the balance degree
    #: the same strategy with one entry per key would give; None otherwise.
    per_key_balance: float | None = None

    @property
    def bounded(self) -> bool:
        """Whether the strategy was scored in its bounded form."""
        return isinstance(self.partitioner, TablePartitioner) and self.partitioner.bounded

    @property
    def bounded_gap(self) -> float:
        """``per_key_balance - balance_degree``: what the bounded form gives up (0: none)."""
        if self.per_key_balance is None:
            return 0.0
        return self.per_key_balance - self.balance_degree

    @property
    def balance_degree(self) -> float:
        """min / max load (capacity-weighted when the evaluation had weights)."""
        return balance_degree(self.loads, self.capacity)

    @property
    def extra_compute_time(self) -> float:
        return extra_compute_time(self.loads)

    @property
    def max_load(self) -> float:
        return float(self.loads.max())

    @property
    def mean_load(self) -> float:
        return float(self.loads.mean())

    @property
    def min_load(self) -> float:
        return float(self.loads.min())

    @property
    def gap_to_bound(self) -> float:
        """``keyed_bound - balance_degree`` (0 means as good as any key-preserving placement)."""
        return self.keyed_bound - self.balance_degree

    def to_dict(self, with_loads: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.name,
            "balance_degree": self.balance_degree,
            "extra_compute_time": self.extra_compute_time,
            "max_load": self.max_load,
            "mean_load": self.mean_load,
            "min_load": self.min_load,
            "max_over_mean": self.max_load / self.mean_load if self.mean_load else 1.0,
            "keyed_bound": self.keyed_bound,
            "bounded": self.bounded,
        }
        if self.per_key_balance is not None:
            out["per_key_balance_degree"] = self.per_key_balance
            out["bounded_gap"] = self.bounded_gap
        if with_loads:
            out["loads"] = self.loads.tolist()
        return out


def evaluate_strategies(
    keys_or_counts: Any,
    n: int,
    *,
    strategies: Sequence[str] | None = None,
    weights: Sequence[float] | None = None,
    evaluate_on: Any = None,
    key_type: str = "auto",
    seed: int = 0,
    null_policy: str = DEFAULT_NULL_POLICY,
    max_keys: int | None = None,
) -> list[StrategyScore]:
    """Score every strategy on a key distribution.

    Parameters
    ----------
    keys_or_counts : sequence of keys or mapping of key to count
        The data the strategies learn from: one key per record in arrival order, or record
        counts per key (a sample works: see ``evaluate_on``).
    n : int
        Number of partitions.
    strategies : sequence of str, optional
        Candidates (:data:`CANDIDATES`). Default: hash, modulo (integer keys only), least_key,
        least_count (with the counts as history), least_count_no_history (only for a record
        sequence: online placement in arrival order), and weight / weight_random when
        ``weights`` are given.
    weights : sequence of float, optional
        Partition weights summing to 100; also makes every balance degree capacity-weighted.
    evaluate_on : sequence of keys or mapping, optional
        Measure loads on this data instead (e.g. fit on a 1 % sample, measure on everything).
        Keys a table strategy never saw are placed by the hash fallback, as in a Spark task.
    key_type : str
        Spark key type for the Hash strategy (see :class:`~trilink_spark.HashPartitioner`).
    seed : int
        Seed of random-mode Weight.
    null_policy : {"group", "error", "partition0"}
    max_keys : int, optional
        Entries of the table strategies (default
        :data:`~trilink_spark.partitioners.tables.table.DEFAULT_MAX_KEYS`). With more distinct keys
        they are scored in their bounded form, as :func:`~trilink_spark.key_by` would place
        them, and each such score also holds the per-key form's balance
        (:attr:`StrategyScore.per_key_balance`, :attr:`StrategyScore.bounded_gap`).

    Returns
    -------
    list of StrategyScore
        In candidate order.

    Notes
    -----
    Cost: each table strategy is fitted once, O(distinct keys * log n) (the no-history
    LeastCount walks every record), twice when it is bounded (its per-key form too); loads
    are one vectorised ``assign`` per strategy.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> scores = tl.evaluate_strategies({k: 10 for k in range(0, 400, 4)}, 4)
    >>> [(s.name, round(s.balance_degree, 2)) for s in scores]
    [('hash', 0.85), ('modulo', 0.0), ('least_key', 1.0), ('least_count', 1.0)]
    """
    n = check_num_partitions(n, "n")
    keys, counts, from_mapping = to_counts(keys_or_counts, null_policy)
    if len(keys) == 0:
        raise InvalidArgumentError("no keys to evaluate: give at least one key or count")
    if strategies is None:
        names = default_candidates(keys.kind, weights=weights is not None,
                                   sequence=not from_mapping)
    else:
        if isinstance(strategies, (str, bytes)):
            raise InvalidArgumentTypeError(
                f"strategies must be a sequence of names, e.g. [{strategies!r}], got a str")
        names = list(strategies)
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"strategies lists a name twice: {names}")
        unknown = [s for s in names if s not in CANDIDATES]
        if unknown:
            raise InvalidArgumentError(
                f"unknown candidate(s) {unknown}; choose from {', '.join(CANDIDATES)}"
            )
        if "least_count_no_history" in names and from_mapping:
            raise InvalidArgumentError(
                "least_count_no_history needs the record sequence, not a {key: count} mapping"
            )
    if evaluate_on is None:
        eval_keys, eval_counts = keys, counts
    else:
        eval_keys, eval_counts, _ = to_counts(evaluate_on, null_policy)
    capacity = None if weights is None else np.asarray(weights, dtype=np.float64)
    bound = keyed_bound(eval_counts, n)
    scores = []
    for name in names:
        def scored(bound_keys: int | None) -> tuple[Partitioner, npt.NDArray[np.float64]]:
            p = build(name, n, key_type=key_type, null_policy=null_policy, weights=weights,
                      seed=seed, max_keys=bound_keys)
            if name == "least_count_no_history":
                p.fit(keys_or_counts)  # online: the records in arrival order
            elif p.is_stateful:
                fit_counts(p, keys, counts)
            if isinstance(p, TablePartitioner) and p.is_stateful:
                pids = p.lookup(eval_keys.arrow)
            else:
                pids = p.assign(eval_keys.arrow)
            return p, np.bincount(pids, weights=eval_counts, minlength=n).astype(np.float64)

        p, loads = scored(max_keys)
        per_key = None
        if isinstance(p, TablePartitioner) and p.bounded and len(keys) < MAX_TABLE_KEYS:
            per_key = balance_degree(scored(len(keys) + 1)[1], capacity)
        scores.append(StrategyScore(name, p, loads, bound, capacity, per_key))
    return scores


def choose_best(scores: Sequence[StrategyScore], min_gain: float = 0.01) -> StrategyScore:
    """The strategy to use: the most balanced, but a stateful one must beat stateless ones.

    A table strategy (Least*, random Weight) costs a coordinator table and a broadcast join, so
    it is chosen only when its balance degree exceeds the best stateless one by more than
    ``min_gain``. Ties keep candidate order.
    """
    return pick_best(scores, min_gain)


def pick_best(
    scores: Sequence[StrategyScore],
    min_gain: float,
    estimates: dict[str, float] | None = None,
    table_estimates: dict[str, float] | None = None,
    floor: float = 0.0,
) -> StrategyScore:
    """The strategy to use: the most balanced, but a table strategy must earn its table.

    A table strategy (Least*, random Weight) costs a coordinator table and a broadcast join,
    so it is chosen only when its balance beats the best stateless one, and ``floor``, by more
    than ``min_gain``. ``estimates`` judge the stateless candidates and ``table_estimates`` the
    comparison with a table one (both default to each score's balance degree). Ties keep
    candidate order. O(candidates).
    """
    if not scores:
        raise InvalidArgumentError("no strategy scores to choose from")
    est = estimates if estimates is not None else {s.name: s.balance_degree for s in scores}
    table = table_estimates if table_estimates is not None else est
    stateless = [s for s in scores if not s.partitioner.is_stateful]
    stateful = [s for s in scores if s.partitioner.is_stateful]
    best_stateless = max(stateless, key=lambda s: est[s.name], default=None)
    best_stateful = max(stateful, key=lambda s: table[s.name], default=None)
    if best_stateful is None:
        return best_stateless if best_stateless is not None else scores[0]
    bar = max(floor, table[best_stateless.name] if best_stateless is not None else 0.0)
    if best_stateless is None or table[best_stateful.name] > bar + min_gain:
        return best_stateful
    return best_stateless
