"""Swap plans by blocks: a swap between block tables plans from the executors' local copies.

A swap from one :class:`~trilink_spark.partitioners.core.block.BlockPartitioner` table to another
over the same blocks (a rebalancer's moves, a rescale, a fluid swap's next step) moves whole
blocks, and the local store files each key under its block first
(:func:`~trilink_spark.state.local.key_bytes`). So the plan needs no key listing on the
driver (:func:`~trilink_spark.keyed.swaps.plan.plan_swap` reads every partition's version from the
state path):

1. When the target is a refit (``refit="minimal"``), one small Spark job reads each
   partition's per-block loads from its local copy (a full scan of the copy, on the
   executors, in parallel; O(blocks) back to the driver) and the driver rebalances the
   blocks on them (:func:`~trilink_spark.partitioners.rebalance_minimal`, ``unit="block"``):
   the same target as from the keys' own loads. A target given whole (a rebalancer's table,
   an explicit one, a fluid swap's aim) needs no such job.
2. One small Spark job range-scans the moving blocks of each source's copy
   (:func:`~trilink_spark.keyed.durable.local_sync.scan_blocks`) and returns their keys: O(the
   moving keys). The driver picks a fluid step's blocks among them, as the key plan does.

A bounded table (:attr:`~trilink_spark.TablePartitioner.bounded`) plans the same way by its
key groups, which the local store files keys under while it is in force
(:meth:`~trilink_spark.keyed.durable.local_sync.LocalConfig.placed_by`): a target given whole
over the same groups (:func:`group_steps`) range-scans the groups whose partition changes and
looks up the named keys (of either table) whose partition changes, each in the copy that
holds it; a fluid step moves those keys and the smallest groups that fit its cap. A refit of
a bounded table (it weighs every key's load, its heaviest keys take the entries) is planned
by keys.

The plan, its moves table and everything after it (segments, the swap batch, replays) are
those of :mod:`~trilink_spark.keyed.swaps.plan`. The jobs also bring every copy to the swap's
starting version, so the segment job and the swap batch find them current.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import typed_error as task_error
from ..._internal.validation import choice
from ...errors import InvalidArgumentError, StateCorruptError, StateStoreError
from ...partitioners import BlockPartitioner, Partitioner, TablePartitioner
from ...partitioners.core.keys import null_partition
from ...partitioners.tables.overlay import OverlayPartitioner
from ...partitioners.choosing.refit import rebalance_minimal
from ...state.store import KEY_FIELD, KeyedStateStore
from ..durable.local_sync import BlockScan, LocalSync, scan_blocks
from .plan import SwapRequest, block_steps, next_blocks, resized, request_start
from .plan import smallest_within
from .units import bounded_with

__all__ = ["BlockAim", "block_aim", "group_steps", "plan_block_swap", "plans_by_blocks",
           "BLOCK_PLANS", "GIVEN_BY_BLOCKS_BYTES"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockAim:
    """Where a block swap goes: ``target`` as it is, or, with ``refit`` True, ``target``
    rebalanced on the state's per-block loads onto ``num_partitions`` partitions.
    ``target`` is a block table, or a bounded table when the placement in force is one
    over the same key groups (:func:`group_steps`)."""

    target: BlockPartitioner | TablePartitioner
    refit: bool
    num_partitions: int


def group_steps(base: Partitioner, target: Partitioner, key_type: str | None) -> bool:
    """Whether a swap from ``base`` to ``target`` moves whole key groups and named keys:
    both bounded tables over the same groups, hashed alike (:attr:`TablePartitioner.bounded`),
    with the same null policy. O(1).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> counts = {f"k{i}": i + 1 for i in range(40)}
    >>> a = tl.LeastCountPartitioner(4, max_keys=8).fit(counts)
    >>> b = tl.LeastKeyPartitioner(3, max_keys=8).fit(counts)
    >>> group_steps(a, b, "string"), group_steps(a, tl.LeastCountPartitioner(4), "string")
    (True, False)
    """
    kind = key_type or "auto"
    return (isinstance(base, TablePartitioner) and isinstance(target, TablePartitioner)
            and base.bounded and target.bounded and base.num_groups == target.num_groups
            and base.fallback_type(kind) == target.fallback_type(kind)
            and base.null_policy == target.null_policy)


def _group_aim(current: TablePartitioner, request: SwapRequest, target: Partitioner | None,
               key_type: str | None) -> BlockAim | None:
    """:func:`block_aim` for a bounded table in force: a target given whole over the same
    groups (a fitted table, or a fluid swap's aim). A refit or a new partition count alone
    needs the keys' loads: it is planned by keys."""
    if target is None:
        if request.refit == "minimal":
            return None
        _, base = request_start(current, request, key_type)
        target = base
    if target is None:
        return None
    bound = target.for_column(key_type)
    return BlockAim(bound, False, bound.num_partitions) \
        if isinstance(bound, TablePartitioner) and group_steps(current, bound, key_type) \
        else None


def block_aim(current: Partitioner, request: SwapRequest, target: Partitioner | None,
              key_type: str | None) -> BlockAim | None:
    """The aim of a swap that can be planned by blocks (module docs), or None: the swap is
    planned by keys. Raises what building the target raises (a swap to refuse).

    ``current`` is the placement in force, bound to ``key_type``; ``target`` the aim of a
    fluid swap under way. By blocks: ``current`` a block table (not a key overlay) and a
    target over the same blocks. The null key has no block: the scans never list it, and
    the plan moves it when the partition count moves its partition (``"group"``). A bounded
    table in force plans by key groups the same way (:func:`_group_aim`)."""
    if isinstance(current, TablePartitioner) and current.bounded:
        return _group_aim(current, request, target, key_type)
    if isinstance(current, OverlayPartitioner) or not isinstance(current, BlockPartitioner):
        return None
    if target is not None:
        bound = target.for_column(key_type)
        return BlockAim(bound, False, bound.num_partitions) \
            if isinstance(bound, BlockPartitioner) and block_steps(current, bound) else None
    n, base = request_start(current, request, key_type)
    start = base if base is not None else current
    if request.refit == "minimal":
        return BlockAim(start, True, n) \
            if isinstance(start, BlockPartitioner) and block_steps(current, start) else None
    aim = base if base is not None else resized(current, n)
    return BlockAim(aim, False, n) \
        if isinstance(aim, BlockPartitioner) and block_steps(current, aim) else None


#: ``auto`` plans a block swap whose target is given whole by blocks from this many bytes of
#: state on the state path; below it, the driver reads a local state path faster than the
#: scan job runs. A refit it plans by keys: its per-block loads are a full scan of each copy
#: in Python, which measured slower than the driver's read at every size (RESULTS.md).
GIVEN_BY_BLOCKS_BYTES = 64 << 20
BLOCK_PLANS = ("auto", "true", "false")


def plans_by_blocks(setting: str, aim: BlockAim, state_bytes: Callable[[], int]) -> bool:
    """Whether to plan a block swap by blocks (:func:`plan_block_swap`) or by keys, per
    ``spark.trilink.state.blockPlans`` (``setting``): ``"true"``, ``"false"``, or
    ``"auto"``: a target given whole by blocks once ``state_bytes()`` (the version's bytes on
    the state path, one listing per partition) reaches :data:`GIVEN_BY_BLOCKS_BYTES`, a refit
    by keys.

    Raises
    ------
    InvalidArgumentError
        ``setting`` is not one of :data:`BLOCK_PLANS`.

    Examples
    --------
    >>> aim = BlockAim(BlockPartitioner(4), False, 4)
    >>> plans_by_blocks("auto", aim, lambda: 1 << 20), plans_by_blocks("true", aim, int)
    (False, True)
    """
    value = choice(setting.strip().lower(), "spark.trilink.state.blockPlans", BLOCK_PLANS)
    if value != "auto":
        return value == "true"
    return not aim.refit and state_bytes() >= GIVEN_BY_BLOCKS_BYTES


def plan_block_swap(spark: Any, store: KeyedStateStore, batch_id: int, prev: int,
                    current: BlockPartitioner | TablePartitioner, request: SwapRequest,
                    aim: BlockAim, local: LocalSync) -> tuple[dict[str, Any], Any, Partitioner]:
    """Decide a block swap for ``batch_id`` from the local copies at version ``prev``
    (module docs); returns what :func:`~trilink_spark.keyed.swaps.plan.plan_swap` returns, the
    same plan for the same state.

    Raises
    ------
    StateStoreError
        A scan job failed (a copy or the state path could not be read): the batch fails, and
        its retry plans again.
    InvalidArgumentError
        The refit cannot be made (the swap is refused, nothing is written).

    Notes
    -----
    Cost: with a refit, one full scan of each copy on its executor (O(state), spread over
    the partitions), O(blocks) to the driver; then O(the moving keys) read and sent to the
    driver. No state path read.
    """
    import pyarrow as pa

    if isinstance(current, TablePartitioner):
        return _plan_group_swap(spark, store, batch_id, prev, current, request, aim, local)
    partitions = current.num_partitions
    target = aim.target
    if not isinstance(target, BlockPartitioner):
        raise InvalidArgumentError(f"a swap from a block table by blocks needs a block table "
                                   f"as its target, got {type(target).__name__}")
    scans: list[BlockScan] | None = None
    if aim.refit:
        scans = _scan(spark, store, batch_id, prev, local, {}, True, partitions)
        loads = np.sum([s.loads for s in scans], axis=0)
        counts: dict[Any, float] = {int(b): float(loads[b]) for b in np.flatnonzero(loads)}
        null_load = float(sum(s.null_load for s in scans))
        if null_load:
            counts[None] = null_load
        target = rebalance_minimal(target, counts, num_partitions=aim.num_partitions,
                                   unit="block")  # type: ignore[assignment]
    moving_blocks = np.flatnonzero(current.table != target.table)
    by_source = {p: moving_blocks[current.table[moving_blocks] == p].tolist()
                 for p in range(partitions)}
    scans = _scan(spark, store, batch_id, prev, local, by_source, False, partitions)
    moved = pa.concat_tables(
        [s.moved.append_column("from", pa.array(np.full(s.moved.num_rows, p, np.int32)))
         for p, s in enumerate(scans)], promote_options="permissive")
    blocks = moved.column("block").to_numpy()
    complete = True
    placement: BlockPartitioner = target
    cap = request.max_keys_per_batch
    if request.mode == "fluid" and cap is not None and moved.num_rows > cap:
        chosen, hybrid = next_blocks(current, target, blocks, cap)
        if not chosen.all():  # else one block over the cap holds every key left: done now
            complete, placement = False, hybrid
            moved, blocks = moved.filter(pa.array(chosen)), blocks[chosen]
    moves = pa.table({KEY_FIELD: moved.column(KEY_FIELD),
                      "from": moved.column("from"),
                      "to": pa.array(target.table[blocks].astype(np.int32), pa.int32())})
    moves = _with_null_move(moves, current, placement, any(s.has_null for s in scans))
    return _scanned_plan(batch_id, prev, request, current, placement, target, moves, scans,
                         complete, "blocks"), moves, placement


def _plan_group_swap(spark: Any, store: KeyedStateStore, batch_id: int, prev: int,
                     current: TablePartitioner, request: SwapRequest, aim: BlockAim,
                     local: LocalSync) -> tuple[dict[str, Any], Any, Partitioner]:
    """:func:`plan_block_swap` between bounded tables (:func:`group_steps`): one Spark job
    range-scans the key groups whose partition changes, each in the copy that holds it now,
    and looks up, where they are now, the named keys (of either table) whose partition
    changes and no scan lists. A scanned key moves when the target places it elsewhere.
    O(the moving groups' keys + the named keys) read and sent to the driver, no state path
    read; the same plan as by keys.

    A fluid step under ``max_keys_per_batch`` moves every named key whose partition changes
    and the smallest moving groups that fit the cap (at least one): its placement is a
    bounded table with those groups switched and those keys pinned where they went
    (:func:`_group_step`)."""
    import pyarrow as pa

    target = aim.target
    if not isinstance(target, TablePartitioner) or current.groups is None \
            or target.groups is None:
        raise InvalidArgumentError("a swap by key groups needs two bounded tables, got "
                                   f"{type(current).__name__} and {type(target).__name__}")
    partitions = current.num_partitions
    now_groups = current.groups.astype(np.int64)
    moving = np.flatnonzero(now_groups != target.groups)
    by_source = {p: moving[now_groups[moving] == p].tolist() for p in range(partitions)}
    names = list(dict.fromkeys([*current.table_arrays()[0], *target.table_arrays()[0]]))
    key_type = local.key_type
    named = pa.array(names, key_type) if key_type is not None else pa.array(names)
    lookups: dict[int, Any] = {}
    wanted = target.assign(named) if names else np.zeros(0, np.int32)
    if names:
        at = current.assign(named).astype(np.int64)
        changed = at != wanted
        group = current.key_groups(named)
        scanned = np.isin(group, moving) & (at == now_groups[group])
        for p in np.unique(at[changed & ~scanned]).tolist():
            lookups[int(p)] = named.filter(pa.array(changed & ~scanned & (at == p)))
    scans = _scan(spark, store, batch_id, prev, local, by_source, False, partitions, lookups)
    found = pa.concat_tables(
        [s.moved.append_column("from", pa.array(np.full(s.moved.num_rows, p, np.int32)))
         for p, s in enumerate(scans)], promote_options="permissive")
    keys = found.column(KEY_FIELD)
    origin = found.column("from").to_numpy()
    to = target.assign(keys).astype(np.int32) if len(keys) else np.zeros(0, np.int32)
    leaving = to != origin
    placement: TablePartitioner = target
    complete = True
    cap = request.max_keys_per_batch
    if request.mode == "fluid" and cap is not None and int(leaving.sum()) > cap:
        by_name = _named_mask(keys, named)
        chosen = _step_groups(found.column("block").to_numpy(), leaving & ~by_name,
                              cap - int((leaving & by_name).sum()))
        if chosen is not None:
            placement, complete = _group_step(current, target, chosen, named, wanted), False
            to = placement.assign(keys).astype(np.int32) if len(keys) else to
            leaving = to != origin
    mask = pa.array(leaving)
    moves = pa.table({KEY_FIELD: keys.filter(mask), "from": found.column("from").filter(mask),
                      "to": pa.array(to[leaving], pa.int32())})
    moves = _with_null_move(moves, current, placement, any(s.has_null for s in scans))
    plan = _scanned_plan(batch_id, prev, request, current, placement, target, moves, scans,
                         complete, "groups")
    return plan, moves, placement


def _named_mask(keys: Any, named: Any) -> Any:
    """Which of ``keys`` are in ``named`` (Arrow arrays), as a numpy mask. O(keys + named)."""
    import pyarrow.compute as pc

    if not len(keys):
        return np.zeros(0, dtype=bool)
    return np.asarray(pc.is_in(keys, value_set=named).to_numpy(zero_copy_only=False), bool)


def _step_groups(groups: Any, leaving: Any, room: int) -> Any:
    """The moving groups a fluid step takes: the smallest (by keys leaving) that fit in
    ``room`` keys, at least one; None when that is every moving group (the step finishes
    the swap). O(keys + groups log groups)."""
    moving = groups[leaving]
    if not len(moving):
        return None
    chosen = smallest_within(moving, room)
    return None if len(chosen) == len(np.unique(moving)) else chosen


def _group_step(current: TablePartitioner, target: TablePartitioner, chosen: Any,
                named: Any, wanted: Any) -> TablePartitioner:
    """The placement of a fluid step between bounded tables: ``current``'s groups with
    ``chosen`` switched to ``target``'s, every named key of either table (``named``) pinned
    where ``target`` puts it (``wanted``: it moves in this step), on ``max`` of both partition
    counts (a partition being removed keeps its groups until they leave). Holds at most both
    tables' entries. O(groups + named keys)."""
    if current.groups is None or target.groups is None:
        raise InvalidArgumentError("a fluid step by key groups needs two bounded tables")
    groups = current.groups.copy()
    groups[chosen] = target.groups[chosen]
    n = max(current.num_partitions, target.num_partitions)
    keys = named.to_pylist()
    # the table with n partitions lends the rest of its fields (loads, weights): a step
    # places every key by its entries and groups and is never fitted
    return bounded_with(target if target.num_partitions == n else current, keys, wanted,
                        groups, max(target.max_keys, len(keys), 1),
                        np.zeros(target.num_groups))


def _scanned_plan(batch_id: int, prev: int, request: SwapRequest, current: Partitioner,
                  placement: Partitioner, target: Partitioner, moves: Any,
                  scans: list[BlockScan], complete: bool, planned_by: str) -> dict[str, Any]:
    """The plan record of a swap planned from the scans: the key plan's fields, the removed
    partitions' counters (partition 0 takes them over) from the scans, and ``planned_by``.
    O(partitions)."""
    partitions = current.num_partitions
    carried: dict[str, int] = {}
    for p in range(placement.num_partitions, partitions):
        for name, value in scans[p].counters.items():
            carried[name] = carried.get(name, 0) + value
    return {
        "batch_id": batch_id, "prev": prev, "mode": request.mode,
        "partitions_before": partitions, "partitions_after": placement.num_partitions,
        "keys_total": int(sum(s.keys for s in scans)), "moved_keys": int(moves.num_rows),
        "complete": complete, "placement": placement.to_dict(), "target": target.to_dict(),
        "max_keys_per_batch": request.max_keys_per_batch, "refit": request.refit,
        "request": request.request_id, "carried_counters": carried, "planned_by": planned_by,
    }


def _with_null_move(moves: Any, current: Partitioner, placement: Partitioner,
                    has_null: bool) -> Any:
    """``moves`` plus the null key's move when the state holds it and the batch's placement
    puts it elsewhere (under ``"group"``, ``pmod(42, n)`` of another partition count). The
    null key has no block, so the scans never list it; its row is the key column's null.
    O(moves)."""
    import pyarrow as pa

    if not has_null:
        return moves
    at = null_partition(current.null_policy, current.num_partitions)
    to = null_partition(placement.null_policy, placement.num_partitions)
    if at == to:
        return moves
    null = pa.table({KEY_FIELD: pa.nulls(1, moves.schema.field(KEY_FIELD).type),
                     "from": pa.array([at], pa.int32()), "to": pa.array([to], pa.int32())})
    return pa.concat_tables([moves, null])


def _scan(spark: Any, store: KeyedStateStore, batch_id: int, prev: int, local: LocalSync,
          by_source: dict[int, list[int]], loads: bool, partitions: int,
          lookups: dict[int, Any] | None = None) -> list[BlockScan]:
    """One Spark task per partition of version ``prev``: :func:`scan_blocks` of its copy
    (``lookups``: the keys, an Arrow array per partition, to look up there)."""
    fn = _scan_function(store, batch_id, prev, local, by_source, loads, lookups or {})
    ids = spark.range(0, partitions, 1, partitions)
    schema = ("partition int, keys long, counters string, loads binary, null_load double, "
              "moved binary, has_null boolean")
    try:
        rows = ids.mapInArrow(fn, schema).collect()
    except Exception as err:  # noqa: BLE001 - a failed job is a state read that failed
        typed = task_error(err)
        if isinstance(typed, (StateCorruptError, StateStoreError)):  # what the task found (a
            # corrupt changelog, a full disk), typed; both fail the batch and keep the request
            raise type(typed)(f"batch {batch_id}: the swap plan could not read the local "
                              f"copies of {store.path} at version {prev}: {typed}") from err
        raise StateStoreError(
            f"batch {batch_id}: the swap plan could not read the local copies of "
            f"{store.path} at version {prev} ({type(err).__name__}: {str(err)[:2000]})"
        ) from err
    found: dict[int, BlockScan] = {}
    for row in rows:
        found[int(row["partition"])] = _decoded(row, f"partition {row['partition']}")
    if sorted(found) != list(range(partitions)):
        raise StateCorruptError(f"batch {batch_id}: the swap plan's scan returned partitions "
                                f"{sorted(found)}, not 0..{partitions - 1}")
    return [found[p] for p in range(partitions)]


def _decoded(row: Any, where: str) -> BlockScan:
    """A scan task's result row as a :class:`BlockScan` (the driver's side of
    :func:`_scan_function`)."""
    import pyarrow as pa

    raw = row["loads"]
    loads = np.frombuffer(raw, dtype="<f8").copy() if raw else None
    moved = pa.ipc.open_stream(pa.py_buffer(row["moved"])).read_all()
    return BlockScan(int(row["keys"]), {str(k): int(v) for k, v in
                                        json.loads(row["counters"]).items()},
                     loads, float(row["null_load"]), moved, bool(row["has_null"]))


def _scan_function(store: KeyedStateStore, batch_id: int, prev: int, local: LocalSync,
                   by_source: dict[int, list[int]], loads: bool,
                   lookups: dict[int, Any]) -> Any:
    def run(batches: Any) -> Any:
        import pyarrow as pa

        schema = pa.schema([("partition", pa.int32()), ("keys", pa.int64()),
                            ("counters", pa.string()), ("loads", pa.binary()),
                            ("null_load", pa.float64()), ("moved", pa.binary()),
                            ("has_null", pa.bool_())])
        for batch in batches:
            for pid in batch.column(0).to_pylist():
                pid = int(pid)
                found = scan_blocks(local, store, pid, prev, by_source.get(pid, []), loads,
                                    f"partition {pid}'s state before batch {batch_id}",
                                    lookups.get(pid))
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, found.moved.schema) as writer:
                    writer.write_table(found.moved)
                per_block = b"" if found.loads is None else \
                    np.asarray(found.loads, dtype="<f8").tobytes()
                yield pa.RecordBatch.from_pydict(
                    {"partition": [pid], "keys": [found.keys],
                     "counters": [json.dumps(found.counters)], "loads": [per_block],
                     "null_load": [found.null_load], "moved": [sink.getvalue().to_pybytes()],
                     "has_null": [found.has_null]},
                    schema=schema)

    return run
