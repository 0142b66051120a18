"""Drop the local copies that an executor no longer uses.

A partition's copy stays on the executor that ran its task (:class:`~trilink_spark.state.local.LocalState`).
When the partition moves (its executor was busy past ``spark.locality.wait``, or lost, or the
run was rescaled), the copy it left behind is never updated again: past the changelogs it can
catch up from, it is only disk. Each copy has a small mark beside it, ``p<partition>.at``, that
names the batch its last task committed (:func:`mark`); a task of the same state path on the
same executor drops the copies whose mark is more than ``behind`` batches older than its own
batch (:func:`sweep`), so the disk holds about one copy per partition, not one per executor.

A copy whose lock is held (a task uses it, or a Python worker holds it open for its next task)
is asked to close first and left alone if it does not; a copy without a mark (written before
marks existed) is left alone. A dropped copy that its partition comes back to is rebuilt from
the state path, as any missing copy is.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
import time

from .held import ask_release

__all__ = ["mark", "sweep", "remove_stale_checkpoints", "STALE_CHECKPOINT_SECONDS"]

logger = logging.getLogger(__name__)

_MARK = re.compile(r"p(\d{5,})\.at")


def mark(root: str, store_id: str, partition: int, version: int) -> None:
    """Record that ``partition``'s copy under ``root`` holds ``version`` (one small file,
    replaced atomically). A mark that cannot be written only keeps the copy from being swept.
    O(1)."""
    base = os.path.join(root, store_id)
    try:
        fd, tmp = tempfile.mkstemp(dir=base, prefix=".at-")
        with os.fdopen(fd, "w") as out:
            out.write(str(int(version)))
        os.replace(tmp, os.path.join(base, f"p{partition:05d}.at"))
    except OSError as err:
        logger.debug("%s: mark of partition %d not written (%s)", base, partition, err)


def sweep(root: str, store_id: str, partition: int, version: int, behind: int) -> list[int]:
    """Drop the copies of ``store_id`` under ``root``, other than ``partition``'s, whose mark
    is more than ``behind`` batches before ``version``; returns the partitions dropped.

    Each candidate's lock is taken without waiting (its holder asked to close it first);
    a copy still in use is left for a later sweep. Cost: one directory listing and one small
    read per copy under ``root`` (O(partitions)), and the removal of each dropped copy.

    Examples
    --------
    >>> import tempfile, os
    >>> root = tempfile.mkdtemp(); os.makedirs(os.path.join(root, "s", "p00001.db"))
    >>> mark(root, "s", 1, 3)
    >>> sweep(root, "s", 0, 20, behind=10)
    [1]
    """
    base = os.path.join(root, store_id)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    dropped: list[int] = []
    for name in names:
        found = _MARK.fullmatch(name)
        if found is None or int(found.group(1)) == partition:
            continue
        pid = int(found.group(1))
        try:
            with open(os.path.join(base, name)) as f:
                at = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if version - at <= behind:
            continue
        if _drop(base, pid):
            dropped.append(pid)
    if dropped:
        logger.info("%s: local copies of partition(s) %s dropped: no task here updated them "
                    "in the last %d batches (spark.trilink.state.dropCopiesAfter)", base,
                    ", ".join(map(str, sorted(dropped))), behind)
    return sorted(dropped)


def _drop(base: str, pid: int) -> bool:
    """Remove partition ``pid``'s copy and mark under ``base`` if its lock is free (the lock
    file stays: removing it could let two processes lock one copy)."""
    directory = os.path.join(base, f"p{pid:05d}.db")
    lock_path = os.path.join(base, f"p{pid:05d}.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not ask_release(directory, 0.5):
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        shutil.rmtree(directory, ignore_errors=True)
        try:
            os.remove(os.path.join(base, f"p{pid:05d}.at"))
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        return not os.path.exists(directory)
    finally:
        os.close(fd)


#: A checkpoint directory older than this (seconds) belongs to a snapshot whose writer died.
STALE_CHECKPOINT_SECONDS = 3600.0


def remove_stale_checkpoints(base: str, partition: int) -> None:
    """Remove snapshot checkpoints and restore downloads of ``partition`` under ``base``
    left by processes that died (a checkpoint's hard links would pin old files)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    now = time.time()
    for name in names:
        if name.startswith(f"snap-{partition}-"):
            path = os.path.join(base, name)
            try:
                if now - os.stat(path).st_mtime > STALE_CHECKPOINT_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass
