"""The manifest protocol of a keyed stream's state path: one writer, one configuration, the
version each micro-batch starts from, and the commit.

:func:`claim` makes a runner the path's one writer before any of its tasks writes, and
refuses a changed configuration (:func:`runner_config`); :func:`start_version` is the
committed version a batch starts from, refusing a manifest older than the state;
:func:`commit_batch` records a batch as committed once every partition wrote its version.
:func:`batch_time` fixes a batch's processing time before its tasks run, for a
processing-time TTL (:data:`PROCESSING_RECORD`), by the rule of
:func:`processing_time_after`. The runner (:mod:`~trilink_spark.keyed.run.streaming`) calls
them at each batch; the manifest itself is read and written by
:class:`~trilink_spark.state.KeyedStateStore`.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Iterable
from typing import Any

from ...errors import InvalidArgumentError, StateCorruptError, StateOwnershipError
from ...state.local import LocalState
from ...state.store import KeyedStateStore

#: The manifest entry naming the event-time column's kind (``"timestamp"``, ``"date"``,
#: ``"integral"`` or ``"fractional"``), recorded with each commit: how
#: :func:`~trilink_spark.keyed.read_state` gives a key's watermark back.
EVENT_TIME_KIND = "event_time_kind"

__all__ = ["EVENT_TIME_KIND", "runner_config", "claim", "start_version", "check_not_rolled_back", "commit_batch", "batch_time",
           "processing_time_after", "PROCESSING_RECORD"]

logger = logging.getLogger(__name__)


def runner_config(options: dict[str, Any], delay_units: float, idle_units: float,
                  value_type: Any) -> dict[str, Any]:
    """The configuration a keyed stream's state is written with (stored in the manifest).

    Parameters
    ----------
    options : dict
        The runner's options (``key``, ``event_time``, ``order_by``, ``processor``).
    delay_units, idle_units : float
        The delay and idle timeout in the event-time column's units.
    value_type : pyarrow.StructType or None
        The processor's declared ``state_schema``.

    Returns
    -------
    dict
        JSON values only (a value JSON cannot hold is stored as its ``str``), so it compares
        equal to itself read back from the manifest.
    """
    processor = options["processor"]
    config = {
        "key": options["key"], "event_time": options["event_time"],
        "order_by": options["order_by"], "delay": delay_units, "idle_timeout": idle_units,
        "processor": f"{type(processor).__module__}.{type(processor).__qualname__}",
        "processor_config": processor.state_config(),
        "state_schema": None if value_type is None else str(value_type),
    }
    out: dict[str, Any] = json.loads(json.dumps(config, default=str))
    return out


def claim(store: KeyedStateStore, manifest: dict[str, Any] | None, token: str,
          query: str | None, config: dict[str, Any], takeover: bool) -> dict[str, Any]:
    """Make this runner the state path's one writer, before any of its tasks writes, or
    refuse; and refuse a changed configuration (checked at each batch).

    On a fresh path the runner creates the manifest, naming itself the owner, only if there
    is none (:meth:`~trilink_spark.state.KeyedStateStore.create_manifest`): of two runners
    started at once, one creates it and the other finds it and is refused. A runner allowed
    on a path another token owns (the same query restarted, or ``takeover``) writes itself
    in as the owner, so the other one's tasks write nothing more (each task checks the owner
    before it writes).

    Parameters
    ----------
    store : KeyedStateStore
    manifest : dict or None
        As just read (None: a fresh path).
    token, query : str
        The runner's token and its streaming query's id (None outside a query).
    config : dict
        :func:`runner_config` of this run.
    takeover : bool
        Take the state path over from another writer.

    Returns
    -------
    dict
        The manifest as it stands now.

    Raises
    ------
    StateOwnershipError
        Another runner (another token and query) owns the state, without ``takeover``.
    InvalidArgumentError
        The state was written with another configuration (the changed settings are named;
        a claim with no committed batch yet holds no state, and takes the new one).

    Notes
    -----
    Cost: nothing when the runner owns the path already; else one manifest write (a fresh
    path: create-if-absent, atomic on a local filesystem, see
    :mod:`trilink_spark._internal.io.files` for the guarantee elsewhere).
    """
    ours_now = {"token": token, "query": query}
    if manifest is None:
        # path_id names this incarnation of the path: a path wiped and begun again gets
        # another, so no executor-local copy of the old one is taken for the new one
        fresh = {"owner": ours_now, "config": config, "committed": [], "placements": [],
                 "path_id": uuid.uuid4().hex}
        if store.create_manifest(fresh):
            logger.info("state at %s: claimed by runner %s (query %s)", store.path, token,
                        query)
            return fresh
        manifest = store.read_manifest()  # another runner created it first
        if manifest is None:
            raise StateOwnershipError(
                f"state at {store.path}: another runner created the manifest and it is gone "
                "again; one writer per state path: give each query its own state_path")
    owner = manifest.get("owner") or {}
    ours = owner.get("token") == token or (query is not None and owner.get("query") == query)
    if owner and not ours and not takeover:
        raise StateOwnershipError(
            f"state at {store.path} is written by another runner (query "
            f"{owner.get('query') or 'none'}, runner {owner.get('token')}); this is query "
            f"{query or 'none'}, runner {token}. One writer per state path: give this "
            "query its own state_path, or pass takeover=True once the other has stopped "
            "for good"
        )
    stored = manifest.get("config") if manifest.get("committed") else None  # else: no state
    if stored is not None and json.dumps(stored, sort_keys=True) != json.dumps(
            config, sort_keys=True):
        changed = sorted(k for k in set(stored) | set(config)
                         if stored.get(k) != config.get(k))
        raise InvalidArgumentError(
            f"state at {store.path} was written with another configuration "
            f"({', '.join(f'{k}: {stored.get(k)!r} -> {config.get(k)!r}' for k in changed)})"
            "; restore the original settings or start from a new state_path"
        )
    if owner.get("token") != token:  # fence the runner this one replaces
        manifest = {**manifest, "owner": ours_now, "config": config}
        store.write_manifest(manifest)
        logger.info("state at %s: now written by runner %s (query %s), was runner %s",
                    store.path, token, query, owner.get("token"))
    return manifest


def start_version(store: KeyedStateStore, manifest: dict[str, Any] | None,
                  batch_id: int, allow_gaps: bool = False) -> int | None:
    """The committed version batch ``batch_id`` starts from (None: empty state).

    A replayed batch starts again from the version before it, never from its own.

    Raises
    ------
    StateCorruptError
        The state is at a batch after ``batch_id`` (the query's checkpoint is older); or
        holds versions after the last committed one and before ``batch_id``, which the
        manifest does not know (the manifest is older than the state: restored from an older
        copy, or a commit lost): starting from the manifest's version would drop them; or
        (unless ``allow_gaps``, ``spark.trilink.state.allowBatchGaps``) ``batch_id`` is past
        the last committed batch plus one: Spark's micro-batch ids are consecutive, so the
        batches between were committed to a state path this one is older than (restored
        from an earlier copy) and would be lost.

    Notes
    -----
    Cost: one listing of partition 0 (every committed version has a partition 0).
    """
    committed = [] if manifest is None else [int(c) for c in manifest.get("committed", [])]
    if committed and batch_id < committed[-1]:
        raise StateCorruptError(
            f"state at {store.path} is at batch {committed[-1]}, ahead of batch "
            f"{batch_id}: the query's checkpoint is older than its state; restore the "
            "checkpoint or start from a new state_path")
    earlier = [c for c in committed if c < batch_id]
    prev = earlier[-1] if earlier else None
    unknown = [v for v in store.versions(0) if (prev is None or v > prev) and v < batch_id]
    if unknown:
        raise StateCorruptError(
            f"{store.path}/manifest.json does not know state versions {unknown[-5:]} (it "
            f"lists committed batches {committed}), which come before batch {batch_id}: the "
            "manifest is older than the state (restored from an older copy, or rolled back "
            f"a commit), and starting from {'empty state' if prev is None else prev} would "
            "drop those batches. Restore the manifest that committed them, or start from a "
            "new state_path")
    if committed and batch_id > committed[-1] + 1 and not allow_gaps:
        missing = (f"{committed[-1] + 1}" if batch_id == committed[-1] + 2
                   else f"{committed[-1] + 1} to {batch_id - 1}")
        raise StateCorruptError(
            f"state at {store.path} last committed batch {committed[-1]}, and batch {batch_id} "
            f"comes next: batch(es) {missing} are missing. Spark's micro-batch ids are "
            "consecutive, so either the state path is older than the query (restored from "
            "an earlier copy, or rolled back), and going on would lose those batches' rows: "
            "restore the state path that committed them, or start from a new state_path; or "
            "the batch function skips the runner for some batches (if df.isEmpty(): return "
            "before run(df, batch_id)), or ids are fed by hand with gaps: then set "
            "spark.trilink.state.allowBatchGaps=true")
    return prev


def check_not_rolled_back(local: LocalState, store: KeyedStateStore, pid: int,
                          target: int | None, batch_id: int) -> None:
    """Refuse a state path that lost a version this copy holds: the copy is at a version
    after the one batch ``batch_id`` starts from, the batch is past that version (so not a
    replay of it, which would undo it), and the state path no longer has it. A task writes
    its changelog to the state path before it applies it to the copy, so the state path
    held that version once: it was rolled back (replaced by an earlier copy), and going on
    would drop the batches after ``target``. This catches what the batch id check
    (:func:`start_version`) lets through with
    ``spark.trilink.state.allowBatchGaps``. O(1), one listing when the copy is ahead.

    Raises
    ------
    StateCorruptError
        The state path was rolled back past this copy's version.
    """
    held = local.version
    if held is None or target is None or held <= target or batch_id <= held:
        return  # (a partition new in this layout starts empty: its old copies are stale)
    if held in store.versions(pid):
        return
    raise StateCorruptError(
        f"partition {pid}'s local copy ({local.directory}) holds state version {held}, which "
        f"its task wrote to {store.path}, but the state path no longer has it and its last "
        f"commit before batch {batch_id} is batch {target}: the state path was rolled back "
        "(replaced by an earlier copy), and going on would lose the batches after it. Restore "
        "the state path that committed them, or start from a new state_path (a state path "
        "restored on purpose: delete the executors' local copies under "
        "spark.trilink.state.localDir first)")


def commit_batch(store: KeyedStateStore, batch_id: int, prev: int | None, token: str,
                 query: str | None, config: dict[str, Any], takeover: bool,
                 new_placement: bool, extra: dict[str, Any] | None = None) -> None:
    """Record ``batch_id`` as committed (after every partition wrote it).

    The manifest is read again and :func:`claim` checked again first: another writer may have
    taken the path while the batch ran. The committed versions become ``prev`` and
    ``batch_id``; ``new_placement`` adds ``batch_id`` to the batches that started a placement.
    ``extra``: further JSON entries committed with it (the arguments of this start, the last
    swap request done), kept until a later commit replaces them.
    """
    manifest = claim(store, store.read_manifest(), token, query, config, takeover)
    placements = sorted(set(manifest.get("placements", [])) | (
        {batch_id} if new_placement else set()))
    manifest = {**manifest,
                "owner": {"token": token, "query": query},
                "config": config,
                "committed": [c for c in (prev, batch_id) if c is not None],
                "placements": placements,
                **(extra or {})}
    store.write_manifest(manifest)


#: The manifest entry of a processing-time TTL: ``since``, the processing time (ms since the
#: epoch) of the first batch of the run's processing-time TTL, and ``times``, the time fixed
#: for each batch that may still run again (by batch id, as a string). A commit of a batch
#: without a processing-time TTL sets it to None.
PROCESSING_RECORD = "processing_time"


def batch_time(store: KeyedStateStore, manifest: dict[str, Any], batch_id: int, now: float,
               token: str, query: str | None, config: dict[str, Any], takeover: bool
               ) -> tuple[dict[str, Any], float, float]:
    """The processing time of ``batch_id``, fixed in the manifest before its tasks run, as
    Spark fixes one batch timestamp per micro-batch: a replayed batch gets the time its
    first attempt recorded, so it gives the same state and output.

    Parameters
    ----------
    store : KeyedStateStore
    manifest : dict
        As :func:`claim` returned it for this batch.
    batch_id : int
    now : float
        The driver's clock (ms since the epoch), used when the batch has no time yet. The
        time recorded is never below an earlier batch's still recorded: processing time
        does not go back when the clock does.
    token, query, config, takeover
        As :func:`claim`, which is checked again before the manifest is written.

    Returns
    -------
    manifest : dict
        The manifest as it stands now.
    time, since : float
        The batch's processing time (whole milliseconds) and the record's ``since``.

    Raises
    ------
    StateCorruptError
        The manifest's record is malformed.
    StateOwnershipError
        Another runner owns the path now.

    Notes
    -----
    Cost: nothing more for a replayed batch; else one manifest read and one write. The record
    keeps the times of the batches from the last committed one on (at most three).
    """
    path = f"{store.path}/manifest.json"
    record = manifest.get(PROCESSING_RECORD)
    times: dict[str, float] = {}
    since: float | None = None
    if record is not None:
        found = record.get("times") if isinstance(record, dict) else None
        since = record.get("since") if isinstance(record, dict) else None
        if not isinstance(found, dict) or not _is_time(since) or not all(
                k.isdigit() and _is_time(v) for k, v in found.items()):
            raise StateCorruptError(f"{path}: malformed {PROCESSING_RECORD} record {record!r}")
        times = {k: float(v) for k, v in found.items()}
    mine = times.get(str(batch_id))
    if mine is not None and since is not None:
        return manifest, mine, since
    committed = [int(c) for c in manifest.get("committed") or []]
    floor = min([batch_id, *committed[-1:]])
    kept = {k: v for k, v in times.items() if int(k) >= floor}
    fixed = processing_time_after(now, kept.values())
    kept[str(batch_id)] = fixed
    since = fixed if since is None else since
    manifest = claim(store, store.read_manifest(), token, query, config, takeover)
    manifest = {**manifest, PROCESSING_RECORD: {"since": since, "times": kept}}
    store.write_manifest(manifest)
    logger.info("state at %s: batch %d runs at processing time %d ms", store.path, batch_id,
                fixed)
    return manifest, fixed, since


def processing_time_after(now: float, earlier: Iterable[float] = ()) -> float:
    """A batch's processing time: the clock ``now`` (ms since the epoch) in whole
    milliseconds, and never below a time fixed for an earlier batch (processing time does
    not go back when the clock does).

    Parameters
    ----------
    now : float
        The clock, in milliseconds since the epoch.
    earlier : iterable of float
        The times of earlier batches that still count (:func:`batch_time`: those recorded
        from the last committed batch on; :class:`~trilink_spark.testing.KeyedTester`: the
        last batch's).

    Returns
    -------
    float
        Whole milliseconds.

    Notes
    -----
    O(len(earlier)).

    Examples
    --------
    >>> processing_time_after(1500.7)
    1500.0
    >>> processing_time_after(1200.0, [1500.0, 900.0])
    1500.0
    """
    return float(max([math.floor(now), *earlier]))


def _is_time(value: Any) -> bool:
    """A finite number that JSON read back (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)
