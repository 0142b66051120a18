"""Snapshots of a partition's local copy, written off the task's path.

When a snapshot is due (:func:`~trilink_spark.keyed.durable.local_sync.snapshot_due`) the
task of a partition takes a RocksDB checkpoint of its local copy (hard links: milliseconds)
at the version the batch started from, which is committed, and hands it to a writer that
stores it as the incremental snapshot ``<version>.tables`` on the state path
(:mod:`trilink_spark.state.incremental`: the table files that the last snapshot does not
hold, then a record that lists every file). The writer is a separate, low-priority Python
process when the state path is a local filesystem (its own interpreter, so neither the
task's GIL nor its memory carries the work; ``nice`` 19 in its session's scheduling group
too, :func:`background_priority`), else a low-priority thread. It never overwrites a
snapshot already there, and removes the checkpoint. A snapshot only shortens a rebuild: a
failure is logged, never raised, and a checkpoint whose writer died is removed by the next
open of the copy (:mod:`trilink_spark.state.local`).

Run as ``python -m trilink_spark.keyed.durable.snapshot_writer`` it reads one JSON request
from stdin: ``{"checkpoint": dir, "state_path": local path, "partition": int, "version":
int, "meta": {str: str}}`` (nothing is unpickled).
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

from ...state.incremental import checkpoint_files, checkpoint_schemas, stamp_checkpoint, upload
from ...state.local import LocalState
from ...state.store import KeyedStateStore
from ..semantics.keys import PartitionState
from .codec import encode_state

__all__ = ["start_snapshot", "write_snapshot", "with_meta", "main", "background_priority"]

logger = logging.getLogger(__name__)

_TABLES = "trilink.shared_tables"
_SNAPSHOT_LOCK = threading.Lock()


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



def background_priority() -> None:
    """Give the calling process the lowest CPU priority: ``nice`` 19, and the same for its
    scheduling group where the kernel groups processes by session (``autogroup``).

    A snapshot writer runs in a session of its own, so that it outlives the task's worker.
    With the kernel's autogroups (``/proc/sys/kernel/sched_autogroup_enabled``, on by
    default in most distributions) a new session is a scheduling group that competes with
    the Spark worker's whole group as an equal, whatever its processes' nice: without this,
    a writer takes up to one core of two from the running tasks. A kernel without
    autogroups (or a ``/proc`` that refuses the write) keeps the plain nice.

    Notes
    -----
    Two system calls and one small write; meant as a ``preexec_fn``.
    """
    os.nice(19)
    try:
        with open("/proc/self/autogroup", "w", encoding="ascii") as group:
            group.write("19")
    except OSError:
        pass  # no autogroups here: the nice is what counts


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
        stamp_checkpoint(local.directory, directory)
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
                [sys.executable, "-m", "trilink_spark.keyed.durable.snapshot_writer"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=background_priority)  # noqa: PLW1509 - a nice, one write
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
                   meta: dict[str, Any], key_type: Any = None) -> dict[str, int] | None:
    """Store the checkpoint at ``directory`` as ``pid``'s snapshot ``version`` (unless one is
    there): its table files that the last snapshot does not hold, then its record
    (:func:`~trilink_spark.state.incremental.upload`); then remove the checkpoint. Returns
    what was uploaded (None: a snapshot was there). O(changed table files) time and I/O."""
    import pyarrow as pa

    try:
        if version in store.listing(pid)[0]:
            return None  # never over a snapshot already there (a swap's, say)
        checkpoint_files(directory)  # whole, before RocksDB opens it
        schemas = checkpoint_schemas(directory)
        base = encode_state(PartitionState(), key_type, None).schema.remove_metadata()
        unified = pa.unify_schemas(list(schemas.values()) or [base],
                                   promote_options="permissive")
        schema = with_meta(unified.empty_table(), meta).schema
        return upload(store, pid, version, directory, schema, meta)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
