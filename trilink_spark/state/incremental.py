"""Incremental snapshots: a partition's local RocksDB copy stored as its own table files.

A snapshot of a partition's executor-local copy (:class:`~trilink_spark.state.local.LocalState`)
is a RocksDB checkpoint (hard links) turned into files on the state path, as Spark's RocksDB
state store provider and Flink's incremental checkpoints keep theirs: each table file (SST) is
uploaded once and every later snapshot that still holds it refers to it. Layout::

    partition=00003/000000000042.tables    the record of snapshot 42 (sealed JSON,
                                           :func:`~trilink_spark.state.formats.parse_tables`)
    partition=00003/tables/<lineage>-000123.sst
                                           a table file, shared by every snapshot that lists it
    partition=00003/tables/<lineage>-000000000042-MANIFEST-000009
                                           RocksDB's small per-snapshot files (MANIFEST,
                                           CURRENT, OPTIONS, WAL): uploaded with each snapshot

**Which files are already there.** RocksDB never rewrites a table file and never reuses its
number within one database, so within one database a file's name and size name its content.
Each local copy carries a random *lineage* (a file ``TRILINK-LINEAGE`` in its directory, new
for each database created or restored): a file of the checkpoint is shared with the previous
snapshot when that snapshot has the same lineage and lists the same name and size, or when the
copy was restored from a snapshot that listed it (``TRILINK-INHERITED.json``, written by
:func:`download`). Every other file is uploaded. Blob names carry the lineage, so two copies
of a partition (two executors, a retried task) never write one blob with different bytes.

**Checked on the way back.** Each file's size and SHA-256 are in the record; :func:`download`
recomputes both and refuses a damaged or missing blob with
:class:`~trilink_spark.errors.StateCorruptError` naming it. The record itself is sealed.
Nothing is unpickled or evaluated: RocksDB reads its own files, rows are Arrow.

**Pruning keeps what a kept snapshot refers to.** :func:`collect` deletes a blob only when no
remaining record lists it and it is older than the newest record (a writer still uploading
for a newer snapshot writes newer blobs), in two steps: it sets the blob aside (renamed
``.aside-<name>``), lists the records again, and then deletes it, or puts it back when a record
written meanwhile lists it. :func:`upload` checks after writing its record that every blob it
lists is there, and uploads again any that is not. So a record written before a blob is set
aside is seen by the second listing, and one written after it finds the blob missing: either
way no kept snapshot loses a file. A blob left aside by a collect that stopped is still read
by :func:`download`, and deleted or put back by the next collect.

Cost: a snapshot uploads the table files written since the last one (what the batches since
changed, after compaction), plus RocksDB's small files: O(changed files), not O(state). Its
local reads are those files' bytes once (hashed while copied). A rebuild downloads the
snapshot's files (O(state)) and replays the changelogs since.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from .._internal.io.files import create_if_absent, write_atomic_stream
from ..errors import StateCorruptError, StateStoreError
from .._internal.io.sealed import unseal
from .formats import dump, parse_tables, tables_bytes, valid_table_files
from .local import iter_rows, open_checkpoint, split_head
from .rows import decode_rows
from .sweep import STALE_CHECKPOINT_SECONDS



class TableStore(Protocol):
    """What this module needs of a :class:`~trilink_spark.state.KeyedStateStore` (which
    imports this module, so it is named by its shape here)."""

    fs: Any
    path: str

    def partition_dir(self, partition: int) -> str: ...

    def version_path(self, partition: int, version: int) -> str: ...

    def listing(self, partition: int) -> tuple[set[int], set[int]]: ...

    def tables_path(self, partition: int, version: int) -> str: ...

    def read_bytes(self, path: str, limit: int | None = None) -> bytes | None: ...

__all__ = ["TableStore", "TABLES_SUFFIX", "TABLES_DIR", "lineage", "stamp_checkpoint", "checkpoint_files", "checkpoint_schemas",
           "upload", "read_record", "restorable", "download", "load_tables_table", "collect",
           "referenced_bytes"]

logger = logging.getLogger(__name__)

#: Suffix of a snapshot record on the state path.
TABLES_SUFFIX = ".tables"
#: The directory, in each partition's, of the shared table files.
TABLES_DIR = "tables"
_LINEAGE = "TRILINK-LINEAGE"
_INHERITED = "TRILINK-INHERITED.json"
_OWN = (_LINEAGE, _INHERITED)
_CHUNK = 1 << 20
#: Bytes of a checkpoint's stamp read at most (its lineage and its file list).
_STAMP_LIMIT = 1 << 20
#: Prefix of a blob that :func:`collect` set aside before deleting it.
_ASIDE = ".aside-"
#: Rows decoded at a time when a snapshot is read as a table.
_ROWS_CHUNK = 65536


def _valid_lineage(text: object) -> bool:
    return isinstance(text, str) and len(text) == 32 and set(text) <= set("0123456789abcdef")


def _identity(directory: str) -> list[int]:
    st = os.stat(directory)
    return [st.st_dev, st.st_ino]


def lineage(directory: str) -> str:
    """The lineage of the RocksDB directory ``directory``: created on first use, and again
    when the file was written for another directory (a copied directory: its inode differs),
    so that two databases never share one. O(1)."""
    path = os.path.join(directory, _LINEAGE)
    try:
        with open(path, encoding="ascii") as f:
            doc = json.loads(f.read(4096))
        if isinstance(doc, dict) and _valid_lineage(doc.get("lineage")) \
                and doc.get("at") == _identity(directory):
            return str(doc["lineage"])
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    return _new_lineage(directory)


def _new_lineage(directory: str) -> str:
    found = uuid.uuid4().hex
    _write_small(os.path.join(directory, _LINEAGE),
                 json.dumps({"lineage": found, "at": _identity(directory)}))
    return found


def _stamp(checkpoint: str) -> dict[str, Any]:
    """What :func:`stamp_checkpoint` wrote into ``checkpoint`` (empty: none, or damaged)."""
    try:
        with open(os.path.join(checkpoint, _LINEAGE), encoding="ascii") as f:
            doc = json.loads(f.read(_STAMP_LIMIT))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _stamped(checkpoint: str) -> str | None:
    """The lineage :func:`stamp_checkpoint` wrote into ``checkpoint`` (None: none, or not
    one)."""
    found = _stamp(checkpoint).get("lineage")
    return str(found) if _valid_lineage(found) else None


def checkpoint_files(checkpoint: str) -> list[str]:
    """The names of ``checkpoint``'s files to store: those it held when it was stamped
    (a file RocksDB's read-only open adds later, its info ``LOG``, is not part of it).

    Raises
    ------
    StateStoreError
        A file of the checkpoint is gone or changed: its directory was removed while the
        snapshot was being written (it would be stored incomplete, a copy that does not open).
    """
    present = {n: os.path.getsize(os.path.join(checkpoint, n))
               for n in os.listdir(checkpoint) if n not in _OWN}
    files = _stamp(checkpoint).get("files")
    if isinstance(files, dict) and files:
        expected = {str(n): s for n, s in files.items()}
    else:  # unstamped: at least RocksDB's root file and the manifest it names
        expected = dict(present)
        expected.setdefault("CURRENT", -1)
        try:
            with open(os.path.join(checkpoint, "CURRENT"), encoding="ascii") as f:
                expected.setdefault(f.read(256).strip(), -1)
        except (OSError, UnicodeDecodeError):
            pass
    lost = sorted(n for n, size in expected.items() if present.get(n) != size
                  and not (size == -1 and n in present))
    if lost:
        raise StateStoreError(
            f"the checkpoint {checkpoint} lost {', '.join(lost[:5])} before it was stored "
            "(its local directory was removed or changed meanwhile); the snapshot is not "
            "written, and the next one is taken from the copy")
    return sorted(expected)


def _write_small(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)


def stamp_checkpoint(database: str, checkpoint: str) -> None:
    """Copy the lineage (and what it inherited) of the copy at ``database`` into its fresh
    ``checkpoint``, so the snapshot writer knows which of its files are already stored, with
    the checkpoint's file names and sizes, so it never stores a checkpoint that lost a file.
    O(the checkpoint's files)."""
    line = lineage(database)
    files = {n: os.path.getsize(os.path.join(checkpoint, n)) for n in os.listdir(checkpoint)
             if n not in _OWN}
    _write_small(os.path.join(checkpoint, _LINEAGE), json.dumps({"lineage": line,
                                                                 "files": files}))
    inherited = os.path.join(database, _INHERITED)
    if os.path.exists(inherited):
        shutil.copyfile(inherited, os.path.join(checkpoint, _INHERITED))


def _inherited(directory: str, line: str) -> dict[str, dict[str, Any]]:
    """The files a restored copy took from its snapshot: empty when unknown, not its own,
    damaged (the file is sealed) or holding an entry out of bounds, so a doubt costs an
    upload, never a wrong reference."""
    where = os.path.join(directory, _INHERITED)
    try:
        with open(where, encoding="utf-8") as f:
            doc = unseal(json.loads(f.read()), where)
    except (OSError, ValueError, RecursionError):  # StateCorruptError is a ValueError
        return {}
    if not isinstance(doc, dict) or doc.get("lineage") != line:
        return {}
    files = doc.get("files")
    if not isinstance(files, list) or not valid_table_files(files):
        return {}
    return {f["name"]: f for f in files if f["name"].endswith(".sst")}


def checkpoint_schemas(directory: str) -> dict[int, Any]:
    """The row schemas a checkpoint (or restored snapshot) at ``directory`` holds, by id."""
    import struct

    import pyarrow as pa

    db = open_checkpoint(directory)
    try:
        out = {}
        it = db.iter()
        it.seek(b"s")
        while it.valid() and it.key().startswith(b"s"):
            out[struct.unpack(">I", it.key()[1:5])[0]] = pa.ipc.read_schema(
                pa.py_buffer(it.value()))
            it.next()
        return out
    finally:
        db.close()


def _blob_dir(store: TableStore, partition: int) -> str:
    return f"{store.partition_dir(partition)}/{TABLES_DIR}"


def read_record(store: TableStore, partition: int, version: int) -> dict[str, Any] | None:
    """``partition``'s snapshot record ``version`` (None: there is none). O(its size)."""
    path = store.tables_path(partition, version)
    data = store.read_bytes(path)
    return None if data is None else parse_tables(data, path, partition, version)


def _upload_file(store: TableStore, local: str, remote: str) -> str:
    """Copy ``local`` to ``remote`` atomically; its SHA-256, computed on the way."""
    digest = hashlib.sha256()

    def write(out: Any) -> None:
        with open(local, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)

    write_atomic_stream(store.fs, remote, write)
    return digest.hexdigest()


def upload(store: TableStore, partition: int, version: int, checkpoint: str,
           schema: Any, meta: dict[str, str]) -> dict[str, int]:
    """Store the checkpoint at ``checkpoint`` as ``partition``'s snapshot ``version`` (module
    docs): the files not already stored, then the record. ``schema``: the Arrow schema the
    snapshot reads as (its metadata the partition-wide values). Returns ``files``,
    ``uploaded`` (bytes written) and ``shared`` (bytes referred to). O(changed files).

    Raises
    ------
    StateStoreError
        The state path cannot be written.
    """
    line = _stamped(checkpoint) or uuid.uuid4().hex  # unstamped: shares nothing
    known = dict(_inherited(checkpoint, line))
    snapshots = [v for v in store.listing(partition)[0] if v < version]
    for v in sorted(snapshots, reverse=True)[:1]:
        try:
            previous = read_record(store, partition, v)
        except StateCorruptError as err:
            logger.warning("partition %d: %s; snapshot %d uploads every file", partition, err,
                           version)
            previous = None
        if previous is not None and previous["lineage"] == line:
            known.update({f["name"]: f for f in previous["files"]})
    blobs = _blob_dir(store, partition)
    files: list[dict[str, Any]] = []
    uploaded = shared = 0
    upload_id = uuid.uuid4().hex[:12]
    try:
        store.fs.create_dir(blobs, recursive=True)
        for name in checkpoint_files(checkpoint):
            local = os.path.join(checkpoint, name)
            size = os.path.getsize(local)
            old = known.get(name)
            if name.endswith(".sst") and old is not None and old["size"] == size:
                files.append({k: old[k] for k in ("name", "blob", "size", "sha256")})
                shared += size
                continue
            # a table file's bytes are fixed by its database and number; RocksDB's small files
            # are rewritten, so each writer's get names of their own (a retried task's too)
            blob = f"{line}-{name}" if name.endswith(".sst") else \
                f"{line}-{version:012d}-{upload_id}-{name}"
            files.append({"name": name, "blob": blob, "size": size,
                          "sha256": _upload_file(store, local, f"{blobs}/{blob}")})
            uploaded += size
        record = {"partition": partition, "version": version, "lineage": line, "files": files,
                  "uploaded": uploaded, "meta": meta,
                  "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}
        path = store.tables_path(partition, version)
        data = tables_bytes(record)
        parse_tables(data, path, partition, version)  # never a record the store refuses
        if not create_if_absent(store.fs, path, data):
            logger.info("partition %d: snapshot %d was written by another attempt", partition,
                        version)
            return {"files": len(files), "uploaded": uploaded, "shared": shared}
        # a blob collect set aside (or deleted) meanwhile is uploaded again (collect docs)
        for f in _missing(store, partition, files):
            _upload_file(store, os.path.join(checkpoint, f["name"]), f"{blobs}/{f['blob']}")
            uploaded += f["size"]
    except OSError as err:
        raise StateStoreError(f"cannot write partition {partition}'s snapshot {version} to "
                              f"{blobs} ({type(err).__name__}: {err})") from None
    logger.info("partition %d: snapshot %d: %d files, %d bytes uploaded, %d shared", partition,
                version, len(files), uploaded, shared)
    return {"files": len(files), "uploaded": uploaded, "shared": shared}


def _missing(store: TableStore, partition: int, files: list[dict[str, Any]]
             ) -> list[dict[str, Any]]:
    from pyarrow import fs

    blobs = _blob_dir(store, partition)
    infos = store.fs.get_file_info([f"{blobs}/{f['blob']}" for f in files])
    return [f for f, info in zip(files, infos) if info.type != fs.FileType.File]


def restorable(store: TableStore, partition: int, version: int) -> bool:
    """Whether ``partition``'s snapshot ``version`` is incremental (a record, no Arrow
    snapshot beside it, which readers would take first). One metadata call."""
    from pyarrow import fs

    found = store.fs.get_file_info([store.tables_path(partition, version),
                                    store.version_path(partition, version)])
    return bool(found[0].type == fs.FileType.File and found[1].type == fs.FileType.NotFound)


def download(store: TableStore, partition: int, version: int, target: str
             ) -> dict[str, Any]:
    """Fetch ``partition``'s snapshot ``version`` into the new directory ``target`` (a RocksDB
    database once done, with a lineage of its own and the files it inherited); returns the
    record. O(the snapshot's bytes), each file's size and SHA-256 checked.

    Raises
    ------
    StateCorruptError
        There is no such snapshot, or a file is missing, of another size or fails its
        checksum; the message names it.
    StateStoreError
        The state path cannot be read or ``target`` cannot be written.
    """
    record = read_record(store, partition, version)
    where = store.tables_path(partition, version)
    if record is None:
        raise StateCorruptError(f"{where} is missing: partition {partition} needs its "
                                f"snapshot of version {version}")
    if not any(f["name"] == "CURRENT" for f in record["files"]):
        raise StateCorruptError(f"{where} lists no CURRENT file: not a whole RocksDB copy; "
                                "restore the state path from a copy, or start over with a new "
                                "state path")
    blobs = _blob_dir(store, partition)
    os.makedirs(target)
    for f in record["files"]:
        remote = f"{blobs}/{f['blob']}"
        if store.fs.get_file_info(remote).type.name == "NotFound":
            aside = f"{blobs}/{_ASIDE}{f['blob']}"  # set aside by a collect that died
            if store.fs.get_file_info(aside).type.name == "File":
                remote = aside
        digest = hashlib.sha256()
        size = 0
        try:
            with store.fs.open_input_stream(remote) as src, \
                    open(os.path.join(target, f["name"]), "wb") as out:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
        except FileNotFoundError:
            raise StateCorruptError(
                f"{remote} is missing: {where} refers to it; restore it from a copy of the "
                "state path, or start over with a new state path") from None
        except OSError as err:
            raise StateStoreError(f"cannot copy {remote} to {target} ({type(err).__name__}: "
                                  f"{err}); free space on that disk or make it writable (for "
                                  "a task's copy: spark.trilink.state.localDir)") from None
        if size != f["size"] or digest.hexdigest() != f["sha256"]:
            raise StateCorruptError(
                f"{remote} fails its checksum ({size} bytes, {f['size']} recorded in {where}): "
                "a damaged table file; restore it from a copy of the state path, or start "
                "over with a new state path")
    line = _new_lineage(target)  # its inode goes along when it is moved into place
    _write_small(os.path.join(target, _INHERITED), dump(
        {"lineage": line, "files": [f for f in record["files"] if f["name"].endswith(".sst")]}
    ).decode("ascii"))
    return record


def load_tables_table(store: TableStore, partition: int, version: int) -> Any:
    """``partition``'s snapshot ``version`` as a state table (one row per key, the
    partition-wide values in its schema metadata), read through a temporary local copy.
    O(the snapshot's bytes) time and local disk.

    Raises
    ------
    StateCorruptError
        As :func:`download`, or a row that does not decode.
    """
    import pyarrow as pa

    with tempfile.TemporaryDirectory(prefix="trilink-snapshot-") as tmp:
        target = os.path.join(tmp, "db")
        record = download(store, partition, version, target)
        where = store.tables_path(partition, version)
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(record["schema"])))
            # the rows' own schemas decide the columns; the record adds partition-wide values
            unified = pa.unify_schemas([schema.remove_metadata(),
                                        *checkpoint_schemas(target).values()],
                                       promote_options="permissive")
        except (ValueError, TypeError, pa.ArrowInvalid, OSError) as err:
            raise StateCorruptError(f"{where}: its schema is not an Arrow schema of its rows "
                                    f"({err})") from None
        except Exception as err:  # noqa: BLE001 - RocksDB raises plain Exceptions
            raise StateCorruptError(f"{where}: its table files do not open ({err})") from None
        rows = set(unified.names) - set(schema.names)
        if "key" not in schema.names or rows:
            raise StateCorruptError(
                f"{where}: its schema does not describe its rows (it lacks "
                f"{', '.join(sorted(rows | ({'key'} - set(schema.names))))}); "
                "restore the state path from a copy, or start over with a new one")
        schema = unified.with_metadata(schema.metadata)
        try:
            batches = list(_batches(target, unified, where))
        except StateCorruptError:
            raise
        except Exception as err:  # noqa: BLE001 - RocksDB raises plain Exceptions
            raise StateCorruptError(f"{where}: its table files do not open ({err})") from None
        return pa.Table.from_batches(batches, schema=schema)


def _batches(directory: str, unified: Any, where: str) -> Iterator[Any]:
    """The rows of the database at ``directory`` as record batches of ``unified``."""
    schemas = checkpoint_schemas(directory)
    db = open_checkpoint(directory)
    try:
        groups: dict[int, list[bytes]] = {}
        held = 0
        for _, row in iter_rows(db):
            _, sid, body = split_head(row, where)
            groups.setdefault(sid, []).append(body)
            held += 1
            if held >= _ROWS_CHUNK:
                yield from _conformed(groups, schemas, unified, where)
                groups, held = {}, 0
        yield from _conformed(groups, schemas, unified, where)
    finally:
        db.close()


def _conformed(groups: dict[int, list[bytes]], schemas: dict[int, Any], unified: Any,
               where: str) -> Iterator[Any]:
    """The grouped rows decoded as record batches of ``unified`` (absent columns null)."""
    import pyarrow as pa

    for sid, bodies in groups.items():
        if sid not in schemas:
            raise StateCorruptError(f"{where}: rows of unknown schema {sid}")
        table = decode_rows(bodies, schemas[sid])
        columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                   else pa.nulls(table.num_rows, f.type) for f in unified]
        yield from pa.table(columns, schema=unified).combine_chunks().to_batches()


def referenced_bytes(record: dict[str, Any]) -> int:
    """The bytes of the files a snapshot record lists."""
    return sum(int(f["size"]) for f in record["files"])


def collect(store: TableStore, partition: int) -> list[str]:
    """Delete ``partition``'s blobs that no remaining snapshot record lists and that are
    older than its newest record (module docs); returns their names. One listing of the
    partition and of its blobs, one read per record.

    Raises
    ------
    StateCorruptError
        A remaining record is damaged: nothing is deleted (what it lists is unknown).
    """
    from pyarrow import fs

    directory = store.partition_dir(partition)
    records = [i for i in store.fs.get_file_info(fs.FileSelector(directory, allow_not_found=True))
               if i.type == fs.FileType.File and i.base_name.endswith(TABLES_SUFFIX)]
    newest = max((i.mtime_ns or 0 for i in records), default=None)
    keep: set[str] = set()
    for info in records:
        stem = info.base_name[: -len(TABLES_SUFFIX)]
        record = read_record(store, partition, int(stem)) if stem.isdigit() else None
        if record is not None:
            keep.update(f["blob"] for f in record["files"])
    # without a record, only what no writer can still be uploading: an hour old
    bound = newest if newest is not None else time.time_ns() - int(STALE_CHECKPOINT_SECONDS * 1e9)
    candidates = [info for info in store.fs.get_file_info(
        fs.FileSelector(_blob_dir(store, partition), allow_not_found=True))
        if info.type == fs.FileType.File and info.base_name not in keep
        and info.mtime_ns is not None and info.mtime_ns < bound]
    if not candidates:
        return []
    blobs = _blob_dir(store, partition)
    aside: list[tuple[str, str]] = []  # (where it is now, its name)
    for info in candidates:
        name = info.base_name
        if name.startswith(_ASIDE):  # left by a collect that stopped midway
            aside.append((info.path, name[len(_ASIDE):]))
            continue
        try:
            store.fs.move(info.path, f"{blobs}/{_ASIDE}{name}")
        except FileNotFoundError:
            continue
        except OSError as err:
            raise StateStoreError(f"cannot move {info.path} ({type(err).__name__}: {err})") \
                from None
        aside.append((f"{blobs}/{_ASIDE}{name}", name))
    # look again: a record written before a blob was set aside lists it, and one written
    # after finds it missing and uploads it again (upload)
    seen = {i.base_name for i in records}
    for info in store.fs.get_file_info(fs.FileSelector(directory, allow_not_found=True)):
        stem = info.base_name[: -len(TABLES_SUFFIX)]
        if info.base_name.endswith(TABLES_SUFFIX) and info.base_name not in seen \
                and stem.isdigit():
            record = read_record(store, partition, int(stem))
            if record is not None:
                keep.update(f["blob"] for f in record["files"])
    gone = []
    for path, name in aside:
        try:
            if name in keep:  # listed after all: put back, unless uploaded again meanwhile
                if store.fs.get_file_info(f"{blobs}/{name}").type == fs.FileType.NotFound:
                    store.fs.move(path, f"{blobs}/{name}")
                    continue
            store.fs.delete_file(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise StateStoreError(f"cannot delete {path} ({type(err).__name__}: {err})") \
                from None
        if name not in keep:
            gone.append(name)
    return gone
