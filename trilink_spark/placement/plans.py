"""What :func:`~trilink_spark.key_by` builds on the driver, kept while it does not change.

A stream places every micro-batch with the same strategy object. Building the placement's
plan costs driver time on every call: the strategy's partition-id expression (tens of Py4J
round trips on a classic session, a string literal of the whole table for a block strategy)
and, for a table strategy, its ``{key: partition}`` table turned into a broadcast DataFrame
(O(distinct keys) in Python plus an Arrow transfer to the JVM: about 0.1-0.2 s at 100,000
keys). :data:`PLAN_CACHE` keeps both between calls:

- the **table frame**, per (session, table strategy object, :attr:`table_version
  <trilink_spark.TablePartitioner.table_version>`, key column type): a changed table (a key
  placed, a swap's new table, a rebalance) has another version, so a stale frame is never
  served;
- the **expressions** (the partition id, the null guard, the select list), per (session,
  strategy object and the state its expression depends on, key column, its type and
  nullability, the frame's columns); a table strategy's expressions name the table frame's
  columns, never its keys, so they are kept per configuration (class, key type, partitions,
  null policy) and serve a strategy read again from a stored record as well; a bounded
  table's expression holds its group table, so it is kept per object and version.

Only strategies whose placement in the JVM is fixed by what the key names are cached: the
catalogue's own classes (Hash, Modulo, Block, Weight, LeastKey, LeastCount, and Overlay over
one of them); anything else (an :class:`~trilink_spark.AdaptivePartitioner`, a user's
subclass) is built afresh on every call, as before.

A session is named by its JVM session's UUID (classic: a ``foreachBatch`` function gets a new
Python wrapper of the same JVM session every batch) or its session id (Spark Connect), so a
cached frame is served only to the session it was made in. On Spark Connect a plan carries
its local data, so a table of :data:`SERVER_VIEW_KEYS` keys or more is kept, from its second
batch on, as a temporary view of the session (``_tl_table_<uuid>``) that every later plan
names; it is dropped when its entry leaves the cache, and made again should something else
drop it (one round trip per batch checks it). Entries hold weak references to
their strategies (an entry whose strategy was collected is dropped) and at most
:data:`PLAN_CACHE_SIZE` entries of each kind are kept, the least recently used evicted first:
a long stream, or many short-lived strategies, never accumulate plans.

Examples
--------
>>> from trilink_spark.placement.plans import PLAN_CACHE
>>> with PLAN_CACHE.disabled():  # every call builds its plan afresh (benchmarks, debugging)
...     PLAN_CACHE.enabled
False
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from .._internal.deprecation import warn_moved
from .._internal.spark.compat import frame_of_arrow, is_connect
from .._internal.spark.frames import Projection
from ..columns import INTERNAL_PREFIX, TABLE_KEY_COL, TABLE_PID_COL, require_columns
from ..errors import InvalidArgumentError
from ..partitioners import BlockPartitioner, HashPartitioner, LeastCountPartitioner
from ..partitioners import LeastKeyPartitioner, ModuloPartitioner, Partitioner
from ..partitioners import TablePartitioner, WeightPartitioner
from ..partitioners.tables.overlay import OverlayPartitioner

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = ["PLAN_CACHE", "PLAN_CACHE_SIZE", "SERVER_VIEW_KEYS", "PlanCache", "PartitionPlan",
           "Held", "plan_cache_session_key", "strategy_state", "table_frame_of",
           "partition_plan_of", "key_kind", "table_frame"]

logger = logging.getLogger(__name__)

#: Entries of each kind (table frames, expressions) :data:`PLAN_CACHE` keeps.
PLAN_CACHE_SIZE = 4

#: On Spark Connect, tables of at least this many keys are kept as a server-side view (a
#: smaller table travels in each plan for less than the round trip that checks a view).
SERVER_VIEW_KEYS = 10_000

#: Classes whose JVM placement is a function of their table version and configuration only.
_TABLE_CLASSES: tuple[type[Partitioner], ...] = (LeastKeyPartitioner, LeastCountPartitioner,
                                                 WeightPartitioner)
#: Classes that never change after construction.
_FIXED_CLASSES: tuple[type[Partitioner], ...] = (HashPartitioner, ModuloPartitioner,
                                                 BlockPartitioner)

T = TypeVar("T")


@dataclass(frozen=True)
class PartitionPlan:
    """The expressions that place one frame's rows (no DataFrame, no session data).

    Attributes
    ----------
    condition : Column or None
        The join condition of the table frame (by column names), None when no table is
        joined (a stateless strategy, or an empty table).
    select : tuple of Column
        The frame's columns by name and the partition id, :data:`~trilink_spark.PARTITION_COL`.
    partition : Column
        :data:`~trilink_spark.PARTITION_COL` by name (for ``repartitionById``).
    projection : Projection
        ``select`` as one projection (one Py4J command a frame after the first).
    """

    condition: Column | None
    select: tuple[Column, ...]
    partition: Column
    projection: Projection


def strategy_state(p: Partitioner, kind: str = "plan"
                   ) -> tuple[list[Partitioner], Hashable] | None:
    """The objects a strategy's JVM placement depends on, and a token of their state.

    Parameters
    ----------
    p : Partitioner
    kind : {"plan", "frame"}
        What is cached: the expressions, or a table strategy's table frame.

    Returns
    -------
    (objects, token) or None
        ``objects``: the strategies kept by identity (weakly); ``token``: everything about the
        placement that may change in place (a table's version, a bound key type). A table
        strategy's expressions depend on its configuration, never on its table, so they are
        named by configuration alone (no object): a strategy read again from a stored record
        reuses them. None for a strategy whose placement may change in ways no token shows
        (an adaptive strategy, a class outside the catalogue): never cached.

    Notes
    -----
    O(1) (an overlay: O(depth)).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> objects, token = strategy_state(tl.HashPartitioner(4))
    >>> token
    ('HashPartitioner',)
    >>> strategy_state(tl.LeastKeyPartitioner(4), "plan")
    ([], ('LeastKeyPartitioner', 'auto', 4, 'group'))
    >>> strategy_state(tl.AdaptivePartitioner(4)) is None
    True
    """
    cls = type(p)
    if cls in _FIXED_CLASSES:
        return [p], (cls.__name__,)
    if cls in _TABLE_CLASSES and isinstance(p, TablePartitioner):
        if kind == "plan" and p.is_stateful and not p.bounded:
            # the plan of a table is its join: shared by every table of this shape (a
            # bounded table's fallback holds its group table, so its plan is its own)
            return [], (cls.__name__, p.key_type, p.num_partitions, p.null_policy)
        return [p], (cls.__name__, p.table_version, p.key_type, p.is_stateful)
    if cls is OverlayPartitioner and isinstance(p, OverlayPartitioner):
        inner = strategy_state(p.base, "frame")
        if inner is None:
            return None
        return [p, *inner[0]], (cls.__name__, inner[1])
    return None


def plan_cache_session_key(spark: Any) -> Hashable | None:
    """The session part of a :data:`PLAN_CACHE` key: a name of the Spark session ``spark``
    that is the same for every Python object of that one session, so a cached plan serves
    only the session it was made in.

    Classic: the JVM session's UUID (a ``foreachBatch`` function gets a new Python wrapper of
    the same JVM session every batch); Spark Connect: the session id. None when neither can be
    read (nothing is cached then). Not the key of the executors' check
    (:func:`~trilink_spark._internal.spark.executors.executor_environment_key`, one per
    application). Cost: one Py4J call on classic, none on Connect.

    Examples
    --------
    >>> plan_cache_session_key(spark) == plan_cache_session_key(spark)  # doctest: +SKIP
    True
    """
    try:
        if is_connect(spark):
            return ("connect", str(spark.session_id))
        return ("classic", str(spark._jsparkSession.sessionUUID()))
    except Exception as err:  # an older JVM, a stopped session: build without the cache
        logger.debug("no session identity (%s): placement plans are not cached", err)
        return None


@dataclass(frozen=True)
class Held:
    """What a cached value keeps outside the Python process (a server-side view).

    Attributes
    ----------
    alive : callable
        Whether it is still there (something else may have dropped it).
    release : callable
        Drops it; called once, when the entry leaves the cache. Errors are logged, not raised
        (the session may be gone).
    """

    alive: Callable[[], bool]
    release: Callable[[], None]


@dataclass
class _Entry:
    refs: tuple[weakref.ref[Partitioner], ...]
    value: Any
    held: Held | None = None
    keep: Callable[[Any], tuple[Any, Held]] | None = None  # at the second use


def _release(entries: list[_Entry]) -> None:
    for entry in entries:
        if entry.held is not None:
            try:
                entry.held.release()
            except Exception as err:  # a stopped session: nothing left to drop
                logger.debug("could not release a cached placement plan: %s", err)


class PlanCache:
    """Two small LRU maps: table frames and placement expressions (see the module).

    Parameters
    ----------
    size : int
        Entries kept of each kind.

    Attributes
    ----------
    enabled : bool
        False: every call builds afresh (the plans before this cache: a benchmark's
        baseline). Set it with :meth:`disabled`.
    hits, misses : int
        Lookups served from the cache and built, since the start or :meth:`clear`.

    Notes
    -----
    Thread safe. Memory: at most ``size`` table frames (each holds its table in the JVM, or
    in the Connect server's session as a temporary view, about the Arrow size of the table)
    and ``size`` expression sets.
    """

    def __init__(self, size: int = PLAN_CACHE_SIZE) -> None:
        self.size = size
        self.enabled = True
        self.hits = 0
        self.misses = 0
        self._maps: dict[str, OrderedDict[Hashable, _Entry]] = {
            "frame": OrderedDict(), "plan": OrderedDict()}
        self._lock = threading.Lock()
        self._dead: list[tuple[str, Hashable]] = []

    def __len__(self) -> int:
        with self._lock:
            gone = self._purge()
            size = sum(len(m) for m in self._maps.values())
        _release(gone)
        return size

    def clear(self) -> None:
        """Drop every entry (releasing what they hold) and reset the counters. O(entries)."""
        with self._lock:
            gone = [e for m in self._maps.values() for e in m.values()]
            for m in self._maps.values():
                m.clear()
            self._dead.clear()
            self.hits = self.misses = 0
        _release(gone)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Within the block every call builds its plan afresh; the entries stay."""
        before, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = before

    def _purge(self) -> list[_Entry]:
        """Drop the entries of collected strategies (under the lock); returns them."""
        gone = []
        while self._dead:
            kind, key = self._dead.pop()
            entry = self._maps[kind].pop(key, None)
            if entry is not None:
                gone.append(entry)
        return gone

    def get(self, kind: str, spark: Any, p: Partitioner, detail: Hashable,
            build: Callable[[], T], keep: Callable[[T], tuple[T, Held]] | None = None) -> T:
        """The value cached for (``spark``, ``p`` and its state, ``detail``), else
        ``build()``, kept for the next call.

        Parameters
        ----------
        kind : {"frame", "plan"}
            Which map.
        spark : SparkSession
        p : Partitioner
            Kept by identity (weakly) and its :func:`strategy_state` token.
        detail : hashable
            Everything else the value depends on.
        build : callable
            Makes the value (called outside the lock).
        keep : callable, optional
            Turns a kept value into the one to serve from then on and what it holds (a
            server-side view). Called at the value's second use: a value used once (a table
            that changes every batch, an uncached call) never leaves anything behind.

        Notes
        -----
        A hit: one :func:`plan_cache_session_key` (one Py4J call on classic), a dict lookup,
        and the held value's ``alive()`` when it has one.
        """
        if not self.enabled:
            return build()
        state = strategy_state(p, kind)
        session = plan_cache_session_key(spark) if state is not None else None
        if state is None or session is None:
            return build()
        objects, token = state
        key = (session, tuple(id(o) for o in objects), token, detail)
        with self._lock:
            gone = self._purge()
            entries = self._maps[kind]
            entry = entries.get(key)
            if entry is not None and not all(r() is o for r, o in zip(entry.refs, objects)):
                entry = None
            if entry is not None:
                entries.move_to_end(key)
        _release(gone)
        if entry is not None and entry.keep is not None:
            return self._promote(kind, key, entry, entry.keep)  # type: ignore[no-any-return]
        if entry is not None and (entry.held is None or entry.held.alive()):
            with self._lock:
                self.hits += 1
            return entry.value  # type: ignore[no-any-return]
        with self._lock:
            self.misses += 1
        value = build()
        dead = self._dead

        def forget(_: object, kind: str = kind, key: Hashable = key) -> None:
            dead.append((kind, key))  # list.append only: safe from a collector's callback

        fresh = _Entry(tuple(weakref.ref(o, forget) for o in objects), value, None, keep)
        with self._lock:
            gone = self._purge()
            entries = self._maps[kind]
            old = entries.pop(key, None)
            if old is not None:
                gone.append(old)
            entries[key] = fresh
            while len(entries) > self.size:
                gone.append(entries.popitem(last=False)[1])
        _release(gone)
        return value

    def _promote(self, kind: str, key: Hashable, entry: _Entry,
                 keep: Callable[[Any], tuple[Any, Held]]) -> Any:
        """The second use of ``entry``: keep what ``keep`` (its own) makes of its value."""
        value, held = keep(entry.value)
        with self._lock:
            self.hits += 1
            if entry.keep is not None and self._maps[kind].get(key) is entry:
                entry.value, entry.held, entry.keep = value, held, None
                return value
        # another thread promoted it, or it left the cache meanwhile: serve, drop ours
        _release([_Entry((), value, held)])
        return entry.value


#: The cache :func:`~trilink_spark.key_by` uses.
PLAN_CACHE = PlanCache()


def _server_view(frame: DataFrame) -> tuple[DataFrame, Held]:
    """On Spark Connect, ``frame`` as a temporary view of its session, broadcast.

    A Connect plan carries its local data: a table frame joined as it is would send the
    whole table to the server, and the server would convert it again, with every batch
    (about 0.3 s at 100,000 keys). The view holds it on the server once; each plan then
    names it. The view (``_tl_table_<uuid>``) is dropped when the entry leaves the cache, and
    made again should something else drop it.
    """
    from pyspark.sql import functions as F

    spark = frame.sparkSession
    name = f"{INTERNAL_PREFIX}table_{uuid.uuid4().hex}"
    frame.createOrReplaceTempView(name)

    def alive() -> bool:
        return bool(spark.catalog.tableExists(name))

    def release() -> None:
        spark.catalog.dropTempView(name)

    return F.broadcast(spark.table(name)), Held(alive, release)


def table_frame_of(spark: Any, table: TablePartitioner, detail: Hashable,
                   build: Callable[[], DataFrame]) -> DataFrame:
    """``build()``'s broadcast table frame of ``table``, or the one cached for this session,
    this table object and its version and ``detail`` (the key column's kind and type). On
    Spark Connect the frame kept is a temporary view of the session (:func:`_server_view`)."""
    view = is_connect(spark) and len(table) >= SERVER_VIEW_KEYS
    return PLAN_CACHE.get("frame", spark, table, detail, build, _server_view if view else None)


def partition_plan_of(spark: Any, p: Partitioner, detail: Hashable,
                      build: Callable[[], PartitionPlan]) -> PartitionPlan:
    """``build()``'s :class:`PartitionPlan` for ``p``, or the one cached for this session,
    this strategy and its state and ``detail`` (key, its type, the frame's columns)."""
    return PLAN_CACHE.get("plan", spark, p, detail, build)


def __getattr__(name: str) -> Any:
    """``session_key``, this module's name of :func:`plan_cache_session_key` until it was
    renamed (it was in this module's ``__all__``): it still resolves, with a
    :class:`DeprecationWarning`, until the next minor release."""
    if name == "session_key":
        warn_moved(f"{__name__}.session_key", f"{__name__}.plan_cache_session_key")
        return plan_cache_session_key
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def key_kind(df: DataFrame, key: str) -> tuple[str | None, DataType]:
    """The key kind a strategy sees for column ``key`` (``"int"``, ``"long"``, ``"string"``,
    ``"binary"``, or ``None`` for any other type) and the column's Spark type.

    A string column under a collation other than ``UTF8_BINARY`` is ``None``: its equality
    (``groupBy``'s) and ``hash()`` disagree, so only Hash places it.

    Raises :class:`~trilink_spark.errors.MissingColumnError` when ``key`` is not a column,
    :class:`~trilink_spark.errors.InvalidArgumentError` when Spark would resolve it as more
    than one (a duplicate name, or another case while ``spark.sql.caseSensitive`` is off).
    O(columns).
    """
    from pyspark.sql import types as T

    require_columns(df, [key], "key column")
    same = [c for c in df.columns if c.lower() == key.lower()]
    if len(same) > 1 and (same.count(key) > 1 or str(df.sparkSession.conf.get(
            "spark.sql.caseSensitive", "false")).lower() != "true"):
        raise InvalidArgumentError(
            f"key column {key!r} is ambiguous: the DataFrame has the columns {same}, which "
            "Spark resolves as the same name; rename or drop all but one first "
            "(df.withColumnRenamed, df.drop)")
    dtype = df.schema[key].dataType
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType)):
        return "int", dtype
    if isinstance(dtype, T.LongType):
        return "long", dtype
    if isinstance(dtype, T.StringType):
        # under another collation Spark's equality (and so its counts) and hash() disagree:
        # such keys can be hashed, never counted into a table
        if getattr(dtype, "collation", "UTF8_BINARY") != "UTF8_BINARY":
            return None, dtype
        return "string", dtype
    if isinstance(dtype, T.BinaryType):
        return "binary", dtype
    return None, dtype


def table_frame(spark: Any, p: TablePartitioner, kind: str, dtype: DataType) -> DataFrame:
    """``p``'s entries as a broadcast frame of (:data:`TABLE_KEY_COL` of ``dtype``,
    :data:`TABLE_PID_COL`), without the keys a ``dtype`` column cannot hold. O(keys)."""
    from pyspark.sql import functions as F

    keys, pids = p.table_arrays()
    want = {"int": int, "long": int, "string": str, "binary": bytes}[kind]
    bits = {"byte": 8, "short": 16, "integer": 32}.get(dtype.typeName(), 64)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)
    arrow_type = {"int": pa.int64(), "long": pa.int64(), "string": pa.string(),
                  "binary": pa.binary()}[kind]
    if set(map(type, keys)) <= {want}:  # one kind of key, the usual table: no loop per key
        key_array = pa.array(keys, type=arrow_type)
        mask = np.ones(len(keys), bool)
        if want is int and bits < 64:
            values = key_array.to_numpy(zero_copy_only=False)
            mask = (values >= low) & (values < high)
            key_array = key_array.filter(pa.array(mask))
    else:
        def fits(k: object) -> bool:  # keys the column cannot hold can never match a row
            return isinstance(k, want) and (want is not int or low <= k < high)  # type: ignore[operator]

        mask = np.fromiter((fits(k) for k in keys), bool, len(keys))
        key_array = pa.array([k for k, m in zip(keys, mask) if m], type=arrow_type)
    table = pa.table({TABLE_KEY_COL: key_array, TABLE_PID_COL: pa.array(pids[mask])})
    frame = frame_of_arrow(spark, table)
    return F.broadcast(frame.select(F.col(TABLE_KEY_COL).cast(dtype).alias(TABLE_KEY_COL),
                                    F.col(TABLE_PID_COL)))
