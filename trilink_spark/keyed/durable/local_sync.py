"""A keyed task that costs what its micro-batch touches: the executor-local store.

With the local store (the default of :func:`~trilink_spark.keyed_foreach_batch`), a task does
not read and rewrite its partition's whole state. It opens the partition's local RocksDB copy
(:class:`~trilink_spark.state.local.LocalState`), brings it to the version the batch starts
from (:func:`sync`), and reads only:

- the rows of the batch's keys;
- the keys the wake index names as due: those for which the partition's progress alone makes
  something happen (a timer or an open window whose time the key's watermark reaches once the
  key is idle, or a state TTL that runs out). A key's wake time is
  ``min(max(next + delay, seen + idle_timeout), seen + state_ttl)``, ``next`` being its
  earliest timer or what the processor reports (:meth:`KeyedWatermarkProcessFunction.state_wake`);
- with a processing-time TTL, the keys the processing-time index names as expired: no batch
  brought them a row for ``processing_ttl`` by the batch's processing time
  (:attr:`LocalConfig.batch_time`, fixed by the driver before the tasks run), the index
  ordering keys by their ``batch_time`` column (:func:`expire_processed`).

Only those keys become Python objects. The hooks run as before over them; the task then writes
a changelog of their rows (and of the keys the TTL expired) to the state path, applies it to the
local copy in one atomic write, and, when a snapshot is due (:func:`snapshot_due`: at least
``snapshot_interval`` batches since the last one, and changelogs since that hold as many rows
as the state has keys), has the version it started from written as a snapshot off its path
(:mod:`~trilink_spark.keyed.durable.snapshot_writer`).

:func:`sync` brings the local copy to the batch's start: nothing to do when it holds that
version (and the changelog on the state path is the one it applied: the attempt tokens match);
an undo of the last batch when it is one batch ahead (a replayed batch); the changelogs since
its version when it is behind (another executor ran the partition, or no task ran); else a
rebuild from the latest snapshot and the changelogs since, counted and logged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ...columns import EVENT_TIME_COL
from ...partitioners import BlockPartitioner, TablePartitioner
from ...errors import StateCorruptError, StateTypeError, TrilinkError
from ...state.changelog import DELETED_FIELD, changelog_info, changelog_table, combine
from ...state.incremental import download, restorable
from ...state.local import NULL_KEY_BYTES, LocalState, head, key_bytes, split_head
from ...state.rows import decode_rows, encode_rows
from ...state.store import KEY_FIELD, STATE_KIND, KeyedStateStore
from .codec import BATCH_TIME, add_counters, decode_state, encode_state
from ..semantics.keys import PartitionState
from ..semantics.tables import KeyedColumns
from .codec import arriving_high, key_array, merge_in, read_counters
from .snapshot_writer import start_snapshot, with_meta

if TYPE_CHECKING:
    import pandas as pd

    from ..semantics.process import KeyedWatermarkProcessFunction

__all__ = ["LocalConfig", "LocalSync", "SwapIn", "read_moved", "local_root", "sync", "load_touched", "save_touched", "wake_times",
           "snapshot_due", "SYNC_KINDS", "MAX_CHAIN_INTERVALS", "BlockScan", "scan_blocks"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: What :func:`sync` did: the copy was current, undone one batch, caught up, or rebuilt.
SYNC_KINDS = ("current", "undo", "catch-up", "rebuild")
_META_KEYS = (b"trilink.partition_high", b"trilink.counters", b"trilink.shared",
              b"trilink.shared_tables")
_TABLES = "trilink.shared_tables"
#: However little a partition changes, a snapshot after this many snapshot intervals, so that
#: its chain of changelogs (files to list, keep and replay) stays bounded.
MAX_CHAIN_INTERVALS = 100


@dataclass(frozen=True)
class LocalConfig:
    """Where a stateful run keeps its executor-local copies, and how (picklable).

    Attributes
    ----------
    root : str
        The local directory (``spark.trilink.state.localDir``); empty: the executor's own,
        resolved by the task (:func:`local_root`).
    store_id : str
        Names the state path's copies under ``root``.
    snapshot_interval : int
        At least this many batches between two snapshots of a partition
        (``spark.trilink.state.snapshotInterval``; :func:`snapshot_due`).
    state_ttl : float
        Event-time units a key may send nothing before its state expires (``inf``: never).
    blocks : BlockPartitioner
        Gives each key its block (the placement's, when it is a block table).
    processing_ttl : float
        Milliseconds of processing time a key may go without a batch that brings it a row
        before its state expires (``inf``: no processing-time TTL). Finite: the copy keeps
        the processing-time index (:attr:`~trilink_spark.state.local.LocalState.timed`).
    batch_time : float or None
        The batch's processing time (ms since the epoch), recorded in the manifest before
        the tasks run, so that a replay uses it again; None: the run keeps none.
    ttl_since : float or None
        The processing time a key without a recorded ``batch_time`` counts as last brought
        a row at: the time of the first batch of the run's processing-time TTL.
    keep_open : bool
        Whether a batch's task leaves its copy open in its Python worker for the partition's
        next task there (``spark.trilink.state.keepOpen``;
        :meth:`~trilink_spark.state.local.LocalState.release`).
    drop_after : int
        A copy under ``root`` that no task updated for more than this many batches is
        dropped by a later task of the run there (``spark.trilink.state.dropCopiesAfter``;
        :func:`~trilink_spark.state.sweep.sweep`); 0: never.
    """

    root: str
    store_id: str
    snapshot_interval: int
    state_ttl: float
    blocks: BlockPartitioner | None
    processing_ttl: float = math.inf
    batch_time: float | None = None
    ttl_since: float | None = None
    keep_open: bool = True
    drop_after: int = 10

    @property
    def layout(self) -> str:
        """How keys are given their block in the local key bytes: a copy recorded under
        another layout is rebuilt, not read (its keys would be looked up under other bytes)."""
        b = self.blocks
        return "none" if b is None else f"{b.num_blocks}:{b.key_type}:{b.null_policy}"

    def placed_by(self, placement: Any) -> LocalConfig:
        """These settings for a batch placed by ``placement``: a block table gives each key
        its block, a bounded table its key group (so a swap of groups range-scans them);
        any other placement keeps the default blocks. O(1), O(groups) for a bounded table."""
        if isinstance(placement, BlockPartitioner):
            return replace(self, blocks=placement)
        if isinstance(placement, TablePartitioner) and placement.bounded \
                and self.blocks is not None:
            # only the hashing counts in the key bytes: the default's null policy, so that a
            # copy of 4,096 long, string or binary groups keeps the default layout
            return replace(self, blocks=BlockPartitioner(
                1, placement.num_groups, key_type=placement.fallback_type(self.blocks.key_type),
                null_policy=self.blocks.null_policy))
        return self


@dataclass(frozen=True)
class SwapIn:
    """What a swap batch moves for one partition (:mod:`~trilink_spark.keyed.swaps.plan`): the keys
    that leave it (an Arrow key array), the segments of state that arrive (state tables),
    and, for partition 0, the counters of the partitions the swap removes. Runtime only."""

    leaving: Any
    incoming: Sequence[Any]
    carried: dict[str, int] | None = None


def local_root(config: LocalConfig) -> str:
    """Where this executor keeps the copies: ``config.root``, else the first of the
    executor's ``SPARK_LOCAL_DIRS``, else the temporary directory (a ``trilink-state``
    folder in either)."""
    if config.root:
        return config.root
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    return os.path.join(first or tempfile.gettempdir(), "trilink-state")


def _timed(config: LocalConfig) -> bool:
    """Whether the run expires keys by processing time (its copies keep the index)."""
    return math.isfinite(config.processing_ttl)


def _times(config: LocalConfig, table: Any) -> list[float] | None:
    """Each row's ``batch_time`` (``-inf``: none recorded) for a copy with the processing-time
    index, in row order; None for a copy without it. O(rows), vectorised."""
    import pyarrow.compute as pc

    if not _timed(config):
        return None
    if table is None or not table.num_rows:
        return []
    if BATCH_TIME not in table.column_names:
        return [-math.inf] * table.num_rows
    column = pc.fill_null(table.column(BATCH_TIME).cast("float64"), -math.inf)
    out: list[float] = column.to_numpy().astype(np.float64).tolist()
    return out


def _expiry_bound(config: LocalConfig) -> tuple[float, bool] | None:
    """The processing time at or below which a key's TTL ran out by this batch, and whether
    the keys without a recorded time are expired too (their time counts as
    :attr:`LocalConfig.ttl_since`); None without a processing-time TTL."""
    if not _timed(config) or config.batch_time is None:
        return None
    bound = config.batch_time - config.processing_ttl
    since = config.batch_time if config.ttl_since is None else config.ttl_since
    return bound, since <= bound


def _expiring(local: LocalState, config: LocalConfig) -> list[bytes]:
    """The keys whose processing-time TTL ran out by this batch (one index range scan)."""
    found = _expiry_bound(config)
    return [] if found is None else local.expiring(*found)


def _key_bytes(config: LocalConfig, keys: Any) -> list[bytes]:
    """Local key bytes of an Arrow key array, with the key's block first."""
    n = len(keys)
    blocks = np.zeros(n, dtype=np.int64)
    if config.blocks is not None and n:
        try:
            blocks = np.maximum(config.blocks.blocks(keys), 0)
        except (TrilinkError, ValueError, TypeError, OverflowError) as err:
            raise StateTypeError(f"keys of type {keys.type} cannot be given their block "
                                 f"({err})") from None
    return key_bytes(keys, blocks)


def wake_times(table: Any, processor: KeyedWatermarkProcessFunction, delay: float,
               idle_timeout: float, state_ttl: float) -> Any:
    """Each row's wake time (module docs), vectorised over a state table. O(rows + timers +
    shared rows)."""
    import pyarrow.compute as pc

    n = table.num_rows
    nxt = np.full(n, np.inf)
    timers = table.column("timers").combine_chunks() if n else None
    if timers is not None and len(pc.list_flatten(timers)):
        flat = pc.list_flatten(timers).to_numpy().astype(np.float64)
        parents = pc.list_parent_indices(timers).to_numpy()
        np.minimum.at(nxt, parents, flat)
    own = processor.state_wake(table)
    if own is not None:
        nxt = np.minimum(nxt, np.asarray(own, dtype=np.float64))
    else:
        for name in table.column_names:
            if name.startswith("shared:"):
                lengths = pc.fill_null(pc.list_value_length(table.column(name)), 0)
                nxt = np.where(np.asarray(lengths.to_numpy()) > 0, -np.inf, nxt)
    seen = np.asarray(pc.fill_null(table.column("seen"), -math.inf).to_numpy(), np.float64) \
        if n else np.zeros(0)
    with np.errstate(invalid="ignore"):
        idle_at = seen + idle_timeout  # -inf + inf: never idle, as the runtime's rule says
        idle_at[np.isnan(idle_at)] = np.inf
        due = np.where(np.isposinf(nxt), np.inf, np.maximum(nxt + delay, idle_at))
        expiry = np.full(n, np.inf) if math.isinf(state_ttl) else seen + state_ttl
    out = np.minimum(due, expiry)
    out[np.isnan(out)] = np.inf
    # -inf (a key without a finite time): read once the partition has one, not before;
    # one step down: what the runtime computes as ``x <= H - delay`` the index must not miss
    # as ``x + delay <= H`` by a rounding
    out = np.where(np.isinf(out), np.where(out > 0, np.inf, np.finfo(np.float64).min),
                   np.nextafter(out, -np.inf))
    return out


def _stored_table(local: LocalState, rows: Sequence[bytes]) -> Any:
    """The state table of stored rows (grouped by schema, decoded, concatenated)."""
    import pyarrow as pa

    groups: dict[int, list[bytes]] = {}
    for row in rows:
        _, sid, body = split_head(row)
        groups.setdefault(sid, []).append(body)
    parts = [decode_rows(bodies, local.schema(sid)) for sid, bodies in groups.items()]
    if not parts:
        return None
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise StateCorruptError(f"{local.directory}: stored rows do not combine ({err})") \
            from None


def _sticky(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` partition-wide values, naming every shared table ``old`` named too: a batch
    that read no key of a table must not forget how its rows are indexed."""
    merged = dict(new)
    before = json.loads(old.get(_TABLES) or "{}")
    now = json.loads(new.get(_TABLES) or "{}")
    if set(before) - set(now):
        merged[_TABLES] = json.dumps({**before, **now})
    return merged


def _meta_of(table: Any) -> dict[str, str]:
    found = table.schema.metadata or {}
    return {k.decode(): found[k].decode() for k in _META_KEYS if k in found}


def _puts(local: LocalState, config: LocalConfig, table: Any,
          processor: KeyedWatermarkProcessFunction, delay: float, idle: float
          ) -> list[tuple[bytes, bytes]]:
    """The local rows of a state table: key bytes and (head + encoded row)."""
    if table is None or not table.num_rows:
        return []
    plain = table.replace_schema_metadata(None)
    sid = local.register(plain.schema)
    wakes = wake_times(plain, processor, delay, idle, config.state_ttl).tolist()
    kbs = _key_bytes(config, plain.column(KEY_FIELD).combine_chunks())
    bodies = encode_rows(plain)
    return [(k, head(w, sid) + b) for k, w, b in zip(kbs, wakes, bodies)]


def _apply_table(local: LocalState, config: LocalConfig, version: int, attempt: str,
                 table: Any, inherit: bool, processor: KeyedWatermarkProcessFunction,
                 delay: float, idle: float, fresh: dict[str, Any] | None = None) -> None:
    """Apply a changelog (counted in the copy's :attr:`~LocalState.chain`), or, into an
    empty copy, a whole state table (``fresh``: the chain it was read from)."""
    import pyarrow.compute as pc

    logged = table.num_rows  # upserts and deletions, as the changelog holds them
    meta = local.meta.get("meta") or {}
    if not inherit:
        meta = _sticky(meta, _meta_of(table))
    deleted: list[bytes] = []
    if DELETED_FIELD in table.column_names:
        gone = pc.fill_null(table.column(DELETED_FIELD), False)
        deleted = _key_bytes(config, table.filter(gone).column(KEY_FIELD).combine_chunks())
        table = table.filter(pc.invert(gone)).drop_columns([DELETED_FIELD])
    puts = _puts(local, config, table, processor, delay, idle)
    times = _times(config, table)
    if fresh is not None:  # an emptied copy: nothing to read back or undo
        local.apply(version, attempt, meta, puts, [], {}, undo=False, chain=fresh, times=times,
                    layout=config.layout)
        return
    keys = [k for k, _ in puts] + deleted
    before = {k: v for k, v in zip(keys, local.get(keys)) if v is not None}
    chain = local.chain
    chain["logged"] = chain.get("logged", 0) + logged
    local.apply(version, attempt, meta, puts, deleted, before, chain=chain, times=times,
                layout=config.layout)


def snapshot_due(local: LocalState, batch_id: int, interval: int, pid: int = 0) -> bool:
    """Whether the task of ``batch_id`` has the version it starts from written as a snapshot.

    A snapshot is due once ``interval`` batches have run since the one that started the last
    snapshot (since batch 0 before the first) and the changelogs since hold at least as many
    rows as the state has keys, or, however little changed, once :data:`MAX_CHAIN_INTERVALS`
    intervals have passed. A copy that does not know its chain (written before it was
    recorded) takes one at the interval. The snapshot's cost,
    O(state), is so spread over batches that changed as much as it holds: a batch pays
    O(its keys) for it, amortised, at any state size (as Spark's RocksDB provider consolidates
    changelogs after ``minDeltasForSnapshot`` of them); a rebuild reads at most about twice
    the state, plus at most ``interval - 1`` batches' changelogs. Partition ``pid`` takes its
    snapshots only in batches with ``(batch_id + pid) % interval == 0``, so partitions that
    fill alike take theirs in different batches (``interval`` partitions never two in one
    batch), not all in the same one. O(1).

    Examples
    --------
    A partition 3 whose changes outgrew its state, at interval 4, waits for its slot:

    >>> import tempfile
    >>> with LocalState.open(tempfile.mkdtemp(), "doc", 3) as local:
    ...     local.apply(5, "a", {}, [], [], {}, chain={"at": None, "logged": 9})
    ...     [b for b in range(4, 12) if snapshot_due(local, b, 4, pid=3)]
    [5, 9]
    """
    if interval < 1 or (batch_id + pid) % interval:
        return False
    chain = local.chain
    at = chain.get("at")
    # the task of batch at + 1 took the last snapshot (of version at); none yet: batch 0
    since = batch_id - (at + 1 if isinstance(at, int) else 0)
    if since < interval:
        return False
    if "logged" not in chain:  # not recorded (an older copy) or malformed: by the interval
        return True
    return chain["logged"] >= local.keys or since >= MAX_CHAIN_INTERVALS * interval


def sync(local: LocalState, store: KeyedStateStore, config: LocalConfig, pid: int,
         target: int | None, processor: KeyedWatermarkProcessFunction, delay: float,
         idle: float) -> str:
    """Bring ``local`` to version ``target`` of partition ``pid`` (module docs); returns
    which of :data:`SYNC_KINDS` it took. A rebuild is logged.

    Raises
    ------
    StateCorruptError
        The state path lacks what ``target`` needs, or a file is damaged.
    """
    if local.version is not None and local.timed != _timed(config):
        local.reset()  # the processing-time index is kept, and rebuilt, for a run that uses it
    if target is None:
        if local.version is None:
            return "current"
        local.reset()
        return "rebuild"
    if _matches(local, store, config, pid, target):
        return "current"
    if local.version is not None and local.version > target and local.undo() \
            and _matches(local, store, config, pid, target):
        return "undo"
    chain: list[tuple[int, Any]] = []
    at: int | None = target
    snapshots, logs = store.listing(pid)
    while at is not None and at not in snapshots:
        if local.version == at and _matches(local, store, config, pid, at):
            for version, log in reversed(chain):
                info = changelog_info(log, store.changelog_path(pid, version))
                _apply_table(local, config, version, info.attempt, log, info.inherit,
                             processor, delay, idle)
            return "catch-up"
        path = store.changelog_path(pid, at)
        log = store.load_changelog(pid, at) if at in logs else None
        if log is None:
            break
        chain.append((at, log))
        prev = changelog_info(log, path).prev
        if prev is not None and prev >= at:
            raise StateCorruptError(f"{path} applies to version {prev}, not an earlier one: "
                                    "not a changelog of this partition")
        at = prev
    if at is not None and at in snapshots and _restored(local, store, config, pid, at):
        for version, log in reversed(chain):
            info = changelog_info(log, store.changelog_path(pid, version))
            _apply_table(local, config, version, info.attempt, log, info.inherit,
                         processor, delay, idle)
        logger.info("partition %d: local state rebuilt at version %d from snapshot %d's "
                    "table files and %d changelogs in %s", pid, target, at, len(chain),
                    store.path)
        return "rebuild"
    if at is None or at in snapshots:  # the chain is read: replay it, not read it again
        base = None if at is None else store.load_snapshot(pid, at)
        table = combine(base, [log for _, log in reversed(chain)],
                        store.changelog_path(pid, target))
        if table is None:
            table = encode_state(PartitionState()).slice(0, 0)
    else:
        table = store.load_table(pid, target)  # names the missing link
    local.reset()
    attempt = store.changelog_attempt(pid, target) or f"snapshot:{target}"
    fresh = {"at": at, "logged": sum(log.num_rows for _, log in chain)}
    _apply_table(local, config, target, attempt, table, False, processor, delay, idle,
                 fresh=fresh)
    logger.info("partition %d: local state rebuilt at version %d from %s (%d keys)", pid,
                target, store.path, table.num_rows)
    return "rebuild"


def _restored(local: LocalState, store: KeyedStateStore, config: LocalConfig, pid: int,
              at: int) -> bool:
    """Whether ``local`` now holds snapshot ``at`` restored from its table files (False: the
    snapshot is not incremental, or was kept in another layout, and ``local`` is as it was
    or empty). O(the snapshot's bytes)."""
    if not restorable(store, pid, at):
        return False
    target = tempfile.mkdtemp(prefix=f"snap-{pid}-restore-", dir=os.path.dirname(local.directory))
    os.rmdir(target)
    try:
        download(store, pid, at, target)
        try:
            local.restore(target)
        except StateCorruptError as err:
            raise StateCorruptError(
                f"{store.tables_path(pid, at)}: its table files do not open as a copy ({err}); "
                "restore the state path from a copy, or start over with a new one") from None
    finally:
        shutil.rmtree(target, ignore_errors=True)
    if local.timed != _timed(config) or not _matches(local, store, config, pid, at):
        local.reset()  # kept for another run's layout: rebuilt from rows instead
        return False
    local.apply(at, str(local.meta.get("attempt")), local.meta.get("meta") or {}, [], [], {},
                undo=False, chain={"at": at, "logged": 0}, times=[] if local.timed else None)
    return True


def _matches(local: LocalState, store: KeyedStateStore, config: LocalConfig, pid: int,
             version: int) -> bool:
    """Whether ``local`` holds ``version`` as the state path has it (same attempt), with its
    keys in ``config``'s layout (:attr:`LocalConfig.layout`)."""
    if local.version != version or local.layout != config.layout:
        return False
    durable = store.changelog_attempt(pid, version)
    mine = local.meta.get("attempt")
    return durable == mine if durable is not None else mine == f"snapshot:{version}"


def load_touched(local: LocalState, config: LocalConfig, frame: pd.DataFrame | None,
                 key: str, key_type: Any, where: str, keys: Any = None,
                 swap: SwapIn | None = None) -> tuple[PartitionState, dict[bytes, bytes]]:
    """The state of the batch's keys and of the due keys, and their stored rows (by key
    bytes): only those are read and decoded. ``keys``: the batch's key column as Arrow, when
    the caller has it (else it is taken from ``frame``).

    In a swap batch (``swap``), the keys that leave are neither read nor run (their stored
    rows join the undo record, for :func:`save_touched` deletes them) and the arriving
    segments join the state (:func:`~trilink_spark.keyed.durable.codec.merge_in`): O(the batch's,
    due and moved keys), not the partition.

    Raises
    ------
    StateCorruptError
        The copy lacks a key the swap moves out, already holds one it moves in, or the batch
        brought rows of a key that leaves (the plan and the placement disagree).
    """
    import pyarrow as pa

    meta = dict(local.meta.get("meta") or {})
    high = float(json.loads(meta.get("trilink.partition_high", "-Infinity")))
    kbs: list[bytes] = []
    if frame is not None and len(frame):
        if keys is None:
            keys = pa.array(frame[key].to_numpy(dtype=object), from_pandas=True)
        elif isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        if key_type is not None and keys.type != key_type:
            try:
                keys = keys.cast(key_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                raise StateTypeError(
                    f"keys of column {key!r} do not convert back to its type {key_type} "
                    f"({err}); the local state store keys them by that type") from None
        kbs = list(dict.fromkeys(_key_bytes(config, keys.unique())))
        times = frame[EVENT_TIME_COL].to_numpy(dtype=np.float64)
        if (~np.isnan(times)).any():
            high = max(high, float(np.nanmax(times)))
    leaving = _moved_bytes(config, None if swap is None else swap.leaving, key_type)
    out = set(leaving)
    if out and not out.isdisjoint(kbs):
        raise StateCorruptError(f"{where}: the batch brought rows of keys its swap plan moves "
                                "out of this partition (the plan and the placement disagree)")
    if swap is not None:  # the arriving keys raise the partition's event time (merge_in)
        high = max(high, arriving_high(swap.incoming))
    wanted = [k for k in dict.fromkeys(kbs + local.due(high) + _expiring(local, config))
              if k not in out]
    stored = local.get(wanted)
    before = {k: v for k, v in zip(wanted, stored) if v is not None}
    table = _stored_table(local, list(before.values()))
    if swap is not None:
        return _swapped(local, config, swap, table, meta, before, leaving, key_type, where), \
            before
    if table is None:
        state = PartitionState()
        if meta:
            empty = encode_state(PartitionState(), key_type, None)
            state = decode_state(with_meta(empty.slice(0, 0), meta), where)
        return state, before
    return decode_state(with_meta(table, meta), where), before


@dataclass(frozen=True)
class LocalSync:
    """What a task other than the batch's own needs to open a partition's local copy and
    bring it to a version (:func:`sync`): picklable, shipped with the swap's segment job."""

    config: LocalConfig
    processor: KeyedWatermarkProcessFunction
    delay: float
    idle: float
    key_type: Any


def _synced(local: LocalSync, store: KeyedStateStore, pid: int, version: int, where: str,
            read: Callable[[LocalState], _T]) -> tuple[_T, dict[str, Any]]:
    """``read(copy)`` on partition ``pid``'s local copy brought to ``version`` first (O(the
    changelogs since its own, or a rebuild)), with the copy's partition-wide values. A copy
    that cannot be read (``read`` raises :class:`StateCorruptError`) is a cache: it is
    emptied and rebuilt from the state path once, as a batch's own task does.

    Raises
    ------
    StateCorruptError
        ``read`` fails on the copy rebuilt from the state path (the message names ``where``).
    """
    config = local.config
    with LocalState.open(local_root(config), config.store_id, pid) as copy:
        for attempt in (1, 2):
            try:
                sync(copy, store, config, pid, version, local.processor, local.delay,
                     local.idle)
                found = read(copy)
                break
            except StateCorruptError as err:
                if attempt == 2:
                    raise  # rebuilt from the state path: the state path itself disagrees
                logger.warning("partition %d, %s: %s; rebuilding the local copy from %s", pid,
                               where, err, store.path)
                copy.reset()
        return found, dict(copy.meta.get("meta") or {})


def read_moved(local: LocalSync, store: KeyedStateStore, pid: int, version: int, keys: Any,
               where: str) -> Any:
    """The rows of ``keys`` (an Arrow array of stored keys) in partition ``pid``'s version
    ``version``, as a state table with the partition-wide values, read from its local copy
    (:func:`_synced`): a swap's segments cost the moved keys, not the partition.
    O(len(keys)).

    Raises
    ------
    StateCorruptError
        The version lacks one of ``keys`` even as rebuilt from the state path. A local copy
        that cannot be read, or lacks one of them, is a cache: it is emptied and rebuilt, as
        a batch's own task does.
    """
    def read(copy: LocalState) -> Any:
        wanted = _moved_bytes(local.config, keys, local.key_type)
        rows = [v for v in copy.get(wanted) if v is not None]
        if len(rows) != len(wanted):
            raise StateCorruptError(
                f"{where}: the swap plan moves {len(wanted)} keys out, but the local copy "
                f"{copy.directory} at version {version} holds {len(rows)} of them")
        return _stored_table(copy, rows)

    table, meta = _synced(local, store, pid, version, f"{where}, swap segments", read)
    if table is None:
        table = encode_state(PartitionState(), local.key_type).slice(0, 0)
    return with_meta(table, meta)


@dataclass(frozen=True)
class BlockScan:
    """What :func:`scan_blocks` read of one partition's local copy for a swap plan.

    Attributes
    ----------
    keys : int
        The keys the copy holds.
    counters : dict
        The partition's counters (rows, late, late_partition).
    loads : numpy.ndarray or None
        Per block, the summed row counts of its keys (each at least 1), as a swap plan weighs
        them; None when not asked for.
    null_load : float
        The null key's row count (0: no null key), which has no block.
    moved : pyarrow.Table
        The keys of the blocks asked for (``key`` as stored, ``block``).
    has_null : bool
        Whether the copy holds the null key (its per-block record says so: O(1)).
    """

    keys: int
    counters: dict[str, int]
    loads: Any
    null_load: float
    moved: Any
    has_null: bool = False


def scan_blocks(local: LocalSync, store: KeyedStateStore, pid: int, version: int,
                blocks: Sequence[int], loads: bool, where: str,
                named: Any = None) -> BlockScan:
    """Read partition ``pid``'s version ``version`` from its local copy for a swap plan by
    blocks: its key count and counters (O(1)), the keys of ``blocks`` (one range scan each:
    O(their keys)), those of ``named`` (an Arrow array of keys, none null) that the copy
    holds (one point lookup each), and with ``loads`` every block's load (a full scan, O(the
    partition)). The copy is brought to ``version`` first (:func:`_synced`).

    The copy is checked as it is read: each scanned block must hold as many keys as the
    copy's per-block record (:attr:`~trilink_spark.state.local.LocalState.block_keys`), and
    a full scan as many as its key count. A copy that fails, or keeps no per-block record
    (an earlier release wrote it), is rebuilt from the state path and read again."""
    import pyarrow as pa

    def read(copy: LocalState) -> BlockScan:
        keys = copy.keys
        held = copy.block_keys
        if held is None and copy.version is not None:
            raise StateCorruptError(f"{copy.directory} keeps no key count per block (written "
                                    "by an earlier release), so its blocks cannot be checked")
        per_block, null_load = None, 0.0
        if loads:
            per_block, null_load, scanned = _block_loads(copy, local.config.blocks)
            if scanned != keys:
                raise StateCorruptError(f"{copy.directory} holds {scanned} keys, but its "
                                        f"record says {keys}")
        parts, block_ids = [], []
        for block in blocks:
            found = copy.block_rows(int(block))
            if held is not None and len(found) != held.get(str(int(block)), 0):
                raise StateCorruptError(
                    f"{copy.directory} holds {len(found)} keys of block {int(block)}, but its "
                    f"record says {held.get(str(int(block)), 0)}: rows were lost or added "
                    "behind its back")
            table = _stored_table(copy, [row for _, row in found])
            if table is not None:
                parts.append(table.select([KEY_FIELD]))
                block_ids.append(np.full(table.num_rows, int(block), dtype=np.int32))
        if named is not None and len(named):
            kbs = _key_bytes(local.config, named)
            table = _stored_table(copy, [row for row in copy.get(kbs) if row is not None])
            if table is not None:  # rows come back grouped by schema: blocks from the keys
                parts.append(table.select([KEY_FIELD]))
                block_ids.append(np.frombuffer(b"".join(
                    k[:4] for k in _key_bytes(local.config, table.column(KEY_FIELD)
                                              .combine_chunks())), dtype=">u4")
                    .astype(np.int32))
        if parts:
            moved = pa.concat_tables(parts, promote_options="permissive")
            moved = moved.append_column("block", pa.array(np.concatenate(block_ids)))
        else:
            moved = pa.table({KEY_FIELD: pa.array([], local.key_type or pa.null()),
                              "block": pa.array([], pa.int32())})
        return BlockScan(keys, {}, per_block, null_load, moved,
                         bool(held is not None and held.get("null", 0)))

    found, meta = _synced(local, store, pid, version, f"{where}, swap plan", read)
    empty = encode_state(PartitionState(), local.key_type).slice(0, 0)
    counters = read_counters(with_meta(empty, meta), f"{where}, local copy")
    return BlockScan(found.keys, counters, found.loads, found.null_load, found.moved,
                     found.has_null)


def _block_loads(copy: LocalState, blocks: BlockPartitioner | None,
                 chunk: int = 65536) -> tuple[Any, float, int]:
    """Per block, the summed ``max(rows, 1)`` of its keys, the null key's, and the keys
    scanned: one full scan of the copy, decoded ``chunk`` rows at a time (memory O(chunk +
    blocks))."""
    loads = np.zeros(1 if blocks is None else blocks.num_blocks, dtype=np.float64)
    null_load = 0.0
    scanned = 0
    pending: list[tuple[bytes, bytes]] = []

    def flush() -> float:
        groups: dict[int, tuple[list[int], list[bytes]]] = {}
        null = 0.0
        for k, row in pending:
            _, sid, body = split_head(row, copy.directory)
            ids, bodies = groups.setdefault(sid, ([], []))
            ids.append(-1 if k == NULL_KEY_BYTES else int.from_bytes(k[:4], "big"))
            bodies.append(body)
        for sid, (ids, bodies) in groups.items():
            rows = decode_rows(bodies, copy.schema(sid)).column("rows").to_numpy()
            weight = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
            at = np.asarray(ids, dtype=np.int64)
            null += float(weight[at < 0].sum())
            if (at >= len(loads)).any():
                raise StateCorruptError(f"{copy.directory}: a key of block {int(at.max())}, "
                                        f"beyond the layout's {len(loads)} blocks")
            np.add.at(loads, at[at >= 0], weight[at >= 0])
        pending.clear()
        return null

    for item in copy.rows():
        pending.append(item)
        scanned += 1
        if len(pending) >= chunk:
            null_load += flush()
    null_load += flush()
    return loads, null_load, scanned


def _moved_bytes(config: LocalConfig, keys: Any, key_type: Any) -> list[bytes]:
    """Local key bytes of a swap's moved keys (an Arrow array of stored keys)."""
    import pyarrow as pa

    if keys is None or not len(keys):
        return []
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if key_type is not None and keys.type != key_type and not pa.types.is_null(keys.type):
        keys = keys.cast(key_type)
    return _key_bytes(config, keys)


def _swapped(local: LocalState, config: LocalConfig, swap: SwapIn, table: Any,
             meta: dict[str, Any], before: dict[bytes, bytes], leaving: list[bytes],
             key_type: Any, where: str) -> PartitionState:
    """The touched state of a swap batch (:func:`load_touched`): ``before`` takes the leaving
    keys' rows, the arriving segments are merged in, and partition 0 takes the removed
    partitions' counters."""
    out_rows = local.get(leaving)
    held = sum(1 for v in out_rows if v is not None)
    if held != len(leaving):
        raise StateCorruptError(f"{where}: the swap plan moves {len(leaving)} keys out of this "
                                f"partition, but its state holds {held} of them")
    before.update({k: v for k, v in zip(leaving, out_rows) if v is not None})
    arriving = [k for t in swap.incoming if t.num_rows
                for k in _moved_bytes(config, t.column(KEY_FIELD), key_type)]
    if any(v is not None for v in local.get(arriving)):
        raise StateCorruptError(f"{where}: keys the swap plan moves into this partition are "
                                "already stored in it")
    parts = [t for t in swap.incoming if t.num_rows]
    if table is None:  # the incoming rows' columns, or the empty state's
        table = (parts[0] if parts else encode_state(PartitionState(), key_type)).slice(0, 0)
    merged = merge_in(with_meta(table, meta), parts)
    if swap.carried:
        merged = add_counters(merged, swap.carried, where)
    return decode_state(merged, where)


def expire(state: PartitionState, state_ttl: float) -> list[Hashable]:
    """Remove (and return) the keys of ``state`` that sent nothing for ``state_ttl`` of the
    partition's event time. O(keys of ``state``)."""
    if not math.isfinite(state_ttl) or not math.isfinite(state.partition_high):
        return []  # no event time to judge by (nor an infinite one)
    high = state.partition_high
    gone = [k for k in state.key_high if high - state.last_seen.get(k, -math.inf) >= state_ttl]
    return _drop(state, gone)


def expire_processed(state: PartitionState, config: LocalConfig) -> list[Hashable]:
    """Remove (and return) the keys of ``state`` that no batch brought a row for
    ``config.processing_ttl`` of processing time, by the batch's recorded time: the last
    batch that did is at or below ``batch_time - processing_ttl`` (a key without a recorded
    one counts from ``ttl_since``). O(keys of ``state``)."""
    found = _expiry_bound(config)
    if found is None:
        return []
    bound, unknown = found
    gone = [k for k in dict.fromkeys([*state.key_high, *state.batch_time])
            if (k in state.batch_time and state.batch_time[k] <= bound)
            or (k not in state.batch_time and unknown)]
    return _drop(state, gone)


def _drop(state: PartitionState, gone: list[Hashable]) -> list[Hashable]:
    """Remove the keys ``gone`` from ``state`` (every per-key field); returns them."""
    if not gone:
        return []
    drop = set(gone)
    for mapping in (state.key_high, state.last_seen, state.key_rows, state.values,
                    state.batch_time):
        for k in gone:
            mapping.pop(k, None)
    state.timers = [(k, t) for k, t in state.timers if k not in drop]
    import pandas as pd

    for name, frame in list(state.shared.items()):
        if isinstance(frame, KeyedColumns):
            state.shared[name] = frame.without_keys(drop)
        elif isinstance(frame, pd.DataFrame) and len(frame):
            level = frame.index.get_level_values(0)
            state.shared[name] = frame[~level.isin(list(drop))]
    return gone


def save_touched(local: LocalState, store: KeyedStateStore, config: LocalConfig, pid: int,
                 batch_id: int, prev: int | None, state: PartitionState,
                 before: dict[bytes, bytes], key_type: Any, value_type: Any,
                 processor: KeyedWatermarkProcessFunction, delay: float, idle: float,
                 fence: Any, leaving: Any = None) -> tuple[int, float | None]:
    """Write the batch's changelog to the state path, then apply it locally; returns its
    bytes, and the milliseconds spent starting a snapshot of ``prev`` when one was due
    (:func:`snapshot_due`; None: none was).
    ``fence()`` is called before anything is written (the owner check). ``leaving``: the
    keys a swap moves out (an Arrow array), deleted with the expired ones."""
    import pyarrow as pa

    gone = expire(state, config.state_ttl) + expire_processed(state, config)
    upserts = encode_state(state, key_type, value_type)
    stored_type = upserts.schema.field(KEY_FIELD).type
    if key_type is not None and stored_type != key_type and upserts.num_rows:
        raise StateTypeError(f"keys do not convert back to the key column's type {key_type} "
                             f"(they are {stored_type}); the local state store keys them by it")
    meta = _sticky(local.meta.get("meta") or {}, _meta_of(upserts))
    upserts = upserts.replace_schema_metadata(
        {**(upserts.schema.metadata or {}), **{k.encode(): v.encode() for k, v in meta.items()}})
    deleted = key_array(gone, key_type) if gone else pa.array([], upserts.schema.field(
        KEY_FIELD).type)
    if leaving is not None and len(leaving):
        out = leaving.combine_chunks() if isinstance(leaving, pa.ChunkedArray) else leaving
        deleted = pa.concat_arrays([deleted, out.cast(deleted.type)]) if len(deleted) else out
    attempt = uuid.uuid4().hex
    log = changelog_table(upserts, deleted, prev, attempt)
    fence()
    written = store.save_changelog(pid, batch_id, log)
    chain = local.chain
    snapshot_ms: float | None = None
    if prev is not None and snapshot_due(local, batch_id, config.snapshot_interval, pid):
        started = time.perf_counter()
        start_snapshot(local, store, pid, prev, key_type)
        snapshot_ms = (time.perf_counter() - started) * 1000.0
        chain = {"at": prev, "logged": 0}
    chain["logged"] = chain.get("logged", 0) + log.num_rows
    puts = _puts(local, config, upserts, processor, delay, idle)
    dels = _key_bytes(config, deleted) if len(deleted) else []
    local.apply(batch_id, attempt, meta, puts, dels, before, chain=chain,
                times=_times(config, upserts), layout=config.layout)
    return written, snapshot_ms


__all__ += ["expire", "expire_processed", "STATE_KIND"]
