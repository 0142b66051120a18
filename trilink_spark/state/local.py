"""A partition's executor-local copy of its keyed state, in RocksDB (``rocksdict``).

The durable truth of keyed state is on the state path (snapshots and changelogs,
:mod:`trilink_spark.state.changelog`); this is its cache on the executor's local disk, so a
micro-batch reads and writes only the keys it touches. It is opened by the task of its
partition, under an exclusive lock, and closed when the task ends; the data stays on disk
between batches.

Layout (one RocksDB directory per state path and partition, under the local directory)::

    m                      JSON: version, attempt token, partition-wide values
    r <key bytes>          a key's row: its wake time (8 bytes), its schema id (4 bytes),
                           its row (:func:`~trilink_spark.state.rows.encode_rows`)
    w <wake> <key bytes>   the wake index: keys in order of the event time at which the
                           partition's progress alone makes something due for them
    t <key bytes>          a key's processing time (8 bytes, ordered as ``w``'s): when the
                           last batch that brought it a row ran (:meth:`LocalState.times`)
    x <time> <key bytes>   the processing-time index: keys in order of that time
    s <schema id>          Arrow schemas of the rows (IPC bytes, read with pyarrow)
    u <key bytes>          undo record of the last batch: the key's row before it (or none)
    U                      undo record of the last batch: the ``m`` record before it

Key bytes are the block (4 bytes) then the key (:func:`key_bytes`), so one block's keys are
one contiguous range. Only a copy kept for a processing-time TTL (:attr:`LocalState.timed`)
holds ``t`` and ``x`` records: one of each per key, ``-inf`` for a key without a recorded
time; :meth:`LocalState.apply` keeps them, :meth:`LocalState.undo` restores them. Nothing
stored is unpickled or evaluated; an undecodable record is a
:class:`~trilink_spark.errors.StateCorruptError` naming the directory.

Locking: one process per partition at a time, through ``fcntl.flock`` on a lock file beside
the database. The kernel releases the lock when its process dies, so a task retried after a
crash never waits on a dead holder.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import StateCorruptError, StateStoreError
from .._internal.validation import is_count
from .held import ASK_TIMEOUT_S, ask_release, hold, identity, take
from .sweep import remove_stale_checkpoints

__all__ = ["LocalState", "key_bytes", "LOCAL_KEY_TYPES", "wake_bytes", "supports_key_type",
           "head", "split_head", "iter_rows", "open_checkpoint", "NULL_KEY_BYTES",
           "storage_fault", "STORAGE_FAULTS"]

logger = logging.getLogger(__name__)

_META = b"m"
_UNDO_META = b"U"
_ROW = b"r"
_WAKE = b"w"
_SCHEMA = b"s"
_UNDO = b"u"
_TIME = b"t"
_EXPIRY = b"x"
#: A copy held open between tasks flushes its writes once its memtables hold more (bytes).
HELD_MEMTABLE_BYTES = 8 << 20
#: A task that logged more than this (a load) waits for the compaction its writes start.
SETTLE_WRITTEN_BYTES = 16 << 20
#: The longest :meth:`LocalState.settle` waits for a compaction (seconds).
SETTLE_TIMEOUT_S = 120.0
#: RocksDB's base level and table file sizes: a merge rewrites a few small files, not a
#: partition's whole last level (RocksDB's 256 MiB default base holds millions of keys).
LEVEL_BASE_BYTES = 16 << 20
TABLE_FILE_BYTES = 2 << 20
_HEAD = struct.Struct(">dI")  # wake time, schema id
#: The local key bytes of the null key: block 0, tag 0, no body (:func:`key_bytes`).
NULL_KEY_BYTES = bytes(5)
#: Arrow type names whose keys the local store encodes (others keep the file store).
LOCAL_KEY_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "bool",
                   "float", "double", "halffloat", "string", "large_string", "binary",
                   "large_binary", "date32", "date64", "timestamp", "null")


def supports_key_type(arrow_type: Any) -> bool:
    """Whether :func:`key_bytes` encodes keys of ``arrow_type`` (a pyarrow DataType)."""
    import pyarrow as pa

    if arrow_type is None:
        return False
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return True  # their names carry a unit: "timestamp[us]", "date32[day]"
    return str(arrow_type) in LOCAL_KEY_TYPES


def key_bytes(keys: Any, blocks: Any) -> list[bytes]:
    """Each key's bytes in the local store: its block (4 bytes, big-endian), a tag, the key.

    The null key is one key, a floating column's NaN another (as Spark's ``groupBy`` and the
    runtime keep them, whatever the NaN's bits); ``-0.0`` is ``0.0``. Integers are 8
    big-endian bytes with the sign bit flipped, floats their canonical 8 bytes, strings and
    binaries their bytes. Vectorised: O(total key bytes), one Python object per key.

    Parameters
    ----------
    keys : pyarrow.Array
        Of a type :func:`supports_key_type` accepts.
    blocks : numpy.ndarray
        Each key's block, in ``[0, 2**32)``.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa
    >>> key_bytes(pa.array(["a", None]), np.array([3, 0]))
    [b'\\x00\\x00\\x00\\x03\\x03a', b'\\x00\\x00\\x00\\x00\\x00']
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    if n == 0:
        return []
    t = keys.type
    null = np.asarray(keys.is_null().to_numpy(zero_copy_only=False), bool) \
        if keys.null_count else np.zeros(n, dtype=bool)
    head = np.empty((n, 5), dtype=np.uint8)
    head[:, :4] = np.where(null, 0, np.asarray(blocks, dtype=np.int64)).astype(">u4") \
        .view(np.uint8).reshape(n, 4)  # a null key is one key: one block
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        head[:, 4] = np.where(null, 0, 3)
        prefix = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(5), n, [None, pa.py_buffer(head.tobytes())]).cast(pa.binary())
        body = pc.fill_null(keys.cast(pa.binary()), b"")
        out: list[bytes] = pc.binary_join_element_wise(prefix, body, b"").to_pylist()
        return out
    if pa.types.is_floating(t):
        values = np.asarray(pc.fill_null(keys.cast(pa.float64()), 0.0).to_numpy(), np.float64)
        payload = np.where(np.isnan(values), np.nan, values + 0.0).astype(">f8")
        tag = 2
    elif t == pa.null():
        payload = np.zeros(n, dtype=">u8")
        tag = 1
    else:
        if pa.types.is_timestamp(t) or pa.types.is_date64(t):
            keys = keys.cast(pa.int64())
        elif pa.types.is_date32(t) or pa.types.is_boolean(t):
            keys = keys.cast(pa.int32()).cast(pa.int64())
        ints = np.asarray(pc.fill_null(keys.cast(pa.int64()), 0).to_numpy(), np.int64)
        payload = (ints.view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
        tag = 1
    head[:, 4] = np.where(null, 0, tag)
    body8 = np.where(null[:, None], 0, payload.view(np.uint8).reshape(n, 8)).astype(np.uint8)
    whole = np.concatenate([head, body8], axis=1)
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(13), n,
                                                 [None, pa.py_buffer(whole.tobytes())])
    rows: list[bytes] = fixed.to_pylist()
    for i in np.flatnonzero(null).tolist():
        rows[i] = rows[i][:5]
    return rows


def wake_bytes(times: Any) -> list[bytes]:
    """Event times as 8 bytes each that sort as the numbers do (NaN first). Vectorised."""
    t = np.asarray(times, dtype=np.float64) + 0.0
    bits = t.view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    ordered = np.where(negative, ~bits, bits | np.uint64(1 << 63)).astype(">u8")
    raw = ordered.tobytes()
    return [raw[i:i + 8] for i in range(0, len(raw), 8)]


#: What RocksDB's I/O errors say when the local disk, not the copy, is at fault.
STORAGE_FAULTS = (("no space left on device", "the disk is full"),
                  ("read-only file system", "the disk is read-only"),
                  ("permission denied", "the directory is not writable"),
                  ("disk quota exceeded", "the disk quota is used up"))


def storage_fault(err: BaseException) -> str | None:
    """What is wrong with the local disk when RocksDB's error ``err`` says so (a full,
    read-only or unwritable disk: no rebuild mends it), else None. O(len(str(err))).

    Examples
    --------
    >>> storage_fault(Exception("IO error: No space left on device: While appending"))
    'the disk is full'
    >>> storage_fault(Exception("Corruption: block checksum mismatch")) is None
    True
    """
    text = str(err).lower()
    return next((what for marker, what in STORAGE_FAULTS if marker in text), None)


class LocalState:
    """One partition's local RocksDB copy, opened under the partition's lock.

    Use :meth:`open` (a context manager closes it). Not picklable: runtime only, opened by the
    task that runs the partition.

    Notes
    -----
    Cost: opening is one ``flock`` and one RocksDB open (milliseconds), or nothing when this
    worker holds the copy open since the partition's last task here (:meth:`release`); reads
    and writes cost what they touch (:meth:`get`: one multi-get; :meth:`due` and
    :meth:`expiring`: one range scan of the due entries; :meth:`apply`: one atomic write
    batch, and for a :attr:`timed` copy one multi-get of the touched keys' processing times).
    A copy held open compacts in the background between tasks. One closed after each task
    has no time of its own for that: :meth:`settle` lets the compaction finish first, or each
    task's writes would stay one more level-0 table file that every later read searches.
    """

    def __init__(self, directory: str, db: Any, lock_fd: int) -> None:
        self.directory = directory
        self._db = db
        self._lock_fd = lock_fd
        self._lock_path = directory[: -len(".db")] + ".lock"
        #: The files this copy opened and locked (a copy replaced since is never held).
        self._opened = identity(directory, self._lock_path)
        try:
            st = os.fstat(lock_fd)
            self._opened = (self._opened[0], (st.st_dev, st.st_ino))
        except OSError:
            pass
        self._schemas: dict[int, Any] = {}
        self.meta: dict[str, Any] = self._read_meta(_META) or {"version": None}

    @classmethod
    def open(cls, root: str, store_id: str, partition: int, timeout: float = 600.0
             ) -> LocalState:
        """Lock and open partition ``partition``'s copy of state path ``store_id`` under
        ``root`` (created when missing).

        Raises
        ------
        StateStoreError
            The directory cannot be created, the lock is not free within ``timeout`` seconds,
            or RocksDB cannot open the copy (then it is removed, so the next attempt rebuilds
            it from the state path).
        """
        from rocksdict import Rdict

        base = os.path.join(root, store_id)
        directory = os.path.join(base, f"p{partition:05d}.db")
        lock_path = os.path.join(base, f"p{partition:05d}.lock")
        held = take(directory, lock_path)
        if held is not None:  # this worker kept it open since its last task
            return held  # type: ignore[no-any-return]
        try:
            os.makedirs(base, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise StateStoreError(f"local state directory {base} cannot be used "
                                  f"({type(err).__name__}: {err}); set "
                                  "spark.trilink.state.localDir to a writable directory") from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise StateStoreError(
                        f"{directory} is locked by another process for more than {timeout} s "
                        "(one task per partition at a time)") from None
                # held open by an idle worker: it closes it (never waited on past the timeout)
                wait = min(ASK_TIMEOUT_S, max(0.05, deadline - time.monotonic()))
                if not ask_release(directory, wait):
                    time.sleep(0.02)
        # A lock file removed while another process held the copy lets this flock succeed
        # while that process still has the database open: have it close it first (no holder:
        # one refused connect), else RocksDB's own lock fails and the copy would be emptied.
        ask_release(directory, min(ASK_TIMEOUT_S, max(0.05, deadline - time.monotonic())))
        options = db_options()
        try:
            db = Rdict(directory, options)
        except Exception as err:  # noqa: BLE001 - RocksDB raises plain Exceptions
            logger.warning("local state %s cannot be opened (%s); emptied, to be rebuilt",
                           directory, err)
            shutil.rmtree(directory, ignore_errors=True)  # a cache: start it again
            try:
                db = Rdict(directory, options)
            except Exception as again:  # noqa: BLE001
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise StateStoreError(f"local state {directory} cannot be created ({again}); "
                                      "set spark.trilink.state.localDir to a writable "
                                      "directory") from None
        remove_stale_checkpoints(base, partition)
        try:
            return cls(directory, db, fd)
        except Exception as err:  # noqa: BLE001 - a cache: emptied, then rebuilt by its caller
            logger.warning("%s: %s; the local copy is emptied", directory, err)
            try:
                db.close()
            except Exception:  # noqa: BLE001 - it is removed next
                pass
            shutil.rmtree(directory, ignore_errors=True)
            try:
                return cls(directory, Rdict(directory, options), fd)
            except Exception as again:  # noqa: BLE001
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise StateStoreError(f"local state {directory} cannot be opened ({again})") \
                    from None

    def release(self, keep: bool) -> bool:
        """End a task's use of this copy: with ``keep``, hold it open in this process for
        the partition's next task here (:mod:`~trilink_spark.state.held`; another process that
        wants it has it closed at once), its writes flushed to a table file once they hold
        more than :data:`HELD_MEMTABLE_BYTES` (until then RocksDB's log keeps them, and a
        worker that dies loses nothing); else :meth:`close` it. Returns whether it is held.
        A copy that cannot be flushed is closed."""
        if keep and self._db is not None:
            try:
                with self._guard("flush"):
                    memtables = self._db.property_int_value("rocksdb.cur-size-all-mem-tables")
                    if (memtables or 0) > HELD_MEMTABLE_BYTES:  # else the log keeps them
                        self._db.flush()
            except (StateCorruptError, StateStoreError) as err:  # a full disk too: closed,
                logger.warning("%s; the local copy is closed", err)  # its lock released
            else:
                if hold(self.directory, self._lock_path, self, self.close, self._opened):
                    return True
        self.close()
        return False

    def close(self) -> None:
        """Close the database and release the lock (idempotent; the lock is released even
        when closing the database fails, which raises as :meth:`_guard` says)."""
        try:
            if self._db is not None:
                db, self._db = self._db, None
                with self._guard("close"):
                    db.close()
        finally:
            if self._lock_fd >= 0:
                fd, self._lock_fd = self._lock_fd, -1
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def __enter__(self) -> LocalState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ records
    def _read_meta(self, name: bytes) -> dict[str, Any] | None:
        with self._guard("read its record"):
            raw = self._db.get(name)
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            meta = None
        if not isinstance(meta, dict) or "version" not in meta:
            raise StateCorruptError(f"{self.directory}: malformed local state record {name!r}")
        return meta

    @property
    def version(self) -> int | None:
        """The version this copy holds (None: empty)."""
        v = self.meta.get("version")
        return v if isinstance(v, int) else None

    @property
    def keys(self) -> int:
        """The keys this copy holds: counted by :meth:`apply` (O(1)); a copy whose record
        lacks the count (written before it was kept) or holds a malformed one is counted
        once, by a scan of its keys, and keeps the count from its next write on."""
        found = self.meta.get("keys")
        if isinstance(found, int) and is_count(found, 0):
            return found
        n = 0
        if self.meta.get("version") is not None:
            with self._guard("count its keys"):
                n = sum(1 for _ in iter_rows(self._db))
            logger.info("%s: %d keys counted (a copy without a key count)", self.directory, n)
        self.meta["keys"] = n
        return n

    @property
    def chain(self) -> dict[str, Any]:
        """What its owner records of the changelogs since the last snapshot, kept with the
        version: ``at``, the version the last snapshot was taken of (None: none since the
        empty state), and ``logged``, the changelog rows since. Empty when unknown (a copy
        written before it was kept) or malformed."""
        found = self.meta.get("chain")
        if not isinstance(found, dict):
            return {}
        at, logged = found.get("at"), found.get("logged")
        if not (at is None or is_count(at, 0)) or not is_count(logged, 0):
            return {}
        return {"at": at, "logged": logged}

    @property
    def layout(self) -> str | None:
        """How its owner encoded the keys' blocks (:func:`key_bytes`), as it recorded it with
        the version; None when not recorded (a copy written before it was kept)."""
        found = self.meta.get("layout")
        return found if isinstance(found, str) else None

    def schema(self, sid: int) -> Any:
        """The Arrow schema with id ``sid``."""
        import pyarrow as pa

        found = self._schemas.get(sid)
        if found is None:
            with self._guard("read a schema"):
                raw = self._db.get(_SCHEMA + struct.pack(">I", sid))
            if raw is None:
                raise StateCorruptError(f"{self.directory}: rows of unknown schema {sid}")
            try:
                found = pa.ipc.read_schema(pa.py_buffer(raw))
            except (pa.ArrowInvalid, OSError, ValueError) as err:
                raise StateCorruptError(f"{self.directory}: schema {sid} is not an Arrow "
                                        f"schema ({err})") from None
            self._schemas[sid] = found
        return found

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The stored rows (head included) of ``keys``; None for a key without one."""
        if not keys:
            return []
        with self._guard("read rows"):
            found: list[bytes | None] = self._db.get([_ROW + k for k in keys])
        return found

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """RocksDB's own errors (a damaged file, an I/O error) as a StateCorruptError naming
        the copy: the task then rebuilds it from the state path. A full or read-only disk
        (:func:`storage_fault`) is a StateStoreError instead, which no rebuild mends."""
        try:
            yield
        except (StateCorruptError, StateStoreError):
            raise
        except Exception as err:  # noqa: BLE001 - rocksdict raises plain Exceptions
            fault = storage_fault(err)
            if fault is not None:
                raise StateStoreError(
                    f"{self.directory}: cannot {what}: {fault} ({err}); free space on that "
                    "disk or make it writable, or point spark.trilink.state.localDir at "
                    "another") from None
            raise StateCorruptError(f"{self.directory}: cannot {what} ({err})") from None

    def due(self, upto: float) -> list[bytes]:
        """Keys whose wake time is at or below ``upto``, in wake order (one range scan)."""
        end = _WAKE + wake_bytes([np.nextafter(upto, np.inf)])[0]  # the first wake above
        return self._scan(_WAKE, end, "scan the wake index")

    @property
    def timed(self) -> bool:
        """Whether this copy keeps the processing-time index (``t`` and ``x`` records): the
        copy of a run with a processing-time TTL."""
        return bool(self.meta.get("timed"))

    def expiring(self, upto: float, unknown: bool) -> list[bytes]:
        """Keys of a :attr:`timed` copy whose processing time is at or below ``upto``, in
        time order (one range scan of the processing-time index); the keys without a
        recorded time only with ``unknown``. Empty for a copy without the index."""
        start = _NO_TIME if unknown else _FIRST_TIME
        end = wake_bytes([np.nextafter(upto, np.inf)])[0]
        if end <= start:
            return []
        return self._scan(_EXPIRY + start, _EXPIRY + end, "scan the processing-time index")

    def times(self, keys: Sequence[bytes]) -> list[float | None]:
        """The processing times :meth:`apply` recorded for ``keys`` (``-inf``: none
        recorded; None: a key without a row, or a copy that is not :attr:`timed`). One
        multi-get."""
        if not keys:
            return []
        with self._guard("read processing times"):
            found = self._db.get([_TIME + k for k in keys])
        return [None if raw is None else _time_of(raw, self.directory) for raw in found]

    def _scan(self, start: bytes, end: bytes, what: str) -> list[bytes]:
        """The key bytes of the index entries from ``start`` up to (not including) ``end``
        (one range scan; an index entry is a prefix, 8 bytes of time, the key bytes)."""
        out: list[bytes] = []
        with self._guard(what):
            it = self._db.iter()
            it.seek(start)
            while it.valid():
                k = it.key()
                if k >= end:
                    break
                out.append(k[9:])
                it.next()
        return out

    def check(self) -> None:
        """Invariant checker (tests, diagnosis): each row has exactly its wake entry, and in
        a :attr:`timed` copy exactly one processing time and its index entry.

        Raises
        ------
        StateCorruptError
            Naming the first disagreement. O(keys).
        """
        with self._guard("check its indexes"):
            rows = dict(iter_rows(self._db))
            wakes = sorted((k[9:], k[1:9]) for k in _prefixed(self._db, _WAKE))
            times = sorted((k[1:], v) for k, v in _prefixed_items(self._db, _TIME))
            expiry = sorted((k[9:], k[1:9]) for k in _prefixed(self._db, _EXPIRY))
        indexed = sorted((k, wake_bytes([w])[0]) for k, w in
                         ((k, _wake_of(r, self.directory)) for k, r in rows.items())
                         if w == w and w != float("inf"))
        if wakes != indexed:
            raise StateCorruptError(f"{self.directory}: the wake index disagrees with the rows "
                                    f"({len(wakes)} entries, {len(indexed)} expected)")
        timed_keys = sorted(rows) if self.timed else []
        if [k for k, _ in times] != timed_keys or expiry != times:
            raise StateCorruptError(
                f"{self.directory}: the processing-time index disagrees with the rows "
                f"({len(rows)} rows, {len(times)} times, {len(expiry)} index entries)")

    def rows(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key's bytes and stored row, in key order (a full scan: snapshots)."""
        return iter_rows(self._db)

    @property
    def block_keys(self) -> dict[str, int] | None:
        """The keys this copy holds per block (``{"<block>": count}``, the null key under
        ``"null"``), kept by :meth:`apply` in O(the keys it adds or deletes); None for a copy
        written before they were kept (a rebuild keeps them)."""
        found = self.meta.get("blocks")
        if isinstance(found, dict) and all(is_count(v, 0) for v in found.values()):
            return found
        return None

    def block_rows(self, block: int) -> list[tuple[bytes, bytes]]:
        """The key bytes and stored rows of one block's keys, the null key left out (it has
        no block: :func:`key_bytes` files it under block 0). One range scan: a key's bytes
        start with its block, so O(the block's keys)."""
        prefix = _ROW + struct.pack(">I", block)
        with self._guard(f"scan block {block}"):
            return [(k[1:], v) for k, v in _prefixed_items(self._db, prefix)
                    if k[1:] != NULL_KEY_BYTES]

    # ------------------------------------------------------------------ writing
    def register(self, schema: Any) -> int:
        """The id of ``schema`` (stored on first use)."""
        from .rows import schema_id

        sid = int(schema_id(schema))
        if sid not in self._schemas:
            key = _SCHEMA + struct.pack(">I", sid)
            if self._db.get(key) is None:
                self._db.put(key, schema.remove_metadata().serialize().to_pybytes())
            self._schemas[sid] = schema.remove_metadata()
        return sid

    def apply(self, version: int, attempt: str, meta: dict[str, Any],
              puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes],
              before: Mapping[bytes, bytes | None], undo: bool = True,
              chain: dict[str, Any] | None = None, times: Sequence[float] | None = None,
              layout: str | None = None) -> None:
        """Move this copy to ``version`` in one atomic write.

        Parameters
        ----------
        puts : sequence of (key bytes, row with head)
        deletes : sequence of key bytes
        before : dict
            Every key of ``puts`` and ``deletes`` that had a row before, with it (keys absent
            from it had none): the undo record, the wake entries to replace, and the change
            in :attr:`keys`.
        undo : bool
            Keep an undo record (:meth:`undo`); False for a rebuild into an empty copy.
        chain : dict, optional
            The new :attr:`chain` record (default: the current one is kept).
        layout : str, optional
            The new :attr:`layout` (default: the current one is kept).
        times : sequence of float, optional
            Each put's processing time (``-inf`` or NaN: none recorded), in the order of
            ``puts``: given for every write of a :attr:`timed` copy (an empty copy given
            them becomes one), which then keeps the processing-time index; never for any
            other. One more multi-get, of the touched keys' times.

        Raises
        ------
        StateCorruptError
            ``times`` given to a copy that is not :attr:`timed`, or withheld from one.
        """
        from rocksdict import WriteBatch

        timed = times is not None
        if self.version is not None and timed != self.timed:
            raise StateCorruptError(
                f"{self.directory}: a copy {'with' if self.timed else 'without'} the "
                "processing-time index cannot apply a batch "
                f"{'without' if self.timed else 'with'} processing times")
        if times is not None and len(times) != len(puts):
            raise StateCorruptError(f"{self.directory}: {len(times)} processing times for "
                                    f"{len(puts)} rows")
        wb = WriteBatch(raw_mode=True)
        wb.delete_range(_UNDO, _UNDO + b"\xff" * 8)
        if undo:
            wb.put(_UNDO_META, json.dumps(self.meta).encode())
        else:
            wb.delete(_UNDO_META)
        touched = [k for k, _ in puts] + list(deletes)
        old_times: list[bytes | None] = [None] * len(touched)
        if timed and touched:
            with self._guard("read processing times"):
                old_times = self._db.get([_TIME + k for k in touched])
        olds = [before.get(k) for k in touched]
        old_wakes = _wake_entries(olds, self.directory)
        for k, old, old_time, old_wake in zip(touched, olds, old_times, old_wakes):
            if undo:  # none, the row, or the row and its processing time
                record = b"\x00" if old is None else (
                    b"\x01" + old if old_time is None else b"\x02" + old_time + old)
                wb.put(_UNDO + k, record)
            if old_wake is not None:
                wb.delete(_WAKE + old_wake + k)
            if old_time is not None:
                wb.delete(_EXPIRY + old_time + k)
        for (k, row), wake in zip(puts, _wake_entries([r for _, r in puts], self.directory)):
            wb.put(_ROW + k, row)
            if wake is not None:
                wb.put(_WAKE + wake + k, b"")
        if times is not None:
            at = np.asarray(times, np.float64)
            for (k, _), when in zip(puts, wake_bytes(np.where(np.isnan(at), -np.inf, at))):
                wb.put(_TIME + k, when)
                wb.put(_EXPIRY + when + k, b"")
        for k in deletes:
            wb.delete(_ROW + k)
            if timed:
                wb.delete(_TIME + k)
        new_keys = [k for k, _ in puts if before.get(k) is None]
        gone = [k for k in deletes if before.get(k) is not None]
        new_meta = {"version": version, "attempt": attempt, "meta": meta,
                    "keys": max(self.keys + len(new_keys) - len(gone), 0),
                    "chain": self.chain if chain is None else chain}
        blocks = {} if self.version is None else self.block_keys
        if blocks is not None:  # a copy written before they were kept keeps none
            new_meta["blocks"] = _counted(blocks, new_keys, gone)
        if (layout or self.layout) is not None:
            new_meta["layout"] = layout or self.layout
        if timed:
            new_meta["timed"] = True
        wb.put(_META, json.dumps(new_meta).encode())
        with self._guard("write"):
            self._db.write(wb)
        self.meta = new_meta

    def undo(self) -> bool:
        """Return to the version before the last :meth:`apply` (False: no undo record)."""
        from rocksdict import WriteBatch

        previous = self._read_meta(_UNDO_META)
        if previous is None:
            return False
        with self._guard("read the undo record"):
            return self._undo(previous)

    def _undo(self, previous: dict[str, Any]) -> bool:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        timed = self.timed
        it = self._db.iter()
        it.seek(_UNDO)
        while it.valid():
            k = it.key()
            if not k.startswith(_UNDO):
                break
            key, old = k[1:], it.value()
            current = self._db.get(_ROW + key)
            if current is not None:
                wake = _wake_of(current, self.directory)
                if wake == wake and wake != float("inf"):
                    wb.delete(_WAKE + wake_bytes([wake])[0] + key)
            now = self._db.get(_TIME + key) if timed else None
            if now is not None:
                wb.delete(_EXPIRY + now + key)
                wb.delete(_TIME + key)
            if old[:1] == b"\x02":  # the row and its processing time (8 bytes)
                old_time, old = old[1:9], b"\x01" + old[9:]
                wb.put(_TIME + key, old_time)
                wb.put(_EXPIRY + old_time + key, b"")
            if old[:1] == b"\x01":
                wb.put(_ROW + key, old[1:])
                wake = _wake_of(old[1:], self.directory)
                if wake == wake and wake != float("inf"):
                    wb.put(_WAKE + wake_bytes([wake])[0] + key, b"")
            else:
                wb.delete(_ROW + key)
            it.next()
        wb.delete_range(_UNDO, _UNDO + b"\xff" * 8)
        wb.delete(_UNDO_META)
        wb.put(_META, json.dumps(previous).encode())
        with self._guard("write"):
            self._db.write(wb)
        self.meta = previous
        return True

    def restore(self, source: str) -> None:
        """Replace this copy by the database at ``source`` (a snapshot's table files,
        :func:`~trilink_spark.state.incremental.download`), moved into place under the lock
        this copy holds. O(1) beyond RocksDB's open.

        Raises
        ------
        StateStoreError, StateCorruptError
            As :meth:`_guard` says; the copy is then empty (and open), to be rebuilt.
        """
        from rocksdict import Rdict

        if self._db is not None:
            db, self._db = self._db, None
            with self._guard("close"):
                db.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self._schemas.clear()
        self.meta = {"version": None}
        try:
            with self._guard("open the restored copy"):
                os.replace(source, self.directory)
                self._db = Rdict(self.directory, db_options())
            self.meta = self._read_meta(_META) or {"version": None}
        except (StateCorruptError, StateStoreError):
            shutil.rmtree(self.directory, ignore_errors=True)  # an empty copy, still locked
            self._db = Rdict(self.directory, db_options())
            raise
        finally:
            self._opened = (identity(self.directory, self._lock_path)[0], self._opened[1])

    def reset(self) -> None:
        """Empty this copy (before a rebuild)."""
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        wb.delete_range(b"\x00", b"\xff" * 8)
        with self._guard("empty the copy"):
            self._db.write(wb)
        self._schemas.clear()
        self.meta = {"version": None}

    def settle(self, timeout: float = SETTLE_TIMEOUT_S) -> float:
        """Flush this copy's writes into a table file and wait (at most ``timeout`` seconds)
        for the compaction RocksDB then starts; returns the seconds spent.

        Closing a copy stops RocksDB's background merges: without a wait, each closing task
        would leave one more level-0 file for every later read to search. Leveled compaction
        keeps them under four, at an amortised cost (about 0.65 s every ten batches at 2.5
        million keys of a copy). A compaction running at the timeout is left to the next task.
        """
        started = time.monotonic()
        with self._guard("flush"):
            self._db.flush()
        while time.monotonic() - started < timeout:
            with self._guard("read its compaction state"):
                busy = (self._db.property_int_value("rocksdb.compaction-pending")
                        or self._db.property_int_value("rocksdb.num-running-compactions"))
            if not busy:
                break
            time.sleep(0.005)
        return time.monotonic() - started

    def level0_files(self) -> int:
        """Table files at RocksDB's level 0 (each read searches every one of them)."""
        with self._guard("read its level-0 file count"):
            return int(self._db.property_int_value("rocksdb.num-files-at-level0") or 0)

    def checkpoint(self, directory: str) -> None:
        """A consistent copy of this database at ``directory`` (hard links: cheap)."""
        from rocksdict import Checkpoint

        Checkpoint(self._db).create_checkpoint(directory)


def _counted(blocks: dict[str, int], added: Sequence[bytes], gone: Sequence[bytes]
             ) -> dict[str, int]:
    """``blocks`` (keys per block, :attr:`LocalState.block_keys`) with keys added and gone."""
    out = dict(blocks)
    for keys, step in ((added, 1), (gone, -1)):
        for k in keys:
            label = "null" if k == NULL_KEY_BYTES else str(int.from_bytes(k[:4], "big"))
            out[label] = out.get(label, 0) + step
    return {label: n for label, n in out.items() if n > 0}


def head(wake: float, sid: int) -> bytes:
    """The head of a stored row: its wake time and schema id."""
    return _HEAD.pack(wake, sid)


def _wake_entries(rows: Sequence[bytes | None], where: str) -> list[bytes | None]:
    """The wake index bytes of stored rows (:func:`wake_bytes` of their heads' wake times);
    None for a missing row and for a row the index leaves out (a wake time of NaN or
    ``+inf``: nothing wakes it). Vectorised: one :func:`wake_bytes` call, one slice per row.

    Raises
    ------
    StateCorruptError
        A row is shorter than its head.
    """
    present = [r for r in rows if r is not None]
    if not present:
        return [None] * len(rows)
    if min(map(len, present)) < _HEAD.size:
        short = min(map(len, present))
        raise StateCorruptError(f"{where}: a stored row of {short} bytes (at least "
                                f"{_HEAD.size})")
    wakes = np.frombuffer(b"".join([r[:8] for r in present]), dtype=">f8").astype(np.float64)
    indexed = (~np.isnan(wakes) & ~np.isposinf(wakes)).tolist()  # finite or -inf: indexed
    entries = iter([w if ok else None for w, ok in zip(wake_bytes(wakes), indexed)])
    return [None if r is None else next(entries) for r in rows]


def _wake_of(row: bytes, where: str) -> float:
    if len(row) < _HEAD.size:
        raise StateCorruptError(f"{where}: a stored row of {len(row)} bytes (at least "
                                f"{_HEAD.size})")
    wake: float = _HEAD.unpack_from(row)[0]
    return wake


#: Index bytes of a key without a recorded processing time (``-inf``), and of the first time
#: above it: the keys without one come first in the processing-time index.
_NO_TIME = wake_bytes([-np.inf])[0]
_FIRST_TIME = wake_bytes([np.nextafter(-np.inf, np.inf)])[0]


def _time_of(raw: bytes, where: str) -> float:
    """The processing time of a ``t`` record (the inverse of :func:`wake_bytes`)."""
    if len(raw) != 8:
        raise StateCorruptError(f"{where}: a processing time of {len(raw)} bytes (8)")
    bits = np.frombuffer(raw, dtype=">u8").astype(np.uint64)
    top = np.uint64(1 << 63)
    plain = np.where(bits & top, bits ^ top, ~bits).astype(np.uint64)
    return float(plain.view(np.float64)[0])


def _prefixed(db: Any, prefix: bytes) -> Iterator[bytes]:
    """The keys of an open database that start with ``prefix``, in order."""
    for k, _ in _prefixed_items(db, prefix):
        yield k


def _prefixed_items(db: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    it = db.iter()
    it.seek(prefix)
    while it.valid():
        k = it.key()
        if not k.startswith(prefix):
            break
        yield k, it.value()
        it.next()


def split_head(row: bytes, where: str = "local state") -> tuple[float, int, bytes]:
    """A stored row's wake time, schema id and encoded row.

    Raises
    ------
    StateCorruptError
        The row is shorter than its head.
    """
    if len(row) < _HEAD.size:
        raise StateCorruptError(f"{where}: a stored row of {len(row)} bytes (at least "
                                f"{_HEAD.size})")
    wake, sid = _HEAD.unpack_from(row)
    return wake, sid, row[_HEAD.size:]


def db_options() -> Any:
    """The RocksDB options of every local copy (:data:`LEVEL_BASE_BYTES`)."""
    from rocksdict import Options

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_bytes_for_level_base(LEVEL_BASE_BYTES)
    options.set_target_file_size_base(TABLE_FILE_BYTES)
    return options


def iter_rows(db: Any) -> Iterator[tuple[bytes, bytes]]:
    """Every key's bytes and stored row of an open database, in key order (a full scan)."""
    for k, row in _prefixed_items(db, _ROW):
        yield k[1:], row


def open_checkpoint(directory: str) -> Any:
    """A checkpoint copy opened read-only (for a snapshot writer)."""
    from rocksdict import AccessType, Rdict

    return Rdict(directory, db_options(), access_type=AccessType.read_only())
