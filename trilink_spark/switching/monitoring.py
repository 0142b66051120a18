"""Online monitoring: what a sample says about balance, with its sampling noise taken out.

The Trilink paper's monitor (§4.2.2) samples the stream and computes the balance degree every
strategy would give. On a sample, min/max of the per-partition loads is biased low: even a
perfect placement shows the sampling noise of each partition's count. With 2,000 sampled
records over 16 partitions the noise alone puts a perfect placement near 0.7, and a strategy
fitted on the same sample looks flat only because it fitted the noise. Comparing strategies on
raw sampled balance therefore makes a monitor switch for nothing.

:func:`denoised_balance` removes the expected noise: Bernoulli sampling at rate ``p`` gives a
partition with true load ``L`` a sampled count of variance ``L p (1 - p)``, so after scaling
back by ``1 / p`` the noise variance is ``L (1/p - 1)``. The spread of the loads around their
mean is shrunk so that its variance is the observed variance minus that noise (never below
zero), and the balance degree is taken on the shrunk loads. Structural imbalance (a heavy key,
a strategy that leaves partitions empty) survives; sampling noise does not. Spread that the
sample cannot tell from noise (less than ``significance`` standard errors above it) counts as
none, so near-equal strategies score alike instead of taking turns at looking best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..partitioners.core.balance import balance_degree
from ..partitioners.choosing.evaluation import StrategyScore

__all__ = ["Decision", "denoised_balance", "split_counts"]


def denoised_balance(
    loads: npt.ArrayLike,
    noise_per_unit: float,
    capacity: Sequence[float] | npt.NDArray[np.float64] | None = None,
    significance: float = 3.0,
) -> float:
    """Balance degree of sampled loads with the sampling noise removed.

    Parameters
    ----------
    loads : array-like
        Per-partition loads estimated from a sample (already scaled to stream records).
    noise_per_unit : float
        Noise variance per unit of load: ``1/p - 1`` for a Bernoulli sample at rate ``p``
        (0 when the loads are exact).
    capacity : sequence of float, optional
        Partition weights, as for :func:`~trilink_spark.partitioners.balance_degree`.
    significance : float
        Spread beyond the noise counts only when it exceeds this many standard errors of the
        spread that noise alone would show (``noise * sqrt(2 / (n - 1))`` for ``n``
        partitions); below that the loads are treated as balanced. This keeps a monitor from
        acting on differences a sample cannot tell apart.

    Returns
    -------
    float
        In [0, 1].

    Notes
    -----
    O(number of partitions).

    Examples
    --------
    >>> round(denoised_balance([90, 110, 100, 100], 0.0), 3)  # exact loads: plain min/max
    0.818
    >>> denoised_balance([90, 110, 100, 100], 99.0)  # all of that spread is sampling noise
    1.0
    >>> denoised_balance([0, 200, 100, 100], 1.0)  # an empty partition is not noise
    0.0
    """
    arr = np.asarray(loads, dtype=np.float64)
    if arr.size == 0:
        return 1.0
    relative = arr if capacity is None else arr / np.asarray(capacity, dtype=np.float64)
    mean = float(relative.mean())
    if mean <= 0:
        return 1.0
    observed = float(((relative - mean) ** 2).mean())
    # a partition's noise variance is noise_per_unit * load (divided by capacity squared when
    # loads are relative to capacity); the spread's noise is its mean over partitions
    per_partition = arr if capacity is None else arr / np.asarray(capacity, np.float64) ** 2
    noise = max(0.0, float(noise_per_unit)) * float(per_partition.mean())
    excess = observed - noise
    standard_error = noise * math.sqrt(2.0 / max(1, arr.size - 1))
    factor = math.sqrt(excess / observed) if excess > significance * standard_error else 0.0
    structural = mean + (relative - mean) * factor
    if np.any(arr == 0):  # an empty partition is empty whatever the noise
        structural[arr == 0] = 0.0
    return balance_degree(np.maximum(structural, 0.0))


def split_counts(
    counts: npt.NDArray[np.float64], rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Split each (rounded) count into two binomial halves: learn on one, score on the other.

    Examples
    --------
    >>> a, b = split_counts(np.array([10.0, 3.0]), np.random.default_rng(0))
    >>> (a + b).tolist()
    [10, 3]
    """
    whole = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64)
    first = rng.binomial(whole, 0.5).astype(np.int64)
    return first, whole - first


@dataclass(frozen=True)
class Decision:
    """One evaluation of :class:`AdaptivePartitioner`.

    Attributes
    ----------
    chosen : str
        Strategy in use after the decision.
    previous : str
        Strategy in use before it.
    switched : bool
        True when the strategy changed (a fresh table of the same Least strategy counts: its
        ``reason`` says "refit").
    triggered : bool
        False when the mode did not call for a decision (``scores`` is then empty).
    reason : str
        Why it switched or stayed.
    scores : tuple of StrategyScore
        Every candidate, freshly fitted on the sample (raw sampled loads).
    estimates : dict of str to float
        Each candidate's balance degree with the sampling noise removed
        (:func:`~trilink_spark.switching.monitoring.denoised_balance`): what the decision compares.
    current_balance : float or None
        The same estimate for the previous strategy (a table one with its history).
    sample_records : float
        Weight of the sample view the decision used.
    batch : int
        Batch boundaries seen before the decision.
    """

    chosen: str
    previous: str
    switched: bool
    triggered: bool
    reason: str
    scores: tuple[StrategyScore, ...] = field(default=(), repr=False)
    estimates: dict[str, float] = field(default_factory=dict)
    current_balance: float | None = None
    sample_records: float = 0.0
    batch: int = 0

    @property
    def best_balance(self) -> float | None:
        """Highest estimated candidate balance degree (``None`` when not scored)."""
        return max(self.estimates.values(), default=None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        """Inverse of :meth:`to_dict` (the candidates' scores are not kept, only estimates)."""
        current = data.get("current_balance")
        return cls(
            chosen=str(data["chosen"]), previous=str(data["previous"]),
            switched=bool(data["switched"]), triggered=bool(data["triggered"]),
            reason=str(data["reason"]),
            estimates={str(k): float(v) for k, v in (data.get("scores") or {}).items()},
            current_balance=None if current is None else float(current),
            sample_records=float(data.get("sample_records", 0.0)),
            batch=int(data.get("batch", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "previous": self.previous,
            "switched": self.switched,
            "triggered": self.triggered,
            "reason": self.reason,
            "current_balance": self.current_balance,
            "sample_records": self.sample_records,
            "batch": self.batch,
            "scores": dict(self.estimates),
        }
