"""LeastKey and LeastCount: Trilink paper, Algorithm 1: the "Least" placement.

A key seen before returns its remembered partition; a new key goes to the partition whose load
is least (ties: lowest partition id), which then carries the key's load. LeastKey measures load
as the number of keys placed on a partition; LeastCount as the number of records.

The least-loaded partition is found with a binary heap of ``(load, partition)`` entries whose
stored loads may lag behind the true ones (loads only grow). The top entry is refreshed until
it is current, which makes it the true minimum: O(log n) per decision, O(1) per load increment.
The paper uses a hash table and a skip list for the same bounds.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any, Self

import numpy as np
import pandas as pd

from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ..core.keys import DEFAULT_NULL_POLICY, Key, normalize_key, to_counts, to_key_array
from .table import TablePartitioner, least_units

__all__ = ["LeastKeyPartitioner", "LeastCountPartitioner"]


class _LeastPartitioner(TablePartitioner):
    """Algorithm 1 with a pluggable load measure."""

    learned_fields = ("table", "loads", "groups", "group_loads")

    def __init__(
        self, num_partitions: int, *, key_type: str = "auto",
        null_policy: str = DEFAULT_NULL_POLICY, max_keys: int | None = None,
    ) -> None:
        super().__init__(num_partitions, key_type=key_type, null_policy=null_policy,
                         max_keys=max_keys)
        self._loads: list[float] = [0.0] * self._num_partitions
        self._heap: list[tuple[float, int]] = [(0.0, i) for i in range(self._num_partitions)]

    @property
    def loads(self) -> np.ndarray:
        """Current load of every partition, as this strategy measures load."""
        return np.asarray(self._loads, dtype=np.float64)

    def _least(self) -> int:
        heap, loads = self._heap, self._loads
        while True:
            stored, pid = heap[0]
            current = loads[pid]
            if stored == current:
                return pid
            heapq.heapreplace(heap, (current, pid))

    def _place(self, key: Key, weight: float) -> int:
        pid = self._least()
        self._loads[pid] += weight
        self._record(key, pid)
        return pid

    def _check(self) -> None:
        """Verify the invariants (used by the randomised tests after every step)."""
        n = self._num_partitions
        if len(self._loads) != n or len(self._heap) != n:
            raise AssertionError("loads and heap must have one entry per partition")
        if sorted(pid for _, pid in self._heap) != list(range(n)):
            raise AssertionError("heap must hold every partition exactly once")
        for stored, pid in self._heap:
            if stored > self._loads[pid]:
                raise AssertionError("a heap entry overstates its partition's load")
        for i in range(1, n):
            if self._heap[(i - 1) // 2] > self._heap[i]:
                raise AssertionError("heap order violated")
        if any(not 0 <= p < n for p in self._table.values()):
            raise AssertionError("a table entry is out of range")
        if self._groups is not None:
            if self._group_loads is None or self._groups.size != self._num_groups \
                    or self._group_loads.size != self._num_groups:
                raise AssertionError("a bounded table has one partition and load per group")
            if self._groups.size and not 0 <= int(self._groups.min()) <= \
                    int(self._groups.max()) < n:
                raise AssertionError("a group's partition is out of range")

    def _charge_groups(self, pids: np.ndarray, weights: np.ndarray) -> None:
        added = np.bincount(pids, weights=weights, minlength=self._num_partitions)
        self._loads = (np.asarray(self._loads) + added).tolist()
        self._rebuild_heap()

    def _key_weights(self, counts: np.ndarray) -> np.ndarray:
        """The load one key of ``counts`` rows carries."""
        return self._unit_weights(counts, np.ones(counts.size))

    #: Place the named keys heavier than a typical group before the groups (LeastKey: all
    #: its keys weigh one; see :meth:`_make_bounded`).
    _keys_first = False

    def _make_bounded(self, keys: list[Key], counts: np.ndarray, rows: np.ndarray,
                      nkeys: np.ndarray) -> None:
        """Keys and key groups as one sequence of units, heaviest first, each onto the least
        loaded partition (Algorithm 1's rule, longest processing time first); LeastKey
        places its named keys heavier than a typical group first, then the groups, then the
        other named keys."""
        group_weights = self._unit_weights(rows, nkeys)
        loads = np.asarray(self._loads, dtype=np.float64)
        if self._keys_first:
            # keys weigh one: the heaviest by records would all fill the partition the groups
            # left lightest, so those heavier than a typical group spread first
            busy = rows[rows > 0]
            heavy = counts > (float(np.median(busy)) if busy.size else 0.0)
            pids = np.zeros(len(keys) + rows.size, dtype=np.int32)
            pids[: len(keys)][heavy] = least_units(loads, self._key_weights(counts[heavy]))
            pids[len(keys):] = least_units(loads, group_weights)
            pids[: len(keys)][~heavy] = least_units(loads, self._key_weights(counts[~heavy]))
        else:
            pids = least_units(loads, np.concatenate([self._key_weights(counts),
                                                      group_weights]))
        self._record_many(keys, pids[: len(keys)])
        self._set_groups(pids[len(keys):], group_weights)
        self._loads = loads.tolist()
        self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = [(load, pid) for pid, load in enumerate(self._loads)]
        heapq.heapify(self._heap)

    def _params(self) -> dict[str, Any]:
        out = self._table_params()
        out["loads"] = list(self._loads)
        return out

    def _restore(self, params: dict[str, Any]) -> None:
        unknown = set(params) - {"table", "loads", "key_type", *self.BOUNDED_FIELDS}
        if unknown:
            raise InvalidArgumentError(f"unknown field(s) {sorted(unknown)} for {self.strategy_name}")
        loads = params.get("loads")
        self._load_table(params.get("table", []))
        self._load_bounded(params)
        if loads is not None:
            if not isinstance(loads, list) or len(loads) != self._num_partitions:
                raise InvalidArgumentError(
                    f"loads must list {self._num_partitions} numbers, got {loads!r:.80}"
                )
            values = np.asarray(loads, dtype=np.float64)
            if not np.all(np.isfinite(values)) or (values < 0).any():
                raise InvalidArgumentError("loads must be finite and non-negative")
            self._loads = values.tolist()
            self._rebuild_heap()


class LeastKeyPartitioner(_LeastPartitioner):
    """Place each new key on the partition holding the fewest keys (Trilink paper, §4.2.1 (2)).

    Balanced when every key carries about the same number of records, whatever the key values
    (sparse or clustered ids, strings). Keys keep their partition for ever (history map).

    Parameters
    ----------
    num_partitions : int
    null_policy : {"group", "error", "partition0"}

    Notes
    -----
    Cost: O(log n) per new key, O(1) expected per known key; memory O(distinct keys). New keys
    are placed in order of first appearance; ``fit`` accepts keys or a ``{key: count}`` mapping
    (counts are ignored: the load is the number of keys).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> p = tl.LeastKeyPartitioner(2).fit(["a", "b", "c"])
    >>> [p("a"), p("b"), p("c")]
    [0, 1, 0]
    """

    strategy_name = "least_key"
    _keys_first = True
    counts_keys = True

    def fit(self, keys_or_counts: Any) -> Self:
        """Place the keys not yet known, in order of first appearance (bounded: the keys
        with most records get the entries left, the others go by group)."""
        keys, counts, _ = to_counts(keys_or_counts, self._null_policy)
        return self.fit_loads(keys.arrow, counts)

    def _place_new(self, keys: list[Key]) -> list[int]:
        return [self._place(k, 1.0) for k in keys]

    def _unit_weights(self, rows: np.ndarray, nkeys: np.ndarray) -> np.ndarray:
        return np.asarray(nkeys, dtype=np.float64)

    def _check(self) -> None:
        super()._check()
        counts = np.bincount(
            np.fromiter(self._table.values(), np.int64, len(self._table)),
            minlength=self._num_partitions,
        ).astype(np.float64)
        if self._groups is not None and self._group_loads is not None:
            counts += np.bincount(self._groups, weights=self._group_loads,
                                  minlength=self._num_partitions)
        if not np.allclose(counts, np.asarray(self._loads)):
            raise AssertionError("LeastKey loads must equal the number of keys per partition")

    @classmethod
    def _from_params(cls, num_partitions: int, null_policy: str, params: dict[str, Any]) -> Self:
        self = cls(num_partitions, key_type=params.get("key_type", "auto"),
                   null_policy=null_policy)
        self._restore(params)
        return self


class LeastCountPartitioner(_LeastPartitioner):
    """Place each new key on the partition with the fewest records (Trilink paper, §4.2.1 (3)).

    Without history it learns online: ``fit(keys)`` walks the records in arrival order, places a
    key on its first record and counts every record. With ``history={key: count}`` (or
    ``fit(mapping)``) it knows the weights up front and places the heaviest keys first (longest
    processing time first), which reaches the keyed bound within a fraction of a percent on
    realistic data (see ``benches/RESULTS.md``).

    Parameters
    ----------
    num_partitions : int
    history : mapping of key to count, optional
        Historical record counts, placed immediately, heaviest first.
    null_policy : {"group", "error", "partition0"}

    Notes
    -----
    Cost: ``fit(mapping)`` sorts the new keys, O(m log m + m log n); ``fit(keys)`` is one pass
    over the records in Python, O(records + new keys * log n); a known key's lookup is O(1)
    expected. A key placed by ``partition``/``assign`` (not by ``fit``) counts one record.
    The null key (null policies ``"group"`` and ``"partition0"``) is never in the table: it
    has a fixed partition (:func:`~trilink_spark.partitioners.core.keys.null_partition`), and
    ``fit`` counts its records there, so the other keys are balanced around it.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> p = tl.LeastCountPartitioner(2, history={"hot": 90, "a": 40, "b": 40})
    >>> [p("hot"), p("a"), p("b")]
    [0, 1, 1]
    """

    strategy_name = "least_count"

    def __init__(
        self,
        num_partitions: int,
        history: Mapping[Any, float] | None = None,
        *,
        key_type: str = "auto",
        null_policy: str = DEFAULT_NULL_POLICY,
        max_keys: int | None = None,
    ) -> None:
        super().__init__(num_partitions, key_type=key_type, null_policy=null_policy,
                         max_keys=max_keys)
        if history is not None:
            if not isinstance(history, Mapping):
                raise InvalidArgumentTypeError(
                    f"history must be a mapping {{key: count}}, got {type(history).__name__}"
                )
            self.fit(history)

    def fit(self, keys_or_counts: Any) -> Self:
        """Learn record counts: a mapping as history (heaviest first), keys as a live stream."""
        with self._lock:
            if isinstance(keys_or_counts, Mapping):
                self._fit_history(keys_or_counts)
            else:
                self._fit_stream(keys_or_counts)
        return self

    def _fit_history(self, counts_map: Mapping[Any, float]) -> None:
        keys, counts, _ = to_counts(counts_map, self._null_policy)
        objs = keys.objects()
        null_rows = 0.0
        if keys.null_mask is not None:  # the null key's rows load its fixed partition
            null_rows = float(counts[keys.null_mask].sum())
            objs, counts = objs[~keys.null_mask], counts[~keys.null_mask]
        self._fit_loads([normalize_key(k) for k in objs.tolist()],  # type: ignore[misc]
                        counts, null_rows, None)

    def _charge_known(self, pids: np.ndarray, rows: np.ndarray, null_rows: float) -> None:
        if null_rows:
            self._loads[self._null_partition()] += null_rows
        if pids.size:
            for pid, count in zip(pids.tolist(), rows.tolist()):
                self._loads[pid] += count

    def _place_keys(self, keys: list[Key], counts: np.ndarray) -> None:
        order = np.argsort(-np.asarray(counts, dtype=np.float64), kind="stable")
        weights = counts.tolist()
        for i in order.tolist():
            self._place(keys[i], weights[i])

    def _fit_stream(self, keys_seq: Any) -> None:
        karr = to_key_array(keys_seq, self._null_policy)
        codes, uniques = pd.factorize(karr.objects())  # the null key: code -1
        distinct = [normalize_key(k) for k in uniques.tolist()]
        pid_of = [self._table.get(k, -1) for k in distinct]  # type: ignore[arg-type]
        new = pid_of.count(-1)
        if self._groups is not None or len(self._table) + new > self._max_keys:
            # past the bound arrival order no longer decides: the keys' counts do
            valid = codes >= 0
            rows = np.bincount(codes[valid], minlength=len(distinct)).astype(np.float64)
            self._fit_loads(distinct, rows,  # type: ignore[arg-type]
                            float(codes.size - np.count_nonzero(valid)), None)
            return
        loads = self._loads
        null_pid = self._null_partition() if karr.null_mask is not None else -1
        for code in codes.tolist():
            if code < 0:  # a null key's record loads its fixed partition, in arrival order
                loads[null_pid] += 1.0
                continue
            pid = pid_of[code]
            if pid < 0:
                pid = self._least()
                pid_of[code] = pid
                self._record(distinct[code], pid)  # type: ignore[arg-type]
            loads[pid] += 1.0

    def _place_new(self, keys: list[Key]) -> list[int]:
        return [self._place(k, 1.0) for k in keys]

    @classmethod
    def _from_params(cls, num_partitions: int, null_policy: str, params: dict[str, Any]) -> Self:
        self = cls(num_partitions, key_type=params.get("key_type", "auto"),
                   null_policy=null_policy)
        self._restore(params)
        return self
