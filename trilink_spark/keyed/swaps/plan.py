"""Barrier-synchronised keyed-state swaps: decide once, move only the keys that change.

A ``foreachBatch`` boundary is an aligned barrier: every task of batch ``b - 1`` has finished
before batch ``b`` starts (the Sync instruction of the Trilink paper, §4.2.3, on Spark's own
barrier). A swap requested while the query runs takes effect at the next boundary:

1. The driver decides the new placement and which stored keys change partition, and writes an
   immutable plan (``swaps/<b>/plan.json`` and the moved keys, ``moves.state``) before any task
   of batch ``b`` runs. A replayed batch finds the plan and never decides again.
2. One small Spark job cuts the moved keys' state out of their old partitions' version
   ``b - 1`` into per-(source, destination) segments: only moved keys' state is written.
3. Each task of batch ``b`` starts from its own state minus its outgoing keys, plus its
   incoming segments, and writes version ``b`` as usual.

``"sync"`` moves every key at once; ``"fluid"`` moves at most ``max_keys_per_batch`` keys per
batch, heaviest first, placing with the old strategy plus an overlay of the keys already moved
(as Megaphone migrates in bins), until done.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..._internal.validation import check_num_partitions, choice, count
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidKeyTypeError
from ...errors import StateCorruptError, TrilinkError, UnknownStrategyError
from ...partitioners import BlockPartitioner, Partitioner, TablePartitioner
from ...partitioners import WeightPartitioner
from ...partitioners.core.base import KEY_KINDS
from ...partitioners.core.keys import null_partition
from ...partitioners.tables.overlay import OverlayPartitioner
from ...partitioners.choosing.refit import rebalance_minimal
from ...state.store import KEY_FIELD, KeyedStateStore
from ..durable.local_sync import LocalSync, read_moved
from ..durable.codec import decode_keys, read_counters

__all__ = ["SwapReport", "SwapRequest", "SWAP_MODES", "REFITS", "check_request", "plan_swap",
           "block_steps", "next_blocks", "smallest_within", "resized", "request_start",
           "write_segments"]

logger = logging.getLogger(__name__)

SWAP_MODES = ("sync", "fluid")
REFITS = ("minimal", "none")


@dataclass(frozen=True)
class SwapReport:
    """What one swap batch did.

    Attributes
    ----------
    batch_id : int
    mode : str
        ``"sync"`` or ``"fluid"``.
    partitions_before, partitions_after : int
    keys_total : int
        Keys with state before the batch.
    moved_keys : int
        Keys whose state changed partition in this batch.
    moved_bytes : int
        Bytes of the segments written for them (Arrow IPC).
    complete : bool
        Whether the placement reached its target (a fluid swap takes several batches); True
        for a refused swap too: nothing is under way, another may be requested.
    seconds : float
        Wall time of the swap batch on the driver: plan, segments and the batch itself.
    refused : str or None
        None when the swap was carried out; else why it could not be (the batch then ran
        with the placement in force, moving nothing, and ``keys_total`` is 0: not counted).
    """

    batch_id: int
    mode: str
    partitions_before: int
    partitions_after: int
    keys_total: int
    moved_keys: int
    moved_bytes: int
    complete: bool
    seconds: float
    refused: str | None = None


@dataclass(frozen=True)
class SwapRequest:
    """A swap asked for with ``run.request_swap(...)``, applied at the next batch.

    ``request_id`` names a request made with ``request_swap`` (kept on the state path until a
    batch planned or refused it: :meth:`to_record`); None for the swaps the runner decides
    itself (an adaptive switch, a restart's changed arguments, a rebalancer's moves).
    """

    strategy: Partitioner | None
    num_partitions: int | None
    refit: str
    mode: str
    max_keys_per_batch: int | None
    #: A catalogue strategy given by name, built at the swap on the target partition count.
    strategy_name: str | None = None
    request_id: str | None = None

    def to_record(self) -> dict[str, Any]:
        """The request as JSON (:meth:`from_record` reads it back). O(the strategy's size)."""
        return {"request_id": self.request_id, "num_partitions": self.num_partitions,
                "refit": self.refit, "mode": self.mode,
                "max_keys_per_batch": self.max_keys_per_batch,
                "strategy_name": self.strategy_name,
                "strategy": None if self.strategy is None else self.strategy.to_dict()}

    @staticmethod
    def from_record(body: dict[str, Any], where: str) -> SwapRequest:
        """A request stored with :meth:`to_record`, checked as ``request_swap`` checks it.

        Raises
        ------
        StateCorruptError
            ``body`` is not a request this release stored (``where`` names the file).
        """
        try:
            strategy = body.get("strategy")
            name = body.get("strategy_name")
            request_id = body["request_id"]
            if not isinstance(request_id, str) or not request_id:
                raise TypeError("request_id must be a non-empty str")
            request = SwapRequest.checked(
                Partitioner.from_dict(strategy) if strategy is not None else name,
                body.get("num_partitions"), body.get("refit"), body.get("mode"),
                body.get("max_keys_per_batch"))
        except (TrilinkError, KeyError, TypeError, ValueError, AttributeError,
                RecursionError) as err:
            raise StateCorruptError(
                f"{where} is not a swap request this release stored ({type(err).__name__}: "
                f"{err}); delete it to drop the request") from None
        return replace(request, request_id=request_id)

    @staticmethod
    def checked(strategy: Any, num_partitions: Any, refit: Any, mode: Any,
                max_keys_per_batch: Any) -> SwapRequest:
        """Validate the arguments of ``request_swap``."""
        if strategy is not None and not isinstance(strategy, (str, Partitioner)):
            raise InvalidArgumentTypeError(
                f"strategy must be a strategy name, a Partitioner or None, got "
                f"{type(strategy).__name__}")
        if isinstance(strategy, OverlayPartitioner):
            raise InvalidArgumentError("an overlay placement is internal to fluid swaps")
        if num_partitions is not None:
            num_partitions = check_num_partitions(num_partitions)
        refit = choice(refit, "refit", REFITS)
        mode = choice(mode, "mode", SWAP_MODES)
        if max_keys_per_batch is not None:
            max_keys_per_batch = count(max_keys_per_batch, "max_keys_per_batch (or None)")
        if mode == "fluid" and max_keys_per_batch is None:
            raise InvalidArgumentError("mode='fluid' needs max_keys_per_batch")
        if strategy is None and num_partitions is None and refit == "none":
            raise InvalidArgumentError(
                "request_swap needs a strategy, a num_partitions or refit='minimal'")
        name = None
        if isinstance(strategy, str):
            from ...partitioners.choosing.catalogue import build

            try:
                build(strategy, num_partitions or 1)  # refuse an unknown name now
            except UnknownStrategyError as err:
                raise InvalidArgumentError(str(err)) from None
            name, strategy = strategy, None
        if (strategy is not None and num_partitions is not None
                and strategy.num_partitions != num_partitions):
            raise InvalidArgumentError(
                f"strategy has {strategy.num_partitions} partitions but num_partitions="
                f"{num_partitions}; give one or make them agree")
        return SwapRequest(strategy, num_partitions, refit, mode, max_keys_per_batch, name)


def _counts(keys: list[Any], rows: Any) -> dict[Any, int]:
    return {k: max(int(r), 1) for k, r in zip(keys, rows)}


def resized(strategy: Partitioner, n: int) -> Partitioner:
    """An unfitted strategy of ``strategy``'s kind and configuration on ``n`` partitions."""
    return Partitioner.from_dict({**strategy.fresh().to_dict(), "num_partitions": n})


def request_start(current: Partitioner, request: SwapRequest, key_type: str | None
           ) -> tuple[int, Partitioner | None]:
    """The partition count a request aims at, and the strategy it starts from (None: the
    placement in force, re-fitted or re-made), bound to the state's key type."""
    n = request.num_partitions or (request.strategy.num_partitions
                                   if request.strategy is not None else current.num_partitions)
    base = request.strategy
    if request.strategy_name is not None:
        from ...partitioners.choosing.catalogue import build

        # by name: built with the null policy in force (the null key stays where it is
        # unless the partition count moves it, under "group")
        base = build(request.strategy_name, n, null_policy=current.null_policy)
    elif base is not None and base.num_partitions != n:
        base = resized(base, n)
    if base is not None:  # a copy: the request's own strategy is never changed
        base = base.for_column(key_type)
    return n, base


def _target(current: Partitioner, request: SwapRequest, keys: list[Any],
            rows: Any, key_type: str | None) -> Partitioner:
    """The placement a request aims at, from the current one and the stored keys' loads,
    bound to the state's key type (before it places any key)."""
    n, base = request_start(current, request, key_type)
    counts = _counts(keys, rows)
    if request.refit == "minimal":
        start = base if base is not None else current
        if isinstance(start, WeightPartitioner):  # unequal capacities: refit it whole
            return resized(start, n).fit(counts)
        return rebalance_minimal(start, counts, num_partitions=n)
    if base is None:  # refit="none", only a new partition count: same kind, re-made
        base = resized(current, n)
    if isinstance(base, TablePartitioner) and not len(base):
        base.fit(counts)
    return base


def block_steps(base: Partitioner, target: Partitioner) -> bool:
    """Whether a fluid swap from ``base`` to ``target`` moves whole blocks (both block tables
    over the same blocks); else it moves keys, under an overlay."""
    return (isinstance(base, BlockPartitioner) and isinstance(target, BlockPartitioner)
            and base.num_blocks == target.num_blocks and base.key_type == target.key_type
            and base.null_policy == target.null_policy)


def smallest_within(units: Any, cap: int) -> Any:
    """The units (blocks, key groups) of a fluid step, given each moving key's unit
    (``units``, not empty): the smallest by keys, as many as fit in ``cap`` keys, and at least
    one (a unit bigger than the cap still moves, alone). O(keys + units log units).

    Examples
    --------
    >>> smallest_within(np.array([3, 3, 3, 1, 2, 2]), 3).tolist()
    [1, 2]
    """
    ids, sizes = np.unique(units, return_counts=True)
    order = np.argsort(sizes, kind="stable")
    fits = np.cumsum(sizes[order]) <= cap
    fits[0] = True
    return ids[order[fits]]


def next_blocks(base: BlockPartitioner, target: BlockPartitioner, blocks: Any,
                 cap: int) -> tuple[Any, BlockPartitioner]:
    """Which moving keys go next, given each one's block (``blocks``): the keys of the
    smallest blocks, as many as fit in ``cap`` keys, at least one block (a mask over
    ``blocks``), and the block table placing them: ``base``'s table with those blocks
    switched to ``target``'s partitions, on ``max`` of both partition counts (a partition
    being removed keeps its blocks until they leave). O(keys + num_blocks log num_blocks)."""
    chosen = smallest_within(blocks, cap)
    table = base.table.copy()
    table[chosen] = target.table[chosen]
    hybrid = base.with_table(table, max(base.num_partitions, target.num_partitions))
    return np.isin(blocks, chosen), hybrid


def _probe_keys(key_type: str | None, column_type: str | None) -> list[Any] | None:
    """A few keys of the state's key type, or None: not known (or of a type not probed)."""
    if key_type in ("int", "long"):
        return [0, 1, 2, 3]
    if key_type == "string":
        return ["a", "b", "c", "d"]
    if key_type == "binary":
        return [b"a", b"b", b"c", b"d"]
    if key_type is None and column_type in ("float", "double"):
        return [0.5, 1.5, 2.5, 3.5]
    return None


def check_request(current: Partitioner, request: SwapRequest, key_type: str | None,
                  column_type: str | None = None) -> None:
    """Refuse a request that cannot be carried out from the placement ``current`` on the
    state's keys.

    Parameters
    ----------
    current : Partitioner
        The placement in force, bound to the state's key type.
    request : SwapRequest
    key_type : {"int", "long", "string", "binary"} or None
        The key type the state is placed by (the one its placement record holds:
        :meth:`~trilink_spark.state.store.KeyedStateStore.placement_record`); None when not
        known yet (checked when planned) or when no strategy hashes the key column in Python.
    column_type : str, optional
        With ``key_type`` None: the key column's Spark type (``"double"``, say), when known.

    The target is built as the swap will build it (:func:`plan_swap`, bound to
    ``key_type``), on a few keys of that type, and places them. O(the placement's size), no
    state read.

    Raises
    ------
    InvalidArgumentError
        More partitions than the blocks of a block placement, or any other target that
        cannot be built from ``current``.
    InvalidKeyTypeError
        The target cannot place keys of this type (``modulo`` on strings; a strategy whose
        ``key_type`` cannot hold the key column's values; any swap of a ``double`` key
        column, which only Spark's own hash places).
    """
    base = current.base if isinstance(current, OverlayPartitioner) else current
    n = request.num_partitions
    if (n is not None and isinstance(base, BlockPartitioner) and request.strategy is None
            and request.strategy_name is None and n > base.num_blocks):
        raise InvalidArgumentError(
            f"num_partitions={n} is more than the placement's {base.num_blocks} blocks: a "
            f"BlockPartitioner moves whole blocks, so it rescales to at most "
            f"{base.num_blocks} partitions; to go further, swap to a strategy with more "
            f"blocks (request_swap(tl.BlockPartitioner({n}, num_blocks=...)))")
    keys = _probe_keys(key_type, column_type)
    if keys is None:
        return
    what = f"this swap ({_describe(request)})"
    try:
        target = _target(base, request, keys, np.ones(len(keys), dtype=np.int64), key_type)
        target.assign(keys)
    except InvalidKeyTypeError as err:
        spark_type = KEY_KINDS.get(key_type or "", column_type)
        raise InvalidKeyTypeError(
            f"{what} cannot place this stream's {spark_type} keys: {err}") from None
    except TrilinkError as err:  # the target cannot be built from the placement in force
        if isinstance(err, InvalidArgumentError):
            raise InvalidArgumentError(f"{what} cannot be carried out: {err}") from None
        logger.debug("%s: not refused on probe keys (%s)", what, err)


def _describe(request: SwapRequest) -> str:
    strategy = request.strategy_name or (
        None if request.strategy is None else type(request.strategy).__name__)
    parts = [f"strategy={strategy!r}"] if strategy else []
    if request.num_partitions is not None:
        parts.append(f"num_partitions={request.num_partitions}")
    return ", ".join(parts + [f"refit={request.refit!r}", f"mode={request.mode!r}"])


def removed_counters(store: KeyedStateStore, prev: int, before: int, after: int
                     ) -> dict[str, int]:
    """The counters of the partitions ``after .. before - 1`` a swap removes, summed (they
    are carried into partition 0, so run-wide totals survive a rescale down). Reads those
    partitions' version ``prev``."""
    total: dict[str, int] = {}
    for p in range(after, before):
        found = read_counters(store.load_table(p, prev), store.version_path(p, prev))
        for name, value in found.items():
            total[name] = total.get(name, 0) + value
    return total


def plan_swap(store: KeyedStateStore, batch_id: int, prev: int, current: Partitioner,
              request: SwapRequest, target: Partitioner | None = None,
              key_type: str | None = None) -> tuple[dict[str, Any], Any, Partitioner]:
    """Decide a swap for ``batch_id`` from the state of version ``prev``.

    Returns the plan (JSON), the moves table (key, from, to) and the placement of the batch.
    ``target``: the aim of a fluid swap already under way. ``key_type``: the kind of the
    key column the state is placed by (``"int"``, ``"long"``, ``"string"``, ``"binary"``;
    :func:`~trilink_spark.keyed.swaps.placement.state_key_type`): every placement the plan uses is
    bound to it (:meth:`~trilink_spark.Partitioner.for_column`), so the stored keys (plain
    Python ints here) are placed in Python exactly as the JVM places their rows.

    Raises
    ------
    InvalidKeyTypeError
        The requested strategy's key type cannot hold the key column's values (nothing is
        written).

    Notes
    -----
    Cost: reads the keys of every partition's version ``prev`` (O(keys)), then vectorised
    placement of those keys (``assign``).
    """
    import pyarrow as pa

    keys_table = store.key_table(prev, extra=("rows",))
    key_col = keys_table.column(KEY_FIELD)
    stored_in = keys_table.column("partition").to_numpy()
    # keys as a strategy places them: the null key is None (decode_keys gives the runtime's
    # NULL_KEY), ints stay exact
    keys = key_col.to_pylist() if key_col.null_count else decode_keys(key_col)
    rows = keys_table.column("rows").to_numpy()
    current = current.for_column(key_type)
    base = current.base if isinstance(current, OverlayPartitioner) else current
    overrides = dict(current.overrides) if isinstance(current, OverlayPartitioner) else {}
    target = (_target(base, request, keys, rows, key_type) if target is None
              else target).for_column(key_type)
    wanted = np.asarray(target.assign(keys), dtype=np.int64) if keys else np.zeros(0, np.int64)
    # the null key has no block and is never an override: it goes where the batch's
    # placement puts it (its null policy's partition), decided once the placement is
    null_at = (np.flatnonzero(np.asarray(key_col.is_null().to_numpy(zero_copy_only=False), bool))
               if key_col.null_count else np.zeros(0, np.int64))
    moving = np.setdiff1d(np.flatnonzero(wanted != stored_in), null_at)
    complete = True
    # a swap under way under a key overlay (planned by a release before block steps) goes on
    # by keys: a block table would drop the overrides, which place keys already moved
    in_blocks = not overrides and block_steps(base, target)
    hybrid: BlockPartitioner | None = None
    if request.mode == "fluid" and request.max_keys_per_batch is not None \
            and len(moving) > request.max_keys_per_batch:
        complete = False
        if not in_blocks:
            heaviest = np.argsort(-rows[moving], kind="stable")[: request.max_keys_per_batch]
            moving = np.sort(moving[heaviest])
        else:
            blocks = base.blocks(keys)[moving]  # type: ignore[attr-defined]
            chosen, hybrid = next_blocks(base, target,  # type: ignore[arg-type]
                                          blocks, request.max_keys_per_batch)
            if chosen.all():  # one block over the cap holds every key left:
                hybrid, complete = None, True  # done now, not after an empty step
            moving = moving[chosen]
    if complete:
        placement: Partitioner = target
    elif hybrid is not None:
        # blocks already moved follow the target, the others stay: still one block table
        placement = hybrid
    else:
        moved: list[Any] = [keys[i] for i in moving.tolist()]
        overrides.update(zip(moved, wanted[moving].tolist()))
        # removed partitions stay until every key has left them
        placement = OverlayPartitioner(
            base, overrides, num_partitions=max(base.num_partitions, target.num_partitions))
    if null_at.size:
        wanted[null_at] = null_partition(placement.null_policy, placement.num_partitions)
        moving = np.union1d(moving, null_at[wanted[null_at] != stored_in[null_at]])
    moves = pa.table({KEY_FIELD: key_col.take(pa.array(moving)),
                      "from": pa.array(stored_in[moving], pa.int32()),
                      "to": pa.array(wanted[moving], pa.int32())})
    plan = {
        "batch_id": batch_id, "prev": prev, "mode": request.mode,
        "partitions_before": current.num_partitions,
        "partitions_after": placement.num_partitions,
        "keys_total": len(keys), "moved_keys": int(len(moving)), "complete": complete,
        "placement": placement.to_dict(), "target": target.to_dict(),
        "max_keys_per_batch": request.max_keys_per_batch, "refit": request.refit,
        # the request_swap call this plan carries out, recorded as done at the commit
        "request": request.request_id,
        # removed partitions' counters, which partition 0 takes over in this batch
        "carried_counters": removed_counters(store, prev, current.num_partitions,
                                             placement.num_partitions),
    }
    return plan, moves, placement


def write_segments(spark: Any, store: KeyedStateStore, batch_id: int, prev: int,
                   moves: Any, owner: str | None = None, local: LocalSync | None = None) -> int:
    """Cut the moved keys' state out of version ``prev`` into per-(source, destination)
    segments, with one Spark task per source partition; returns the bytes written.

    Idempotent: a replay rewrites the same segments from the same inputs. ``owner``: the
    runner's token, which each task checks in the manifest before it writes
    (:meth:`KeyedStateStore.check_owner`; None: no check). ``local``: the state's
    executor-local copies, from which each task reads only the moved keys
    (:func:`~trilink_spark.keyed.durable.local_sync.read_moved`); None: it reads its source's whole
    version from the state path.
    """
    if moves.num_rows == 0:
        return 0
    sources = sorted(set(moves.column("from").to_pylist()))
    fn = _segment_function(store, batch_id, prev, sources, owner, local)
    ids = spark.range(0, len(sources), 1, len(sources))
    written = ids.mapInArrow(fn, "source int, bytes long").collect()
    total = int(sum(int(r["bytes"]) for r in written))
    logger.info("batch %d: %d keys moved from %d partitions, %d bytes of segments", batch_id,
                moves.num_rows, len(sources), total)
    return total


def _segment_function(store: KeyedStateStore, batch_id: int, prev: int,
                      sources: list[int], owner: str | None = None,
                      local: LocalSync | None = None) -> Any:
    def run(batches: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..durable.codec import cut_segments

        moves = store.load_moves(batch_id)
        schema = pa.schema([("source", pa.int32()), ("bytes", pa.int64())])
        for batch in batches:
            for i in batch.column(0).to_pylist():
                source = sources[int(i)]
                mine = moves.filter(pc.equal(moves.column("from"), source))
                if local is None:
                    stored = store.load_table(source, prev)
                else:
                    stored = read_moved(local, store, source, prev, mine.column(KEY_FIELD),
                                        f"partition {source}'s state before batch {batch_id}")
                _, parts = cut_segments(stored, mine)
                if sum(t.num_rows for t in parts.values()) != mine.num_rows:
                    raise StateCorruptError(
                        f"batch {batch_id}'s plan moves {mine.num_rows} keys out of partition "
                        f"{source}, but its version {prev} holds "
                        f"{sum(t.num_rows for t in parts.values())} of them")
                if owner is not None:
                    store.check_owner(owner, f"partition {source}'s segments of batch "
                                             f"{batch_id}")
                total = store.save_segment(batch_id, source, parts)
                yield pa.RecordBatch.from_pydict({"source": [source], "bytes": [total]},
                                                 schema=schema)

    return run
