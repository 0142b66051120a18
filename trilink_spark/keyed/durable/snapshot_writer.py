"""Snapshots of a partition's local copy, written off the task's path.

When a snapshot is due (:func:`~trilink_spark.keyed.durable.local_sync.snapshot_due`) the task of a
partition takes a RocksDB checkpoint of its
local copy (hard links: milliseconds) at the version the batch started from, which is
committed, and hands it to a writer that turns it into the snapshot ``<version>.state`` on the
state path: a separate, low-priority Python process when the state path is a local filesystem
(its own interpreter, so neither the task's GIL nor its memory carries the work), else a
low-priority thread. The writer reads the checkpoint a chunk of rows at a time, twice
(checksums, then the file: :func:`~trilink_spark._internal.io.arrowio.write_batches`), never
overwrites a snapshot already there, and removes the checkpoint. A snapshot only shortens a
rebuild: a failure is logged, never raised, and a checkpoint whose writer died is removed by
the next open of the copy (:mod:`trilink_spark.state.local`).

Run as ``python -m trilink_spark.keyed.durable.snapshot_writer`` it reads one JSON request from stdin:
``{"checkpoint": dir, "state_path": local path, "partition": int, "version": int, "meta":
{str: str}}`` (nothing is unpickled).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any

from ...state.local import LocalState, iter_rows, open_checkpoint, split_head
from ...state.rows import decode_rows
from ...state.store import KeyedStateStore
from ..semantics.keys import PartitionState
from .codec import encode_state

__all__ = ["start_snapshot", "write_snapshot", "with_meta", "main"]

logger = logging.getLogger(__name__)

_TABLES = "trilink.shared_tables"
_SNAPSHOT_LOCK = threading.Lock()
#: Rows decoded at a time while a snapshot is written.
_SNAPSHOT_CHUNK = 65536


def with_meta(table: Any, meta: dict[str, Any]) -> Any:
    """``table`` with the partition-wide values ``meta``; of the shared tables it names,
    only those whose column ``table`` has (keys read without rows in a table have none)."""
    encoded = {k.encode(): v.encode() for k, v in meta.items()}
    tables = meta.get(_TABLES)
    if tables is not None:
        kept = {name: info for name, info in json.loads(tables).items()
                if f"shared:{name}" in table.column_names}
        encoded[_TABLES.encode()] = json.dumps(kept).encode()
    return table.replace_schema_metadata(encoded)



def start_snapshot(local: LocalState, store: KeyedStateStore, pid: int, version: int,
                   key_type: Any) -> None:
    """Checkpoint ``local`` (at ``version``) and have it written as a snapshot in the
    background (module docs). Never raises: a snapshot is optional."""
    if local.version != version:
        return
    directory = tempfile.mkdtemp(prefix=f"snap-{pid}-", dir=os.path.dirname(local.directory))
    os.rmdir(directory)
    try:
        local.checkpoint(directory)
    except Exception as err:  # noqa: BLE001 - a snapshot is optional
        logger.warning("partition %d: no snapshot of version %d (%s)", pid, version, err)
        shutil.rmtree(directory, ignore_errors=True)
        return
    meta = dict(local.meta.get("meta") or {})
    if type(store.fs).__name__ == "LocalFileSystem":
        request = {"checkpoint": directory, "state_path": store.path, "partition": pid,
                   "version": version, "meta": meta}
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "trilink_spark.keyed.durable.snapshot_writer"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=lambda: os.nice(19))  # noqa: PLW1509 - a plain nice
        except OSError as err:
            logger.warning("partition %d: snapshot process not started (%s); in a thread",
                           pid, err)
        else:
            try:  # sent now: a worker that exits after its task must not take it along
                if process.stdin is not None:
                    process.stdin.write(json.dumps(request).encode())
                    process.stdin.close()
            except OSError as err:
                logger.warning("partition %d: snapshot request not sent (%s)", pid, err)
            threading.Thread(target=_reap, args=(process, pid, version),
                             name=f"trilink-snapshot-{pid}", daemon=True).start()
            return
    threading.Thread(target=_in_thread, args=(directory, store, pid, version, meta, key_type),
                     name=f"trilink-snapshot-{pid}", daemon=True).start()


def _reap(process: Any, pid: int, version: int) -> None:
    """Wait for the writer (so it leaves no zombie) and log a failure."""
    err = process.stderr.read()
    process.wait()
    if process.returncode:
        logger.warning("partition %d: snapshot of version %d not written (%s)", pid, version,
                       err.decode("utf-8", "replace").strip().splitlines()[-1:] or "?")


def _in_thread(directory: str, store: KeyedStateStore, pid: int, version: int,
               meta: dict[str, Any], key_type: Any) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass
    try:
        with _SNAPSHOT_LOCK:
            write_snapshot(directory, store, pid, version, meta, key_type)
    except Exception as err:  # noqa: BLE001 - a snapshot is optional
        logger.warning("partition %d: snapshot of version %d not written (%s: %s)", pid,
                       version, type(err).__name__, err)


def write_snapshot(directory: str, store: KeyedStateStore, pid: int, version: int,
                   meta: dict[str, Any], key_type: Any = None) -> None:
    """Write the checkpoint at ``directory`` as ``pid``'s snapshot ``version`` (unless one is
    there), a chunk of rows at a time, then remove the checkpoint. O(state) time, O(chunk)
    memory."""
    import pyarrow as pa

    try:
        if version in store.listing(pid)[0]:
            return  # never over a snapshot already there (a swap's, say)
        schemas = _schemas(directory)
        base = encode_state(PartitionState(), key_type, None).schema.remove_metadata()
        unified = pa.unify_schemas(list(schemas.values()) or [base],
                                   promote_options="permissive")

        def chunks() -> Any:
            db = open_checkpoint(directory)
            try:
                groups: dict[int, list[bytes]] = {}
                held = 0
                for _, row in iter_rows(db):
                    _, sid, body = split_head(row, directory)
                    groups.setdefault(sid, []).append(body)
                    held += 1
                    if held >= _SNAPSHOT_CHUNK:
                        yield from _conformed(groups, schemas, unified)
                        groups, held = {}, 0
                yield from _conformed(groups, schemas, unified)
            finally:
                db.close()

        schema = with_meta(unified.empty_table(), meta).schema
        store.save_snapshot_stream(pid, version, schema, chunks)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _conformed(groups: dict[int, list[bytes]], schemas: dict[int, Any], unified: Any) -> Any:
    """The grouped rows decoded as record batches of ``unified`` (absent columns null)."""
    import pyarrow as pa

    for sid, bodies in groups.items():
        table = decode_rows(bodies, schemas[sid])
        columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                   else pa.nulls(table.num_rows, f.type) for f in unified]
        yield from pa.table(columns, schema=unified).combine_chunks().to_batches()


def _schemas(directory: str) -> dict[int, Any]:
    """The row schemas a checkpoint holds, by id."""
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


def main() -> int:
    """The snapshot writer process (module docs): 0 when written, 2 for a bad request."""
    try:
        request = json.loads(sys.stdin.buffer.read(1 << 20))
        directory = str(request["checkpoint"])
        path = str(request["state_path"])
        pid, version = int(request["partition"]), int(request["version"])
        meta = {str(k): str(v) for k, v in dict(request["meta"]).items()}
    except (ValueError, KeyError, TypeError) as err:
        sys.stderr.write(f"bad snapshot request: {err}\n")
        return 2
    write_snapshot(directory, KeyedStateStore(path), pid, version, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
