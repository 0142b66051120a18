"""Versioned keyed state on any ``pyarrow.fs`` filesystem: split by key, never pickled.

Layout under the state path::

    manifest.json                          owner, configuration, committed batches, placements
    records/swap-request.json              a small sealed JSON record (here: a swap
                                           requested and not yet planned)
    placements/000000000000.json           the placement in force from batch 0 and the key
                                           column's type it hashes keys as (immutable)
    partition=00003/000000000042.state     partition 3's state after batch 42 (Arrow IPC)
    partition=00003/000000000043.log       or what batch 43 changed (changelog.py)
    partition=00003/000000000044.tables    or a local copy's snapshot: its RocksDB table
                                           files under partition=00003/tables/, shared
                                           between snapshots (incremental.py)
    swaps/000000000042/plan.json           the swap decided for batch 42 (immutable)
    swaps/000000000042/moves.state         its moved keys: key, from, to (Arrow IPC)
    swaps/000000000042/segment-00001.state moved keys' state leaving partition 1 (Arrow IPC,
                                           one record batch per destination)

Every file is written to a temporary name and renamed, so readers see whole files only. A
state version is a table with one row per key (column ``key``) and whatever per-key columns
its writer keeps; partition-wide values travel in the table's schema metadata. Loading a file
parses Arrow and JSON only: nothing stored is unpickled or evaluated, and a truncated, corrupt
or foreign file raises :class:`~trilink_spark.errors.StateCorruptError` naming it.

Every file carries a checksum, checked when it is read: the Arrow files their per-batch CRC-32
(:mod:`trilink_spark._internal.io.arrowio`, format version 2), the JSON files a seal
(:mod:`trilink_spark._internal.io.sealed`), so a byte damaged after it was written is refused,
never read as another value. Files of releases before checksums are still read (unchecked).
What each JSON file holds, and how it is checked, is in :mod:`trilink_spark.state.formats`.

The manifest is the path's claim: the first runner creates it (create-if-absent, see
:meth:`KeyedStateStore.create_manifest`) before any of its tasks writes, with its owner token,
which each task checks (:meth:`KeyedStateStore.check_owner`) before it writes. A manifest that
is missing while state files exist is refused, never taken for a fresh path.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._internal.io.arrowio import open_table, read_table, write_table
from .._internal.io.sealed import seal
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ..errors import StateOwnershipError, StateStoreError
from .._internal.io.files import create_if_absent, resolve_filesystem, write_atomic
from ..partitioners import Partitioner
from ..partitioners.core.persistence import read_strategy, write_strategy
from .formats import MAX_RECORD_BYTES, manifest_bytes, parse_manifest, parse_placement
from .formats import parse_plan, parse_small_record, placement_bytes, plan_bytes, record_bytes
from .formats import MAX_TIMING_BYTES, TIMING_SUFFIX, parse_timing, segment_index, SEGMENT_INDEX
from .changelog import CHANGELOG_KIND, attempt_token, changelog_info, combine
from .incremental import TABLES_SUFFIX, collect, load_tables_table, read_record, referenced_bytes

__all__ = ["KeyedStateStore", "KEY_FIELD", "STATE_KIND", "TIMING_SUFFIX",
           "MAX_RECORD_BYTES", "parse_timing"]

logger = logging.getLogger(__name__)

_SUFFIX = ".state"
_LOG_SUFFIX = ".log"
#: Name of the key column of every stored state table.
KEY_FIELD = "key"
#: Format tag of keyed state tables (see :mod:`trilink_spark._internal.io.arrowio`).
STATE_KIND = "keyed-state"
_MOVES_KIND = "swap-moves"


def _version_name(version: int) -> str:
    return f"{version:012d}{_SUFFIX}"


class KeyedStateStore:
    """Per-partition state versions, one per micro-batch, plus the manifest and swap plans.

    Parameters
    ----------
    path : str
        Local directory or URI (``file://``, ``s3://``, ``gs://``, ``hdfs://`` ...).
    filesystem : pyarrow.fs.FileSystem, optional
        Default: ``pyarrow.fs.FileSystem.from_uri(path)`` (a plain path is local).
    keep_versions : int
        Versions kept per partition; older ones are deleted by :meth:`prune`. Whatever a replay
        of the newest batch needs is always kept, so ``keep_versions=1`` is safe.

    Raises
    ------
    StateStoreError
        The path cannot be created or written (checked once, on the driver, with a probe file).

    Notes
    -----
    Picklable (it travels to executors with the task). Cost per task: one read before and one
    write and rename after (plus, for a keyed runner's task, one small read of the manifest:
    the owner check), and one CRC-32 pass over what is read and written (O(bytes)); the driver
    reads and writes the small manifest once per batch and lists partition 0 once.
    Executors need access to the path (local mode: any directory; a cluster: a shared
    filesystem). A file ``<name>.state`` whose name is not a version, or a
    ``partition=<name>`` directory whose name is not a number, is not this store's: reading
    the store then raises :class:`~trilink_spark.errors.StateCorruptError` naming it.

    Examples
    --------
    >>> from trilink_spark.state import KeyedStateStore
    >>> store = KeyedStateStore("/tmp/state")  # doctest: +SKIP
    >>> store.owners()  # doctest: +SKIP
    {'sensor-1': 0, 'sensor-2': 3}
    """

    def __init__(self, path: str, filesystem: Any = None, keep_versions: int = 10) -> None:
        if not isinstance(path, str) or not path:
            raise InvalidArgumentTypeError("state path must be a non-empty str")
        if isinstance(keep_versions, bool) or not isinstance(keep_versions, int) or keep_versions < 1:
            raise InvalidArgumentError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
        filesystem, path = resolve_filesystem(path, filesystem)
        self.fs = filesystem
        self.path = path.rstrip("/")
        self.keep_versions = keep_versions
        probe = f"{self.path}/.probe-{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(self.path, recursive=True)
            with self.fs.open_output_stream(probe) as f:
                f.write(b"")
            self.fs.delete_file(probe)
        except OSError as err:
            raise StateStoreError(
                f"state path {self.path} cannot be written ({type(err).__name__}: {err}); give "
                "a writable directory"
            ) from None

    # ------------------------------------------------------------------ raw files
    @classmethod
    def open_existing(cls, path: str, filesystem: Any = None) -> KeyedStateStore:
        """The store at an existing ``path``, for reading only: no directory is created and no
        probe file written (a read-only path works). O(1) file-system calls.

        Raises
        ------
        InvalidArgumentError
            ``path`` is not a directory, or not a path or URI pyarrow can open (an unknown
            scheme, a NUL character).
        StateStoreError
            The filesystem cannot be reached or the path cannot be looked up (its client
            fails to load, an I/O error).
        """
        import pyarrow as pa
        from pyarrow import fs

        if not isinstance(path, str):
            raise InvalidArgumentTypeError(
                f"state path must be a non-empty str, got {type(path).__name__}")
        if not path:
            raise InvalidArgumentError("state path must be a non-empty str, got ''")
        try:
            filesystem, inner = resolve_filesystem(path, filesystem)
            kind = filesystem.get_file_info(inner).type
        except (pa.ArrowInvalid, ValueError, TypeError) as err:
            raise InvalidArgumentError(
                f"state path {path!r} is not a path or URI that can be read ({err}); give a "
                "local directory or a URI such as file:///data/state or s3://bucket/state"
            ) from None
        except OSError as err:
            raise StateStoreError(
                f"state path {path!r} cannot be looked up ({type(err).__name__}: "
                f"{' '.join(str(err).split())[:300]})") from None
        if kind != fs.FileType.Directory:
            raise InvalidArgumentError(
                f"state path {path!r} is not a directory; give the state_path a "
                "keyed_foreach_batch stream wrote")
        store = cls.__new__(cls)
        store.fs, store.path, store.keep_versions = filesystem, inner.rstrip("/"), 1
        return store

    def partition_dir(self, partition: int) -> str:
        """The directory of ``partition``'s files."""
        return f"{self.path}/partition={partition:05d}"

    def version_path(self, partition: int, version: int) -> str:
        """Where ``partition``'s state ``version`` lives."""
        return f"{self.partition_dir(partition)}/{_version_name(version)}"

    def _list(self, directory: str) -> list[Any]:
        from pyarrow import fs

        try:
            infos: list[Any] = self.fs.get_file_info(
                fs.FileSelector(directory, allow_not_found=True))
        except OSError as err:
            raise StateStoreError(
                f"cannot list {directory} ({type(err).__name__}: {err})") from None
        return infos

    def read_bytes(self, path: str, limit: int | None = None) -> bytes | None:
        """The file's bytes (at most ``limit`` + 1 of them when given), None when it is
        missing; another read failure is a StateStoreError naming it."""
        try:
            with self.fs.open_input_stream(path) as f:
                data: bytes = f.read() if limit is None else f.read(limit + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            from pyarrow import fs

            if self.fs.get_file_info(path).type == fs.FileType.NotFound:
                return None
            raise StateStoreError(f"cannot read {path} ({type(err).__name__}: {err})") from None
        return data

    def _write(self, path: str, data: bytes) -> None:
        directory = path.rsplit("/", 1)[0]
        try:
            self.fs.create_dir(directory, recursive=True)
            write_atomic(self.fs, path, data)
        except OSError as err:
            raise StateStoreError(
                f"cannot write {path} ({type(err).__name__}: {err})") from None

    def versions(self, partition: int) -> list[int]:
        """Stored versions of a partition (snapshots and changelogs), ascending."""
        snapshots, logs = self.listing(partition)
        return sorted(snapshots | logs)

    def listing(self, partition: int) -> tuple[set[int], set[int]]:
        """A partition's stored snapshot versions and changelog versions (one listing).

        Raises
        ------
        StateCorruptError
            A ``.state`` or ``.log`` file whose name is not a version.
        """
        from pyarrow import fs

        snapshots: set[int] = set()
        logs: set[int] = set()
        for info in self._list(self.partition_dir(partition)):
            name = info.base_name
            if info.type != fs.FileType.File:
                continue
            for suffix, found in ((_SUFFIX, snapshots), (TABLES_SUFFIX, snapshots),
                                  (_LOG_SUFFIX, logs)):
                if name.endswith(suffix):
                    stem = name[: -len(suffix)]
                    if not stem.isdigit():
                        raise StateCorruptError(
                            f"{info.path} is not a state version of this store (versions are "
                            f"named <batch id>{suffix}); move it out of the state path")
                    found.add(int(stem))
        return snapshots, logs

    def partitions(self) -> list[int]:
        """Partitions with a directory in the store, ascending."""
        from pyarrow import fs

        out = []
        for info in self._list(self.path):
            if info.type != fs.FileType.Directory or not info.base_name.startswith("partition="):
                continue
            number = info.base_name.split("=", 1)[1]
            if not number.isdigit():
                raise StateCorruptError(
                    f"{info.path} is not a partition of this store (partitions are named "
                    "partition=<number>); move it out of the state path"
                )
            out.append(int(number))
        return sorted(out)

    def load(self, partition: int, version: int) -> bytes | None:
        """The bytes of ``partition``'s state ``version`` (None when there is no such file)."""
        return self.read_bytes(self.version_path(partition, version))

    def load_before(self, partition: int, version: int) -> bytes | None:
        """The newest state of ``partition`` older than ``version`` (None: start empty)."""
        older = [v for v in self.versions(partition) if v < version]
        return self.load(partition, older[-1]) if older else None

    def latest(self, partition: int) -> bytes | None:
        """The newest state of ``partition``."""
        return self.load_before(partition, 2**62)

    def save(self, partition: int, version: int, data: bytes) -> None:
        """Write ``partition``'s state as ``version`` (atomically: temporary file, rename)."""
        self._write(self.version_path(partition, version), data)

    # ------------------------------------------------------------------ state tables
    def save_table(self, partition: int, version: int, table: Any) -> int:
        """Write a state table as ``partition``'s ``version``; returns the bytes written."""
        data = write_table(table, STATE_KIND)
        self.save(partition, version, data)
        return len(data)

    def load_table(self, partition: int, version: int) -> Any:
        """``partition``'s state table ``version``: its snapshot, or the snapshot before it
        with the changelogs since replayed (:func:`~trilink_spark.state.changelog.combine`).

        Raises
        ------
        StateCorruptError
            The version is missing (a gap: a deleted file, a broken chain of changelogs) or
            a file is not a state table or changelog.

        Notes
        -----
        Cost: the snapshot's bytes plus those of the changelogs since it, O(bytes read).
        """
        path = self.version_path(partition, version)
        logs: list[Any] = []
        at: int | None = version
        while at is not None:
            found = self._snapshot(partition, at)
            if found is not None:
                return combine(found, logs[::-1], path) if logs else found
            log_path = self.changelog_path(partition, at)
            raw = self.read_bytes(log_path)
            if raw is None:
                present = self.versions(partition)
                raise StateCorruptError(
                    f"{path} is missing and so is {log_path}: partition {partition} needs "
                    f"state version {version}"
                    + (f" (through version {at})" if at != version else "")
                    + f", stored versions are {present[-5:]}; a deleted version is never "
                    "skipped (restore it, or start over with an empty state path)")
            log = read_table(raw, CHANGELOG_KIND, log_path)
            logs.append(log)
            prev = changelog_info(log, log_path).prev
            if prev is not None and prev >= at:
                raise StateCorruptError(f"{log_path} applies to version {prev}, not an "
                                        "earlier one: not a changelog of this partition")
            at = prev
        return combine(None, logs[::-1], path)

    def version_bytes(self, partition: int, version: int) -> int:
        """Bytes of the files ``partition``'s ``version`` is read from: its snapshot, or the
        newest snapshot before it and the changelogs since (one listing)."""
        from pyarrow import fs

        sizes: dict[tuple[str, int], int] = {}
        for info in self._list(self.partition_dir(partition)):
            for suffix in (_SUFFIX, TABLES_SUFFIX, _LOG_SUFFIX):
                stem = info.base_name[: -len(suffix)]
                if info.type == fs.FileType.File and info.base_name.endswith(suffix) \
                        and stem.isdigit():
                    sizes[(suffix, int(stem))] = int(info.size or 0)
        base = max((v for s, v in sizes if s != _LOG_SUFFIX and v <= version), default=-1)
        if (TABLES_SUFFIX, base) in sizes and (_SUFFIX, base) not in sizes:
            record = read_record(self, partition, base)  # the files it lists, shared or not
            sizes[(_SUFFIX, base)] = referenced_bytes(record) if record else 0
        return sum(size for (s, v), size in sizes.items()
                   if (s == _SUFFIX and v == base) or (s == _LOG_SUFFIX and base < v <= version))

    def load_snapshot(self, partition: int, version: int) -> Any:
        """``partition``'s snapshot ``version`` (StateCorruptError when it is missing)."""
        found = self._snapshot(partition, version)
        if found is None:
            raise StateCorruptError(f"{self.version_path(partition, version)} is missing: "
                                    f"partition {partition} needs its snapshot of version "
                                    f"{version}")
        return found

    def _snapshot(self, partition: int, version: int) -> Any:
        """The snapshot ``version`` as a table, in either form (None: there is none)."""
        path = self.version_path(partition, version)
        data = self.read_bytes(path)
        if data is not None:
            return read_table(data, STATE_KIND, path)
        if self.read_bytes(self.tables_path(partition, version), 0) is None:
            return None
        return load_tables_table(self, partition, version)

    def tables_path(self, partition: int, version: int) -> str:
        """Where the record of ``partition``'s incremental snapshot ``version`` lives."""
        return f"{self.partition_dir(partition)}/{version:012d}{TABLES_SUFFIX}"

    def delete_changelog(self, partition: int, version: int, snapshot: bool = False) -> None:
        """Delete ``partition``'s changelog ``version`` (before a whole version replaces it,
        so a changelog an earlier attempt left is never read as that version), and with
        ``snapshot`` its snapshot ``version`` too (all an earlier attempt wrote as it)."""
        self._delete(self.changelog_path(partition, version))
        if snapshot:
            self._delete(self.version_path(partition, version))
            self._delete(self.tables_path(partition, version))

    def changelog_path(self, partition: int, version: int) -> str:
        """Where ``partition``'s changelog of ``version`` lives."""
        return f"{self.partition_dir(partition)}/{version:012d}{_LOG_SUFFIX}"

    def save_changelog(self, partition: int, version: int, table: Any) -> int:
        """Write a changelog (:func:`~trilink_spark.state.changelog.changelog_table`) as
        ``partition``'s ``version`` (a snapshot an earlier attempt left as ``version`` is
        deleted first, or it would be read instead); returns the bytes written. O(bytes)."""
        data = write_table(table, CHANGELOG_KIND)
        self._delete(self.version_path(partition, version))
        self._delete(self.tables_path(partition, version))
        self._write(self.changelog_path(partition, version), data)
        return len(data)

    def load_changelog(self, partition: int, version: int) -> Any:
        """``partition``'s changelog ``version`` (None: there is none). O(its bytes)."""
        path = self.changelog_path(partition, version)
        raw = self.read_bytes(path)
        return None if raw is None else read_table(raw, CHANGELOG_KIND, path)

    def changelog_attempt(self, partition: int, version: int) -> str | None:
        """The attempt token of ``partition``'s changelog ``version`` (None: there is none,
        or it is a snapshot), read from the head of the file only (its schema), O(1)."""
        path = self.changelog_path(partition, version)
        return attempt_token(lambda limit: self.read_bytes(path, limit), MAX_TIMING_BYTES)

    def key_table(self, version: int | None = None, extra: Sequence[str] = ()) -> Any:
        """Every key of a committed version with its partition: an Arrow table (key, partition,
        then the ``extra`` state columns).

        Raises
        ------
        StateCorruptError
            A key is stored in two partitions, or a file is missing or corrupt.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        version, partitions = self.committed_layout(version)
        parts = []
        key_type, typed_from = None, -1
        for p in range(partitions):
            stored = self.load_table(p, version)
            path = self.version_path(p, version)
            lacking = [c for c in (KEY_FIELD, *extra) if c not in stored.column_names]
            if lacking:
                raise StateCorruptError(
                    f"{path} has no {lacking} column(s) (columns {stored.column_names}); it is "
                    "not a keyed state table of this store")
            keys = stored.column(KEY_FIELD)
            if not pa.types.is_null(keys.type):
                if key_type is None:
                    key_type, typed_from = keys.type, p
                elif keys.type != key_type:
                    raise StateCorruptError(
                        f"{path} stores keys of type {keys.type}, partition {typed_from} of "
                        f"type {key_type}; one state version holds one key type")
            columns = {KEY_FIELD: keys,
                       "partition": pa.array(np.full(len(keys), p, dtype=np.int32))}
            columns.update({name: stored.column(name) for name in extra})
            parts.append(pa.table(columns))
        if not parts:
            return pa.table({KEY_FIELD: pa.array([], pa.null()),
                             "partition": pa.array([], pa.int32())})
        try:
            table = pa.concat_tables(parts, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
            raise StateCorruptError(
                f"state version {version} under {self.path} has partitions whose columns "
                f"do not combine ({err})") from None
        counts = table.group_by(KEY_FIELD).aggregate([("partition", "count")])
        doubled = counts.filter(pc.greater(counts["partition_count"], 1))
        if doubled.num_rows:
            raise StateCorruptError(
                f"state version {version} under {self.path} holds key(s) "
                f"{doubled.column(KEY_FIELD).to_pylist()[:5]} in more than one partition"
            )
        return table

    def owners(self, version: int | None = None) -> dict[Any, int]:
        """``{key: partition}`` of a committed version (default: the newest).

        Raises
        ------
        StateCorruptError
            A key is found in two partitions, or a file is missing or corrupt.

        Notes
        -----
        Cost: reads every partition's state file of that version (O(state)).
        """
        table = self.key_table(version)
        return dict(zip(table.column(KEY_FIELD).to_pylist(),
                        table.column("partition").to_pylist()))

    def committed_layout(self, version: int | None = None,
                         manifest: dict[str, Any] | None = None) -> tuple[int, int]:
        """A committed version (default: the newest) and its partition count.

        ``manifest``: the manifest, when the caller has just read it.
        """
        manifest = self.read_manifest() if manifest is None else manifest
        committed = [] if manifest is None else list(manifest.get("committed", []))
        if version is None:
            if not committed:
                raise StateCorruptError(f"no committed state version under {self.path}")
            version = int(committed[-1])
        _, partitions = self.placement_at(version, manifest)
        return version, partitions

    # ------------------------------------------------------------------ manifest
    def _manifest_path(self) -> str:
        return f"{self.path}/manifest.json"

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest (None on a fresh path: no manifest and no state files).

        Raises
        ------
        StateCorruptError
            The manifest is not this store's, fails its checksum, or is missing while the path
            holds state files (a partial restore: never read as a fresh path).

        Notes
        -----
        Cost: one small read; without a manifest, one listing of the path (and of each
        partition directory, only when there are some).
        """
        path = self._manifest_path()
        data = self.read_bytes(path)
        if data is None:
            self._refuse_orphans(path)
            return None
        return parse_manifest(data, path)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Replace the manifest (atomically; sealed with its checksum)."""
        self._write(self._manifest_path(), manifest_bytes(manifest))

    def create_manifest(self, manifest: dict[str, Any]) -> bool:
        """Write the manifest only if there is none: True when this call created it.

        The claim of a fresh path. Atomic on a local filesystem (at most one of any number
        of concurrent callers gets True, and readers see a whole file); on other filesystems
        a check then a write (:func:`~trilink_spark._internal.io.files.create_if_absent`).
        """
        path = self._manifest_path()
        try:
            return create_if_absent(self.fs, path, manifest_bytes(manifest))
        except OSError as err:
            raise StateStoreError(f"cannot write {path} ({type(err).__name__}: {err})") from None

    def check_owner(self, token: str, what: str) -> None:
        """Refuse to write unless the manifest names ``token`` as the owner (the fence a task
        checks before it writes). ``what``: the writer, for the message. One small read.

        Raises
        ------
        StateOwnershipError
            Another runner owns the path now (it took the path over), or it has no manifest.
        """
        manifest = self.read_manifest() or {}
        owner = manifest.get("owner") or {}
        if not isinstance(owner, dict) or owner.get("token") != token:
            held = owner.get("token") if isinstance(owner, dict) else owner
            raise StateOwnershipError(
                f"{what}: state at {self.path} is owned by runner {held!r} now, not by this "
                f"runner ({token}); it writes nothing (one writer per state path: another "
                "runner took the path over)")

    def _refuse_orphans(self, manifest: str) -> None:
        """StateCorruptError when the path holds state files but no manifest ``manifest``."""
        from pyarrow import fs

        found = [info.base_name for info in self._list(self.path)
                 if info.base_name in ("placements", "swaps", "strategy.json")
                 or (info.type == fs.FileType.Directory
                     and info.base_name.startswith("partition="))]
        if not found:
            return
        if found == ["strategy.json"]:
            raise StateCorruptError(
                f"state at {self.path} has a strategy.json but no manifest: it was "
                "written by an older trilink-spark; start from a new state_path")
        versions = sorted({v for p in self.partitions() for v in self.versions(p)})
        raise StateCorruptError(
            f"{manifest} is missing, but {self.path} holds state ({', '.join(sorted(found)[:5])}"
            f"; state versions {versions[-5:]}): the manifest says which versions are "
            "committed, so the state is not read as a fresh path. Restore the manifest with the "
            "rest of the state (a partial restore?), or start from a new state_path")

    # ------------------------------------------------------------------ placements
    def _placement_path(self, from_batch: int) -> str:
        return f"{self.path}/placements/{from_batch:012d}.json"

    def save_placement(self, from_batch: int, strategy: Partitioner | None,
                       partitions: int, key_type: str | None = None) -> None:
        """Record the placement in force from ``from_batch`` (``None``: input partitions).

        ``key_type``: the kind of the key column the state is placed by (``"int"`` for
        tinyint, smallint and int, ``"long"``, ``"string"``, ``"binary"``), the one key type
        every placement of this state hashes its keys as (:meth:`placement_record`).

        Raises
        ------
        InvalidArgumentError
            ``key_type`` is not one of those (nor None).
        """
        self._write(self._placement_path(from_batch),
                    placement_bytes(strategy, partitions, key_type))

    def load_placement(self, from_batch: int, missing_ok: bool = False
                       ) -> tuple[Partitioner | None, int]:
        """The placement recorded for ``from_batch``: (strategy or None, partition count).

        ``missing_ok``: a missing record gives ``(None, 0)`` instead of an error (a corrupt
        one is an error either way).
        """
        strategy, partitions, _ = self.placement_record(from_batch, missing_ok)
        return strategy, partitions

    def placement_record(self, from_batch: int, missing_ok: bool = False
                         ) -> tuple[Partitioner | None, int, str | None]:
        """The placement recorded for ``from_batch``: (strategy or None, partition count,
        key type). The key type is None in a record an older release wrote (before key types
        were recorded) and for a placement by input partitions.

        ``missing_ok``: a missing record gives ``(None, 0, None)`` instead of an error.

        Raises
        ------
        StateCorruptError
            The record is missing (without ``missing_ok``), not JSON, not a placement, or
            inconsistent (naming the file and the field).

        Notes
        -----
        Reads and parses one record: O(its size), a table strategy's table included.
        """
        path = self._placement_path(from_batch)
        data = self.read_bytes(path)
        if data is None:
            if missing_ok:
                return None, 0, None
            raise StateCorruptError(f"{path} is missing; the manifest lists it")
        return parse_placement(data, path)

    def placement_at(self, batch: int, manifest: dict[str, Any] | None = None
                     ) -> tuple[Partitioner | None, int]:
        """The placement that was in force at ``batch`` (per the manifest's history;
        ``manifest``: the manifest, when the caller has just read it)."""
        return self.load_placement(self.placement_start(batch, manifest))

    def placement_record_at(self, batch: int, manifest: dict[str, Any] | None = None
                            ) -> tuple[Partitioner | None, int, str | None]:
        """:meth:`placement_record` of the placement in force at ``batch``."""
        return self.placement_record(self.placement_start(batch, manifest))

    def placement_start(self, batch: int, manifest: dict[str, Any] | None = None) -> int:
        """The batch the placement in force at ``batch`` started from (a record written
        once: with the manifest's ``path_id`` it names one placement)."""
        manifest = self.read_manifest() if manifest is None else manifest
        starts = [] if manifest is None else sorted(manifest.get("placements", []))
        before = [s for s in starts if s <= batch]
        if not before:
            raise StateCorruptError(f"no placement recorded under {self.path} for batch {batch}")
        return int(before[-1])

    # ------------------------------------------------------------------ swap plans
    def _swap_dir(self, batch: int) -> str:
        return f"{self.path}/swaps/{batch:012d}"

    def save_plan(self, batch: int, plan: dict[str, Any], moves: Any) -> None:
        """Write a swap plan: the moves table first, the plan (which makes it exist) last."""
        self._write(f"{self._swap_dir(batch)}/moves{_SUFFIX}", write_table(moves, _MOVES_KIND))
        self._write(f"{self._swap_dir(batch)}/plan.json", plan_bytes(plan))

    def load_plan(self, batch: int) -> dict[str, Any] | None:
        """The swap plan of ``batch`` (None when that batch swapped nothing)."""
        path = f"{self._swap_dir(batch)}/plan.json"
        data = self.read_bytes(path)
        if data is None:
            return None
        return parse_plan(data, path, batch)

    def load_moves(self, batch: int) -> Any:
        """The moves table (key, from, to) of ``batch``'s plan."""
        path = f"{self._swap_dir(batch)}/moves{_SUFFIX}"
        data = self.read_bytes(path)
        if data is None:
            raise StateCorruptError(f"{path} is missing; batch {batch}'s plan needs it")
        return read_table(data, _MOVES_KIND, path)

    def segment_path(self, batch: int, source: int) -> str:
        """The file of the moved keys' state leaving ``source`` in ``batch``'s swap."""
        return f"{self._swap_dir(batch)}/segment-{source:05d}{_SUFFIX}"

    def save_segment(self, batch: int, source: int, parts: Mapping[int, Any]) -> int:
        """Write the moved keys' state leaving ``source``, one segment per destination
        (``{destination: table}``, same schema); returns the bytes written.

        One file per source partition, one record batch per destination, so a destination
        reads only its own rows and the fixed Arrow overhead (schema, footer) is paid once
        per source. The destinations and their row counts are in the schema metadata.
        """
        import pyarrow as pa

        order = sorted(parts)
        if not order:
            raise InvalidArgumentError("a segment file needs at least one destination")
        tables = [parts[d] for d in order]
        schema = tables[0].schema.remove_metadata()
        batches = []
        for dest, table in zip(order, tables):
            if table.schema.remove_metadata() != schema:
                raise InvalidArgumentError(
                    f"segment of partition {source} -> {dest} has another schema than -> "
                    f"{order[0]}: {table.schema} vs {schema}")
            if table.num_rows == 0:
                raise InvalidArgumentError(
                    f"segment of partition {source} -> {dest} has no rows; leave it out")
            batches.append(pa.Table.from_batches(table.to_batches(), schema=schema)
                           .combine_chunks().to_batches()[0])
        index = json.dumps([[int(d), int(t.num_rows)] for d, t in zip(order, tables)])
        metadata = dict(tables[0].schema.metadata or {})
        metadata[SEGMENT_INDEX] = index.encode()
        data = write_table(pa.Table.from_batches(batches, schema=schema.with_metadata(metadata)),
                           STATE_KIND)
        self._write(self.segment_path(batch, source), data)
        return len(data)

    def load_segment(self, batch: int, source: int, destination: int) -> Any:
        """The moved keys' state from ``source`` to ``destination`` in ``batch``'s swap.

        Reads the file's footer and that destination's record batch only.
        """
        path = self.segment_path(batch, source)
        try:
            file = self.fs.open_input_file(path)
        except FileNotFoundError:
            file = None
        except OSError as err:
            from pyarrow import fs

            if self.fs.get_file_info(path).type != fs.FileType.NotFound:
                raise StateStoreError(
                    f"cannot read {path} ({type(err).__name__}: {err})") from None
            file = None
        if file is None:
            raise StateCorruptError(f"{path} is missing; batch {batch}'s swap needs it")
        with file:
            stored = open_table(file, STATE_KIND, path)
            metadata = dict(stored.metadata)
            raw = metadata.pop(SEGMENT_INDEX, None)
            index = segment_index(raw, path, stored.num_batches)
            position = {dest: i for i, (dest, _) in enumerate(index)}
            if destination not in position:
                raise StateCorruptError(
                    f"{path} holds no segment for partition {destination} (it holds "
                    f"{sorted(position)}), but batch {batch}'s moves send keys there")
            table = stored.read([position[destination]])
        if table.num_rows != index[position[destination]][1]:
            raise StateCorruptError(
                f"{path}: the segment for partition {destination} has {table.num_rows} rows, "
                f"its index says {index[position[destination]][1]}")
        return table.replace_schema_metadata(metadata or None)

    def timing_path(self, partition: int, version: int) -> str:
        """Where the timing of ``partition``'s ``version`` lives, beside the version."""
        return f"{self.partition_dir(partition)}/{version:012d}{TIMING_SUFFIX}"

    def save_timing(self, partition: int, version: int, timing: Mapping[str, Any]) -> None:
        """Write what the task that wrote ``partition``'s ``version`` measured (JSON,
        atomically). A replayed batch overwrites it."""
        data = json.dumps(seal(timing), separators=(",", ":"), allow_nan=False).encode()
        self._write(self.timing_path(partition, version), data)

    def timing(self, partition: int, version: int) -> dict[str, Any] | None:
        """What the task that wrote ``partition``'s ``version`` measured of its own work, or
        None: no record (a version carried forward, as no task ran; or written by an older
        release), or one that is not well-formed (logged, never raised). O(1) reads."""
        path = self.timing_path(partition, version)
        try:
            with self.fs.open_input_stream(path) as f:
                # at most one byte past the limit: a huge file is refused, never read whole
                raw: bytes = f.read(MAX_TIMING_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            logger.warning("no timing for %s (%s: %s)", path, type(err).__name__, err)
            return None
        return parse_timing(raw, path)

    def swap_batches(self) -> list[int]:
        """Batches with a swap directory, ascending."""
        from pyarrow import fs

        out = []
        for info in self._list(f"{self.path}/swaps"):
            if info.type == fs.FileType.Directory and info.base_name.isdigit():
                out.append(int(info.base_name))
        return sorted(out)

    # ------------------------------------------------------------------ small records
    def record_path(self, name: str) -> str:
        """Where the small record ``name`` lives (``records/<name>.json``)."""
        if not isinstance(name, str) or not name.replace("-", "").isalnum():
            raise InvalidArgumentError(
                f"a record name is letters, digits and '-', got {name!r}")
        return f"{self.path}/records/{name}.json"

    def save_record(self, name: str, body: Mapping[str, Any]) -> None:
        """Write the small JSON record ``name`` (:func:`~trilink_spark.state.formats.record_bytes`:
        sealed with its checksum, as every JSON file of the store), atomically (temporary
        file, rename). O(size of the body).

        Raises
        ------
        InvalidArgumentError
            ``body`` is not JSON (NaN and infinities included) or is over
            :data:`~trilink_spark.state.formats.MAX_RECORD_BYTES`.
        """
        self._write(self.record_path(name), record_bytes(name, body))

    def load_record(self, name: str) -> dict[str, Any] | None:
        """The body of the small record ``name`` (None when there is none). O(its size):
        at most one byte past :data:`~trilink_spark.state.formats.MAX_RECORD_BYTES` is read.

        Raises
        ------
        StateCorruptError
            The file is too large, not JSON, not sealed, fails its checksum (a torn or
            edited file), is not a record of this store, or is another record: the message
            names it (:func:`~trilink_spark.state.formats.parse_small_record`).
        """
        path = self.record_path(name)
        data = self.read_bytes(path, MAX_RECORD_BYTES)
        return None if data is None else parse_small_record(data, name, path)

    def delete_record(self, name: str) -> None:
        """Delete the small record ``name`` (nothing when there is none)."""
        self._delete(self.record_path(name))

    # ------------------------------------------------------------------ upkeep
    def prune(self, partitions: int, newest: int, keep_from: int | None = None,
              listed: Sequence[Sequence[int]] | None = None) -> None:
        """Delete versions beyond the newest ``keep_versions`` up to ``newest``.

        ``keep_from``: versions at or above it are always kept (what a replay of the newest
        batch reads). A changelog needs the snapshot and changelogs before it: nothing from
        the newest snapshot at or below the oldest kept version on is deleted, so every kept
        version stays readable. ``listed``: unused (each partition is listed once here).
        """
        for p in range(partitions):
            snapshots, logs = self.listing(p)
            versions = sorted(snapshots | logs)
            kept = [v for v in versions if v <= newest][-self.keep_versions:]
            floor = min(kept + ([keep_from] if keep_from is not None else []), default=None)
            if floor is None:
                continue
            bases = [v for v in snapshots if v <= floor]
            # the chain of the kept versions may start at empty state: then keep it all
            base = max(bases) if bases else (-1 if any(v < floor for v in logs) else floor)
            for v in versions:
                if v < base:
                    self._delete(self.version_path(p, v))
                    self._delete(self.tables_path(p, v))
                    self._delete(self.changelog_path(p, v))
                if v < floor and v not in kept:  # a measurement, not part of any chain
                    self._delete(self.timing_path(p, v))
            if any(v < base for v in snapshots):
                try:  # the table files no kept snapshot lists (incremental.collect)
                    collect(self, p)
                except StateCorruptError as err:
                    logger.warning("partition %d: table files not collected (%s)", p, err)
        if keep_from is not None:
            for batch in self.swap_batches():
                if batch < keep_from:
                    self._delete(self._swap_dir(batch), directory=True)

    def _delete(self, path: str, directory: bool = False) -> None:
        try:
            (self.fs.delete_dir if directory else self.fs.delete_file)(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise StateStoreError(f"cannot delete {path} ({type(err).__name__}: {err})") from None

    def has_version(self, version: int, partitions: int) -> bool:
        """Whether every partition ``0..partitions-1`` has state ``version``."""
        return all(version in self.versions(p) for p in range(partitions))

    # ------------------------------------------------------------------ legacy placement
    def save_strategy(self, strategy: Partitioner) -> None:
        write_strategy(self.fs, f"{self.path}/strategy.json", strategy)

    def load_strategy(self) -> Partitioner | None:
        return read_strategy(self.fs, f"{self.path}/strategy.json")

    # ------------------------------------------------------------------ measurements
    def state_bytes(self) -> int:
        """Total size of the newest committed version's files (for state-cost measurements;
        a store without a manifest, a merge buffer's: each partition's newest file)."""
        has_manifest = self.read_bytes(self._manifest_path()) is not None
        manifest = self.read_manifest() if has_manifest else None
        if manifest is None or not manifest.get("committed"):
            return sum(len(self.latest(p) or b"") for p in self.partitions())
        version, partitions = self.committed_layout(None, manifest)
        return sum(self.version_bytes(p, version) for p in range(partitions))
