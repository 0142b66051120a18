"""Sampling-based automatic switching between strategies (Trilink paper, §4.2.2 and Table 6).

An :class:`AdaptivePartitioner` watches a sample of the key stream, scores what every candidate
strategy *would* give on it, and switches to the best one when its mode says so:

========== ============================================ =======================================
mode        decides when                                 suits (Table 6)
========== ============================================ =======================================
periodic    every ``period_s`` seconds or                stable input rate
            ``period_batches`` micro-batches
quantity    every ``quantity`` observed records          changing input rate
threshold   the current strategy's balance degree on     as few switches as possible
            the sample falls below ``threshold``
manual      never on its own (a config update pins it)   operator control
========== ============================================ =======================================

Every mode has hysteresis: a switch happens only when the best candidate beats the current
strategy by at least ``min_gain`` (balance degree), so sampling noise cannot make it flap.

**The sample view.** Observed keys are kept as counts per key. Each observation (one call to
:meth:`AdaptivePartitioner.observe` or ``observe_df``, normally one micro-batch) first multiplies
every stored count by ``decay`` and then adds the new sample, so a batch observed ``k``
observations ago weighs ``decay**k``: with the default 0.5 the view follows a change of the key
distribution within two or three batches. Keys whose weight falls below 0.01 are dropped, so the
view holds the keys of the last few observations only.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from datetime import timedelta
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from .._internal.validation import check_num_partitions
from .._internal.validation import refuse_streaming
from ..columns import column_of
from ..errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError
from ..errors import InvalidKeyTypeError
from ..partitioners.core.keys import DEFAULT_NULL_POLICY, Key, KeyArray, null_key_error, to_counts
from ..partitioners.core.keys import to_key_array
from ..partitioners import Partitioner, TablePartitioner, WeightPartitioner
from ..partitioners.choosing.catalogue import build, candidate_of, default_candidates, fit_counts
from ..partitioners.core.base import decode_key, encode_key
from ..partitioners.choosing.evaluation import StrategyScore, evaluate_strategies, pick_best
from ..placement.key_by import key_kind
from .config_center import ConfigCenter, find_center
from .monitoring import Decision, denoised_balance, split_counts
from .settings import validate_update

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["AdaptivePartitioner", "Decision"]

logger = logging.getLogger(__name__)

_PRUNE_BELOW = 0.01
_DEFAULT_PERIOD_S = 20.0


class AdaptivePartitioner(Partitioner):
    """A strategy that switches itself to the best candidate for the observed keys.

    It delegates placement (``partition``, ``assign``, ``spark_column``, and
    :func:`~trilink_spark.key_by`) to :attr:`current`, so it is usable wherever a strategy is.

    Parameters
    ----------
    num_partitions : int
    strategies : sequence of str, optional
        Candidates (names of :data:`~trilink_spark.partitioners.CANDIDATES`, without
        ``least_count_no_history``). Default: hash, modulo (integer keys only), least_key,
        least_count, and weight / weight_random when ``weights`` are given.
    sample_rate : float
        Bernoulli rate of :meth:`observe_df`, in (0, 1].
    mode : {"threshold", "periodic", "quantity", "manual"}
        When to decide (module table).
    threshold : float
        Threshold mode: decide when the current balance degree on the sample is below it.
    period_s, period_batches : float, str, timedelta or int, optional
        Periodic mode: decide after this many seconds (by ``clock``; a Spark interval string
        such as ``"30 seconds"`` or a timedelta too) or batch boundaries; with neither given,
        every 20 s.
    quantity : int
        Quantity mode: decide after this many observed records (estimated stream records).
    min_gain : float
        Hysteresis: switch only when the best candidate beats the current strategy by at least
        this much balance degree (table strategies must also beat the best stateless one by it).
    decay : float
        Weight kept by earlier observations at each new one, in [0, 1).
    min_sample : int
        No decision before the sample view holds this many sampled records.
    initial : str or Partitioner
        Strategy before the first switch (default ``"hash"``, Spark's own placement).
    weights : sequence of float, optional
        Partition weights (sum 100) for the weight candidates and capacity-weighted scores.
    key_type : str
        Spark key type for hash scoring (``observe_df`` sets it from the column).
    seed : int
        Seed of sampling and of random-mode Weight.
    config : ConfigCenter, optional
        Where run-time updates come from (default: a new in-process :class:`ConfigCenter`,
        reachable as :attr:`config`). Updates take effect at the next :meth:`batch_boundary`.
    null_policy : {"group", "error", "partition0"}
    clock : callable
        Seconds for periodic mode (default ``time.monotonic``).

    Notes
    -----
    Cost per decision: every candidate is fitted on the sample view, O(distinct sampled keys x
    log n) for the table strategies plus one vectorised ``assign`` each; the current table
    strategy is copied (O(its table)) to score it with its history. Observing costs O(sampled
    keys). Memory: the view holds the keys of the last few observations (see ``decay``), and a
    current table strategy keeps its history map. Switching changes where keys go: use it for
    pipelines whose keyed state does not outlive a micro-batch
    (:func:`~trilink_spark.switching.adaptive_foreach_batch` refuses to switch a stateful one).

    Thread safety: every method may be called from several threads. Placement (``partition``,
    ``assign``, ``fit``, ``spark_column``) and every decision or configuration change hold the
    partitioner's lock, so a placement call sees one strategy from start to end: the one
    current when it began. Threads that place the same new key get the same partition.

    Copies: ``copy()``, ``to_dict()``/``from_dict()`` and pickling keep the current strategy,
    the settings, the sample view and the decision log. A copy made in the same process keeps
    following the original's config center; one unpickled in another process (a Spark task)
    has a private center (config updates are applied on the driver).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> ap = tl.AdaptivePartitioner(4, mode="quantity", quantity=1000, min_sample=100, seed=1)
    >>> ap.observe(["hot"] * 700 + [f"k{i}" for i in range(300)])
    >>> d = ap.decide()
    >>> d.switched, d.chosen
    (True, 'least_count')
    >>> ap.partition("hot") == ap.current.partition("hot")
    True
    """

    strategy_name = "adaptive"
    by_name = False

    def __init__(
        self,
        num_partitions: int,
        strategies: Sequence[str] | None = None,
        sample_rate: float = 0.01,
        mode: str = "threshold",
        *,
        threshold: float = 0.8,
        period_s: float | str | timedelta | None = None,
        period_batches: int | None = None,
        quantity: int = 1_000_000,
        min_gain: float = 0.05,
        decay: float = 0.5,
        min_sample: int = 500,
        initial: str | Partitioner = "hash",
        weights: Sequence[float] | None = None,
        key_type: str = "auto",
        seed: int = 0,
        config: ConfigCenter | None = None,
        null_policy: str = DEFAULT_NULL_POLICY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(num_partitions, null_policy=null_policy)
        settings: dict[str, Any] = {
            "sample_rate": sample_rate,
            "mode": mode,
            "threshold": threshold,
            "period_s": period_s,
            "period_batches": period_batches,
            "quantity": quantity,
            "min_gain": min_gain,
            "decay": decay,
            "min_sample": min_sample,
        }
        if strategies is not None:
            settings["candidates"] = list(strategies)
        self._settings = validate_update(settings)
        if weights is not None:
            self._weights: list[float] | None = [float(w) for w in weights]
            WeightPartitioner(self._weights, num_partitions=self.num_partitions)  # validates
        else:
            self._weights = None
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidArgumentTypeError(f"seed must be an int, got {type(seed).__name__}")
        if not callable(clock):
            raise InvalidArgumentTypeError("clock must be a callable returning seconds")
        self._seed = seed
        self._key_type = key_type
        self._clock = clock
        self._lock = threading.RLock()
        self._kind: str | None = None
        self._view = pd.Series(dtype=np.float64)
        self._scale = 1.0
        self._w1 = self._w2 = 0.0
        self._observations = 0
        self._records_total = 0.0
        self._records_since = 0.0
        self._batches_since = 0
        self._batch = 0
        self._last_decision_at = clock()
        self._frozen: str | None = None
        self._provisional = False
        self._decisions: list[Decision] = []
        if isinstance(initial, Partitioner):
            if initial.num_partitions != self.num_partitions:
                raise InvalidArgumentError(
                    f"initial strategy has {initial.num_partitions} partitions, expected "
                    f"{self.num_partitions}"
                )
            self._current, self._current_name = initial, candidate_of(initial)
        else:
            self._current_name = validate_update({"strategy": initial})["strategy"]
            self._current = self._fresh(self._current_name)
        self._pending: dict[str, Any] | None = None
        self._applied: dict[str, Any] = {}
        self._config = config if config is not None else ConfigCenter()
        self._config_given = config is not None
        self._config_detached = False
        if not isinstance(self._config, ConfigCenter):
            raise InvalidArgumentTypeError("config must be a ConfigCenter or RedisConfigCenter")
        self._unsubscribe: Callable[[], None] | None = self._config.subscribe(_Listener(self))

    # ------------------------------------------------------------------ state
    @property
    def current(self) -> Partitioner:
        """The strategy in use now."""
        return self._current

    @property
    def current_name(self) -> str:
        """Name of :attr:`current` (a :data:`~trilink_spark.partitioners.CANDIDATES` entry)."""
        return self._current_name

    @property
    def decisions(self) -> list[Decision]:
        """Log of the triggered decisions, oldest first."""
        with self._lock:
            return list(self._decisions)

    @property
    def config(self) -> ConfigCenter:
        """The configuration center this partitioner listens to."""
        return self._config

    @property
    def config_detached(self) -> bool:
        """True for a copy, in another process, of a partitioner given a config center: the
        copy listens to a private center, so updates published to the original's never reach
        it. Copies in Spark tasks only place keys, where that does not matter; a copy that
        decides does (Spark Connect runs ``foreachBatch`` in a Python process of its server).
        """
        return bool(getattr(self, "_config_detached", False))

    @property
    def settings(self) -> dict[str, Any]:
        """Current mode, rates and parameters (as a config snapshot would set them)."""
        with self._lock:
            return dict(self._settings)

    @property
    def seed(self) -> int:
        """Seed of sampling and of random-mode Weight."""
        return self._seed

    @property
    def sample_rate(self) -> float:
        return float(self._settings["sample_rate"])

    @property
    def mode(self) -> str:
        return str(self._settings["mode"])

    @property
    def sample_view(self) -> pd.Series:
        """The decayed sample counts per key (a copy)."""
        with self._lock:
            return self._view.copy()

    @property
    def records_observed(self) -> float:
        """Stream records the observations stood for, in total."""
        return self._records_total

    def freeze(self, reason: str) -> None:
        """Keep deciding (and logging) but never switch; config strategy changes are refused."""
        with self._lock:
            self._frozen = str(reason)

    # ------------------------------------------------------------------ delegation
    def unwrap(self, refit: bool = False) -> Partitioner:
        """:attr:`current`; with ``refit=True`` a table learnt from the sample only is dropped.

        After a switch to a table strategy its table holds the sampled keys, placed by their
        sampled counts. When the caller is about to teach it every key with exact counts
        (``key_by(..., fit="full")`` does), a fresh table placed from those counts is closer to
        the keyed bound, so the sampled one is discarded first (once).
        """
        with self._lock:
            if refit and self._provisional:
                self._current = self._fresh(self._current_name)
                self._provisional = False
            return self._current

    @property
    def is_stateful(self) -> bool:
        return self._current.is_stateful

    def partition(self, key: Any) -> int:
        with self._lock:
            return self._current.partition(key)

    def assign(self, keys: Any) -> npt.NDArray[np.int32]:
        with self._lock:
            return self._current.assign(keys)

    def fit(self, keys_or_counts: Any) -> AdaptivePartitioner:
        """Teach :attr:`current` the keys (as its own ``fit``); returns ``self``."""
        with self._lock:
            self._current.fit(keys_or_counts)
        return self

    def _partition(self, key: Key) -> int:
        with self._lock:
            return self._current._partition(key)

    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]:
        with self._lock:
            return self._current._assign(keys)

    def spark_column(self, key: Column) -> Column:
        with self._lock:
            return self._current.spark_column(key)

    # ------------------------------------------------------------------ observing
    def observe(self, keys_or_counts: Any, represents: float | None = None) -> None:
        """Add one observation (keys, one per record, or a ``{key: count}`` mapping).

        Parameters
        ----------
        keys_or_counts
            The sampled keys.
        represents : float, optional
            Stream records the sample stands for. Default: its size / :attr:`sample_rate`, as
            if you sampled at that rate. Pass the sample's own size when the keys are all the
            records. Quantity mode counts these; sampling noise is judged from the ratio.

        Notes
        -----
        Runtime complexity: O(sampled keys + keys in the view), vectorised.
        """
        keys, counts, _ = to_counts(keys_or_counts, self.null_policy)
        if represents is None:
            represents = float(counts.sum()) / self.sample_rate
        self._observe_arrays(keys, counts, represents)

    def _observe_arrays(
        self, keys: KeyArray | None, counts: npt.NDArray[np.float64], represents: float | None
    ) -> None:
        sampled = float(counts.sum())
        if represents is None:
            represents = sampled
        if not np.isfinite(represents) or represents < 0:
            raise InvalidArgumentError(f"represents must be a finite count >= 0, got {represents}")
        if keys is not None and keys.null_mask is not None:  # counted, never placed
            valid = ~keys.null_mask
            keys = KeyArray(keys.kind, keys.arrow.filter(pa.array(valid)), None)
            counts = counts[valid]
        if keys is not None and len(keys) == 0:
            keys = None
        with self._lock:
            if keys is not None and self._kind is not None and (
                _family(keys.kind) != _family(self._kind)
            ):
                raise InvalidKeyTypeError(
                    f"observed {keys.kind} keys after {self._kind} keys; one key type per stream"
                )
            view = self._view * float(self._settings["decay"])
            if keys is not None:
                ints = keys.kind in ("int", "long")
                index = pd.Index(keys.ints() if ints else keys.objects())
                new = pd.Series(counts, index=index, dtype=np.float64)
                view = view.add(new, fill_value=0.0) if len(view) else new.groupby(level=0).sum()
                self._kind = self._kind or keys.kind
            self._view = view[view >= _PRUNE_BELOW]
            decay = float(self._settings["decay"])
            self._w1 = self._w1 * decay + sampled
            self._w2 = self._w2 * decay * decay + sampled
            if sampled > 0:
                self._scale = represents / sampled
            self._observations += 1
            self._records_total += represents
            self._records_since += represents

    def observe_df(self, df: DataFrame, key: str, seed: int | None = None) -> int:
        """Sample ``df`` with Spark (Bernoulli at :attr:`sample_rate`, seeded) and observe it.

        Returns the number of sampled rows. Cost: one single-stage Spark job that scans ``df``
        once and ships the sampled keys (``sample_rate`` x rows of them) to the driver as Arrow,
        where they are counted in C++ (``pyarrow.compute.value_counts``). Null keys count as
        records (the null key sits on its fixed partition under every candidate, so the
        scores leave it out); with ``null_policy="error"`` they raise
        :class:`~trilink_spark.errors.NullKeyError`.
        """
        import pyarrow.compute as pc

        refuse_streaming(df, "AdaptivePartitioner.observe_df", "it samples the keys with a job",
                         "adaptive_foreach_batch observes every micro-batch: stream.writeStream"
                         ".foreachBatch(adaptive_foreach_batch(func, adaptive, key)).start()")
        kind, dtype = key_kind(df, key)
        if kind is None:
            raise InvalidKeyTypeError(
                f"key column {key!r} is {dtype.simpleString()}; adaptive placement supports int, "
                "long, string and binary keys"
            )
        if self._key_type == "auto":
            self._key_type = kind
        rate = self.sample_rate
        sample_seed = self._seed + self._observations if seed is None else seed
        src = df.select(column_of(key))
        if rate < 1.0:
            src = src.sample(fraction=rate, seed=sample_seed)
        column = src.toArrow().column(0)
        sampled = float(len(column))
        if column.null_count and self.null_policy == "error":
            raise null_key_error(f"column {key!r} has null keys")
        column = column.drop_null()
        if len(column) == 0:
            self._observe_arrays(None, np.zeros(0), sampled / rate)
            return int(sampled)
        tally = pc.value_counts(column)
        keys = to_key_array(tally.field("values"), self.null_policy)
        counts = tally.field("counts").to_numpy().astype(np.float64)
        self._observe_arrays(keys, counts, sampled / rate)
        return int(sampled)

    # ------------------------------------------------------------------ deciding
    def _candidate_names(self) -> list[str]:
        return default_candidates(self._kind, weights=self._weights is not None,
                                  names=self._settings.get("candidates"))

    def _view_arrays(self) -> tuple[KeyArray, npt.NDArray[np.float64]]:
        """The view as a key array and counts scaled to stream records (vectorised)."""
        index = self._view.index
        values = self._view.to_numpy(dtype=np.float64) * self._scale
        raw = index.to_numpy() if self._kind in ("int", "long") else index.to_numpy(dtype=object)
        return to_key_array(pa.array(raw), self.null_policy), values

    def _capacity(self) -> npt.NDArray[np.float64] | None:
        return None if self._weights is None else np.asarray(self._weights, dtype=np.float64)

    def _noise_per_unit(self, thinning: float = 1.0) -> float:
        """Sampling-noise variance per unit of scaled load (see :mod:`~trilink_spark.switching.monitoring`).

        The view is a decayed sum of Bernoulli samples; ``w2 / w1`` corrects the Poisson
        variance for the decay weights. ``thinning`` is the share of the view being scored.
        """
        decay_factor = self._w2 / self._w1 if self._w1 > 0 else 1.0
        rate = min(1.0, thinning / self._scale) if self._scale > 0 else 1.0
        return decay_factor * self._scale / thinning * (1.0 - rate) if rate < 1.0 else 0.0

    def _current_loads(
        self, keys: KeyArray, counts: npt.NDArray[np.float64], *, teach: bool
    ) -> npt.NDArray[np.float64]:
        """Loads the current strategy gives; a table one keeps its history. ``teach``: new keys
        are placed as key_by(fit="full") would place them, else they get the hash fallback."""
        p = self._current
        if isinstance(p, TablePartitioner) and p.is_stateful:
            if teach:
                probe = p.copy()
                fit_counts(probe, keys, counts)
                pids = probe.lookup(keys.arrow)
            else:
                pids = p.lookup(keys.arrow)
        else:
            pids = p.assign(keys.arrow)
        return np.bincount(pids, weights=counts, minlength=self.num_partitions).astype(np.float64)

    def _estimate(self, loads: npt.NDArray[np.float64], thinning: float = 1.0) -> float:
        return denoised_balance(loads, self._noise_per_unit(thinning), self._capacity())

    def _trigger(self) -> tuple[bool, str]:
        mode = self.mode
        if mode == "manual":
            return False, "manual mode: only config updates change the strategy"
        if mode == "quantity":
            quantity = int(self._settings["quantity"])
            return (
                self._records_since >= quantity,
                f"{self._records_since:.0f} of {quantity} records since the last decision",
            )
        period_s = self._settings.get("period_s")
        period_batches = self._settings.get("period_batches")
        if period_s is None and period_batches is None:
            period_s = _DEFAULT_PERIOD_S
        elapsed = self._clock() - self._last_decision_at
        due_time = period_s is not None and elapsed >= float(period_s)
        due_batches = period_batches is not None and self._batches_since >= int(period_batches)
        return (
            due_time or due_batches,
            f"{elapsed:.1f} s and {self._batches_since} batches since the last decision "
            f"(period: {period_s} s / {period_batches} batches)",
        )

    def decide(self, force: bool = False) -> Decision:
        """Score the candidates on the sample view and switch when the mode and gain say so.

        Parameters
        ----------
        force : bool
            Decide now whatever the mode (hysteresis still applies).

        Returns
        -------
        Decision
            Also appended to :attr:`decisions` when triggered.
        """
        with self._lock:
            name = self._current_name
            weight = float(self._view.sum())
            base: dict[str, Any] = {"chosen": name, "previous": name, "switched": False,
                    "sample_records": weight, "batch": self._batch}
            if weight < int(self._settings["min_sample"]) or not len(self._view):
                return Decision(
                    triggered=False,
                    reason=f"sample holds {weight:.0f} of min_sample "
                    f"{self._settings['min_sample']} records",
                    **base,
                )
            keys, counts = self._view_arrays()
            current_balance: float | None = None
            if force:
                triggered, why = True, "forced"
            elif self.mode == "threshold":
                current_balance = self._estimate(self._current_loads(keys, counts, teach=True))
                limit = float(self._settings["threshold"])
                triggered = current_balance < limit
                why = f"{name} balance {current_balance:.3f} vs threshold {limit}"
            else:
                triggered, why = self._trigger()
            if not triggered:
                return Decision(triggered=False, reason=why, current_balance=current_balance, **base)
            decision = self._switch_if_better(keys, counts, why, base)
            self._decisions.append(decision)
            self._last_decision_at = self._clock()
            self._records_since = 0.0
            self._batches_since = 0
        return decision

    def _scores(
        self, keys: KeyArray, counts: npt.NDArray[np.float64]
    ) -> tuple[list[StrategyScore], StrategyScore, dict[str, float], float, float]:
        """Score every candidate and the current strategy; pick the best; estimate the gain.

        Returns the scores, the best candidate, the estimates compared, the current strategy's
        estimate and the gain. Balances are denoised (:mod:`~trilink_spark.switching.monitoring`).

        *From a stateless strategy*, candidates are fitted on the whole view and scored on it.
        A fresh table is thereby scored on the counts it learnt, which is what
        ``key_by(fit="full")`` gives it (it learns the exact counts of the batch it places), so
        a table candidate is compared against the plain denoised balance of the stateless ones.
        Between stateless strategies only a spread the sample can tell from noise counts.

        *From a table strategy*, that was taught exact counts, a fresh table fitted on the
        sample it is scored on would look better for having fitted the sample and be refit
        every time. So candidates learn on one half of the sample
        (:func:`~trilink_spark.switching.monitoring.split_counts`) and all of them, the current
        table included, are scored on the other half (keys a table has not seen get the hash
        fallback); only a spread the sample can tell from noise counts.
        """
        common: dict[str, Any] = {
            "strategies": self._candidate_names(),
            "weights": self._weights,
            "key_type": self._key_type,
            "seed": self._seed,
            "null_policy": self.null_policy,
        }
        n, capacity = self.num_partitions, self._capacity()
        min_gain = float(self._settings["min_gain"])
        if self._current.is_stateful:
            rng = np.random.default_rng([self._seed, len(self._decisions)])
            learn_c, score_c = split_counts(self._view.to_numpy(dtype=np.float64), rng)
            index = self._view.index.tolist()
            learn = {k: c * self._scale for k, c in zip(index, learn_c.tolist()) if c > 0}
            score = {k: c * self._scale for k, c in zip(index, score_c.tolist()) if c > 0}
            if learn and score:
                scores = evaluate_strategies(learn, n, evaluate_on=score, **common)
                noise = self._noise_per_unit(0.5)
                est = {s.name: denoised_balance(s.loads, noise, capacity) for s in scores}
                skeys, scounts, _ = to_counts(score, self.null_policy)
                current = denoised_balance(
                    self._current_loads(skeys, scounts, teach=False), noise, capacity
                )
                best = pick_best(scores, min_gain, est, est)
                return scores, best, est, current, est[best.name] - current
        mapping = dict(zip(self._view.index.tolist(), counts.tolist()))
        scores = evaluate_strategies(mapping, n, **common)
        noise = self._noise_per_unit()
        current_loads = self._current_loads(keys, counts, teach=True)
        strict = {s.name: denoised_balance(s.loads, noise, capacity) for s in scores}
        plain = {s.name: denoised_balance(s.loads, noise, capacity, 0.0) for s in scores}
        current = denoised_balance(current_loads, noise, capacity)
        current_plain = denoised_balance(current_loads, noise, capacity, 0.0)
        best = pick_best(scores, min_gain, strict, plain, current_plain)
        if best.partitioner.is_stateful:
            estimates = {**strict, best.name: plain[best.name]}
            return scores, best, estimates, current_plain, plain[best.name] - current_plain
        return scores, best, strict, current, strict[best.name] - current

    def _switch_if_better(
        self,
        keys: KeyArray,
        counts: npt.NDArray[np.float64],
        why: str,
        base: dict[str, Any],
    ) -> Decision:
        name = self._current_name
        scores, best, estimates, current_balance, gain = self._scores(keys, counts)
        min_gain = float(self._settings["min_gain"])
        best_balance = estimates[best.name]
        refit = best.name == name
        scored: dict[str, Any] = {"scores": tuple(scores), "estimates": estimates,
                  "current_balance": current_balance}
        if gain < min_gain or (refit and not best.partitioner.is_stateful):
            reason = (
                f"{why}; stay on {name} ({current_balance:.3f}): best is {best.name} "
                f"({best_balance:.3f}), gain below min_gain {min_gain}"
            )
            return Decision(triggered=True, reason=reason, **scored, **base)
        action = f"refit {name}" if refit else f"switch {name} -> {best.name}"
        if self._frozen is not None:
            reason = f"{why}; would {action} (gain {gain:.3f}) but switching is off: {self._frozen}"
            logger.warning("adaptive partitioner: %s", reason)
            return Decision(triggered=True, reason=reason, **scored, **base)
        self._current, self._current_name = best.partitioner, best.name
        self._provisional = best.partitioner.is_stateful
        reason = (
            f"{why}; {action}: {best_balance:.3f} vs {current_balance:.3f} "
            f"(gain {gain:.3f} >= {min_gain})"
        )
        logger.info("adaptive partitioner: %s", reason)
        base = {**base, "chosen": best.name, "switched": True}
        return Decision(triggered=True, reason=reason, **scored, **base)

    # ------------------------------------------------------------------ configuration
    def _on_config(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            self._pending = dict(snapshot)

    def before_batch(self, df: Any, key: str, batch_id: int) -> None:
        """A stateful runner's new micro-batch: apply config updates, observe the batch (one
        sampling job) and decide. A switch is then carried out by the runner as a swap of
        keyed state (:meth:`~trilink_spark.keyed.KeyedBatchFunction.request_swap`)."""
        self.batch_boundary()
        self.observe_df(df, key, seed=self.seed + batch_id)
        self.decide()

    def batch_boundary(self) -> dict[str, Any] | None:
        """Mark a micro-batch boundary: apply a pending config update and count the batch.

        Returns the snapshot applied, if any.
        :func:`~trilink_spark.switching.adaptive_foreach_batch` calls it before each batch; call it
        yourself between batches otherwise.
        """
        with self._lock:
            self._batch += 1
            self._batches_since += 1
            snapshot, self._pending = self._pending, None
            if snapshot is None:
                return None
            self._apply(snapshot)
            return snapshot

    def _apply(self, snapshot: dict[str, Any]) -> None:
        changed = {k: v for k, v in snapshot.items()
                   if k not in ("version", "strategy") and self._applied.get(k, object()) != v}
        self._applied = dict(snapshot)
        self._settings.update(changed)
        version = snapshot.get("version")
        if changed:
            logger.info("config version %s applied: %s", version, changed)
        # a snapshot that names a strategy pins it, also when the partitioner has switched away
        # from it since an earlier snapshot named it (mode="manual" keeps it pinned)
        strategy = snapshot.get("strategy")
        if strategy is None or strategy == self._current_name:
            return
        try:
            self._pin(strategy, f"config version {version}")
        except (ConfigError, InvalidArgumentError, InvalidKeyTypeError) as err:
            logger.warning("config version %s: strategy %r refused: %s", version, strategy, err)

    def _pin(self, name: str, source: str) -> None:
        if self._frozen is not None:
            raise ConfigError(f"switching is off: {self._frozen}")
        if name in ("weight", "weight_random") and self._weights is None:
            raise ConfigError(f"{name} needs weights; this partitioner has none")
        if name == "modulo" and self._kind not in (None, "int", "long"):
            raise InvalidKeyTypeError(f"modulo needs integer keys; the stream has {self._kind} keys")
        previous = self._current_name
        fresh = self._fresh(name)
        if isinstance(fresh, TablePartitioner) and fresh.is_stateful and len(self._view):
            keys, counts = self._view_arrays()
            fit_counts(fresh, keys, counts)
        self._current, self._current_name = fresh, name
        self._provisional = fresh.is_stateful
        self._decisions.append(Decision(
            chosen=name, previous=previous, switched=True, triggered=True,
            reason=f"{source} pinned strategy {name}", sample_records=float(self._view.sum()),
            batch=self._batch,
        ))
        logger.info("adaptive partitioner: %s pinned %s (was %s)", source, name, previous)

    def _fresh(self, name: str) -> Partitioner:
        return build(name, self.num_partitions, key_type=self._key_type,
                     null_policy=self.null_policy, weights=self._weights, seed=self._seed)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state: the current strategy, settings, sample view and decision log."""
        with self._lock:
            view_keys = self._view.index.tolist()
            return {
                "strategy": "adaptive",
                "num_partitions": self.num_partitions,
                "null_policy": self.null_policy,
                "current_name": self._current_name,
                "current": self._current.to_dict(),
                "settings": dict(self._settings),
                "weights": self._weights,
                "key_type": self._key_type,
                "seed": self._seed,
                "frozen": self._frozen,
                "provisional": self._provisional,
                "kind": self._kind,
                "view": [[encode_key(k), float(w)]
                         for k, w in zip(view_keys, self._view.tolist())],
                "sampling": {"scale": self._scale, "w1": self._w1, "w2": self._w2,
                             "observations": self._observations,
                             "records_total": self._records_total,
                             "records_since": self._records_since,
                             "batches_since": self._batches_since, "batch": self._batch},
                "decisions": [d.to_dict() for d in self._decisions],
            }

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> AdaptivePartitioner:
        settings = dict(data.get("settings") or {})
        candidates = settings.pop("candidates", None)
        out = cls(
            check_num_partitions(data.get("num_partitions")),
            candidates,
            initial=Partitioner.from_dict(dict(data["current"])),
            weights=data.get("weights"),
            key_type=data.get("key_type", "auto"),
            seed=int(data.get("seed", 0)),
            null_policy=data.get("null_policy", DEFAULT_NULL_POLICY),
            **settings,
        )
        out._current_name = str(data.get("current_name", out._current_name))
        frozen = data.get("frozen")
        out._frozen = None if frozen is None else str(frozen)
        out._provisional = bool(data.get("provisional", False))
        out._kind = data.get("kind")
        view = data.get("view") or []
        if view:
            keys = [decode_key(k) for k, _w in view]
            out._view = pd.Series([float(w) for _k, w in view], index=pd.Index(keys),
                                  dtype=np.float64)
        sampling = dict(data.get("sampling") or {})
        out._scale = float(sampling.get("scale", 1.0))
        out._w1 = float(sampling.get("w1", 0.0))
        out._w2 = float(sampling.get("w2", 0.0))
        out._observations = int(sampling.get("observations", 0))
        out._records_total = float(sampling.get("records_total", 0.0))
        out._records_since = float(sampling.get("records_since", 0.0))
        out._batches_since = int(sampling.get("batches_since", 0))
        out._batch = int(sampling.get("batch", 0))
        out._decisions = [Decision.from_dict(d) for d in data.get("decisions") or []]
        return out

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = dict(self.__dict__)
            state["_decisions"] = list(self._decisions)
        state["_config_id"] = self._config.center_id
        clock = state.pop("_clock", None)
        if clock is not time.monotonic:
            state["_clock_name"] = "custom"  # a custom clock stays with the original
        for transient in ("_lock", "_config", "_unsubscribe"):
            state.pop(transient, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        config_id = state.pop("_config_id", None)
        if state.pop("_clock_name", None) is not None:
            logger.info("copy of an AdaptivePartitioner: its custom clock is not copied; "
                        "the copy uses time.monotonic")
        state.setdefault("_pending", None)
        state.setdefault("_config_given", False)
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._clock = time.monotonic
        center = find_center(config_id)
        self._config_detached = bool(
            self._config_given and (center is None or getattr(self, "_config_detached", False)))
        self._config = center if center is not None else ConfigCenter()
        self._unsubscribe = self._config.subscribe(_Listener(self))

    def close(self) -> None:
        """Stop listening to the config center."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def __repr__(self) -> str:
        return (
            f"AdaptivePartitioner(num_partitions={self.num_partitions}, mode={self.mode!r}, "
            f"current={self._current_name!r})"
        )


def _family(kind: str) -> str:
    return "integer" if kind in ("int", "long") else kind


class _Listener:
    """A config subscription that does not keep its partitioner alive (a dropped copy is
    collected, and its subscription then does nothing)."""

    __slots__ = ("_target",)

    def __init__(self, target: AdaptivePartitioner) -> None:
        self._target = weakref.ref(target)

    def __call__(self, snapshot: dict[str, Any]) -> None:
        target = self._target()
        if target is not None:
            target._on_config(snapshot)
