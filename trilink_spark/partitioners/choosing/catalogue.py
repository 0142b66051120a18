"""The one catalogue of placement strategies: what exists, how each is built and taught.

Every place that offers a choice of strategies reads it from here: ``key_by(strategy="auto")``
and :func:`~trilink_spark.evaluate_strategies` (the candidates they score), the adaptive
partitioner (what it may switch to), the config center (what an update may pin) and the
``trilink-spark balance`` command. Adding a strategy is one :class:`Partitioner` subclass (its
``strategy_name`` registers the class for ``from_dict``) and one :func:`register_candidate`
call here.

Examples
--------
>>> from trilink_spark.partitioners.choosing.catalogue import build, candidate_names
>>> candidate_names()[:4]
('hash', 'modulo', 'least_key', 'least_count')
>>> build("least_key", 4).num_partitions
4
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import InvalidArgumentError, UnknownStrategyError
from ..core.keys import DEFAULT_NULL_POLICY, KeyArray
from ..core.base import Partitioner
from ..core.block import DEFAULT_BLOCKS, BlockPartitioner
from ..core.hash import HashPartitioner
from ..tables.least import LeastCountPartitioner, LeastKeyPartitioner
from ..core.modulo import ModuloPartitioner
from ..tables.table import TablePartitioner
from ..tables.weight import WeightPartitioner

__all__ = [
    "Candidate",
    "register_candidate",
    "candidate_names",
    "configurable_names",
    "default_candidates",
    "ruled_out_by_keys",
    "build",
    "candidate_of",
    "fit_counts",
]


@dataclass(frozen=True)
class Candidate:
    """One entry of the catalogue.

    Attributes
    ----------
    name : str
        The candidate's name (``"least_count_no_history"``); may differ from the class's
        ``strategy_name`` when one class offers several variants.
    build : callable
        ``build(n, key_type=..., null_policy=..., weights=..., seed=...)``: an unfitted strategy.
    integer_keys : bool
        Only for integer keys (Modulo).
    needs_weights : bool
        Only when partition weights are given (Weight).
    learns_sequence : bool
        Learns from the record sequence, not from counts (online LeastCount): offered only when
        the input is a sequence of keys, never pinned by a config update.
    matches : callable, optional
        ``matches(strategy)``: whether a built strategy is this candidate (default: the class's
        ``strategy_name`` equals :attr:`name`).
    opt_in : bool
        Offered only where named (``key_by(df, k, "block")``, ``strategies=[...]``, a config's
        candidates), never among the defaults that ``"auto"``, :func:`evaluate_strategies` and
        the adaptive partitioner score on their own (Block: its default table balances as Hash
        does, so scoring it would only add a near-tie).
    """

    name: str
    build: Callable[..., Partitioner]
    integer_keys: bool = False
    needs_weights: bool = False
    learns_sequence: bool = False
    matches: Callable[[Partitioner], bool] | None = None
    opt_in: bool = False

    def is_candidate_of(self, strategy: Partitioner) -> bool:
        if self.matches is not None:
            return self.matches(strategy)
        return strategy.strategy_name == self.name


_CATALOGUE: dict[str, Candidate] = {}


def register_candidate(candidate: Candidate) -> None:
    """Add a candidate (or replace one of the same name); order of registration is report order."""
    _CATALOGUE[candidate.name] = candidate


def candidate_names() -> tuple[str, ...]:
    """Every candidate, in report order (:data:`~trilink_spark.partitioners.CANDIDATES`)."""
    return tuple(_CATALOGUE)


def configurable_names() -> tuple[str, ...]:
    """Candidates a config update may pin or list (those that learn from counts)."""
    return tuple(c.name for c in _CATALOGUE.values() if not c.learns_sequence)


def _candidate(name: str) -> Candidate:
    found = _CATALOGUE.get(name)
    if found is None:
        raise UnknownStrategyError(
            f"unknown candidate {name!r}; choose from {', '.join(_CATALOGUE)}"
        )
    return found


def ruled_out_by_keys(key_kind: str | None) -> dict[str, str]:
    """The candidates :func:`default_candidates` leaves out for keys of ``key_kind``, each with
    why (``trilink-spark balance`` prints it under its table). O(candidates).

    Examples
    --------
    >>> ruled_out_by_keys("string")
    {'modulo': 'string keys (Modulo needs integer keys)'}
    >>> ruled_out_by_keys("long")
    {}
    """
    return {c.name: f"{key_kind} keys ({c.name.capitalize()} needs integer keys)"
            for c in _CATALOGUE.values()
            if c.integer_keys and not c.opt_in and key_kind not in (None, "int", "long")}


def default_candidates(
    key_kind: str | None, *, weights: bool = False, sequence: bool = False,
    names: Sequence[str] | None = None,
) -> list[str]:
    """The candidates that apply: to keys of ``key_kind``, with or without weights, on a record
    sequence or on counts. ``names`` restricts the choice (and is checked against the catalogue);
    without it, opt-in candidates (Block) are left out.

    Examples
    --------
    >>> default_candidates("string")
    ['hash', 'least_key', 'least_count']
    >>> default_candidates("long", sequence=True)
    ['hash', 'modulo', 'least_key', 'least_count', 'least_count_no_history']
    """
    chosen = list(_CATALOGUE) if names is None else [_candidate(n).name for n in names]
    out = []
    for name in chosen:
        c = _CATALOGUE[name]
        if c.integer_keys and key_kind not in (None, "int", "long"):
            continue
        if c.needs_weights and not weights:
            continue
        if c.learns_sequence and not sequence:
            continue
        if c.opt_in and names is None:
            continue
        out.append(name)
    return out


def build(
    name: str,
    n: int,
    *,
    key_type: str = "auto",
    null_policy: str = DEFAULT_NULL_POLICY,
    weights: Sequence[float] | None = None,
    seed: int = 0,
    max_keys: int | None = None,
) -> Partitioner:
    """An unfitted strategy of candidate ``name`` on ``n`` partitions (``max_keys``: a table
    strategy's bound on entries, default :data:`~trilink_spark.partitioners.tables.table.DEFAULT_MAX_KEYS`).
    O(n).

    Raises :class:`~trilink_spark.errors.UnknownStrategyError` for a name not in the catalogue and
    :class:`~trilink_spark.errors.InvalidArgumentError` when it needs ``weights`` and has none.
    """
    c = _candidate(name)
    if c.needs_weights and weights is None:
        raise InvalidArgumentError(
            f"strategy {name!r} needs weights: pass WeightPartitioner(weights, mode) or "
            "weights=[...] summing to 100"
        )
    return c.build(n, key_type=key_type, null_policy=null_policy, weights=weights, seed=seed,
                   max_keys=max_keys)


def candidate_of(strategy: Partitioner) -> str:
    """The catalogue name of a built strategy (``"weight_random"`` for a random Weight)."""
    for c in reversed(_CATALOGUE.values()):  # variants are registered after their base
        if not c.learns_sequence and c.is_candidate_of(strategy):
            return c.name
    return strategy.strategy_name


def fit_counts(p: Partitioner, keys: KeyArray, counts: npt.NDArray[np.float64]) -> None:
    """Teach a strategy distinct keys with their record counts, as ``key_by(fit="full")`` does.

    LeastCount takes the counts as history (heaviest key first); every other strategy learns
    the keys. O(keys log keys).
    """
    if isinstance(p, TablePartitioner):
        p.fit_loads(keys.arrow, np.asarray(counts, dtype=np.float64))
    else:
        p.fit(keys.arrow)


# ---------------------------------------------------------------------- the strategies
def _hash(n: int, *, key_type: str, null_policy: str, **_: Any) -> Partitioner:
    return HashPartitioner(n, key_type=key_type, null_policy=null_policy)


def _modulo(n: int, *, null_policy: str, **_: Any) -> Partitioner:
    return ModuloPartitioner(n, null_policy=null_policy)


def _least_key(n: int, *, key_type: str, null_policy: str, max_keys: int | None = None,
               **_: Any) -> Partitioner:
    return LeastKeyPartitioner(n, key_type=key_type, null_policy=null_policy,
                               max_keys=max_keys)


def _least_count(n: int, *, key_type: str, null_policy: str, max_keys: int | None = None,
                 **_: Any) -> Partitioner:
    return LeastCountPartitioner(n, key_type=key_type, null_policy=null_policy,
                                 max_keys=max_keys)


def _block(n: int, *, key_type: str, null_policy: str, **_: Any) -> Partitioner:
    return BlockPartitioner(n, max(DEFAULT_BLOCKS, n), key_type=key_type,
                            null_policy=null_policy)


def _weight(mode: str) -> Callable[..., Partitioner]:
    def make(n: int, *, key_type: str, null_policy: str, weights: Sequence[float] | None,
             seed: int, max_keys: int | None = None, **_: Any) -> Partitioner:
        return WeightPartitioner(list(weights or ()), mode, seed=seed, num_partitions=n,
                                 key_type=key_type, null_policy=null_policy,
                                 max_keys=max_keys)

    return make


def _is_weight(mode: str) -> Callable[[Partitioner], bool]:
    return lambda p: isinstance(p, WeightPartitioner) and p.mode == mode


register_candidate(Candidate("hash", _hash))
register_candidate(Candidate("modulo", _modulo, integer_keys=True))
register_candidate(Candidate("least_key", _least_key))
register_candidate(Candidate("least_count", _least_count))
register_candidate(Candidate("least_count_no_history", _least_count, learns_sequence=True,
                             matches=lambda p: isinstance(p, LeastCountPartitioner)))
register_candidate(Candidate("weight", _weight("hash"), needs_weights=True,
                             matches=_is_weight("hash")))
register_candidate(Candidate("weight_random", _weight("random"), needs_weights=True,
                             matches=_is_weight("random")))
register_candidate(Candidate("block", _block, opt_in=True))
