"""The history map shared by LeastKey, LeastCount and random-mode Weight.

In the paper these strategies run on a coordinator (the Flink JobManager) that remembers every
key it has placed, so a key never moves by accident (Trilink paper, Algorithm 1, lines 1-2). Here the
coordinator is the object in the driver: the first time it meets a key it decides and records
the decision.

A copy shipped to Spark executors (``rdd.partitionBy(n, p)`` pickles ``p``) must not decide on its
own: two tasks would place the same new key differently and split it. So inside a Spark task an
unknown key is placed by the deterministic fallback, Spark's hash placement
``pmod(murmur3(key), n)``, the same rule :func:`trilink_spark.key_by` uses in the JVM for keys
the table does not know. Fit the strategy on the driver first to avoid the fallback entirely.

**Bounded tables.** A table of one entry per key does not scale to millions of keys: driver
memory, the table shipped to every job, the state of every swap all grow with it. So a table
holds at most ``max_keys`` entries (default :data:`DEFAULT_MAX_KEYS`, the conf
``spark.trilink.table.maxKeys`` where :func:`~trilink_spark.key_by` builds the strategy). When a
fit would pass that bound, the heaviest keys keep entries of their own and every other key goes
by its **key group** ``pmod(hash(key), num_groups)`` (Spark's hash, as the fallback hashes it,
as :class:`~trilink_spark.partitioners.core.block.BlockPartitioner` places its blocks), through a
group table fitted by the same strategy on the groups' loads. Keys and groups are placed as one
sequence of units, heaviest first (longest processing time first), onto the partition the
strategy finds least loaded. Once a table is bounded, a new key goes by its group: it never
gets an entry by accident, and it never moves unless its group moves (a swap, a refit, a
rebalance). With at most ``max_keys`` distinct keys nothing changes: one entry per key.
"""

from __future__ import annotations

import copy
import heapq
import logging
import threading
from abc import abstractmethod
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from ..._internal.validation import count, fits_int64, short_repr
from ..._internal.validation import loads as check_loads
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidKeyTypeError
from ..core.keys import DEFAULT_NULL_POLICY, Key, KeyArray, key_index, normalize_key
from ..core.keys import to_key_array
from ..core.base import Partitioner, decode_key, encode_key
from ..core.hash import check_key_type, spark_hash_array, spark_hash_of
from ..core.block import DEFAULT_BLOCKS, MAX_BLOCKS, BlockPartitioner

__all__ = ["TablePartitioner", "in_spark_task", "DEFAULT_MAX_KEYS", "MAX_TABLE_KEYS",
           "check_max_keys", "least_units"]

logger = logging.getLogger(__name__)

#: Explicit entries of a table strategy unless told otherwise (``max_keys``, the conf
#: ``spark.trilink.table.maxKeys``): measured as the largest table whose broadcast and fit cost
#: stays within a few tenths of a second a job (``benches/RESULTS.md``).
DEFAULT_MAX_KEYS = 65_536
#: The most explicit entries a table may be given (a stored table asking for more is refused).
MAX_TABLE_KEYS = 1 << 24


def check_max_keys(value: Any, name: str = "max_keys") -> int:
    """``value`` as an entry bound: an int in ``[1, MAX_TABLE_KEYS]``. O(1).

    Examples
    --------
    >>> check_max_keys(1000)
    1000
    """
    return count(value, name, 1, high=MAX_TABLE_KEYS)


def least_units(loads: npt.NDArray[np.float64], weights: npt.NDArray[np.float64],
                capacity: npt.NDArray[np.float64] | None = None) -> npt.NDArray[np.int32]:
    """Place units heaviest first, each on the partition whose load (over its capacity) is
    least, ties to the lowest partition id: longest processing time first. ``loads`` is
    updated in place. Units of zero weight are spread round-robin over the partitions, so
    that keys which arrive later in an empty key group do not all meet on one partition.

    O(u log u + u log n) for ``u`` units, one heap step per unit.

    Examples
    --------
    >>> import numpy as np
    >>> least_units(np.zeros(2), np.array([5.0, 3.0, 3.0])).tolist()
    [0, 1, 1]
    """
    n = loads.size
    out = np.zeros(weights.size, dtype=np.int32)
    order = np.argsort(-weights, kind="stable")
    cap = np.ones(n) if capacity is None else np.asarray(capacity, dtype=np.float64)
    heap = [(float(loads[p] / cap[p]), p) for p in range(n) if cap[p] > 0]
    heapq.heapify(heap)
    live = [p for _, p in sorted(heap, key=lambda e: e[1])] or [0]
    zero = 0
    w = weights.tolist()
    for i in order.tolist():
        wi = w[i]
        if wi <= 0.0:
            out[i] = live[zero % len(live)]
            zero += 1
            continue
        _, p = heapq.heappop(heap)
        out[i] = p
        loads[p] += wi
        heapq.heappush(heap, (float(loads[p] / cap[p]), p))
    return out


def in_spark_task() -> bool:
    """True inside a Spark task (a Python worker), where no coordinator decisions are made."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is an extra
        return False
    return TaskContext.get() is not None


class TablePartitioner(Partitioner):
    """A strategy whose decisions are remembered in a history map ``{key: partition}``.

    Subclasses implement :meth:`_place_new`, the decision for keys never seen before, in the
    order given.

    Parameters
    ----------
    num_partitions : int
    key_type : {"auto", "int", "long", "string", "binary"}
        Spark type of the key column, which decides how the hash fallback hashes an integer
        key (Spark hashes ``int`` and ``long`` differently). ``"auto"`` hashes every integer as
        ``long`` on every path (:func:`~trilink_spark.key_by` then hashes an ``int`` column's
        unknown keys as ``long`` too); a strategy that :func:`~trilink_spark.key_by` builds by
        name takes the key column's type. The type is stored with the table and never changes
        by itself, so an unknown key goes to the same partition before and after a job.
    null_policy : {"group", "error", "partition0"}
    max_keys : int, optional
        The most keys with an entry of their own (default :data:`DEFAULT_MAX_KEYS`). A fit
        that would pass it makes the table *bounded* (module docs): the heaviest keys keep
        entries, every other key goes by its key group ``pmod(hash(key), num_groups)``.

    Notes
    -----
    Memory: one dict entry per key with an entry (at most ``max_keys``; about 100-150 bytes
    each in CPython), bounded 12 bytes per key group (two numpy arrays), and a pandas index
    built lazily for vectorised lookups. A known key costs an O(1) expected lookup.

    A bounded table places a key without an entry by its group, in Python and in the JVM
    alike, and never records it: ``partition`` and ``assign`` change nothing then, and only
    ``fit`` (which counts the rows it is given) changes the loads.

    Thread safety: placing new keys (``partition``, ``assign`` and ``fit`` on the driver) holds
    the strategy's lock and checks the table again inside it, so threads sharing one strategy
    place each key once and agree on where it went. Lookups of known keys read the table
    without the lock. A copy (``copy()``, pickling) has its own lock.
    """

    learned_fields: ClassVar[tuple[str, ...]] = ("table", "groups", "group_loads")
    #: ``"auto"`` hashes an int column's unknown keys as ``long``, on every path
    #: (:meth:`fallback_type`).
    auto_int_key_type: ClassVar[str] = "long"

    def __init__(
        self, num_partitions: int, *, key_type: str = "auto",
        null_policy: str = DEFAULT_NULL_POLICY, max_keys: int | None = None,
    ) -> None:
        super().__init__(num_partitions, null_policy=null_policy)
        self._key_type = check_key_type(key_type)
        self._max_keys = DEFAULT_MAX_KEYS if max_keys is None else check_max_keys(max_keys)
        self._num_groups = max(DEFAULT_BLOCKS, self._num_partitions)
        # bounded: every key group's partition and load
        self._groups: npt.NDArray[np.int32] | None = None
        self._group_loads: npt.NDArray[np.float64] | None = None
        self._table: dict[Key, int] = {}
        # how many times the table changed: with the object's identity, a cache key
        self._version = 0
        # (index, partition ids), replaced whole so a reader never pairs one with the other's
        self._lookup_cache: tuple[pd.Index, npt.NDArray[np.int32]] | None = None
        self._lock = threading.RLock()

    @property
    def is_stateful(self) -> bool:
        return True

    @property
    def key_type(self) -> str:
        """Spark key type the hash fallback follows (see the class parameters)."""
        return self._key_type

    @property
    def max_keys(self) -> int:
        """The most keys with an entry of their own (the class parameters). O(1)."""
        return self._max_keys

    @property
    def bounded(self) -> bool:
        """Whether keys without an entry go by their key group (module docs). O(1).

        Examples
        --------
        >>> import trilink_spark as tl
        >>> p = tl.LeastCountPartitioner(4, max_keys=2).fit({"a": 9, "b": 5, "c": 1, "d": 1})
        >>> p.bounded, len(p)
        (True, 2)
        """
        return self._groups is not None

    @property
    def num_groups(self) -> int:
        """Key groups of the bounded form, ``max(4096, num_partitions)``. O(1)."""
        return self._num_groups

    @property
    def groups(self) -> npt.NDArray[np.int32] | None:
        """Every key group's partition (a read-only copy; None: not bounded)."""
        if self._groups is None:
            return None
        out = self._groups.copy()
        out.flags.writeable = False
        return out

    def group_placement(self, kind: str) -> BlockPartitioner | None:
        """The key groups as a :class:`~trilink_spark.partitioners.core.block.BlockPartitioner`
        hashing keys of ``kind`` as the table does (None: not bounded). O(num_groups)."""
        if self._groups is None:
            return None
        return BlockPartitioner(self._num_partitions, self._num_groups, self._groups,
                                key_type=self.fallback_type(kind),
                                null_policy=self._null_policy)

    def key_groups(self, keys: Any) -> npt.NDArray[np.int64]:
        """The key group of every key, ``pmod(hash(key), num_groups)`` hashed as the
        fallback hashes it; ``-1`` for a null key. O(total key bytes), vectorised.

        Examples
        --------
        >>> import trilink_spark as tl
        >>> tl.LeastKeyPartitioner(2).key_groups([1, None]).tolist()
        [1181, -1]
        """
        karr = to_key_array(keys, self._null_policy)
        if karr.null_mask is None:
            return self._group_ids(karr)
        out = np.full(len(karr.arrow), -1, dtype=np.int64)
        valid = ~karr.null_mask
        sub = KeyArray(kind=karr.kind, arrow=karr.arrow.filter(pa.array(valid)), null_mask=None)
        out[valid] = self._group_ids(sub)
        return out

    def _group_ids(self, keys: KeyArray) -> npt.NDArray[np.int64]:
        hashes = spark_hash_array(keys, self.fallback_type(keys.kind)).astype(np.int64)
        return np.mod(hashes, self._num_groups)

    def bind_key_type(self, kind: str) -> None:
        """Fix the key type to a column's (``"int"``, ``"long"``, ``"string"``, ``"binary"``).

        An ``"auto"`` strategy takes ``kind``; one already bound keeps its type when ``kind``
        is compatible (an ``int`` column under a ``long`` strategy is hashed as ``long``) and
        refuses an incompatible one, or an ``"int"`` binding while the table holds integers
        beyond 32 bits. Binding changes where unknown keys fall back to: do it before the
        strategy places anything. O(keys in the table) for ``"int"``, else O(1).
        """
        kind = check_key_type(kind)
        with self._lock:
            if kind == "int" and self._key_type == "auto" and any(
                isinstance(k, int) and not -(2**31) <= k < 2**31 for k in self._table
            ):
                raise InvalidKeyTypeError(
                    f"{type(self).__name__} holds integer keys beyond 32 bits; it cannot be "
                    "bound to Spark int keys"
                )
            if kind == "int" and self._key_type == "auto" and self._groups is not None:
                raise InvalidKeyTypeError(
                    f"{type(self).__name__} is bounded: its key groups hash integers as "
                    "long; binding it to Spark int keys would move every key without an "
                    "entry (use key_type='long' for an int column)")
            if self._key_type in ("auto", kind) or (self._key_type, kind) == ("long", "int"):
                if self._key_type == "auto":
                    self._key_type = kind
                return
        raise InvalidKeyTypeError(
            f"{type(self).__name__} was bound to {self._key_type} keys; a {kind} key column "
            "cannot be placed by it (its hash fallback would disagree with Spark's)"
        )

    def fallback_type(self, kind: str) -> str:
        """The Spark type keys of ``kind`` are hashed as by the fallback (every path)."""
        if self._key_type != "auto":
            return self._key_type
        return "long" if kind in ("int", "long") else kind

    # ------------------------------------------------------------------ table
    @property
    def assignments(self) -> dict[Key, int]:
        """A copy of the history map ``{key: partition}``, in placement order."""
        return dict(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, key: object) -> bool:
        return normalize_key(key) in self._table

    def table_arrays(self) -> tuple[list[Key], npt.NDArray[np.int32]]:
        """The history map as parallel lists: keys and partition ids, of one state of the
        table (read under the strategy's lock, so a thread placing new keys meanwhile never
        gives keys of one table and partitions of another). O(keys)."""
        with self._lock:
            return (list(self._table),
                    np.fromiter(self._table.values(), np.int32, len(self._table)))

    @property
    def table_version(self) -> int:
        """A count that grows whenever the table changes (a key placed, a stored table
        loaded) and never otherwise. With the object's identity it names one state of the
        table: what is built from the table (:func:`~trilink_spark.key_by`'s broadcast frame)
        can be kept while it holds. A copy starts from its original's count. O(1).

        Examples
        --------
        >>> import trilink_spark as tl
        >>> p = tl.LeastKeyPartitioner(2)
        >>> before = p.table_version
        >>> _ = p.fit(["a"])
        >>> p.table_version > before
        True
        """
        return self._version

    def _record(self, key: Key, pid: int) -> None:
        self._table[key] = pid
        self._version += 1
        self._lookup_cache = None

    def _lookup(self) -> tuple[pd.Index, npt.NDArray[np.int32]]:
        cache = self._lookup_cache
        if cache is None:
            with self._lock:
                cache = self._lookup_cache
                if cache is None:
                    keys, pids = self.table_arrays()
                    cache = (key_index(keys), pids)
                    self._lookup_cache = cache
        return cache

    # ------------------------------------------------------------------ placement
    @abstractmethod
    def _place_new(self, keys: list[Key]) -> list[int]:
        """Decide, record and return partitions for keys never placed before, in order."""

    def _fallback(self, key: Key) -> int:
        kind = "long" if isinstance(key, int) else "string" if isinstance(key, str) else "binary"
        hashed = spark_hash_of(key, self.fallback_type(kind))
        groups = self._groups
        if groups is not None:
            return int(groups[hashed % self._num_groups])
        return hashed % self._num_partitions

    def _partition(self, key: Key) -> int:
        pid = self._table.get(key)
        if pid is not None:
            return pid
        if self._groups is not None:  # bounded: a key without an entry goes by its group
            return self._fallback(key)
        if in_spark_task():
            logger.debug("key %r unknown inside a Spark task: hash fallback", key)
            return self._fallback(key)
        with self._lock:
            pid = self._table.get(key)  # another thread may have placed it meanwhile
            if pid is not None:
                return pid
            if self._groups is None and len(self._table) < self._max_keys:
                return self._place_new([key])[0]
            self._fit_bounded([key], np.ones(1), None)  # at the bound: bounded from now on
            pid = self._table.get(key)
            return pid if pid is not None else self._fallback(key)

    def _known(
        self, keys: KeyArray
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
        """Objects, partition ids of known keys (0 elsewhere) and the mask of unknown keys."""
        objs = keys.objects()
        out = np.zeros(len(objs), dtype=np.int32)
        valid = np.ones(len(objs), dtype=bool) if keys.null_mask is None else ~keys.null_mask
        index, pids = self._lookup()
        empty = np.full(len(objs), -1, dtype=np.intp)
        pos = index.get_indexer(objs) if len(index) else empty  # type: ignore[arg-type]
        known = (pos >= 0) & valid
        out[known] = pids[pos[known]]
        return objs, out, (pos < 0) & valid

    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]:
        objs, out, unknown = self._known(keys)
        if not unknown.any():
            return out
        if self._groups is not None or in_spark_task():
            out[unknown] = self._fallback_array(keys, unknown)
            return out
        with self._lock:
            # look again inside the lock: another thread may have placed some or bounded it
            objs, out, unknown = self._known(keys)
            if unknown.any():
                codes, uniques = pd.factorize(objs[unknown])
                new_keys = [normalize_key(k) for k in uniques.tolist()]
                if self._groups is None \
                        and len(self._table) + len(new_keys) <= self._max_keys:
                    placed = np.asarray(self._place_new(new_keys),  # type: ignore[arg-type]
                                        dtype=np.int32)
                    out[unknown] = placed[codes]
                    return out
                # past the bound (or bounded meanwhile): one record each, as placed here
                self._fit_bounded(new_keys, np.ones(len(new_keys)), None)  # type: ignore[arg-type]
                objs, out, unknown = self._known(keys)
                if unknown.any():
                    out[unknown] = self._fallback_array(keys, unknown)
        return out

    def _fallback_array(
        self, keys: KeyArray, rows: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.int32]:
        sub = KeyArray(kind=keys.kind, arrow=keys.arrow.filter(pa.array(rows)), null_mask=None)
        groups = self._groups
        if groups is not None:
            return groups[self._group_ids(sub)]
        hashes = spark_hash_array(sub, self.fallback_type(keys.kind)).astype(np.int64)
        return np.mod(hashes, self._num_partitions).astype(np.int32)

    def lookup_known(self, keys: Any) -> npt.NDArray[np.bool_]:
        """Which of ``keys`` have an entry of their own (never the null key). O(keys),
        vectorised.

        Examples
        --------
        >>> import trilink_spark as tl
        >>> tl.LeastKeyPartitioner(2).fit(["a"]).lookup_known(["a", "b", None]).tolist()
        [True, False, False]
        """
        karr = to_key_array(keys, self._null_policy)
        _objs, _out, unknown = self._known(karr)
        known = ~unknown
        if karr.null_mask is not None:
            known &= ~karr.null_mask
        return known

    def lookup(self, keys: Any) -> npt.NDArray[np.int32]:
        """Like :meth:`assign` but never places a key: unknown keys get the hash fallback
        (the null key its null policy's partition, as everywhere).

        This is what a Spark task, or :func:`trilink_spark.key_by` with ``fit="none"``, does with
        keys the table does not know.
        """
        karr = to_key_array(keys, self._null_policy)
        _objs, out, unknown = self._known(karr)
        if unknown.any():
            out[unknown] = self._fallback_array(karr, unknown)
        if karr.null_mask is not None:
            out[karr.null_mask] = self._null_partition()
        return out

    # ------------------------------------------------------------------ fitting loads
    def fit_loads(self, keys: Any, counts: Any, rest: tuple[Any, Any] | None = None,
                  null_rows: float = 0.0) -> Self:
        """Learn distinct keys with their record counts and, optionally, the load of further
        keys summed by key group, without listing them: what :func:`~trilink_spark.key_by`
        learns from the executors.

        Parameters
        ----------
        keys : array-like
            Distinct keys (a null key's count loads the null key's partition).
        counts : array-like of float
            Rows of each key.
        rest : (rows per group, keys per group), optional
            Two arrays of :attr:`num_groups` numbers: rows and distinct keys of every key
            group's keys that ``keys`` does not list. Any rows there make the table bounded.
        null_rows : float
            Rows of the null key not counted in ``keys``.

        Returns
        -------
        self

        Notes
        -----
        Keys the table knows keep their partition (their rows count there); new keys get
        entries while the table holds at most :attr:`max_keys`, the heaviest first; past
        that, the rest go by group (module docs). O(m log m + num_groups log n) for ``m``
        keys listed.

        Examples
        --------
        >>> import numpy as np, trilink_spark as tl
        >>> p = tl.LeastCountPartitioner(2, max_keys=1)
        >>> rest = (np.full(p.num_groups, 1.0), np.full(p.num_groups, 1.0))
        >>> p.fit_loads(["hot"], [5000.0], rest).bounded
        True
        """
        karr = to_key_array(keys, self._null_policy)
        values = check_loads(counts, "counts")
        if not self.is_stateful:  # a hash-mode Weight: nothing to learn
            return self
        if values.size != len(karr.arrow):
            raise InvalidArgumentError(
                f"counts must list one number per key: {len(karr.arrow)} keys, "
                f"{values.size} counts")
        extra = float(check_loads([null_rows], "null_rows")[0])
        if karr.null_mask is not None:
            extra += float(values[karr.null_mask].sum())
            values = values[~karr.null_mask]
            objs = karr.objects()[~karr.null_mask]
        else:
            objs = karr.objects()
        rest_arrays = None
        if rest is not None:
            if not isinstance(rest, tuple) or len(rest) != 2:
                raise InvalidArgumentTypeError(
                    "rest must be a tuple (rows per group, keys per group)")
            rows, nkeys = (check_loads(r, "rest") for r in rest)
            if rows.size != self._num_groups or nkeys.size != self._num_groups:
                raise InvalidArgumentError(
                    f"rest must list {self._num_groups} rows and {self._num_groups} key "
                    f"counts (one per key group), got {rows.size} and {nkeys.size}")
            rest_arrays = (rows, nkeys)
        key_list: list[Key] = [normalize_key(k) for k in objs.tolist()]  # type: ignore[misc]
        with self._lock:
            self._fit_loads(key_list, values, extra, rest_arrays)
        return self

    def _fit_loads(self, keys: list[Key], counts: npt.NDArray[np.float64], null_rows: float,
                   rest: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None
                   ) -> None:
        """:meth:`fit_loads` under the lock, keys normalised and non-null: the known keys'
        rows charged, the new keys placed per key (:meth:`_place_keys`) or bounded."""
        known = np.fromiter((self._table.get(k, -1) for k in keys), np.int64, len(keys))
        new_at = np.flatnonzero(known < 0)
        self._charge_known(known[known >= 0], counts[known >= 0], null_rows)
        new_keys = [keys[i] for i in new_at.tolist()]
        if not self._fit_bounded(new_keys, counts[new_at], rest):
            self._place_keys(new_keys, counts[new_at])

    def _charge_known(self, pids: npt.NDArray[np.int64], rows: npt.NDArray[np.float64],
                      null_rows: float) -> None:  # count the known keys' rows (default: none)
        pass

    def _place_keys(self, keys: list[Key], counts: npt.NDArray[np.float64]) -> None:
        """Give every new key an entry, by the strategy's rule (the per-key fit)."""
        self._place_new(keys)

    #: Whether the strategy's load is its number of keys (LeastKey), not records.
    counts_keys: ClassVar[bool] = False

    def _unit_weights(self, rows: npt.NDArray[np.float64], nkeys: npt.NDArray[np.float64]
                      ) -> npt.NDArray[np.float64]:  # units' load: records (LeastKey: keys)
        return rows

    @property
    def group_loads(self) -> npt.NDArray[np.float64] | None:
        """Each key group's load as the strategy measures it (None: not bounded)."""
        return None if self._group_loads is None else self._group_loads.copy()

    def _fit_bounded(self, new_keys: list[Key], new_counts: npt.NDArray[np.float64],
                     rest: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None
                     ) -> bool:
        """Place new keys the bounded way when the table is bounded or would pass
        :attr:`max_keys`; False (nothing done) when every new key gets an entry per key."""
        rest_rows = np.zeros(self._num_groups) if rest is None else rest[0]
        rest_keys = np.zeros(self._num_groups) if rest is None else rest[1]
        listed_rest = (rest_rows > 0).any() or (rest_keys > 0).any()
        if not new_keys and not listed_rest:
            return False  # nothing new: the table stays as it is
        if self._groups is None and not listed_rest \
                and len(self._table) + len(new_keys) <= self._max_keys:
            return False
        if self._groups is None:
            room = max(0, self._max_keys - len(self._table))
            order = np.argsort(-new_counts, kind="stable")
            chosen, others = order[:room], order[room:]
            rows, nkeys = self._group_sums([new_keys[i] for i in others.tolist()],
                                           new_counts[others])
            self._make_bounded([new_keys[i] for i in chosen.tolist()], new_counts[chosen],
                               rows + rest_rows, nkeys + rest_keys)
            logger.info("%s: past its bound of %d keys; %d with entries, the rest by group",
                        type(self).__name__, self._max_keys, len(self._table))
            return True
        rows, nkeys = self._group_sums(new_keys, new_counts)
        rows, nkeys = rows + rest_rows, nkeys + rest_keys
        weights = self._unit_weights(rows, nkeys)
        self._charge_groups(self._groups.astype(np.int64), weights)
        if self._group_loads is not None:
            self._group_loads = self._group_loads + weights
        return True

    def _group_sums(self, keys: list[Key], counts: npt.NDArray[np.float64]
                    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Rows and keys of every key group over ``keys`` (distinct, non-null)."""
        b = self._num_groups
        if not keys:
            return np.zeros(b), np.zeros(b)
        ids = self._group_ids(to_key_array(keys))
        return (np.bincount(ids, weights=counts, minlength=b).astype(np.float64),
                np.bincount(ids, minlength=b).astype(np.float64))

    def _charge_groups(self, pids: npt.NDArray[np.int64], weights: npt.NDArray[np.float64]
                       ) -> None:  # count units on partitions (default: no loads kept)
        pass

    def _make_bounded(self, keys: list[Key], counts: npt.NDArray[np.float64],
                      rows: npt.NDArray[np.float64], nkeys: npt.NDArray[np.float64]) -> None:
        """Give ``keys`` entries and every key group a partition (the first bounded fit),
        by the strategy's rule; default: the keys by :meth:`_place_new`, the groups
        balanced by records around them."""
        pids = np.asarray(self._place_new(keys), dtype=np.int64)
        loads = np.bincount(pids, weights=counts, minlength=self._num_partitions)
        self._set_groups(least_units(loads.astype(np.float64), rows), rows)

    def _set_groups(self, groups: npt.NDArray[np.int32], loads: npt.NDArray[np.float64]
                    ) -> None:
        table = np.asarray(groups, dtype=np.int32).copy()
        table.flags.writeable = False
        self._groups = table
        self._group_loads = np.asarray(loads, dtype=np.float64).copy()
        self._version += 1
        self._lookup_cache = None

    def _record_many(self, keys: list[Key], pids: npt.NDArray[np.int32]) -> None:
        self._table.update(zip(keys, pids.tolist()))
        self._version += len(keys)
        self._lookup_cache = None

    # ------------------------------------------------------------------ serialisation
    def _table_params(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"table": [[encode_key(k), p] for k, p in self._table.items()],
                                   "key_type": self._key_type}
            if self._max_keys != DEFAULT_MAX_KEYS:
                out["max_keys"] = self._max_keys
            if self._groups is not None and self._group_loads is not None:
                out["num_groups"] = self._num_groups
                out["groups"] = self._groups.tolist()
                out["group_loads"] = self._group_loads.tolist()
            return out

    BOUNDED_FIELDS: ClassVar[tuple[str, ...]] = ("max_keys", "num_groups", "groups",
                                                  "group_loads")

    def _load_bounded(self, params: dict[str, Any]) -> None:
        """Restore ``max_keys`` and the groups from stored fields, each checked."""
        if params.get("max_keys") is not None:
            self._max_keys = check_max_keys(params["max_keys"], "stored max_keys")
        groups, loads = params.get("groups"), params.get("group_loads")
        if groups is None and loads is None:
            return
        b = params.get("num_groups")
        if b != self._num_groups:
            raise InvalidArgumentError(
                f"stored num_groups must be {self._num_groups} for {self._num_partitions} "
                f"partitions, got {b!r:.40}")
        if not isinstance(groups, list) or len(groups) != b or not all(
                type(g) is int and 0 <= g < self._num_partitions for g in groups):
            raise InvalidArgumentError(
                f"stored groups must list {b} partition ids in [0, {self._num_partitions})")
        values = check_loads(loads if isinstance(loads, list) else [None], "stored group_loads")
        if values.size != b:
            raise InvalidArgumentError(f"stored group_loads must list {b} loads")
        if len(self._table) > self._max_keys:
            raise InvalidArgumentError(f"a stored bounded table holds at most max_keys="
                                       f"{self._max_keys} entries, got {len(self._table)}")
        self._set_groups(np.asarray(groups, dtype=np.int32), values)

    def _load_table(self, rows: Any) -> None:
        if not isinstance(rows, list):
            raise InvalidArgumentError(f"table must be a list of [key, partition], got {rows!r}")
        if self._load_plain(rows):
            return
        for row in rows:
            if not isinstance(row, list) or len(row) != 2:
                raise InvalidArgumentError(f"table entry {row!r} is not [key, partition]")
            key, pid = row
            k = decode_key(key)
            if isinstance(k, int) and not fits_int64(k):
                raise InvalidArgumentError(
                    f"table entry {short_repr(key)}: an integer key must fit Spark's bigint "
                    f"(a 64-bit signed integer)")
            if (k is None or isinstance(pid, bool) or not isinstance(pid, int)
                    or not 0 <= pid < self._num_partitions):
                raise InvalidArgumentError(
                    f"table entry {key!r}: {pid!r} is not a key with a partition in "
                    f"[0, {self._num_partitions})"
                )
            if k in self._table:
                raise InvalidArgumentError(f"table lists key {key!r} twice")
            self._record(k, pid)

    def _load_plain(self, rows: list[Any]) -> bool:
        """Load a stored table of plain keys at once: into an empty table, every row a
        ``[key, partition]`` list, the keys all ``str`` or all ``int`` and distinct, the
        partitions ints in range. False (nothing loaded) for anything else, which
        :meth:`_load_table` then checks row by row and names. O(rows), no Python loop per row.
        """
        if self._table or not rows or set(map(type, rows)) != {list} \
                or set(map(len, rows)) != {2}:
            return False
        keys, pids = zip(*rows)
        if set(map(type, keys)) not in ({str}, {int}) or set(map(type, pids)) != {int}:
            return False
        if isinstance(keys[0], int) and not (fits_int64(min(keys)) and fits_int64(max(keys))):
            return False  # named row by row
        if min(pids) < 0 or max(pids) >= self._num_partitions or len(set(keys)) != len(keys):
            return False
        self._table.update(zip(keys, pids))
        self._version += len(keys)
        self._lookup_cache = None
        return True

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = dict(self.__dict__)
            state["_table"] = dict(self._table)
        state["_lookup_cache"] = None
        state.pop("_lock", None)
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> TablePartitioner:
        """A deep copy (:meth:`copy`) whose table is copied as one dict: its keys (int, str,
        bytes) and partition ids are immutable, so they are shared, not copied one by one.
        O(keys) in C, where ``copy.deepcopy`` of the dict walks every entry in Python."""
        state = self.__getstate__()  # the table copied under the lock
        table = state.pop("_table")
        other = type(self).__new__(type(self))
        memo[id(self)] = other
        other.__setstate__({**copy.deepcopy(state, memo), "_table": table})
        return other

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_key_type", "auto")
        self.__dict__.setdefault("_max_keys", DEFAULT_MAX_KEYS)
        self.__dict__.setdefault("_num_groups", max(DEFAULT_BLOCKS, self._num_partitions))
        self.__dict__.setdefault("_groups", None)
        self.__dict__.setdefault("_group_loads", None)
        self.__dict__.setdefault("_version", len(self._table))
        self._lookup_cache = None
        self._lock = threading.RLock()
