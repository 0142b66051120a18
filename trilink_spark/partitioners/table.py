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
"""

from __future__ import annotations

import copy
import logging
import threading
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from ..errors import InvalidArgumentError, InvalidKeyTypeError
from .keys import DEFAULT_NULL_POLICY, Key, KeyArray, key_index, normalize_key
from .keys import to_key_array
from .base import Partitioner, decode_key, encode_key
from .hash import check_key_type, spark_hash_array, spark_hash_of

__all__ = ["TablePartitioner", "in_spark_task"]

logger = logging.getLogger(__name__)


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

    Notes
    -----
    Memory: one dict entry per distinct key placed (about 100-150 bytes each in CPython), plus a
    pandas index built lazily for vectorised lookups. A known key costs an O(1) expected lookup.

    Thread safety: placing new keys (``partition``, ``assign`` and ``fit`` on the driver) holds
    the strategy's lock and checks the table again inside it, so threads sharing one strategy
    place each key once and agree on where it went. Lookups of known keys read the table
    without the lock. A copy (``copy()``, pickling) has its own lock.
    """

    learned_fields: ClassVar[tuple[str, ...]] = ("table",)
    #: ``"auto"`` hashes an int column's unknown keys as ``long``, on every path
    #: (:meth:`fallback_type`).
    auto_int_key_type: ClassVar[str] = "long"

    def __init__(
        self, num_partitions: int, *, key_type: str = "auto",
        null_policy: str = DEFAULT_NULL_POLICY,
    ) -> None:
        super().__init__(num_partitions, null_policy=null_policy)
        self._key_type = check_key_type(key_type)
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
        return spark_hash_of(key, self.fallback_type(kind)) % self._num_partitions

    def _partition(self, key: Key) -> int:
        pid = self._table.get(key)
        if pid is not None:
            return pid
        if in_spark_task():
            logger.debug("key %r unknown inside a Spark task: hash fallback", key)
            return self._fallback(key)
        with self._lock:
            pid = self._table.get(key)  # another thread may have placed it meanwhile
            return pid if pid is not None else self._place_new([key])[0]

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
        if in_spark_task():
            out[unknown] = self._fallback_array(keys, unknown)
            return out
        with self._lock:
            # look again inside the lock: another thread may have placed some of them
            objs, out, unknown = self._known(keys)
            if unknown.any():
                codes, uniques = pd.factorize(objs[unknown])
                new_keys = [normalize_key(k) for k in uniques.tolist()]
                placed = np.asarray(self._place_new(new_keys), dtype=np.int32)  # type: ignore[arg-type]
                out[unknown] = placed[codes]
        return out

    def _fallback_array(
        self, keys: KeyArray, rows: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.int32]:
        sub = KeyArray(kind=keys.kind, arrow=keys.arrow.filter(pa.array(rows)), null_mask=None)
        hashes = spark_hash_array(sub, self.fallback_type(keys.kind)).astype(np.int64)
        return np.mod(hashes, self._num_partitions).astype(np.int32)

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

    # ------------------------------------------------------------------ serialisation
    def _table_params(self) -> dict[str, Any]:
        with self._lock:
            return {"table": [[encode_key(k), p] for k, p in self._table.items()],
                    "key_type": self._key_type}

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
        self.__dict__.setdefault("_version", len(self._table))
        self._lookup_cache = None
        self._lock = threading.RLock()
