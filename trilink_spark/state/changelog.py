"""Changelogs of keyed state: what one micro-batch changed in one partition, as Arrow.

A state version of a partition is either a **snapshot** (``<batch>.state``: the whole
partition, one row per key, :mod:`trilink_spark.keyed.durable.codec`'s columns) or a **changelog**
(``<batch>.log``): the rows of the keys the batch changed (upserts, every column of the state
table) and the keys it deleted (a row with ``deleted`` true and nulls elsewhere), over the
version the batch started from. A changelog's schema metadata names that version
(``trilink.prev``, JSON: an int, or null for empty state), the task attempt that wrote it
(``trilink.attempt``) and whether it carries the partition-wide values (the newest event time,
the counters, partition state) or inherits them (``trilink.inherit``: ``"1"`` for a changelog
of a partition no task ran for). Both are written with
:func:`~trilink_spark._internal.io.arrowio.write_table` (checksummed Arrow IPC), tagged
:data:`SNAPSHOT_KIND` and :data:`CHANGELOG_KIND`.

A version is read back by walking ``trilink.prev`` from it to a snapshot (or to empty state)
and replaying the changelogs in order (:func:`combine`): one vectorised pass, the last write of
each key wins and a deleted key is gone. This module holds the table logic only; the files are
the :class:`~trilink_spark.state.KeyedStateStore`'s.

Examples
--------
>>> import pyarrow as pa
>>> base = pa.table({"key": ["a", "b"], "n": [1, 2]})
>>> log = changelog_table(pa.table({"key": ["b"], "n": [5]}), pa.array(["a"]), 0, "t1")
>>> combine(base, [log], "p0").to_pydict()
{'key': ['b'], 'n': [5]}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import StateCorruptError

__all__ = ["attempt_token", "CHANGELOG_KIND", "SNAPSHOT_KIND", "DELETED_FIELD", "changelog_table",
           "changelog_info", "combine", "ChangelogInfo"]

#: Format tag of a changelog (see :mod:`trilink_spark._internal.io.arrowio`).
CHANGELOG_KIND = "keyed-changelog"
#: Format tag of a snapshot: the state table of :mod:`trilink_spark.keyed.durable.codec`.
SNAPSHOT_KIND = "keyed-state"
#: Column of a changelog that marks a deleted key.
DELETED_FIELD = "deleted"
_KEY = "key"
_PREV = b"trilink.prev"
_ATTEMPT = b"trilink.attempt"
_INHERIT = b"trilink.inherit"
_OWN = (_PREV, _ATTEMPT, _INHERIT)


class ChangelogInfo:
    """What a changelog's metadata says: the version it applies to, who wrote it, and whether
    it inherits the partition-wide values."""

    __slots__ = ("prev", "attempt", "inherit")

    def __init__(self, prev: int | None, attempt: str, inherit: bool) -> None:
        self.prev = prev
        self.attempt = attempt
        self.inherit = inherit


def changelog_table(upserts: Any, deleted: Any, prev: int | None, attempt: str,
                    inherit: bool = False) -> Any:
    """One changelog: ``upserts`` (a state table with column ``key``, whose schema metadata
    holds the partition-wide values) plus the ``deleted`` keys.

    Parameters
    ----------
    upserts : pyarrow.Table
        The changed keys' rows.
    deleted : pyarrow.Array
        Keys deleted by the batch (in the key column's type).
    prev : int or None
        The version the batch started from (None: empty state).
    attempt : str
        The writing task attempt's token (a restarted executor compares it with its local
        copy's: :class:`~trilink_spark.state.local.LocalState`).
    inherit : bool
        The partition-wide values are the previous version's (no task ran).

    Returns
    -------
    pyarrow.Table
        O(rows): one concatenation.
    """
    import pyarrow as pa

    if _KEY not in upserts.column_names:
        raise StateCorruptError(f"a changelog needs a {_KEY!r} column, got {upserts.column_names}")
    meta = dict(upserts.schema.metadata or {})
    flags = pa.array(np.zeros(upserts.num_rows, dtype=bool))
    table = upserts.append_column(DELETED_FIELD, flags)
    if len(deleted):
        gone = pa.table({_KEY: deleted,
                         DELETED_FIELD: pa.array(np.ones(len(deleted), dtype=bool))})
        table = pa.concat_tables([table.replace_schema_metadata(None), gone],
                                 promote_options="permissive")
    meta.update({_PREV: json.dumps(prev).encode(), _ATTEMPT: attempt.encode(),
                 _INHERIT: b"1" if inherit else b"0"})
    return table.replace_schema_metadata(meta)


def changelog_info(table: Any, where: str) -> ChangelogInfo:
    """A changelog's :class:`ChangelogInfo`.

    Raises
    ------
    StateCorruptError
        ``where`` lacks the changelog's metadata or its ``deleted`` column, or they are
        malformed.
    """
    meta = table.schema.metadata or {}
    try:
        prev = json.loads(meta[_PREV])
        attempt = meta[_ATTEMPT].decode("utf-8")
        inherit = meta[_INHERIT]
    except (KeyError, ValueError, UnicodeDecodeError):
        raise StateCorruptError(f"{where} has no valid changelog metadata (trilink.prev, "
                                "trilink.attempt, trilink.inherit); it is not a changelog "
                                "this release wrote") from None
    if (prev is not None and (not isinstance(prev, int) or isinstance(prev, bool) or prev < 0)) \
            or inherit not in (b"0", b"1") or DELETED_FIELD not in table.column_names \
            or _KEY not in table.column_names:
        raise StateCorruptError(f"{where}: malformed changelog (prev {prev!r}, columns "
                                f"{table.column_names})")
    return ChangelogInfo(prev, attempt, inherit == b"1")


def combine(base: Any | None, logs: Sequence[Any], where: str) -> Any:
    """The state table after replaying ``logs`` (oldest first) over ``base`` (None: empty).

    Each key's last row wins; a key whose last row is a deletion is dropped. The schema
    metadata (the partition-wide values) is the newest changelog's that carries its own, else
    ``base``'s. Cost: O(rows of ``base`` and ``logs``), vectorised (Arrow's hash grouping;
    null keys are one key, as in Spark).

    Raises
    ------
    StateCorruptError
        The tables' columns do not combine.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    meta = dict(base.schema.metadata or {}) if base is not None else {}
    for log in logs:
        if not changelog_info(log, where).inherit:
            meta = {k: v for k, v in (log.schema.metadata or {}).items() if k not in _OWN}
    parts = []
    if base is not None:
        parts.append(base.replace_schema_metadata(None).append_column(
            DELETED_FIELD, pa.array(np.zeros(base.num_rows, dtype=bool))))
    parts.extend(log.replace_schema_metadata(None) for log in logs)
    if not parts:
        return None
    try:
        table = pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise StateCorruptError(f"{where}: the snapshot and changelogs do not combine "
                                f"({err})") from None
    if len(parts) > 1 and table.num_rows:
        order = pa.table({_KEY: table.column(_KEY),
                          "i": pa.array(np.arange(table.num_rows, dtype=np.int64))})
        last = order.group_by(_KEY, use_threads=False).aggregate([("i", "max")])
        keep = np.sort(last.column("i_max").to_numpy())
        table = table.take(pa.array(keep))
    deleted = table.column(DELETED_FIELD)
    table = table.filter(pc.invert(pc.fill_null(deleted, False)))
    table = table.drop_columns([DELETED_FIELD])
    return table.replace_schema_metadata(meta or None)


def attempt_token(read: Callable[[int], bytes | None], limit: int) -> str | None:
    """The attempt token of a changelog file from its head only (its schema): ``read(n)``
    returns at most ``n`` + 1 of its first bytes (None: no such file); a schema longer than
    ``limit`` bytes is not read. None when there is no file or no token, or the head is
    damaged (the caller then reads the chain, and refuses it). O(1)."""
    import pyarrow as pa

    head = read(1 << 16)
    if head is None or len(head) < 16:
        return None
    # after the magic: a continuation marker, then the schema message's length
    need = 16 + int.from_bytes(head[12:16], "little", signed=True)
    if len(head) < need <= limit:  # a long schema (partition-wide values)
        head = read(need) or head
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(head[8:]))
    except (pa.ArrowInvalid, OSError, ValueError):
        return None
    attempt = (schema.metadata or {}).get(b"trilink.attempt")
    return None if attempt is None else attempt.decode("utf-8", "replace")
