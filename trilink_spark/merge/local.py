"""Local Merge: time-slot pre-aggregation on the map side, before the keyed exchange.

Trilink paper, §4.3 (1), Figure 11 (b), Table 7. Within each input partition, rows of one key
in one time slot are merged into one partial row (see :mod:`~trilink_spark.merge.aggregates`)
before anything is shuffled. A merged row carries the largest event time of its rows, so watermarks
downstream stay right, and a flush emits its slots in time order. When a buffer is flushed
depends on the mode:

============== ================================================ =======================
mode           flush when                                       suits (Table 7)
============== ================================================ =======================
groups         the buffer would hold more than ``max_groups``   batch DataFrames: the
               (key, slot) groups                               fewest partial rows
quantity       ``quantity`` rows were merged                    throughput
periodic       the oldest buffered row is ``delay`` older than  low latency
               the newest one seen
punctuation    a row matches ``punctuation`` (flushed with it)  window boundaries
============== ================================================ =======================

In the groups and quantity modes with count, sum, min, max and mean, the Arrow batches are
aggregated by Arrow's hash aggregation as they arrive, in chunks of 262,144 rows
(:class:`ArrowMerge`), and only partial rows are held; a groups-mode buffer is flushed before the batch whose groups would pass
``max_groups`` (batch by batch, where the pandas pass cuts at the row). Every mode also flushes
at the end of the partition. The default, ``mode="auto"``, takes the mode its arguments ask
for (``punctuation=``, ``delay=`` or ``quantity=`` given), else ``"groups"`` for a batch
DataFrame (with the default ``max_groups`` of 1,000,000, each key's
rows of one slot in a partition become one partial row unless the partition has more groups
than that) and ``"quantity"`` (the paper's) for a streaming one. ``max_groups`` bounds what
costs memory in a buffer, its groups (one partial row each, whatever the rows merged into
them); ``quantity`` bounds rows instead, so with many keys it flushes a slot in several
pieces. Merging the output with
:func:`~trilink_spark.merge_partials` gives exactly what aggregating the raw rows gives.

``engine="spark"`` (or ``spark.trilink.mergeEngine=spark``) computes the same partial rows,
one per (input partition, key, slot), with Spark's own partial aggregation in the JVM instead
(batch DataFrames, groups mode, count, sum, min, max and mean): no row crosses into Python, at
the price of one exchange of the partial rows.

Rows whose event time is null, NaN or infinite are kept: they go to a slot of their own,
``slot_start`` null, with a null event time, and they move nothing that depends on time (no
flush bound, no slot, no watermark downstream). Null and NaN keys are keys like any other
(Spark's ``groupBy`` semantics: null and NaN are two keys, ``-0.0`` and ``0.0`` one).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from ..columns import CONST_TIME_COL, ET_COL, INTERNAL_PREFIX, ORDER_COL, POS_COL, PUNCT_COL
from ..columns import GROUP_COL, SLOT_COL
from ..columns import check_atomic_key, check_user_columns, require_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .._internal.optiming import OperatorTimer, Stopwatch, operator_timer, task_identity
from ..eventtime import SPARK_TIME_TYPES, delay_in_units, event_time_micros, from_units
from ..eventtime import MAX_EXACT, event_time_whole
from ..columns import column_of, quoted
from .expressions import AggSpec, parse_aggs
from .partials import arrow_partials, partial_groups

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["local_merge", "MERGE_MODES", "MERGE_ENGINES", "AUTO_MODE", "DEFAULT_MAX_GROUPS",
           "flush_bounds", "plan_merge", "MergePlan",
           "partition_flushes", "partition_partials", "Flushes", "read_partition", "source_rows",
           "arrow_to_pandas", "check_merge_names", "to_arrow", "ArrowMerge"]

logger = logging.getLogger(__name__)

#: Flush modes (Trilink paper, §4.3, Table 7).
MERGE_MODES: tuple[str, ...] = ("groups", "quantity", "periodic", "punctuation")
#: ``mode="auto"``: ``"groups"`` for a batch DataFrame, ``"quantity"`` for a streaming one.
AUTO_MODE = "auto"
#: Engines of :func:`local_merge`: ``"python"`` merges inside each input partition (no
#: exchange, every mode); ``"spark"`` has Spark's own partial aggregation compute the same
#: partial rows (batch DataFrames, groups mode; one exchange of the partial rows).
MERGE_ENGINES: tuple[str, ...] = ("python", "spark")
#: ``spark.trilink.mergeEngine``: the engine :func:`local_merge` uses when ``engine`` is not
#: given; where the Spark engine cannot run the call, the Python engine does.
ENGINE_CONF = "mergeEngine"
#: Quantity mode's rows per flush when ``quantity`` is not given.
DEFAULT_QUANTITY = 10_000
#: Default bound of the ``"groups"`` mode: buffered (key, slot) groups per partition.
DEFAULT_MAX_GROUPS = 1_000_000
#: Output column: the start of each partial row's time slot.
SLOT = "slot_start"
#: Inside Local Merge: the internal slot of a row without a (finite) event time, kept in the
#: null slot (a row with a NaN slot and no event time is not merged).
_UNTIMED_SLOT = float("inf")


#: Periodic mode: rows ahead of every position checked by one vectorised sweep; a flush that
#: turns out longer is found by a galloping scan from its start (a tuning constant).
_SHORT_REACH = 16
#: First chunk of a galloping scan, in rows (doubled at each step).
_FIRST_CHUNK = 64


def flush_bounds(
    et: np.ndarray, mode: str, quantity: int, delay: float, punct: np.ndarray | None,
    groups: np.ndarray | None = None, max_groups: int = DEFAULT_MAX_GROUPS,
) -> list[int]:
    """End positions (exclusive) of the flushes of one partition's rows, in arrival order.

    Parameters
    ----------
    et : numpy.ndarray
        Event times (float, NaN for none) in arrival order.
    mode : {"quantity", "periodic", "punctuation"}
    quantity : int
        Quantity mode: rows per flush.
    delay : float
        Periodic mode: a flush ends before the first row that makes the largest minus the
        smallest event time of the flush exceed ``delay`` (rows without a time never do).
    punct : numpy.ndarray of bool, optional
        Punctuation mode: a flush ends after each row where it is true.
    groups : numpy.ndarray of int, optional
        Groups mode: each row's (key, slot) group code.
    max_groups : int
        Groups mode: a flush ends before the row that would make it hold more groups.

    Returns
    -------
    list of int
        Increasing ends; the last is ``len(et)`` (none for no rows).

    Notes
    -----
    Cost: O(n) numpy work in every mode, with no Python step per row. Periodic mode makes one
    vectorised sweep that finds, for every row, where a flush starting there ends when that is
    within a few rows; a walk over the flushes (one Python step each) then takes those, and
    scans ahead of a longer flush's start in chunks that double (a galloping search), so each
    row is scanned O(1) times whatever the order of the event times.

    Examples
    --------
    >>> flush_bounds(np.arange(5.0), "quantity", 2, 0.0, None)
    [2, 4, 5]
    >>> flush_bounds(np.array([0.0, 1, 5, 6, 20]), "periodic", 0, 4.0, None)
    [2, 4, 5]
    >>> flush_bounds(np.zeros(6), "groups", 0, 0.0, None, np.array([0, 1, 0, 2, 1, 0]), 2)
    [3, 5, 6]
    """
    for what, bound, used in (("quantity", quantity, mode == "quantity"),
                              ("max_groups", max_groups, mode == "groups")):
        integral = isinstance(bound, (int, np.integer)) and not isinstance(bound, bool)
        if used and (not integral or bound < 1):
            raise InvalidArgumentError(f"{what} must be an int >= 1, got {bound!r}")
    n = len(et)
    if n == 0:
        return []
    if mode == "quantity":
        bounds = list(range(quantity, n, quantity))
    elif mode == "groups":
        if groups is None or len(groups) != n:
            raise InvalidArgumentError("groups mode needs a group code per row")
        bounds = _group_bounds(np.asarray(groups, dtype=np.int64), max_groups)
    elif mode == "punctuation":
        ends = np.flatnonzero(punct) + 1 if punct is not None else np.zeros(0, dtype=np.int64)
        bounds = [int(e) for e in ends[ends < n]]
    elif mode == "periodic":
        if not delay >= 0:
            raise InvalidArgumentError(f"delay must be >= 0, got {delay!r}")
        bounds = _periodic_bounds(np.asarray(et, dtype=np.float64), float(delay))
    else:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MERGE_MODES)}, got {mode!r}")
    return bounds + [n]


def _group_bounds(codes: np.ndarray, max_groups: int) -> list[int]:
    """Groups-mode flush starts after the first row: each flush is as long as it can be with
    at most ``max_groups`` distinct codes. O(n log n): one stable sort for each row's previous
    occurrence, then a galloping scan per flush (a window that doubles until it holds the
    first code beyond the bound), so each row is scanned O(1) times."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    prev = np.full(n, -1, dtype=np.int64)
    same = codes[order[1:]] == codes[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    bounds: list[int] = []
    start = 0
    while start < n:
        width = max(_FIRST_CHUNK, 2 * max_groups)
        while True:
            fresh = np.flatnonzero(prev[start:start + width] < start)
            if len(fresh) > max_groups:
                end = start + int(fresh[max_groups])
                break
            if start + width >= n:
                end = n
                break
            width *= 2
        if end < n:
            bounds.append(end)
        start = end
    return bounds


def _periodic_bounds(et: np.ndarray, delay: float) -> list[int]:
    """Periodic flush starts after the first row (see :func:`flush_bounds`)."""
    n = len(et)
    top = np.where(np.isnan(et), -np.inf, et)  # a row without a time never raises the max
    bottom = np.where(np.isinf(top), np.inf, top)  # nor lowers the min
    with np.errstate(invalid="ignore"):  # inf - inf: no spread, as NaN > delay is false
        short = _short_ends(top, bottom, delay)
        bounds: list[int] = []
        start = 0
        while start < n:
            step = short[start]
            start = start + step if step else _scan_end(top, bottom, start, delay)
            if start < n:
                bounds.append(start)
    return bounds


def _short_ends(top: np.ndarray, bottom: np.ndarray, delay: float) -> list[int]:
    """For every row i, the d <= _SHORT_REACH such that a flush starting at i ends before row
    i + d, or 0 when it does not end within that reach (one sweep per d, over the rows still
    open; O(n * _SHORT_REACH) at most)."""
    n = len(top)
    ends = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    hi, lo = top.copy(), bottom.copy()
    still = np.ones(n, dtype=bool)  # aligned with idx: not ended yet
    contiguous = True  # idx is still 0..len-1, so row i + d is a slice
    for d in range(1, min(_SHORT_REACH, n - 1) + 1):
        k = n - d if contiguous else int(np.searchsorted(idx, n - d))
        idx, hi, lo, still = idx[:k], hi[:k], lo[:k], still[:k]
        ahead = slice(d, d + k) if contiguous else idx + d
        np.maximum(hi, top[ahead], out=hi)
        np.minimum(lo, bottom[ahead], out=lo)
        over = (hi - lo) > delay
        over &= still
        ends[idx[over]] = d
        still &= ~over
        left = int(np.count_nonzero(still))
        if not left:
            break
        if left < k // 2:  # drop the ended rows once they are most
            idx, hi, lo, still = idx[still], hi[still], lo[still], still[still]
            contiguous = False
    result: list[int] = ends.tolist()
    return result


def _scan_end(top: np.ndarray, bottom: np.ndarray, start: int, delay: float) -> int:
    """Where a flush starting at ``start`` ends: scans chunks of doubling size (galloping),
    O(length of the flush); ``len(top)`` when it runs to the end."""
    n = len(top)
    hi, lo = -np.inf, np.inf
    begin, size = start, _FIRST_CHUNK
    while begin < n:
        stop = min(n, begin + size)
        run_hi = np.maximum.accumulate(top[begin:stop])
        np.maximum(run_hi, hi, out=run_hi)
        run_lo = np.minimum.accumulate(bottom[begin:stop])
        np.minimum(run_lo, lo, out=run_lo)
        over = np.flatnonzero(run_hi - run_lo > delay)
        if len(over):
            return begin + int(over[0])
        hi, lo = float(run_hi[-1]), float(run_lo[-1])
        begin, size = stop, size * 2
    return n


@dataclass(frozen=True)
class MergePlan:
    """What the partition function of a validated merge needs (picklable; no DataFrame)."""

    key: str
    specs: list[AggSpec]
    mode: str
    quantity: int
    delay: float
    time_kind: str
    time_name: str
    names: list[str]
    out_schema: Any
    arrow_schema: Any
    max_groups: int = DEFAULT_MAX_GROUPS
    #: Source columns that travel under internal names (dotted or backticked names), mapped
    #: to the user's names: :func:`partition_partials` gives the names back.
    aliases: dict[str, str] = field(default_factory=dict)
    #: Slot length in event-time units: slots are computed from the event time inside the
    #: partition (one column less crosses from the JVM).
    slot_units: float = 0.0


def source_rows(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """A partition's source rows with arrival positions (the rows arrive in arrival order,
    sorted by ``order_by`` in the JVM when given; numbered as Spark's
    ``monotonically_increasing_id``, the partition id in the upper bits, so first and last
    compare across partitions as before) and each row's slot start
    (:data:`_UNTIMED_SLOT` for rows without a finite event time), computed as Spark's
    ``et - pmod(et, slot)`` in doubles. Rows that have both are returned as they are; else a
    shallow copy with the columns added (the caller's frame is not changed). O(rows),
    vectorised."""
    if POS_COL in rows.columns and (SLOT_COL in rows.columns or ET_COL not in rows.columns):
        return rows
    rows = rows.copy(deep=False)
    if POS_COL not in rows.columns:
        partition = task_identity()[1]
        rows[POS_COL] = (np.int64(partition) << np.int64(33)) + np.arange(len(rows),
                                                                          dtype=np.int64)
    if SLOT_COL not in rows.columns and ET_COL in rows.columns:
        rows[SLOT_COL] = _slot_starts(_floats(rows[ET_COL]), float(plan.slot_units))
    return rows


def _slot_starts(et: np.ndarray, size: float) -> np.ndarray:
    """Each event time's slot start, as Spark's ``et - pmod(et, size)`` in doubles;
    :data:`_UNTIMED_SLOT` where ``et`` is NaN. Vectorised, O(len(et))."""
    with np.errstate(invalid="ignore"):
        # Spark's Pmod for doubles: r = a % n (Java's %, C's fmod); r < 0 ? (r + n) % n : r.
        # Adding n to a positive remainder would round (0.1 % 3 -> 0.10000000000000009)
        # and -0.0 would keep its sign: both differ from Spark's slot
        rem = np.fmod(et, size)
        rem = np.where(rem < 0, np.fmod(rem + size, size), rem)
        start = et - rem
    slots: np.ndarray = np.where(np.isnan(et), _UNTIMED_SLOT, start)
    return slots


def _user_columns(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """``rows`` of the merge's source with the user's column names (see ``plan.aliases``)."""
    return rows.rename(columns=plan.aliases) if plan.aliases else rows


class Flushes(NamedTuple):
    """The partial rows of every flush of one partition (see :func:`partition_partials`).

    ``frame`` has the columns of the plan's output, flushes in order and each flush's rows in
    slot order; ``flush`` numbers each row's flush (0, 1, ... over the flushes that have rows);
    ``consumed`` is how many leading input rows were flushed (the rest is a kept tail).
    """

    frame: pd.DataFrame
    flush: np.ndarray
    consumed: int

    def pieces(self) -> Iterator[pd.DataFrame]:
        """One frame per flush, in order (slices of ``frame``; O(flushes))."""
        if not len(self.frame):
            return
        cuts = (np.flatnonzero(np.diff(self.flush)) + 1).tolist()
        for start, end in zip([0, *cuts], [*cuts, len(self.frame)]):
            yield self.frame.iloc[start:end]


def partition_partials(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool = False) -> Flushes:
    """One input partition's rows (arrival order) to the partial rows of all its flushes.

    With ``keep_tail`` the rows after the last flush point are not flushed (a streaming
    buffer keeps them for the next micro-batch; see :func:`buffered_rows`).

    Notes
    -----
    Cost: the flush bounds (:func:`flush_bounds`, O(n)), then ONE pandas group-by over
    (flush, key, slot) for every flush together and one stable sort of the groups into flush
    then slot order: O(n log n) vectorised, whatever the number of flushes.

    Examples
    --------
    >>> flushed = partition_partials(rows, plan)  # doctest: +SKIP
    >>> [len(piece) for piece in flushed.pieces()]  # doctest: +SKIP
    [3, 2]
    """
    rows = source_rows(rows, plan)
    if not len(rows):
        return Flushes(pd.DataFrame(columns=plan.names), np.zeros(0, dtype=np.int64), 0)
    rows = _user_columns(rows, plan)
    ends = _flush_ends(rows, plan, keep_tail)
    consumed = ends[-1] if ends else 0
    part = rows.iloc[:consumed]
    flush_of_row = np.repeat(np.arange(len(ends)), np.diff([0, *ends]))
    timed = part[ET_COL].notna().to_numpy()
    timed |= _floats(part[SLOT_COL]) == _UNTIMED_SLOT  # rows without a time: the null slot
    if not timed.all():
        part, flush_of_row = part[timed], flush_of_row[timed]
    if not len(part):
        return Flushes(pd.DataFrame(columns=plan.names), np.zeros(0, dtype=np.int64), consumed)
    # rows without an event time have a null slot: a group of its own (dropna=False)
    out = partial_groups(part, [flush_of_row, plan.key, SLOT_COL], plan.specs, ET_COL, POS_COL)
    flush = out.index.get_level_values(0).to_numpy(dtype=np.int64)
    slot = _floats(out.index.get_level_values(2))
    slot[slot == _UNTIMED_SLOT] = np.nan
    order = np.argsort(slot, kind="stable")  # within a flush: slot order, then first seen
    order = order[np.argsort(flush[order], kind="stable")]
    out = out.iloc[order]
    flush = flush[order]
    frame = out.reset_index(drop=True)
    keys = out.index.get_level_values(1)
    if len(keys) and keys.isna().all():  # pandas makes an all-null level float: keep None
        keys = pd.Index(np.full(len(keys), None, dtype=object))
    elif pd.api.types.is_float_dtype(keys.dtype):  # Spark's key of -0.0 and 0.0 is 0.0
        keys = keys + 0.0
    frame[plan.key] = keys
    frame[plan.time_name] = _times(_floats(frame[ET_COL]), plan.time_kind)
    frame[SLOT] = _times(slot[order], plan.time_kind)
    numbers = np.zeros(len(flush), dtype=np.int64)  # dense: flushes with no rows get none
    numbers[1:] = np.cumsum(flush[1:] != flush[:-1])
    return Flushes(frame[plan.names], numbers, consumed)


def _floats(values: Any) -> np.ndarray:
    """Numbers (any numeric pandas dtype, nulls included) as float64, NaN for null."""
    if isinstance(values, (pd.Series, pd.Index)):
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(values, dtype=np.float64)


def _times(units: np.ndarray, kind: str) -> Any:
    """:func:`~trilink_spark.eventtime.from_units`, null where ``units`` is NaN."""
    missing = np.isnan(units)
    if not missing.any():
        return from_units(units, kind)
    values = from_units(np.where(missing, 0.0, units), kind)
    if kind == "timestamp":
        return pd.Series(values).mask(missing).to_numpy()
    if kind == "integral":
        return pd.arrays.IntegerArray(np.asarray(values, dtype=np.int64), missing)
    return pd.arrays.FloatingArray(np.where(missing, 0.0, units), missing)


def partition_flushes(
    rows: pd.DataFrame, plan: MergePlan, keep_tail: bool = False
) -> Iterator[pd.DataFrame]:
    """One input partition's rows (arrival order) to its flushes of partial rows.

    With ``keep_tail`` the rows after the last flush point are not flushed (a streaming
    buffer keeps them for the next micro-batch; see :func:`buffered_rows`).

    Notes
    -----
    Cost: :func:`partition_partials` (one group-by for every flush), then one slice per
    flush. Callers that need no per-flush pieces use ``partition_partials`` directly.
    """
    yield from partition_partials(rows, plan, keep_tail).pieces()


def _flush_ends(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool) -> list[int]:
    et = rows[ET_COL].to_numpy(dtype=np.float64)
    punct = rows[PUNCT_COL].fillna(False).to_numpy(dtype=bool) if PUNCT_COL in rows else None
    groups: np.ndarray | None = None
    if plan.mode == "groups":
        codes = rows.groupby([plan.key, SLOT_COL], sort=False, dropna=False).ngroup()
        groups = codes.to_numpy(dtype=np.int64)
    bounds = flush_bounds(et, plan.mode, plan.quantity, plan.delay, punct, groups,
                          plan.max_groups)
    if keep_tail:
        bounds = bounds[:-1]  # the last bound is the end of the rows: keep that tail
        if plan.mode == "punctuation" and punct is not None and len(punct) and punct[-1]:
            bounds.append(len(rows))  # a punctuation row ends the input: nothing is left
    return bounds


def buffered_rows(rows: pd.DataFrame, plan: MergePlan) -> pd.DataFrame:
    """The rows :func:`partition_flushes` with ``keep_tail`` leaves for the next batch."""
    ends = (_flush_ends(_user_columns(source_rows(rows, plan), plan), plan, True)
            if len(rows) else [])
    last = ends[-1] if ends else 0
    return rows.iloc[last:]


def _nullable_dtype(arrow_type: Any) -> Any:
    """pandas' nullable dtype for an Arrow integer, float or boolean type (else None)."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        return pd.api.types.pandas_dtype(str(arrow_type).capitalize().replace("Uint", "UInt"))
    if pa.types.is_float32(arrow_type):
        return pd.Float32Dtype()
    if pa.types.is_float64(arrow_type):
        return pd.Float64Dtype()
    if pa.types.is_boolean(arrow_type):
        return pd.BooleanDtype()
    return None


def arrow_to_pandas(table: Any) -> pd.DataFrame:
    """An Arrow table as pandas with nullable dtypes for integers, floats and booleans.

    Integers stay exact (not float64 because of a null) and NaN stays a value distinct from
    null, as Spark keeps them; the internal event-time and slot columns, if there, become
    float64 with NaN for null. Cost: one Arrow conversion, O(rows).
    """
    frame: pd.DataFrame = table.to_pandas(types_mapper=_nullable_dtype)
    for col in (ET_COL, SLOT_COL):
        if col in frame.columns:
            frame[col] = _floats(frame[col])
    return frame


def to_arrow(frame: pd.DataFrame, schema: Any) -> Any:
    """``frame`` as an Arrow table of ``schema`` (no index).

    A column pandas made float64 only because all its values are null (an all-null group
    level, a reindexed reduction) is given as nulls to a non-numeric field, instead of having
    Arrow reinterpret its bytes. Cost: one Arrow conversion, O(rows).
    """
    import pyarrow as pa

    fixed = {}
    for field in schema:
        values = frame[field.name]
        numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
        if not numeric and values.dtype == np.float64:
            fixed[field.name] = pd.Series(np.full(len(values), None, dtype=object),
                                          index=values.index).where(values.isna(), values)
    if fixed:
        frame = frame.assign(**fixed)
    return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)


def read_partition(batches: Iterator[Any]) -> pd.DataFrame:
    """A partition's Arrow batches as one pandas frame (empty frame when none); see
    :func:`arrow_to_pandas` for the dtypes."""
    import pyarrow as pa

    received = list(batches)
    return arrow_to_pandas(pa.Table.from_batches(received)) if received else pd.DataFrame()


#: Buffered pieces of partial rows held before the newest are merged (see ``ArrowMerge._push``):
#: a buffer holds O(_FEW_PIECES + log(max_groups)) pieces whatever the batch size (one-row
#: batches too), not one per batch (a tuning constant).
_FEW_PIECES = 128
#: Inside the Arrow merge: each row's flush within one batch (the flushes it completes).
_FLUSH_COL = GROUP_COL


def _arrow_key_ok(kind: Any) -> bool:
    """Whether Arrow's hash grouping keys ``kind`` as Spark's ``groupBy`` does (floats are
    not: Spark makes -0.0 and 0.0 one key and every NaN one key)."""
    import pyarrow as pa

    return any(test(kind) for test in (pa.types.is_integer, pa.types.is_string,
                                       pa.types.is_large_string, pa.types.is_binary,
                                       pa.types.is_boolean, pa.types.is_date32,
                                       pa.types.is_timestamp))


class _Flushed(NamedTuple):
    """Output rows of one or more consecutive flushes: ``ends`` are where each ends in
    ``table`` (increasing, the last is its length)."""

    table: Any
    ends: list[int]

    def pieces(self) -> list[Any]:
        """One table per flush (zero-copy slices)."""
        return [self.table.slice(a, b - a) for a, b in zip([0, *self.ends[:-1]], self.ends)]


class ArrowMerge:
    """Local Merge of one partition on its Arrow batches as they arrive (groups and quantity
    modes; see :func:`local_merge`).

    Each batch is partially aggregated by Arrow's hash aggregation as it comes
    (:func:`~trilink_spark.merge.partials.arrow_partials`), then held as partial rows; a flush
    merges the held partials and emits them in slot order. ``add`` returns the flushes a
    batch completes; ``finish`` the last one. Memory holds the partial rows buffered (at most
    ``max_groups`` groups in at most twice as many partial rows, or ``quantity`` rows' worth)
    in O(log) pieces, not the partition's rows.

    Notes
    -----
    Cost: O(rows) Arrow work per batch plus O(groups) per flush; the flushes one batch
    completes (many when ``quantity`` or ``max_groups`` is small) are computed by ONE hash
    aggregation over (flush, key, slot) and emitted as one table. The groups bound is exact,
    and a buffer is flushed only when a batch's groups would pass it: the buffer is merged to
    count its groups when the sum of its pieces' rows could pass ``max_groups``; once it holds
    more than half the bound, each batch's new groups are counted against a Python set of the
    buffer's (key, slot) groups (O(the batch's partial rows); the set has at most
    ``max_groups`` entries), so the checks cost O(rows) in all and a partition with at most
    ``max_groups`` groups gives one partial row per group. A batch alone holding more than
    ``max_groups`` groups is cut at the exact rows (its (key, slot) codes by Arrow's
    dictionary encoding, then :func:`flush_bounds`). Past :data:`_FEW_PIECES` held pieces the
    newest are merged while they are about as large as the one before them (O(rows log
    groups) in all), so tiny batches cannot pile up pieces.

    Examples
    --------
    >>> merge = ArrowMerge.start(plan, first_batch)  # doctest: +SKIP
    >>> tables = [*merge.add(first_batch), *merge.finish()]  # doctest: +SKIP
    """

    def __init__(self, plan: MergePlan) -> None:
        self.plan = plan
        self.pieces: list[Any] = []
        self.held = 0  # groups mode: an upper bound of the buffered groups; quantity: rows
        #: groups mode, once the buffer is near full: its exact groups, the keys of each slot
        #: (then ``held`` is their number)
        self.seen: dict[float, set[Any]] | None = None
        self.rows_in = 0

    @classmethod
    def start(cls, plan: MergePlan, batch: Any) -> ArrowMerge | None:
        """An ArrowMerge for a partition whose first batch is ``batch``, or None when the
        plan needs the pandas path (periodic or punctuation mode, arrival positions, a float
        or other key Arrow does not group as Spark does, an aggregate without Arrow form)."""
        if plan.mode not in ("groups", "quantity"):
            return None
        names = set(batch.schema.names)
        if PUNCT_COL in names or POS_COL in names or SLOT_COL in names or ET_COL not in names:
            return None
        merge = cls(plan)
        table = merge._prepare(batch.slice(0, 0))
        if not _arrow_key_ok(table.schema.field(plan.key).type):
            return None
        if arrow_partials(table, [plan.key, SLOT_COL], plan.specs, ET_COL) is None:
            return None
        return merge

    def _prepare(self, batch: Any) -> Any:
        """A batch as a table with the user's names and each row's slot."""
        import pyarrow as pa

        table = pa.Table.from_batches([batch])
        if self.plan.aliases:
            table = table.rename_columns([self.plan.aliases.get(n, n) for n in table.column_names])
        et = table[ET_COL].to_numpy()  # nulls (no finite event time) become NaN
        return table.append_column(SLOT_COL, pa.array(_slot_starts(et, self.plan.slot_units)))

    def _partials(self, table: Any, merging: bool = False) -> Any:
        return arrow_partials(table, [self.plan.key, SLOT_COL], self.plan.specs, ET_COL, merging)

    def _merged(self) -> Any:
        import pyarrow as pa

        if len(self.pieces) == 1:
            return self.pieces[0]
        return self._partials(pa.concat_tables(self.pieces), merging=True)

    def _push(self, piece: Any) -> None:
        """Buffer a piece of partial rows. Past :data:`_FEW_PIECES` pieces, the newest ones are
        merged into one: those after the last piece that is more than twice as large as all
        the pieces after it. So the pieces held stay O(_FEW_PIECES + log(groups)), a merge
        comes once per O(_FEW_PIECES) batches, and each partial row is merged O(log) times."""
        import pyarrow as pa

        pieces = self.pieces
        pieces.append(piece)
        # held bounds the groups from above (groups mode, until it counts them exactly in
        # seen; quantity mode: rows, counted by the caller)
        groups = self.plan.mode == "groups" and self.seen is None
        if groups:
            self.held += piece.num_rows
        if len(pieces) <= _FEW_PIECES:
            return
        first, newer = len(pieces) - 1, pieces[-1].num_rows
        while first > 0 and pieces[first - 1].num_rows <= 2 * newer:
            first -= 1
            newer += pieces[first].num_rows
        if first == len(pieces) - 1:
            return
        merged = self._partials(pa.concat_tables(pieces[first:]), merging=True)
        if groups:
            self.held += merged.num_rows - newer
        self.pieces = [*pieces[:first], merged]

    def _flush(self) -> list[_Flushed]:
        """The buffer as one output table (none when empty); the buffer is emptied."""
        self.seen = None
        if not self.pieces:
            return []
        merged = self._merged()
        self.pieces, self.held = [], 0
        return [self._output(merged)] if merged.num_rows else []

    def add(self, batch: Any) -> list[Any]:
        """Take one Arrow batch; returns the output tables of the flushes it completes (one
        per flush)."""
        return [piece for flushed in self._add(batch) for piece in flushed.pieces()]

    def finish(self) -> list[Any]:
        """The last flush (the end of the partition flushes every mode)."""
        return [piece for flushed in self._flush() for piece in flushed.pieces()]

    def _add(self, batch: Any) -> list[_Flushed]:
        if not batch.num_rows:
            return []
        self.rows_in += batch.num_rows
        table = self._prepare(batch)
        if self.plan.mode == "quantity":
            return self._add_quantity(table)
        return self._add_groups(table)

    def _by_flush(self, table: Any, ends: list[int]) -> tuple[Any, np.ndarray]:
        """Partials of ``table`` per (flush, key, slot), flush ``i`` being the rows before
        ``ends[i]``: one hash aggregation for all of them. Returns the partials sorted by
        flush and where each flush's partials start (``len(ends) + 1`` offsets)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        bounds: np.ndarray = np.asarray([0, *ends], dtype=np.int64)
        flush = np.repeat(np.arange(len(ends), dtype=np.int64), bounds[1:] - bounds[:-1])
        by = [_FLUSH_COL, self.plan.key, SLOT_COL]
        grouped = arrow_partials(table.append_column(_FLUSH_COL, pa.array(flush)), by,
                                 self.plan.specs, ET_COL)
        # Arrow's hash aggregation over several keys gives no order of groups: flush order
        grouped = grouped.take(pc.sort_indices(grouped[_FLUSH_COL]))
        codes = grouped[_FLUSH_COL].to_numpy()
        starts = np.searchsorted(codes, np.arange(len(ends) + 1), side="left")
        return grouped, starts

    def _add_quantity(self, table: Any) -> list[_Flushed]:
        n, quantity = table.num_rows, self.plan.quantity
        first = min(n, quantity - self.held)  # the rows that fill the buffer
        if first == n:
            self._push(self._partials(table))
            self.held += n
            return self._flush() if self.held == quantity else []
        ends = [*range(first, n, quantity), n]  # then whole flushes, and a rest
        complete = len(ends) if (n - first) % quantity == 0 else len(ends) - 1
        grouped, starts = self._by_flush(table, ends)
        self._push(grouped.slice(0, starts[1]).drop_columns([_FLUSH_COL]))
        out = self._flush()  # the buffer is full
        if complete > 1:
            out.append(self._output(grouped.slice(starts[1], starts[complete] - starts[1])))
        if complete < len(ends):
            self._push(grouped.slice(starts[-2]).drop_columns([_FLUSH_COL]))
            self.held = n - ends[-2]
        return out

    def _add_groups(self, table: Any) -> list[_Flushed]:
        import pyarrow as pa

        limit = self.plan.max_groups
        piece = self._partials(table)
        if piece.num_rows > limit:  # this batch alone passes the bound: cut it at its rows
            out = self._flush()
            ends = _group_bounds(self._group_codes(table), limit) + [table.num_rows]
            grouped, starts = self._by_flush(table, ends)
            if len(ends) > 1:
                out.append(self._output(grouped.slice(0, starts[-2])))
            self._push(grouped.slice(starts[-2]).drop_columns([_FLUSH_COL]))
            return out
        if self.seen is None:
            if self.held + piece.num_rows <= limit:  # an upper bound of the groups is within
                self._push(piece)
                return []
            merged = self._merged()  # the buffer's groups, exactly
            self.pieces, self.held = [merged], merged.num_rows
            if 2 * merged.num_rows <= limit:  # far from full: the next merge is far too
                if merged.num_rows + piece.num_rows <= limit:
                    self._push(piece)
                    return []
                both = self._partials(pa.concat_tables([merged, piece]), merging=True)
                if both.num_rows <= limit:
                    self.pieces, self.held = [both], both.num_rows
                    return []
                out = self._flush()  # with this batch the buffer would pass the bound
                self._push(piece)
                return out
            # near full: from now on, count each batch's new groups against the buffer's
            # (a check per batch costs O(its partial rows), not a merge of the buffer)
            self.seen = {}
            self.held = self._add_new(self._new_groups(merged), 0)
        fresh = self._new_groups(piece)
        if self.held + sum(map(len, fresh.values())) <= limit:
            self.held = self._add_new(fresh, self.held)
            self._push(piece)
            if sum(p.num_rows for p in self.pieces) > 2 * limit:  # merged: at most limit rows
                self.pieces = [self._merged()]
            return []
        out = self._flush()  # with this batch the buffer would pass the bound: flush first
        self._push(piece)
        return out

    def _new_groups(self, partials: Any) -> dict[float, set[Any]]:
        """The (key, slot) groups of partial rows not in :attr:`seen`, as the keys of each
        slot: Python values, equal exactly when Arrow groups them together (strings and bytes
        by content, timestamps by instant; slots are never -0.0 or NaN). O(rows) plus a sort
        of the slots."""
        slots = partials[SLOT_COL].to_numpy()
        keys = partials[self.plan.key]
        seen = self.seen if self.seen is not None else {}
        distinct, count = np.unique(slots, return_counts=True)
        if len(distinct) == 1:
            per_slot = [(float(distinct[0]), keys.to_pylist())]
        else:
            order = np.argsort(slots, kind="stable")
            ordered = keys.take(order).to_pylist()
            ends = np.cumsum(count).tolist()
            per_slot = [(float(slot), ordered[a:b]) for slot, a, b in
                        zip(distinct.tolist(), [0, *ends[:-1]], ends)]
        fresh: dict[float, set[Any]] = {}
        for slot, values in per_slot:
            new = set(values)
            known = seen.get(slot)
            if known is not None:
                new -= known
            if new:
                fresh[slot] = new
        return fresh

    def _add_new(self, fresh: dict[float, set[Any]], held: int) -> int:
        """Add groups of :meth:`_new_groups` to :attr:`seen`; returns ``held`` plus their
        number."""
        seen = self.seen if self.seen is not None else {}
        for slot, new in fresh.items():
            seen.setdefault(slot, set()).update(new)
            held += len(new)
        self.seen = seen
        return held

    def _group_codes(self, table: Any) -> np.ndarray:
        """Each row's (key, slot) group as an int64 code, equal exactly for equal groups as
        Arrow's hash grouping sees them (its dictionary encoding; nulls one code)."""
        import pyarrow.compute as pc

        def codes(column: Any) -> tuple[np.ndarray, int]:
            encoded = pc.dictionary_encode(column.combine_chunks(), null_encoding="encode")
            return encoded.indices.to_numpy().astype(np.int64), len(encoded.dictionary)

        key, _ = codes(table[self.plan.key])
        slot, slots = codes(table[SLOT_COL])
        joined: np.ndarray = key * slots + slot
        return joined

    def _output(self, merged: Any) -> _Flushed:
        """Merged partials as output rows: flush by flush (when they carry
        :data:`_FLUSH_COL`), each in slot order (rows without a time last), slots and event
        times in the column's type."""
        import pyarrow as pa
        import pyarrow.compute as pc

        plan = self.plan
        flushes = _FLUSH_COL in merged.column_names
        order = [(_FLUSH_COL, "ascending")] if flushes else []
        keys = [*order, (SLOT_COL, "ascending")]
        merged = merged.take(pc.sort_indices(merged, sort_keys=keys))  # stable; null slot: inf
        ends = [merged.num_rows]
        if flushes:
            flush = merged[_FLUSH_COL].to_numpy()
            ends = [*(np.flatnonzero(flush[1:] != flush[:-1]) + 1).tolist(), merged.num_rows]
        slot = merged[SLOT_COL].to_numpy()
        slot = np.where(slot == _UNTIMED_SLOT, np.nan, slot)
        columns = {plan.key: merged[plan.key], SLOT: _arrow_times(slot, plan.time_kind),
                   plan.time_name: _arrow_times(merged[ET_COL].to_numpy(), plan.time_kind)}
        for spec in plan.specs:
            for col in spec.partial_columns:
                columns[col] = merged[col]
        arrays = [columns[f.name].cast(f.type) for f in plan.arrow_schema]
        return _Flushed(pa.Table.from_arrays(arrays, schema=plan.arrow_schema), ends)


def _arrow_times(units: np.ndarray, kind: str) -> Any:
    """Event-time units (NaN for none) as an Arrow array of the column's kind (timestamps in
    microseconds, integers, doubles); cast to the output type by the caller."""
    import pyarrow as pa

    missing = np.isnan(units)
    if kind == "fractional":
        return pa.array(units, pa.float64(), mask=missing)
    ints = np.rint(np.where(missing, 0.0, units)).astype(np.int64)
    values = pa.array(ints, pa.int64(), mask=missing)
    return values.cast(pa.timestamp("us", tz="UTC")) if kind == "timestamp" else values


#: Input rows the Arrow merge aggregates at once: Spark's Arrow batches (10,000 rows by
#: default) are gathered up to this many, so a key whose rows are spread over many batches
#: becomes one partial row per chunk rather than per batch (a tuning constant; it costs this
#: many rows of memory beyond the buffered groups).
_CHUNK_ROWS = 1 << 18


def _chunks(batches: Iterator[Any], rows: int = _CHUNK_ROWS) -> Iterator[Any]:
    """``batches`` gathered into record batches of at least ``rows`` rows (the last may be
    shorter; empty batches dropped). One copy of the rows, O(rows)."""
    held: list[Any] = []
    count = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield _joined(held)
            held, count = [], 0
    if held:
        yield _joined(held)


def _joined(batches: list[Any]) -> Any:
    """One record batch of ``batches`` (the same one when there is only one)."""
    import pyarrow as pa

    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _arrow_merge_partition(plan: MergePlan, timer: OperatorTimer | None = None) -> Any:
    """The partition function of :func:`local_merge`: Arrow batches merged as they arrive
    (:class:`ArrowMerge`); the pandas path when the plan needs it."""
    pandas_run = _merge_partition(plan, timer)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        watch = Stopwatch()
        pulled = watch.pull(batches)
        first = next(pulled, None)
        if first is None:
            if timer is not None:
                timer.write(rows_in=0, rows_out=0, busy_ms=watch.busy_ms(),
                            wait_ms=watch.wait_ms)
            return
        merge = ArrowMerge.start(plan, first)
        if merge is None:
            yield from pandas_run(itertools.chain([first], pulled))
            return
        out = 0
        for batch in _chunks(itertools.chain([first], pulled)):
            for flushed in merge._add(batch):  # one table for the flushes of a batch
                out += flushed.table.num_rows
                yield from watch.emit(flushed.table.to_batches())
        for flushed in merge._flush():
            out += flushed.table.num_rows
            yield from watch.emit(flushed.table.to_batches())
        if timer is not None:
            timer.write(rows_in=merge.rows_in, rows_out=out, busy_ms=watch.busy_ms(),
                        wait_ms=watch.wait_ms)

    return run


def _merge_partition(plan: MergePlan, timer: OperatorTimer | None = None) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        watch = Stopwatch()
        rows = source_rows(read_partition(watch.pull(batches)), plan)
        flushed = partition_partials(rows, plan)
        out = 0
        if len(flushed.frame):
            table = to_arrow(flushed.frame, plan.arrow_schema)
            out = table.num_rows
            yield from watch.emit(table.to_batches())
        if timer is not None:
            timer.write(rows_in=len(rows), rows_out=out, busy_ms=watch.busy_ms(),
                        wait_ms=watch.wait_ms)

    return run


def local_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = AUTO_MODE,
    *,
    quantity: int | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
    engine: str | None = None,
) -> DataFrame:
    """Pre-aggregate rows per key and time slot inside each input partition (no shuffle).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    key : str
    event_time : str
        Timestamp or numeric event-time column.
    slot : str, float or datetime.timedelta
        Slot length: an interval string (``"60 seconds"``), seconds or a timedelta for
        timestamps; the column's unit otherwise.
    aggs : Column, sequence or mapping
        Spark Column aggregates (``[F.sum("v").alias("s"), F.count("*")]``), Spark's dict
        form (``{"v": "sum"}``) or ``{name: (func, column)}``; funcs: count, sum, min, max,
        mean (avg), first, last or a :class:`~trilink_spark.Combine` (see
        :func:`~trilink_spark.merge.expressions.parse_aggs`).
    mode : {"auto", "groups", "quantity", "periodic", "punctuation"}
        When buffers flush (module docs). ``"auto"``: the mode the arguments ask for
        (``punctuation`` given: punctuation; ``delay``: periodic; ``quantity``: quantity),
        else ``"groups"`` for a batch DataFrame and ``"quantity"`` for a streaming one.
    quantity : int, optional
        Quantity mode: rows merged per flush (default 10,000).
    max_groups : int
        Groups mode: the most (key, slot) groups a partition's buffer holds before it flushes
        (default 1,000,000).
    delay : str, float or timedelta
        Periodic mode: how much older than the newest row the oldest buffered row may be
        (``"30 seconds"``, seconds, or a timedelta for timestamps).
    punctuation : str
        Punctuation mode: a boolean column; a row where it is true flushes the buffer with it.
    order_by : str, optional
        Arrival order within a partition (default: the input order).
    engine : {"python", "spark"}, optional
        ``"python"``: the merge runs inside each input partition, as described above (no
        exchange). ``"spark"``: Spark's own partial aggregation computes the partial rows,
        one per (input partition, key, slot), ``groupBy(spark_partition_id(), key, slot)``
        in the JVM, so no row crosses into Python; the partial rows (not the input rows) then
        cross one exchange and leave their input partition. Only for batch DataFrames in the
        groups mode, without ``order_by``, with count, sum, min, max and mean; Spark bounds
        its memory by spilling, so ``max_groups`` does not apply. Default: the
        ``spark.trilink.mergeEngine`` conf (``"python"``); when the conf asks for
        ``"spark"`` and a call cannot use it, that call uses ``"python"``.

    Returns
    -------
    pyspark.sql.DataFrame
        Partial rows: ``key``, ``slot_start``, ``event_time`` (the largest of the merged rows,
        same name and type), then the partial columns of each aggregate. Rows whose event
        time is null, NaN or +-inf are kept, merged per key into a slot of their own
        (``slot_start`` and the event time null), so ``merge_partials`` still equals
        aggregating the raw rows; null and NaN keys and values follow Spark (see
        :mod:`~trilink_spark.merge.aggregates`: NaN is a value, ``max`` NaN-first, sums with
        ``inf`` are ``inf``).

    Raises
    ------
    InvalidArgumentError
        An aggregate named like the key, the event time or ``slot_start``, or a bad mode or
        slot; ``engine="spark"`` for a call it cannot run (the message says why);
        :class:`~trilink_spark.ReservedColumnError` for a column or aggregate named
        ``_tl_*``.
    InvalidArgumentTypeError
        ``sum`` or ``mean`` of a non-numeric column (the message names it and its type).
    InvalidKeyTypeError
        A struct, array or map key.
    ArithmeticOverflowError
        From the job: an integral ``sum`` beyond 64 bits (Spark's ANSI overflow).

    Notes
    -----
    Cost: one vectorised pass per input partition in Python, O(n log n) in every mode and
    whatever the arrival order, no shuffle; only the key, event time and aggregated columns
    travel. Groups and quantity modes with count, sum, min, max and mean: Arrow's hash
    aggregation per arriving batch, O(n), holding only the buffered partial rows. Otherwise
    (periodic, punctuation, float keys, first, last, Combine, decimal sums): the flush bounds
    in O(n), then one pandas group-by for all flushes, a partition's rows held until its last
    flush. The output has at most one row per key, slot and flush: with
    few keys per slot it is a small fraction of the input, which is what the keyed exchange
    after it then carries. With ``spark.trilink.operatorTiming`` set, each task also writes
    one timing record (:mod:`~trilink_spark._internal.optiming`: rows in and out, its own milliseconds).

    ``engine="spark"``: Spark's hash aggregation in the JVM (partial, then final after the
    exchange), O(rows); one exchange carrying the partial rows. Every input row otherwise
    crosses from the JVM to a Python worker, which costs about what Spark's whole native
    aggregation costs (benches/RESULTS.md, §18).

    Examples
    --------
    >>> aggs = {"n": ("count", None), "volts": ("mean", "volts")}
    >>> partial = tl.local_merge(df, "sensor", "ts", 60.0, aggs)  # doctest: +SKIP
    >>> tl.merge_partials(partial, "sensor", aggs)  # doctest: +SKIP
    >>> native = tl.local_merge(df, "sensor", "ts", 60.0, aggs, engine="spark")  # doctest: +SKIP
    """
    src, plan = plan_merge(df, key, event_time, slot, aggs, mode, quantity=quantity, delay=delay,
                           punctuation=punctuation, order_by=order_by, max_groups=max_groups)
    native = _spark_engine(df, plan, engine, order_by)
    if native is not None:
        return native
    timer = operator_timer(df.sparkSession, "local_merge")
    result: DataFrame = src.mapInArrow(_arrow_merge_partition(plan, timer), plan.out_schema)
    return result


def _spark_engine(df: DataFrame, plan: MergePlan, engine: str | None,
                  order_by: str | None) -> DataFrame | None:
    """:func:`local_merge` on Spark's partial aggregation (:func:`_spark_partials`) when
    ``engine`` (else the ``spark.trilink.mergeEngine`` conf) asks for it and the call allows
    it; else None (the Python engine runs). An explicit ``engine="spark"`` the call cannot
    use is an InvalidArgumentError saying why; the conf's falls back to the Python engine."""
    from .._internal.spark.session import conf_get

    explicit = engine is not None
    chosen = engine if explicit else conf_get(df.sparkSession, ENGINE_CONF, "python")
    if not isinstance(chosen, str) or chosen not in MERGE_ENGINES:
        where = "engine" if explicit else f"spark.trilink.{ENGINE_CONF}"
        error = InvalidArgumentError if isinstance(chosen, str) else InvalidArgumentTypeError
        raise error(f"{where} must be one of {', '.join(MERGE_ENGINES)}, got {chosen!r}")
    if chosen == "python":
        return None
    why = None
    native = None
    if df.isStreaming:
        why = "a streaming DataFrame (Spark's partial aggregation cannot feed later stages)"
    elif plan.mode != "groups":
        why = f"the {plan.mode} mode (its flushes are Python's)"
    elif order_by is not None:
        why = "order_by (Spark's aggregation keeps no arrival order)"
    else:
        native, lacking = _spark_partials(df, plan)
        if lacking is not None:
            why = (f"aggregate {lacking!r} (no Spark form: first and last need arrival "
                   "order, a Combine runs in Python)")
    if why is None:
        return native
    if explicit:
        raise InvalidArgumentError(
            f"engine='spark' cannot run {why}; it runs batch DataFrames in the groups mode "
            "without order_by, with count, sum, min, max and mean: use engine='python'")
    logger.debug("local_merge: spark.trilink.%s=spark does not apply to %s; the Python "
                 "engine runs", ENGINE_CONF, why)
    return None


def _value_types(df: DataFrame, plan: MergePlan) -> dict[str, str]:
    """Each aggregate's input column type (Spark's simple string), by aggregate name."""
    return {spec.name: df.schema[spec.column].dataType.simpleString()
            for spec in plan.specs if spec.column is not None}


def _spark_partials(df: DataFrame, plan: MergePlan) -> tuple[DataFrame | None, str | None]:
    """:func:`local_merge` by Spark's partial aggregation, ``(frame, None)``; or ``(None,
    name)`` of the first aggregate without a Spark form. The frame is ``groupBy(
    spark_partition_id(), key, slot)`` over the key, the aggregated columns and the event
    time, each slot
    ``et - pmod(et, slot)`` as the Python engine computes it (in longs for a timestamp or
    integral event time and a whole slot, which is exact there; else in doubles), rows
    without a finite event time in the null slot; the output has the Python engine's schema
    (``plan.out_schema``). A plan, no job."""
    from pyspark.sql import functions as F

    types = _value_types(df, plan)
    size = float(plan.slot_units)
    exact = size.is_integer() and size <= MAX_EXACT
    whole = event_time_whole(df, plan.time_name) if exact else None
    if whole is not None:
        et = whole
        # the exact start, a long (grouped faster than a double); below -2**53 (the first
        # slot of the most negative times) rounded as the Python engine's pmod in doubles
        # rounds it (-2**53 - 1 is no double); a slot longer than 2**53: in doubles
        start = et - F.pmod(et, F.lit(int(size)))
        slot = F.when(start < F.lit(-MAX_EXACT), start.cast("double").cast("long")) \
            .otherwise(start)
    else:
        et = event_time_micros(df, plan.time_name)[0]
        et = F.when(~F.isnan(et) & (F.abs(et) < F.lit(float("inf"))), et)  # finite, else null
        slot = et - F.pmod(et, F.lit(size))
    exprs: list[Any] = [F.max(F.col(ET_COL)).alias(ET_COL)]
    for spec in plan.specs:
        value = None if spec.column is None else column_of(spec.column)
        parts = spec.aggregate.spark_init(value, types.get(spec.name, "bigint"))
        if parts is None:
            return None, spec.name
        exprs += parts
    values = [column_of(c) for c in dict.fromkeys(
        [plan.key, *(s.column for s in plan.specs if s.column is not None)])]
    source = df.select(*values, et.alias(ET_COL), slot.alias(SLOT_COL))
    grouped = source.groupBy(F.spark_partition_id().alias(GROUP_COL), column_of(plan.key),
                             F.col(SLOT_COL)).agg(*exprs)
    # the key, the slot and the event time by position: a key may be named like the others
    leading = [column_of(plan.key), _spark_times(F.col(SLOT_COL), plan.time_kind),
               _spark_times(F.col(ET_COL), plan.time_kind)]
    out = []
    for i, field_ in enumerate(plan.out_schema.fields):
        column = leading[i] if i < len(leading) else column_of(field_.name)
        out.append(column.cast(field_.dataType).alias(field_.name))
    return grouped.select(*out), None


def _spark_times(units: Any, kind: str) -> Any:
    """A Spark column of event-time units (longs, or doubles; null for none) as the column's
    kind, as :func:`_arrow_times` makes them: doubles, integers rounded half to even,
    timestamps from whole microseconds."""
    from pyspark.sql import functions as F

    if kind == "fractional":
        return units
    whole = F.bround(units, 0).cast("bigint")
    return F.timestamp_micros(whole) if kind == "timestamp" else whole


def check_merge_names(specs: list[AggSpec], key: str, others: list[str]) -> None:
    """Refuse aggregates whose output or partial columns are named like the key or one of
    ``others`` (the event time, ``slot_start``): InvalidArgumentError. O(aggregates)."""
    # Spark resolves names case-insensitively by default: 'K' is the key 'k' too
    taken = {key.lower(): ("the key", key),
             **{name.lower(): ("a column of the output", name) for name in others}}
    for spec in specs:
        for column in [spec.name, *spec.partial_columns]:
            if column.lower() in taken:
                what, name = taken[column.lower()]
                raise InvalidArgumentError(
                    f"aggregate {spec.name!r} would write column {column!r}, which is "
                    f"{what} ({name!r}); rename the aggregate"
                )


def plan_merge(
    df: DataFrame,
    key: str,
    event_time: str,
    slot: Any,
    aggs: Any,
    mode: str = AUTO_MODE,
    *,
    quantity: int | None = None,
    delay: Any = None,
    punctuation: str | None = None,
    order_by: str | None = None,
    max_groups: int = DEFAULT_MAX_GROUPS,
) -> tuple[DataFrame, MergePlan]:
    """Validate a merge; returns its narrow source DataFrame and plan (see :func:`local_merge`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    require_columns(df, [key], "key column")
    check_atomic_key(df, key)
    if mode == AUTO_MODE:  # the mode the arguments ask for, else by the kind of frame
        if punctuation is not None:
            mode = "punctuation"
        elif delay is not None:
            mode = "periodic"
        elif quantity is not None or df.isStreaming:
            mode = "quantity"
        else:
            mode = "groups"
    if quantity is None:
        quantity = DEFAULT_QUANTITY
    if mode not in MERGE_MODES:
        raise InvalidArgumentError(
            f"mode must be {AUTO_MODE!r} or one of {', '.join(MERGE_MODES)}, got {mode!r}")
    if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1:
        raise InvalidArgumentTypeError(f"max_groups must be an int >= 1, got {max_groups!r}")
    specs = parse_aggs(aggs, df.columns, df)
    # Global Merge adds CONST_TIME_COL itself (and checks the user's columns before)
    check_user_columns(SimpleNamespace(columns=[c for c in df.columns if c != CONST_TIME_COL]),
                       [c for s in specs for c in s.partial_columns])
    check_merge_names(specs, key, [event_time, SLOT])
    et_col, kind = event_time_micros(df, event_time)
    slot_units = delay_in_units(slot, kind, "slot")
    if slot_units <= 0:
        raise InvalidArgumentError(f"slot must be > 0, got {slot!r}")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity < 1:
        raise InvalidArgumentTypeError(f"quantity must be an int >= 1, got {quantity!r}")
    delay_units = 0.0
    if mode == "periodic":
        if delay is None:
            raise InvalidArgumentError("periodic mode needs delay=...")
        delay_units = delay_in_units(delay, kind)
    if mode == "punctuation":
        if punctuation is None or punctuation not in df.columns:
            raise InvalidArgumentError("punctuation mode needs punctuation=<boolean column of df>")
    require_columns(df, [order_by], "order_by column")
    for spec in specs:  # refuse non-numeric sums and means before the job
        if spec.column is not None:
            spec.partial_types(df.schema[spec.column].dataType.simpleString())
    values = sorted({s.column for s in specs if s.column is not None} - {key})
    # non-finite times (NaN, +-inf) count as none; slots are computed in doubles (no cast
    # that could overflow for huge times)
    finite = F.when(~F.isnan(et_col) & (F.abs(et_col) < F.lit(float("inf"))), et_col)
    # PySpark's mapInArrow cannot take input columns whose names hold a dot or a backtick:
    # such columns travel under internal names, given back inside each partition
    aliases = {f"{INTERNAL_PREFIX}col{i}": name for i, name in enumerate([key, *values])
               if "." in name or "`" in name}
    inside = {name: alias for alias, name in aliases.items()}
    # only what the merge needs crosses into Python: the key, the aggregated columns and the
    # event time; arrival positions and slots are computed inside the partition
    # (source_rows), which costs less than carrying two more columns over Arrow
    cols = [column_of(c).alias(inside.get(c, c)) for c in [key, *values]] + [
            finite.alias(ET_COL)]
    if mode == "punctuation":
        cols.append(column_of(str(punctuation)).cast("boolean").alias(PUNCT_COL))
    if order_by is not None:
        cols += [column_of(order_by).alias(ORDER_COL),
                 F.monotonically_increasing_id().alias(POS_COL)]
    src = df.select(*cols)
    if order_by is not None:  # arrival order is the sorted order; the sort keys stay behind
        src = src.sortWithinPartitions(ORDER_COL, POS_COL).drop(ORDER_COL, POS_COL)
    time_type = SPARK_TIME_TYPES[kind]
    fields = [f"{quoted(key)} {df.schema[key].dataType.simpleString()}",
              f"{SLOT} {time_type}", f"{quoted(event_time)} {time_type}"]
    names = [key, SLOT, event_time]
    for spec in specs:
        value_type = (df.schema[spec.column].dataType.simpleString()
                      if spec.column is not None else "bigint")
        for col, dtype in zip(spec.partial_columns, spec.partial_types(value_type)):
            fields.append(f"{quoted(col)} {dtype}")
            names.append(col)
    out_schema = StructType.fromDDL(", ".join(fields))
    if not isinstance(out_schema, StructType):  # pragma: no cover - fromDDL of fields is a struct
        raise InvalidArgumentTypeError("internal: partial schema is not a struct")
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_schema, timezone=timezone)
    plan = MergePlan(key, specs, mode, quantity, delay_units, kind, event_time, names,
                     out_schema, arrow_schema, max_groups, aliases, slot_units=slot_units)
    return src, plan
