"""Swap plans by blocks: a swap between block tables plans from the executors' local copies.

A swap from one :class:`~trilink_spark.partitioners.block.BlockPartitioner` table to another
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

from ..._internal.validation import choice
from ...errors import StateCorruptError, StateStoreError
from ...partitioners import BlockPartitioner, Partitioner
from ...partitioners.keys import null_partition
from ...partitioners.overlay import OverlayPartitioner
from ...partitioners.refit import rebalance_minimal
from ...state.store import KEY_FIELD, KeyedStateStore
from ..durable.local_sync import BlockScan, LocalSync, scan_blocks
from .plan import SwapRequest, block_steps, next_blocks, resized, request_start

__all__ = ["BlockAim", "block_aim", "plan_block_swap", "plans_by_blocks", "BLOCK_PLANS",
           "GIVEN_BY_BLOCKS_BYTES"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockAim:
    """Where a block swap goes: ``target`` as it is, or, with ``refit`` True, ``target``
    rebalanced on the state's per-block loads onto ``num_partitions`` partitions."""

    target: BlockPartitioner
    refit: bool
    num_partitions: int


def block_aim(current: Partitioner, request: SwapRequest, target: Partitioner | None,
              key_type: str | None) -> BlockAim | None:
    """The aim of a swap that can be planned by blocks (module docs), or None: the swap is
    planned by keys. Raises what building the target raises (a swap to refuse).

    ``current`` is the placement in force, bound to ``key_type``; ``target`` the aim of a
    fluid swap under way. By blocks: ``current`` a block table (not a key overlay) and a
    target over the same blocks. The null key has no block: the scans never list it, and
    the plan moves it when the partition count moves its partition (``"group"``)."""
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
                    current: BlockPartitioner, request: SwapRequest, aim: BlockAim,
                    local: LocalSync) -> tuple[dict[str, Any], Any, Partitioner]:
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

    partitions = current.num_partitions
    target = aim.target
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
    carried: dict[str, int] = {}
    for p in range(placement.num_partitions, partitions):
        for name, value in scans[p].counters.items():
            carried[name] = carried.get(name, 0) + value
    plan = {
        "batch_id": batch_id, "prev": prev, "mode": request.mode,
        "partitions_before": partitions, "partitions_after": placement.num_partitions,
        "keys_total": int(sum(s.keys for s in scans)), "moved_keys": int(moves.num_rows),
        "complete": complete, "placement": placement.to_dict(), "target": target.to_dict(),
        "max_keys_per_batch": cap, "refit": request.refit, "request": request.request_id,
        "carried_counters": carried, "planned_by": "blocks",
    }
    return plan, moves, placement


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
          by_source: dict[int, list[int]], loads: bool, partitions: int) -> list[BlockScan]:
    """One Spark task per partition of version ``prev``: :func:`scan_blocks` of its copy."""
    fn = _scan_function(store, batch_id, prev, local, by_source, loads)
    ids = spark.range(0, partitions, 1, partitions)
    schema = ("partition int, keys long, counters string, loads binary, null_load double, "
              "moved binary, has_null boolean")
    try:
        rows = ids.mapInArrow(fn, schema).collect()
    except Exception as err:  # noqa: BLE001 - a failed job is a state read that failed
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
                   by_source: dict[int, list[int]], loads: bool) -> Any:
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
                                    f"partition {pid}'s state before batch {batch_id}")
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
