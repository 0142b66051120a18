"""The Arrow engine of Local Merge: Arrow batches merged as they arrive.

In the groups and quantity modes with count, sum, min, max and mean, :class:`ArrowMerge`
aggregates each batch with Arrow's hash aggregation
(:func:`~trilink_spark.merge.algebra.partials.arrow_partials`) and holds only partial rows;
:func:`arrow_merge_partition` is the partition function of
:func:`~trilink_spark.local_merge`, which hands a partition the Arrow engine cannot merge
(periodic or punctuation mode, float keys, first, last, Combine, decimal sums) to the pandas
engine (:func:`~trilink_spark.merge.engines.pandas_engine.merge_partition`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ...columns import ET_COL, GROUP_COL, POS_COL, PUNCT_COL, SLOT_COL
from ..._internal.optiming import OperatorTimer, Stopwatch
from .bounds import group_bounds
from .pandas_engine import merge_partition
from ..algebra.partials import arrow_partials
from .plan import SLOT, UNTIMED_SLOT, MergePlan, slot_starts

__all__ = ["ArrowMerge", "arrow_merge_partition"]


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
    modes; see :func:`~trilink_spark.local_merge`).

    Each batch is partially aggregated by Arrow's hash aggregation as it comes
    (:func:`~trilink_spark.merge.algebra.partials.arrow_partials`), then held as partial rows; a flush
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
    dictionary encoding, then :func:`~trilink_spark.merge.engines.bounds.flush_bounds`). Past
    :data:`_FEW_PIECES` held pieces the newest are merged while they are about as large as the
    one before them (O(rows log groups) in all), so tiny batches cannot pile up pieces.

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
        return table.append_column(SLOT_COL, pa.array(slot_starts(et, self.plan.slot_units)))

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
            ends = group_bounds(self._group_codes(table), limit) + [table.num_rows]
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
        slot = np.where(slot == UNTIMED_SLOT, np.nan, slot)
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


def arrow_merge_partition(plan: MergePlan, timer: OperatorTimer | None = None) -> Any:
    """The partition function of :func:`~trilink_spark.local_merge`: Arrow batches merged as
    they arrive (:class:`ArrowMerge`); the pandas path
    (:func:`~trilink_spark.merge.engines.pandas_engine.merge_partition`) when the plan needs it."""
    pandas_run = merge_partition(plan, timer)

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
