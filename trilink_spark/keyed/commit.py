"""The manifest of a keyed stream's state: one writer, one configuration, committed batches.

Each micro-batch of :func:`~trilink_spark.keyed_foreach_batch` checks the manifest before it
runs (:func:`claim`: no second writer, no changed configuration; :func:`start_version`: the
version it starts from) and records itself once every partition wrote its version
(:func:`commit_batch`). The manifest is read and written through
:class:`~trilink_spark.state.KeyedStateStore`; it holds the owner (runner token and query id), the
configuration, the committed versions (the newest two) and the batches that started a
placement.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidArgumentError, StateCorruptError, StateOwnershipError
from ..state.store import KeyedStateStore

__all__ = ["runner_config", "claim", "start_version", "commit_batch"]


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
          query: str | None, config: dict[str, Any], takeover: bool) -> None:
    """Refuse a second writer and a changed configuration (checked at each batch).

    Parameters
    ----------
    store : KeyedStateStore
    manifest : dict or None
        As just read (None: a new state path, nothing to check).
    token, query : str
        The runner's token and its streaming query's id (None outside a query).
    config : dict
        :func:`runner_config` of this run.
    takeover : bool
        Take the state path over from another writer.

    Raises
    ------
    StateOwnershipError
        Another runner (another token and query) owns the state, without ``takeover``.
    InvalidArgumentError
        The state was written with another configuration (the changed settings are named).
    """
    if manifest is None:
        return
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
    stored = manifest.get("config")
    if stored is not None and json.dumps(stored, sort_keys=True) != json.dumps(
            config, sort_keys=True):
        changed = sorted(k for k in set(stored) | set(config)
                         if stored.get(k) != config.get(k))
        raise InvalidArgumentError(
            f"state at {store.path} was written with another configuration "
            f"({', '.join(f'{k}: {stored.get(k)!r} -> {config.get(k)!r}' for k in changed)})"
            "; restore the original settings or start from a new state_path"
        )


def start_version(store: KeyedStateStore, manifest: dict[str, Any] | None,
                  batch_id: int) -> int | None:
    """The committed version batch ``batch_id`` starts from (None: empty state).

    A replayed batch starts again from the version before it, never from its own.

    Raises
    ------
    StateCorruptError
        The state is at a batch after ``batch_id`` (the query's checkpoint is older).
    """
    committed = [] if manifest is None else [int(c) for c in manifest.get("committed", [])]
    if committed and batch_id < committed[-1]:
        raise StateCorruptError(
            f"state at {store.path} is at batch {committed[-1]}, ahead of batch "
            f"{batch_id}: the query's checkpoint is older than its state; restore the "
            "checkpoint or start from a new state_path")
    earlier = [c for c in committed if c < batch_id]
    return earlier[-1] if earlier else None


def commit_batch(store: KeyedStateStore, batch_id: int, prev: int | None, token: str,
                 query: str | None, config: dict[str, Any], takeover: bool,
                 new_placement: bool) -> None:
    """Record ``batch_id`` as committed (after every partition wrote it).

    The manifest is read again and :func:`claim` checked again first: another writer may have
    taken the path while the batch ran. The committed versions become ``prev`` and
    ``batch_id``; ``new_placement`` adds ``batch_id`` to the batches that started a placement.
    """
    manifest = store.read_manifest() or {}
    claim(store, manifest or None, token, query, config, takeover)
    placements = sorted(set(manifest.get("placements", [])) | (
        {batch_id} if new_placement else set()))
    manifest.update({
        "owner": {"token": token, "query": query},
        "config": config,
        "committed": [c for c in (prev, batch_id) if c is not None],
        "placements": placements,
    })
    store.write_manifest(manifest)
