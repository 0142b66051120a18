"""A bounded table's rebalancing units: its key groups and its named keys, as one block table.

The load-aware rebalancer moves the blocks of a block table. A bounded table
(:attr:`~trilink_spark.TablePartitioner.bounded`) has two kinds of unit that move whole: each
key group (the keys without an entry) and each named key. :func:`unit_table` numbers them
(the groups ``0 .. num_groups - 1``, then the entries in table order) and lays them out as a
:class:`~trilink_spark.BlockPartitioner` whose table is where each unit is now, so the
rebalancer measures and moves them as blocks; :func:`from_units` turns the table it moves to
back into a bounded table. The tasks count their rows per unit with :class:`UnitRows`.

Named keys are the heaviest keys: counted apart from their groups, a slow partition's hot key
is one unit the rebalancer can weigh (and moves only when that fits the records to move
better than the small groups do), and moving a group never claims load it does not carry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...partitioners import BlockPartitioner, Partitioner, TablePartitioner
from ...partitioners.core.base import encode_key
from ...partitioners.core.block import MAX_BLOCKS

__all__ = ["UnitRows", "unit_table", "from_units", "unit_rows", "bounded_with"]

logger = logging.getLogger(__name__)


def unit_table(p: TablePartitioner) -> BlockPartitioner | None:
    """``p``'s units as a block table (module docs): unit ``g < num_groups`` is key group
    ``g``, unit ``num_groups + i`` the ``i``-th entry of ``p.table_arrays()``; each on the
    partition it is on now. None when ``p`` is not bounded or has more units than a block
    table holds (:data:`~trilink_spark.partitioners.core.block.MAX_BLOCKS`). O(groups + entries).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> p = tl.LeastCountPartitioner(4, max_keys=2).fit({"a": 9, "b": 5, "c": 1, "d": 1})
    >>> units = unit_table(p)
    >>> units.num_blocks, units.table[4096:].tolist() == [p.partition("a"), p.partition("b")]
    (4098, True)
    """
    groups = p.groups
    if groups is None:
        return None
    _, pids = p.table_arrays()
    if p.num_groups + len(pids) > MAX_BLOCKS:
        logger.warning("a bounded table of %d entries has more units than a block table "
                       "holds (%d); it is not rebalanced", len(pids), MAX_BLOCKS)
        return None
    table = np.concatenate([groups.astype(np.int64), pids.astype(np.int64)])
    return BlockPartitioner(p.num_partitions, len(table), table, null_policy=p.null_policy)


def from_units(p: TablePartitioner, units: BlockPartitioner) -> TablePartitioner:
    """``p`` with each group and named key on the partition ``units`` gives its unit (a
    table :func:`unit_table` made of ``p``, moved by the rebalancer). The loads ``p`` keeps
    for its next fit stay as they are. O(groups + entries).

    Raises
    ------
    InvalidArgumentError
        ``units`` is not over ``p``'s units, or places one on a partition ``p`` has not.
    """
    from ...errors import InvalidArgumentError

    keys, pids = p.table_arrays()
    g = p.num_groups
    if p.groups is None or units.num_blocks != g + len(keys) \
            or units.num_partitions != p.num_partitions:
        raise InvalidArgumentError(
            f"a unit table of {units.num_blocks} units on {units.num_partitions} partitions "
            f"is not over this table's {g} groups and {len(keys)} entries on "
            f"{p.num_partitions} partitions")
    return bounded_with(p, keys, units.table[g:], units.table[:g])


def bounded_with(base: TablePartitioner, keys: Any, pids: Any, groups: Any,
                 max_keys: int | None = None, group_loads: Any = None) -> TablePartitioner:
    """``base`` (its strategy and every other stored field) with the entries ``keys`` ->
    ``pids`` and the key groups on ``groups``: a bounded table placed by a swap or the
    rebalancer, never fitted. ``max_keys`` and ``group_loads`` replace ``base``'s when
    given. Built through the stored form, so every field is checked. O(groups + entries).

    Raises
    ------
    InvalidArgumentError
        A field the stored form refuses (a partition out of range, more entries than
        ``max_keys``, ...).
    """
    from ...errors import InvalidArgumentError

    fields = base.to_dict()
    fields.update(table=[[encode_key(k), int(q)] for k, q in zip(keys, np.asarray(pids).tolist())],
                  groups=np.asarray(groups).astype(int).tolist())
    if max_keys is not None:
        fields["max_keys"] = max_keys
    if group_loads is not None:
        fields["group_loads"] = np.asarray(group_loads, dtype=float).tolist()
    out = Partitioner.from_dict(fields)
    if not isinstance(out, TablePartitioner):
        raise InvalidArgumentError(f"{base.strategy_name} did not come back as a table")
    return out


@dataclass(frozen=True)
class UnitRows:
    """What a task needs to count its rows per unit of a bounded table (picklable, shipped
    with the batch when the run has a rebalancer): the groups' hashing and the entries' keys
    (an Arrow array, in table order)."""

    groups: BlockPartitioner
    named: Any

    @property
    def num_units(self) -> int:
        """Groups plus entries. O(1)."""
        return self.groups.num_blocks + len(self.named)

    def rows(self, keys: Any) -> dict[str, list[int]]:
        """Rows per unit of ``keys`` (an Arrow key column; sparse: the units that got rows;
        the null key has no unit). O(rows + entries), vectorised: one hash lookup of the
        keys in the entries.

        Examples
        --------
        >>> import pyarrow as pa, trilink_spark as tl
        >>> p = tl.LeastCountPartitioner(2, max_keys=1).fit({"a": 5, "b": 1, "c": 1})
        >>> counter = unit_rows(p, "string")
        >>> out = counter.rows(pa.array(["a", "a", "b", None]))
        >>> out["blocks"][-1], out["rows"][-1], sum(out["rows"])
        (4096, 2, 3)
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        units = self.groups.blocks(keys)
        if len(self.named) and len(keys):
            named, probe = self.named, keys
            if pa.types.is_integer(keys.type):  # entries are longs: widen, never narrow
                probe = keys.cast(pa.int64())
            elif named.type != keys.type:
                named = named.cast(keys.type)
            found = pc.index_in(probe, value_set=named)
            at = np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
            units = np.where(at >= 0, self.groups.num_blocks + at, units)
        counts = np.bincount(units[units >= 0], minlength=self.num_units)
        used = np.flatnonzero(counts)
        return {"blocks": used.tolist(), "rows": counts[used].tolist()}


def unit_rows(p: TablePartitioner, kind: str) -> UnitRows | None:
    """The :class:`UnitRows` of bounded table ``p`` for a key column of ``kind`` (None: not
    bounded, or too many units: :func:`unit_table`). O(groups + entries)."""
    import pyarrow as pa

    groups = p.group_placement(kind)
    if groups is None or p.num_groups + len(p) > MAX_BLOCKS:
        return None
    keys, _ = p.table_arrays()
    arrow = {"int": pa.int64(), "long": pa.int64(), "string": pa.string(),
             "binary": pa.binary()}.get(kind)
    return UnitRows(groups, pa.array(keys, arrow) if arrow is not None else pa.array(keys))
