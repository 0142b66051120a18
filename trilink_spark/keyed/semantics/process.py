"""Keyed process functions on keyed watermarks (the Trilink paper, §4.1, the template pattern).

:class:`KeyedWatermarkProcessFunction` separates what every stateful keyed operator repeats
(tracking each key's watermark, telling late rows from on-time ones, firing timers) from what a
user writes: three hooks, called per key with that key's rows of a batch as a pandas DataFrame.
Its shape follows PySpark's ``StatefulProcessor``: lifecycle hooks (``open``, ``close``) and a
handle, :class:`KeyedContext`, that gives out the key's state, timers and watermark.

**Semantics.** Within a partition, rows are taken in arrival order. A key's watermark is the
largest event time of its earlier rows minus ``delay``; a row below it is *late*
(``process_late``), otherwise *on time* (``process_on_time``). Rows with a null event time are
never late and move no watermark. After a key's rows of a batch, its timers at or below its new
watermark fire in time order (``on_timer``). The partition-level verdict (a single watermark
over every key of the partition, as Spark or Flink would keep) is counted beside it, so the two
can be compared.

**Idle keys.** A key is idle when its partition's newest event time has moved on by more than
``idle_timeout`` since the key's last row arrived (a key that keeps sending is never idle, however
far its clock lags). An idle key's watermark is moved up to the partition's watermark and its
due timers fire, so a key that stopped sending does not keep its windows open for ever. If it
sends again, its rows are judged against that advanced watermark. Idleness is checked at the
end of each batch.

**Per-key or vectorised.** By default the runtime calls the per-key hooks. A processor that
overrides :meth:`~KeyedWatermarkProcessFunction.process_rows` runs *vectorised* instead: it gets
each batch whole, as a :class:`KeyedRows` (every row's key and late verdict), and emits from
:meth:`~KeyedWatermarkProcessFunction.on_watermark`, asking :meth:`KeyedRuntime.watermarks`
which keys' watermarks passed a time (:class:`~trilink_spark.KeyedWindowAggregate` does so).
Both ways are driven by the same two functions of :class:`KeyedRuntime`, so they share one
semantics: :meth:`KeyedRuntime.judge` (lateness and the advance of each key's high-water mark)
and :meth:`KeyedRuntime.watermarks` (the idle rule).

**Keys.** The per-key hooks (and ``ctx.key``) get each key in its column's type: ``None``
for the null key (a key of its own under the null policy ``"group"``), exact ``int`` values
for an integer column (beside a null too, where pandas would make them floats),
``float("nan")`` for the NaN key of a floating column (a key apart from the null key, as in
Spark's ``groupBy``) and ``0.0`` for ``-0.0``. A vectorised processor sees the runtime's own
identities in :class:`KeyedRows` (``keys``, ``row_keys``, ``key_array``): the null key is
:data:`~trilink_spark.keyed.semantics.keys.NULL_KEY`, a float NaN object, and the NaN key
:data:`~trilink_spark.keyed.semantics.keys.NAN_KEY`; ``batch.user_keys`` converts them. In ``rows``
the key column of a task's batch is exact too: pandas' nullable ``Int64`` (and so on) for an
integer column holding a null, nullable ``Float64`` for a floating column. What a hook
returns goes to the sink through pandas and Arrow, as ``applyInPandas`` output does: ``None``
and NaN in a row are null there, so a NaN key emitted in a double column arrives as null.

**Units.** Event times, watermarks and timers are numbers: microseconds since the epoch for
timestamp columns, the column's own unit for numeric ones. Hooks find a row's event time in
the column :data:`EVENT_TIME_COL`.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from ...columns import EVENT_TIME_COL
from ...errors import InvalidArgumentError
from .keys import NAN_KEY, NULL_KEY, PartitionState, check_value, object_array
from .keys import user_key
from .timers import TimerService

__all__ = [
    "EVENT_TIME_COL",
    "KeyedRows",
    "KeyedContext",
    "KeyedWatermarkProcessFunction",
    "KeyedRuntime",
    "KeyWatermarks",
    "RuntimeCounters",
]

Output = pd.DataFrame | Iterable[Any] | None
#: Keys as :meth:`KeyedRuntime.watermarks` takes them: a sequence, a numpy array or a pandas
#: Index or Series.
KeysLike = Sequence[Hashable] | NDArray[Any] | pd.Index | pd.Series


def _scalar(value: Any) -> Hashable:
    """A key as the hooks see it: numpy scalars become Python ones."""
    out: Hashable = value.item() if isinstance(value, np.generic) else value
    return out


def _factorize(keys: KeysLike) -> tuple[NDArray[np.intp], list[Hashable], NDArray[np.object_]]:
    """Each entry's index into the distinct keys (in order of first appearance), and those keys
    as a list and as an object array, as the runtime identifies them: the null key
    :data:`~trilink_spark.keyed.semantics.keys.NULL_KEY`; in a masked floating column (the task's
    key column), NaN :data:`~trilink_spark.keyed.semantics.keys.NAN_KEY`, a key of its own, and
    ``-0.0`` the key ``0.0`` (as Spark's ``groupBy`` has them); a plain float NaN is missing,
    as pandas has it. One Python step per distinct key at most."""
    if isinstance(keys, (np.ndarray, pd.Index, pd.Series)):
        values: Any = keys
    else:
        values = object_array(list(keys))
    codes, uniques = pd.factorize(values, sort=False, use_na_sentinel=False)
    plain = uniques.dtype != object or pd.api.types.infer_dtype(uniques, skipna=False) in (
        "string", "bytes", "empty")
    if plain:  # Python scalars already, none of them a sequence
        distinct: list[Hashable] = uniques.tolist()
    else:
        distinct = [_scalar(u) for u in uniques.tolist()]
    missing = pd.isna(uniques)
    for i in np.flatnonzero(missing).tolist():  # one null key object, so it finds its state again
        distinct[i] = NULL_KEY
    if uniques.dtype.kind == "f":  # what is left of NaN is a NaN key; -0.0 + 0.0 is 0.0
        for i in np.flatnonzero(~np.asarray(missing, dtype=bool)).tolist():
            value = distinct[i]
            distinct[i] = NAN_KEY if value != value else value + 0.0  # type: ignore[operator]
    if plain:  # no sequence among them: filled without a Python loop
        array = np.empty(len(distinct), dtype=object)
        array[:] = distinct
    else:
        array = object_array(distinct)
    return np.asarray(codes, dtype=np.intp), distinct, array


def _grouping(codes: NDArray[np.intp], n_keys: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Row positions sorted by key (stable: arrival order within a key) and each key's bounds
    in them: key ``i``'s rows are ``order[bounds[i]:bounds[i + 1]]``."""
    order = np.argsort(codes, kind="stable").astype(np.intp)
    counts = np.bincount(codes, minlength=n_keys)
    bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.intp)
    return order, bounds


@dataclass(frozen=True, eq=False)
class KeyedRows:
    """One partition's batch of rows as the runtime judged it (argument of
    :meth:`KeyedWatermarkProcessFunction.process_rows`).

    Attributes
    ----------
    rows : pandas.DataFrame
        The batch in arrival order, with :data:`EVENT_TIME_COL`.
    keys : list of Hashable
        The batch's distinct keys in order of first arrival, as the runtime identifies them
        (Python scalars; integers exact): the null key is
        :data:`~trilink_spark.keyed.semantics.keys.NULL_KEY` (a float NaN object, so
        ``pd.isna`` finds it) and a floating column's NaN key
        :data:`~trilink_spark.keyed.semantics.keys.NAN_KEY` (not a float: pandas would take it
        for missing). Pass them as they are to :meth:`KeyedRuntime.watermarks`, and use them
        as the first index level of a keyed table in ``runtime.shared``; :attr:`user_keys`
        gives them as the per-key hooks get them (``None``, ``nan``).
    codes : numpy.ndarray of intp
        Each row's key, as an index into ``keys``.
    event_time : numpy.ndarray of float64
        Each row's event time; NaN where it is null.
    late : numpy.ndarray of bool
        Each row's verdict: its event time is below its key's watermark, the largest event
        time of the key's earlier rows (this batch's and before) minus ``delay``. Null event
        times are never late.
    watermark_before : numpy.ndarray of float64
        Per distinct key, its watermark before the batch (``-inf`` for a key never seen).
    key_array : numpy.ndarray of object, optional
        ``keys`` as an object array (made from ``keys`` when not given).

    Notes
    -----
    Made by :meth:`KeyedRuntime.judge`, which has already counted the late rows and advanced
    each key's high-water mark. :attr:`row_keys` costs O(rows) once (then cached), and
    :meth:`positions` O(rows log rows).

    Examples
    --------
    >>> class Nothing(KeyedWatermarkProcessFunction):
    ...     def process_on_time(self, key, rows, ctx):
    ...         return None
    >>> rt = KeyedRuntime(Nothing(), "k", delay=1, idle_timeout=math.inf)
    >>> batch = rt.judge(pd.DataFrame({"k": ["a", "b", "a", "a"],
    ...                                EVENT_TIME_COL: [5.0, 1.0, 9.0, 7.0]}))
    >>> batch.keys, batch.codes.tolist(), batch.late.tolist()
    (['a', 'b'], [0, 1, 0, 0], [False, False, False, True])
    >>> batch.row_keys.tolist(), [p.tolist() for p in batch.positions()]
    (['a', 'b', 'a', 'a'], [[0, 2, 3], [1]])
    """

    rows: pd.DataFrame
    keys: list[Hashable]
    codes: NDArray[np.intp]
    event_time: NDArray[np.float64]
    late: NDArray[np.bool_]
    watermark_before: NDArray[np.float64]
    key_array: NDArray[np.object_] | None = field(default=None, repr=False)

    @cached_property
    def row_keys(self) -> NDArray[np.object_]:
        """Each row's key (an object array)."""
        keys = self.key_array if self.key_array is not None else object_array(self.keys)
        return keys[self.codes]

    @cached_property
    def user_keys(self) -> list[Hashable]:
        """:attr:`keys` as the per-key hooks get them: ``None`` for the null key,
        ``float("nan")`` for the NaN key, every other key itself. O(distinct keys) once."""
        return [user_key(k) for k in self.keys]

    @property
    def on_time(self) -> NDArray[np.bool_]:
        """Rows that are not late (null event times included, as ``process_on_time`` gets them)."""
        return ~self.late

    def positions(self) -> list[NDArray[np.intp]]:
        """Row positions of each key of :attr:`keys`, in arrival order."""
        order, bounds = _grouping(self.codes, len(self.keys))
        return [order[bounds[i]:bounds[i + 1]] for i in range(len(self.keys))]


@dataclass(frozen=True, eq=False)
class KeyWatermarks:
    """What :meth:`KeyedRuntime.watermarks` says about keys: one entry per key it was given.

    Attributes
    ----------
    watermark : numpy.ndarray of float64
        The key's watermark now: its highest event time minus ``delay`` (``-inf`` for a key
        never seen) or, for an idle key, the partition's watermark; ``+inf`` once bounded input
        ended.
    idle : numpy.ndarray of bool
        Whether the key is idle (module docs).
    due : numpy.ndarray of bool
        Whether the entry's time is at or below its watermark (all False when no times were
        given).
    """

    watermark: NDArray[np.float64]
    idle: NDArray[np.bool_]
    due: NDArray[np.bool_]


class KeyedContext:
    """The handle a hook receives: the current key's state, timers and watermark.

    Attributes
    ----------
    key : Hashable
        The key as the hook gets it: ``None`` for the null key, ``float("nan")`` for the NaN
        key of a floating column, an exact ``int`` for an integer column (also beside a null).
    """

    __slots__ = ("_runtime", "key", "_key", "_judged")

    def __init__(self, runtime: KeyedRuntime, key: Hashable,
                 judged: float | None = None) -> None:
        self._runtime = runtime
        self._key = key  # the runtime's own identity of the key (NULL_KEY, NAN_KEY)
        self.key = user_key(key)
        self._judged = judged

    @property
    def watermark(self) -> float:
        """The key's watermark (``-inf`` before its first row).

        In ``process_on_time`` and ``process_late`` it is the watermark the rows were judged
        against (the key's watermark before the batch); in ``on_timer`` and ``on_end``, the
        key's current one.
        """
        if self._judged is not None:
            return self._judged
        return self._runtime.key_watermark(self._key)

    @property
    def partition_watermark(self) -> float:
        """The watermark a single per-partition watermark would have now."""
        return self._runtime.partition_high - self._runtime.delay

    def get_state(self, name: str, default: Any = None) -> Any:
        """The key's value ``name`` (``default`` when unset)."""
        return self._runtime.values.get(self._key, {}).get(name, default)

    def set_state(self, name: str, value: Any) -> None:
        """Set the key's value ``name`` (kept across batches in streaming).

        With a declared ``state_schema`` the value must fit its field's type; without one it
        must be JSON-representable, and comes back as JSON gives it (tuples as lists).

        Raises
        ------
        StateTypeError
            ``name`` is not declared, or ``value`` does not fit its declared type.
        """
        check_value(name, value, self._runtime.value_fields, self.key)
        self._runtime.values.setdefault(self._key, {})[name] = value

    def clear_state(self, name: str | None = None) -> None:
        """Drop one value of the key, or all of them."""
        values = self._runtime.values
        if name is None:
            values.pop(self._key, None)
            return
        mine = values.get(self._key)
        if mine is not None:
            mine.pop(name, None)
            if not mine:
                del values[self._key]

    def register_timer(self, timestamp: int) -> bool:
        """Fire ``on_timer`` once the key's watermark reaches ``timestamp`` (O(log n))."""
        return self._runtime.timers.register(self._key, int(timestamp))

    def delete_timer(self, timestamp: int) -> bool:
        return self._runtime.timers.delete(self._key, int(timestamp))

    def timers(self) -> list[int]:
        """The key's registered timers, ascending."""
        return self._runtime.timers.timers_of(self._key)


class KeyedWatermarkProcessFunction(ABC):
    """Template for keyed processing on keyed watermarks: subclass and fill in the hooks.

    Set :attr:`output_schema` (a Spark DDL string or ``StructType``) to the rows the hooks
    return. Each hook returns ``None``, a pandas DataFrame, or an iterable of rows (tuples or
    dicts in schema order). Configuration lives in the instance and must pickle (it is shipped
    to executors); per-key data lives in the state the context gives out. Set
    :attr:`state_schema` (Spark DDL, e.g. ``"n long, last double"``) to store per-key values
    in typed columns; without it they are stored as JSON.

    The per-key hooks (``process_on_time``, ``process_late``, ``on_timer``, ``on_end``) cost
    one Python call per key and hook in each batch. A processor with many keys per partition
    can override :meth:`process_rows` instead, to handle a batch vectorised (module docs).

    Examples
    --------
    >>> class CountOnTime(KeyedWatermarkProcessFunction):
    ...     output_schema = "key string, n long"
    ...     def process_on_time(self, key, rows, ctx):
    ...         ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
    ...         return None
    ...     def on_end(self, key, ctx):
    ...         return [(key, ctx.get_state("n", 0))]
    """

    output_schema: Any = None
    #: Spark DDL of the per-key values (``ctx.set_state``); None: JSON values.
    state_schema: str | None = None

    def input_columns(self) -> Sequence[str] | None:
        """The input columns the hooks read besides the key (``None``, the default: all).

        A processor that names them lets only those cross the keyed exchange and into Python
        (with the key and the event time); the rows its hooks get then hold just those.
        """
        return None

    def open(self, partition_id: int) -> None:
        """Called once per partition and batch before any row."""

    @abstractmethod
    def process_on_time(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        """Rows of ``key`` at or above its watermark, in arrival order."""

    def process_late(self, key: Hashable, rows: pd.DataFrame, ctx: KeyedContext) -> Output:
        """Rows of ``key`` below its watermark (default: dropped; the runtime counts them)."""
        return None

    def on_timer(self, key: Hashable, timestamp: int, ctx: KeyedContext) -> Output:
        """A timer of ``key`` whose time the key's watermark reached."""
        return None

    def on_end(self, key: Hashable, ctx: KeyedContext) -> Output:
        """Bounded (batch) input only: called for every key with state when input ends,
        after its timers fired with an infinite watermark."""
        return None

    def process_rows(self, batch: KeyedRows, runtime: KeyedRuntime) -> Output:
        """The vectorised hook: all of a partition's rows of one batch, already judged.

        Override it to run vectorised: the runtime then calls it once per batch instead of
        ``process_late`` and ``process_on_time`` once per key (``process_on_time`` must still
        be defined, as it is abstract, but is not called). The runtime has judged the batch
        with :meth:`KeyedRuntime.judge` exactly as for the per-key hooks: ``batch.late`` is
        each row's verdict, late rows are counted and every key's high-water mark has moved.
        Keep per-partition data in ``runtime.shared``: a pandas DataFrame whose first index
        level is the key, or a :class:`~trilink_spark.keyed.semantics.tables.KeyedColumns`
        (numpy columns, no index to build), is per-key state (it moves with its keys when
        partitions are swapped); any other value must be JSON-representable and stays with
        its partition. Both are kept
        between micro-batches and emit what the new watermarks complete from :meth:`on_watermark`.
        Do not judge lateness or idleness here: that is the runtime's.

        Parameters
        ----------
        batch : KeyedRows
            The rows, each row's key (``batch.codes`` into ``batch.keys``, or
            ``batch.row_keys``), event time and late verdict.
        runtime : KeyedRuntime
            The partition's runtime: ``shared``, ``watermarks``, ``counters``.

        Returns
        -------
        None, pandas.DataFrame or iterable of rows
            Rows to emit now.

        Notes
        -----
        Cost: the runtime's part is O(rows) vectorised (a factorize of the keys and a grouped
        running maximum) plus one dict read and write per distinct key; the hook is one Python
        call per batch, so a processor written with numpy or pandas makes no Python call per
        key or row. Timers registered on ``runtime.timers`` still fire through ``on_timer``.

        Examples
        --------
        Count each key's late rows; emit the counts when input ends:

        >>> class LateCounts(KeyedWatermarkProcessFunction):
        ...     output_schema = "k string, late long"
        ...     def process_on_time(self, key, rows, ctx):  # abstract, but not called
        ...         raise NotImplementedError
        ...     def process_rows(self, batch, runtime):
        ...         per_key = np.bincount(batch.codes, weights=batch.late,
        ...                               minlength=len(batch.keys))
        ...         totals = runtime.shared.setdefault("late", {})
        ...         for key, n in zip(batch.keys, per_key.tolist()):  # one step per key
        ...             totals[key] = totals.get(key, 0) + int(n)
        ...     def on_watermark(self, runtime):
        ...         return sorted(runtime.shared["late"].items()) if runtime.ended else None
        >>> rt = KeyedRuntime(LateCounts(), "k", delay=1, idle_timeout=math.inf)
        >>> rt.process(pd.DataFrame({"k": ["a", "b", "a", "a"],
        ...                          EVENT_TIME_COL: [5.0, 1.0, 9.0, 7.0]}))
        [None, None]
        >>> rt.finish()
        [[('a', 1), ('b', 0)]]
        """
        return None

    def on_watermark(self, runtime: KeyedRuntime) -> Output:
        """Called after each batch, once its watermarks moved, and once at the end of input.

        After a batch: its rows were handled (per-key hooks or :meth:`process_rows`) and due
        timers fired, those of idle keys included. At the end of bounded input
        (:meth:`KeyedRuntime.finish`) it is called last, with ``runtime.ended`` True: every
        watermark is then ``+inf``. Ask :meth:`KeyedRuntime.watermarks` which keys'
        watermarks reached a time (it applies the idle rule). Default: nothing.

        Returns
        -------
        None, pandas.DataFrame or iterable of rows

        Notes
        -----
        Cost: one Python call per batch (plus what the processor does).

        Examples
        --------
        >>> class Watermarks(KeyedWatermarkProcessFunction):
        ...     def process_on_time(self, key, rows, ctx):
        ...         return None
        ...     def on_watermark(self, runtime):
        ...         marks = runtime.watermarks(["a", "b"])
        ...         return [tuple(marks.watermark.tolist())]
        >>> rt = KeyedRuntime(Watermarks(), "k", delay=1, idle_timeout=math.inf)
        >>> rt.process(pd.DataFrame({"k": ["a", "b", "a"], EVENT_TIME_COL: [5.0, 1.0, 9.0]}))[-1]
        [(8.0, 0.0)]
        """
        return None

    def close(self) -> None:
        """Called once per partition and batch after the last row."""

    def bind(self, schema: Any, key: str, event_time: str, time_kind: str) -> None:
        """Called on the driver with the input schema before the job runs (e.g. to derive
        :attr:`output_schema` from the key's type). ``time_kind``: "timestamp", "integral" or
        "fractional"."""

    def state_config(self) -> dict[str, Any]:
        """The configuration stored with the state: a restart with another one is refused.

        Default: the instance's public attributes that are JSON values (numbers, strings,
        booleans, None, and lists or tuples of them). Override to choose.
        """
        def plain(value: Any) -> bool:
            if value is None or isinstance(value, (bool, int, float, str)):
                return True
            return isinstance(value, (list, tuple)) and all(plain(v) for v in value)

        return {name: list(v) if isinstance(v, tuple) else v
                for name, v in sorted(vars(self).items())
                if not name.startswith("_") and plain(v)}

    def state_wake(self, table: Any) -> Any:
        """Per stored key, the earliest event time at which this processor needs the key's
        state although the key sent no rows (its timers aside, which the runtime knows).

        The executor-local store (:mod:`~trilink_spark.keyed.durable.local_sync`) reads a key that
        sent no rows only when its watermark can reach this time (once the key is idle) or
        one of its timers. Default None: a key with rows in a ``runtime.shared`` table is
        read at every batch once it is idle (correct for any processor, at the cost of
        reading those keys); a per-key processor's state waits for its rows or timers.

        Parameters
        ----------
        table : pyarrow.Table
            Stored state rows (:mod:`~trilink_spark.keyed.durable.codec`'s columns).

        Returns
        -------
        numpy.ndarray of float or None
            One time per row (``inf``: nothing pending). Cost: vectorised, O(rows).
        """
        return None

    @property
    def vectorised(self) -> bool:
        """Whether the class overrides :meth:`process_rows` (then the runtime calls it rather
        than the per-key hooks)."""
        return type(self).process_rows is not KeyedWatermarkProcessFunction.process_rows

    def process_batch(self, runtime: KeyedRuntime, frame: pd.DataFrame) -> list[Output]:
        """All of a partition's rows of one batch: the runtime's entry point.

        The default runs the per-key hooks (:meth:`KeyedRuntime.run_per_key`) or, for a
        :attr:`vectorised` processor, :meth:`process_rows` (:meth:`KeyedRuntime.run_vectorised`).
        Overriding this method itself still works (it was the way to vectorise before
        :meth:`process_rows`), but the override must then judge lateness itself: prefer
        :meth:`process_rows`.
        """
        if self.vectorised:
            return runtime.run_vectorised(frame)
        return runtime.run_per_key(frame)

    def finish_batch(self, runtime: KeyedRuntime) -> list[Output]:
        """End of bounded input (see :meth:`on_end` and :meth:`on_watermark`); overridden
        together with :meth:`process_batch`, if at all."""
        return runtime.finish_per_key()


@dataclass
class RuntimeCounters:
    """Rows seen, late by the key watermark, and late by the partition watermark."""

    rows: int = 0
    late: int = 0
    late_partition: int = 0


class KeyedRuntime:
    """One partition's keyed state and the loop that drives a processor over it.

    The runtime owns the semantics (module docs): :meth:`judge` is the one lateness rule and
    :meth:`watermarks` the one idle rule, for per-key and vectorised processors alike.

    Parameters
    ----------
    processor : KeyedWatermarkProcessFunction
    key : str
        Key column of the frames :meth:`process` receives.
    delay : float
        Allowed lateness in internal units.
    idle_timeout : float
        How far the partition's event time may move on without a row of a key before the key
        counts as idle (module docs).
    state : PartitionState, optional
        A :meth:`snapshot` to resume from (decoded from a stored table by
        :func:`~trilink_spark.keyed.durable.codec.decode_state`).
    value_fields : dict of str to pyarrow.DataType, optional
        The processor's declared ``state_schema``, field by field: ``ctx.set_state`` checks
        values against it.
    processing_time : float, optional
        The batch's processing time (ms since the epoch), recorded by the driver: every key
        of the batch gets it in :attr:`batch_time` (for a processing-time TTL). None: the
        keys of the batch lose theirs (the run keeps none).

    Notes
    -----
    Cost per batch: one vectorised pass for lateness (:meth:`judge`), then one Python call per
    key per hook (not per row), or one call in all for a vectorised processor. Memory: per key
    seen, its highest event time and when it last sent (two dict entries; about 200 bytes in
    memory, ~40 bytes stored) plus whatever state and timers the processor keeps.
    """

    def __init__(
        self,
        processor: KeyedWatermarkProcessFunction,
        key: str,
        delay: float,
        idle_timeout: float,
        state: PartitionState | None = None,
        value_fields: dict[str, Any] | None = None,
        processing_time: float | None = None,
    ) -> None:
        self.processor = processor
        self.processing_time = processing_time
        self.key_column = key
        self.delay = float(delay)
        self.idle_timeout = float(idle_timeout)
        self.value_fields = value_fields
        restored = state if state is not None else PartitionState()
        self.key_high: dict[Hashable, float] = restored.key_high
        self.partition_high: float = restored.partition_high
        self.values: dict[Hashable, dict[str, Any]] = restored.values
        self.timers = TimerService.from_list(restored.timers)
        self.counters = RuntimeCounters(**{k: int(v) for k, v in restored.counters.items()
                                           if k in ("rows", "late", "late_partition")})
        #: Rows each key sent so far (a load measure for rebalancing).
        self.key_rows: dict[Hashable, int] = restored.key_rows
        #: Partition state of a vectorised processor: keyed DataFrames move with their keys,
        #: other (JSON) values stay with the partition.
        self.shared: dict[str, Any] = restored.shared
        #: Partition's newest event time when each key last sent a row (for idleness).
        self.last_seen: dict[Hashable, float] = restored.last_seen
        #: Processing time of the last batch that brought each key a row (``processing_time``).
        self.batch_time: dict[Hashable, float] = restored.batch_time
        #: True once bounded input ended (:meth:`finish`): every watermark is then ``+inf``.
        self.ended = False

    def key_watermark(self, key: Hashable) -> float:
        """The key's own watermark: its highest event time minus ``delay`` (no idle rule)."""
        return self.key_high.get(key, -math.inf) - self.delay

    def snapshot(self) -> PartitionState:
        """The partition's state (watermarks, user state, timers, counters), to store with
        :func:`~trilink_spark.keyed.durable.codec.encode_state`. Its dicts are the runtime's own,
        not copies: encode them before the runtime processes more rows."""
        c = self.counters
        return PartitionState(
            key_high=self.key_high, last_seen=self.last_seen, key_rows=self.key_rows,
            values=self.values, timers=[(k, int(t)) for k, t in self.timers.to_list()],
            partition_high=self.partition_high,
            counters={"rows": c.rows, "late": c.late, "late_partition": c.late_partition},
            shared=self.shared, batch_time=self.batch_time)

    # ------------------------------------------------------------------ the semantics
    def judge(self, frame: pd.DataFrame) -> KeyedRows:
        """Judge a batch by its keys' watermarks and advance them: the one lateness rule.

        A row is late when its event time is below its key's watermark: the largest event time
        of the key's earlier rows (this batch's and before) minus ``delay``. Null (NaN) event
        times are never late and move no watermark. Afterwards the late rows are counted,
        every key of the batch has its highest event time in :attr:`key_high` and the
        partition's newest event time in :attr:`last_seen` (when it last sent, for the idle
        rule of :meth:`watermarks`) and the batch's processing time in :attr:`batch_time`.

        Parameters
        ----------
        frame : pandas.DataFrame
            The batch in arrival order, with the key column and :data:`EVENT_TIME_COL`.

        Returns
        -------
        KeyedRows

        Notes
        -----
        Cost: O(rows) vectorised over every key at once (a factorize of the keys and a grouped
        running maximum), plus one dict read and one write per distinct key.

        Examples
        --------
        >>> class Nothing(KeyedWatermarkProcessFunction):
        ...     def process_on_time(self, key, rows, ctx):
        ...         return None
        >>> rt = KeyedRuntime(Nothing(), "k", delay=1, idle_timeout=math.inf)
        >>> rt.judge(pd.DataFrame({"k": ["a", "a"], EVENT_TIME_COL: [5.0, 3.0]})).late.tolist()
        [False, True]
        >>> rt.judge(pd.DataFrame({"k": ["a", "b"], EVENT_TIME_COL: [3.5, 0.0]})).late.tolist()
        [True, False]
        >>> rt.key_high, rt.counters.late
        ({'a': 5.0, 'b': 0.0}, 2)
        """
        et = frame[EVENT_TIME_COL].to_numpy(dtype=np.float64)
        codes, keys, key_array = _factorize(frame[self.key_column])
        prior = np.array([self.key_high.get(k, -math.inf) for k in keys], dtype=np.float64)
        filled = np.where(np.isnan(et), -np.inf, et)
        running = pd.Series(filled).groupby(codes, sort=False).cummax()
        # the largest event time of each row's earlier rows of its key (NaN: none this batch)
        earlier = running.groupby(codes, sort=False).shift(1).to_numpy(dtype=np.float64)
        before = np.fmax(earlier, prior[codes])
        late = et < before - self.delay  # NaN event times compare False: never late
        high = prior.copy()
        np.maximum.at(high, codes, filled)
        self.counters.late += int(np.count_nonzero(late))
        self.key_high.update(zip(keys, high.tolist()))
        self.last_seen.update(dict.fromkeys(keys, self.partition_high))
        if self.processing_time is not None:
            self.batch_time.update(dict.fromkeys(keys, self.processing_time))
        elif self.batch_time:  # a time from a run that kept them is no longer the last one
            for k in keys:
                self.batch_time.pop(k, None)
        sent = np.bincount(codes, minlength=len(keys)).tolist()
        rows = self.key_rows
        rows.update([(k, rows.get(k, 0) + n) for k, n in zip(keys, sent)])
        return KeyedRows(frame, keys, codes, et, late, prior - self.delay, key_array)

    def watermarks(self, keys: KeysLike, times: ArrayLike | None = None) -> KeyWatermarks:
        """The current watermark of each of ``keys``: the one idle rule.

        A key's watermark is its highest event time minus ``delay``; when the key is idle (the
        partition's newest event time moved on by more than ``idle_timeout`` since the key's
        last row) it is the partition's watermark instead. Once bounded input ended
        (:attr:`ended`) every watermark is ``+inf``.

        With ``times`` (one per entry of ``keys``), ``due`` says which entries' times their
        key's watermark reached, and an idle key with a due entry catches up: its high-water
        mark is raised to the partition's, so the rows it sends later are judged against the
        advanced watermark.

        Parameters
        ----------
        keys : sequence, numpy.ndarray, pandas.Index or pandas.Series
            Keys, repeats allowed (e.g. one entry per open window or timer).
        times : array-like of float, optional
            One time per entry (a window end, a timer).

        Returns
        -------
        KeyWatermarks
            One entry per entry of ``keys``.

        Raises
        ------
        InvalidArgumentError
            ``times`` is not one number per key.

        Notes
        -----
        Cost: O(n) vectorised for ``n`` entries (a factorize of the keys), plus two dict reads
        per distinct key and one write per idle key that catches up.

        Examples
        --------
        >>> class Nothing(KeyedWatermarkProcessFunction):
        ...     def process_on_time(self, key, rows, ctx):
        ...         return None
        >>> rt = KeyedRuntime(Nothing(), "k", delay=1, idle_timeout=10)
        >>> _ = rt.process(pd.DataFrame({"k": ["quiet", "busy"], EVENT_TIME_COL: [3.0, 4.0]}))
        >>> _ = rt.process(pd.DataFrame({"k": ["busy"], EVENT_TIME_COL: [30.0]}))
        >>> marks = rt.watermarks(["quiet", "busy", "quiet"], [10.0, 40.0, 35.0])
        >>> marks.watermark.tolist(), marks.idle.tolist(), marks.due.tolist()
        ([29.0, 29.0, 29.0], [True, False, True], [True, False, False])
        >>> rt.key_high["quiet"]  # it caught up
        30.0
        """
        n = len(keys)
        when = None if times is None else np.asarray(times, dtype=np.float64)
        if when is not None and when.shape != (n,):
            raise InvalidArgumentError(
                f"times must hold one number per key ({n}), got shape {when.shape}"
            )
        if self.ended:
            watermark = np.full(n, np.inf)
            due = np.zeros(n, dtype=bool) if when is None else when <= watermark
            return KeyWatermarks(watermark, np.zeros(n, dtype=bool), due)
        codes, distinct, _ = _factorize(keys)
        high = np.array([self.key_high.get(k, -math.inf) for k in distinct], dtype=np.float64)
        seen = np.array([self.last_seen.get(k, -math.inf) for k in distinct], dtype=np.float64)
        idle = self._idle(seen)
        mark = np.where(idle, self.partition_high - self.delay, high - self.delay)
        watermark = mark[codes]
        if when is None:
            return KeyWatermarks(watermark, idle[codes], np.zeros(n, dtype=bool))
        due = when <= watermark
        reached = np.zeros(len(distinct), dtype=bool)
        reached[codes[due]] = True
        for i in np.flatnonzero(reached & idle).tolist():  # idle keys follow the partition
            key = distinct[i]
            self.key_high[key] = max(self.key_high.get(key, -math.inf), self.partition_high)
        return KeyWatermarks(watermark, idle[codes], due)

    def _idle(self, last_seen: NDArray[np.float64]) -> NDArray[np.bool_]:
        """The idle rule over keys' :attr:`last_seen` values (module docs)."""
        with np.errstate(invalid="ignore"):  # -inf - -inf: NaN, not idle
            idle: NDArray[np.bool_] = self.partition_high - last_seen > self.idle_timeout
        return idle

    def is_idle(self, key: Hashable) -> bool:
        """Whether the partition moved on by more than ``idle_timeout`` since ``key``'s last row."""
        seen = np.array([self.last_seen.get(key, -math.inf)], dtype=np.float64)
        return bool(self._idle(seen)[0])

    # ------------------------------------------------------------------ driving
    def process(self, frame: pd.DataFrame) -> list[Output]:
        """Run one batch of rows (in arrival order, with :data:`EVENT_TIME_COL`)."""
        out: list[Output] = []
        if len(frame) == 0:
            return out
        et = frame[EVENT_TIME_COL].to_numpy(dtype=np.float64)
        valid = ~np.isnan(et)
        filled = np.where(valid, et, -np.inf)
        running = np.maximum.accumulate(np.concatenate(([self.partition_high], filled)))
        self.counters.late_partition += int(np.count_nonzero(et < running[:-1] - self.delay))
        self.partition_high = float(running[-1])
        self.counters.rows += len(frame)
        return self.processor.process_batch(self, frame)

    def run_per_key(self, frame: pd.DataFrame) -> list[Output]:
        """The template loop: :meth:`judge` the batch, then per key its hooks and its due
        timers, then idle keys' timers and ``on_watermark``."""
        batch = self.judge(frame)
        processor = self.processor
        out: list[Output] = []
        order, bounds = _grouping(batch.codes, len(batch.keys))
        ordered = frame.take(order)  # one sort; each key's rows are then a slice, as in groupby
        ordered_late = batch.late[order]
        for i, key in enumerate(batch.keys):
            rows = ordered.iloc[bounds[i]:bounds[i + 1]]
            late = ordered_late[bounds[i]:bounds[i + 1]]
            ctx = KeyedContext(self, key, judged=float(batch.watermark_before[i]))
            if late.any():
                out.append(processor.process_late(ctx.key, rows[late], ctx))
            if not late.all():
                out.append(processor.process_on_time(ctx.key, rows[~late], ctx))
            out.extend(self._fire(key, self.key_watermark(key), KeyedContext(self, key)))
        out.extend(self._fire_idle())
        out.append(processor.on_watermark(self))
        return out

    def run_vectorised(self, frame: pd.DataFrame) -> list[Output]:
        """The vectorised loop: :meth:`judge` the batch, ``process_rows``, due timers (of the
        batch's keys, then of idle keys), then ``on_watermark``."""
        batch = self.judge(frame)
        processor = self.processor
        out: list[Output] = [processor.process_rows(batch, self)]
        if self.timers:
            for key in batch.keys:
                out.extend(self._fire(key, self.key_watermark(key), KeyedContext(self, key)))
        out.extend(self._fire_idle())
        out.append(processor.on_watermark(self))
        return out

    def _fire(self, key: Hashable, watermark: float, ctx: KeyedContext) -> list[Output]:
        fired: list[Output] = []
        due = [ts for ts in self.timers.timers_of(key) if ts <= watermark]
        while due:
            for ts in due:
                self.timers.delete(key, ts)
                fired.append(self.processor.on_timer(ctx.key, ts, ctx))
            due = [ts for ts in self.timers.timers_of(key) if ts <= watermark]  # set in on_timer
        return fired

    def _fire_idle(self) -> list[Output]:
        """Timers of idle keys fire at their watermark, the partition's (:meth:`watermarks`)."""
        # no timers, no idle key (infinite timeout) or no finite partition watermark: nothing
        # fires (an infinite newest event time, from an infinite input value, fires none either)
        if not self.timers or not math.isfinite(self.idle_timeout) \
                or not math.isfinite(self.partition_high):
            return []
        # only timers at or below the partition watermark can be due for an idle key
        watermark = self.partition_high - self.delay
        pending = list(itertools.takewhile(lambda timer: timer[1] <= watermark, self.timers))
        if not pending:
            return []
        keys = [key for key, _ in pending]
        marks = self.watermarks(keys, [float(ts) for _, ts in pending])
        chosen: dict[Hashable, float] = {}
        for key, pick, mark in zip(keys, (marks.due & marks.idle).tolist(),
                                   marks.watermark.tolist()):
            if pick and key not in chosen:
                chosen[key] = mark
        out: list[Output] = []
        for key, mark in chosen.items():
            out.extend(self._fire(key, mark, KeyedContext(self, key)))
        return out

    def finish(self) -> list[Output]:
        """End of bounded input: every watermark goes to infinity (the processor's
        :meth:`~KeyedWatermarkProcessFunction.finish_batch`)."""
        return self.processor.finish_batch(self)

    def finish_per_key(self) -> list[Output]:
        """End of input for per-key and vectorised processors alike: :attr:`ended` is set,
        timers of every key fire with an infinite watermark, then ``on_end`` per key with
        state, then ``on_watermark``."""
        self.ended = True
        out: list[Output] = []
        for key in list(dict.fromkeys(k for k, _ in self.timers)):
            self.key_high[key] = math.inf
            out.extend(self._fire(key, math.inf, KeyedContext(self, key)))
        for key in list(self.values):
            ctx = KeyedContext(self, key)
            out.append(self.processor.on_end(ctx.key, ctx))
        out.append(self.processor.on_watermark(self))
        return out

    def _check(self) -> None:
        """Invariant checker (for tests): watermark bookkeeping, counters and timers agree."""
        unknown = set(self.last_seen) - set(self.key_high)
        if unknown:
            raise AssertionError(f"keys with a last row but no high-water mark: {unknown}")
        if not self.ended:
            above = [k for k, high in self.key_high.items() if high > self.partition_high]
            if above:
                raise AssertionError(f"keys above the partition's high-water mark: {above}")
        if any(seen > self.partition_high for seen in self.last_seen.values()):
            raise AssertionError("a key was last seen after the partition's newest event time")
        c = self.counters
        if not (0 <= c.late <= c.rows and 0 <= c.late_partition <= c.rows):
            raise AssertionError(f"counters out of range: {c}")
        self.timers._check()
