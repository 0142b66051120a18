"""Files on any ``pyarrow.fs`` filesystem: where a path lives, and writes readers never see half of.

Used by the keyed state store and by stored strategies (Ahead KeyBy assignments).

Creating a file only if it is absent (:func:`create_if_absent`, how a runner claims a fresh
state path) has the guarantee each filesystem allows: pyarrow.fs has no create-if-absent.

================================ =========================================================
filesystem                       guarantee of :func:`create_if_absent`
================================ =========================================================
``pyarrow.fs.LocalFileSystem``   atomic: the bytes go to a temporary file, which is then
(a plain path, ``file://``)      hard-linked to the name (``link`` fails if the name
                                 exists), so of any number of concurrent callers, threads or
                                 processes on one machine, exactly one creates the file,
                                 and readers see it whole. Where the filesystem has no hard
                                 links (``link`` refused), ``O_CREAT | O_EXCL``: still
                                 exactly one creator, but a reader may see the file before
                                 its bytes (a short read). A local path that is a network
                                 mount has the mount's own guarantee (NFSv3 and later
                                 implement both atomically).
any other (S3, GCS, HDFS, ...)   a check, then an atomic write: two callers within the
                                 same moment can both create it (the later one's bytes
                                 win). The keyed runner narrows this with its owner token,
                                 which every task checks before it writes.
================================ =========================================================

Examples
--------
>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> fs, path = resolve_filesystem(os.path.join(d, "x.json"))
>>> write_atomic(fs, path, b"{}")
>>> open(path, "rb").read()
b'{}'
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from ...errors import InvalidArgumentTypeError

__all__ = ["resolve_filesystem", "write_atomic", "write_atomic_stream", "create_if_absent"]


def resolve_filesystem(path: str, filesystem: Any = None) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)``: a URI names its filesystem, a plain path is local.

    Notes
    -----
    No I/O beyond what ``pyarrow.fs.FileSystem.from_uri`` does to build a client.
    """
    from pyarrow import fs

    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        found, inner = fs.FileSystem.from_uri(path)
        return found, str(inner)
    return fs.LocalFileSystem(), os.path.abspath(path)


def write_atomic(filesystem: Any, path: str, data: bytes) -> None:
    """Write ``data`` to ``path``: a temporary file beside it, then a rename, so a reader sees
    the old file or the new one, never a part.

    Notes
    -----
    One write and one rename (on object stores a rename is a copy: O(len(data))).
    """
    if not isinstance(data, bytes):
        raise InvalidArgumentTypeError(f"data must be bytes, got {type(data).__name__}")
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with filesystem.open_output_stream(temporary) as f:
            f.write(data)
        filesystem.move(temporary, path)
    except BaseException:
        try:  # leave no half-written temporary behind
            filesystem.delete_file(temporary)
        except OSError:
            pass
        raise


def write_atomic_stream(filesystem: Any, path: str, write: Callable[[Any], None]) -> None:
    """:func:`write_atomic` for data produced by ``write(stream)`` into an output stream, so
    it need not be in memory at once."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with filesystem.open_output_stream(temporary) as f:
            write(f)
        filesystem.move(temporary, path)
    except BaseException:
        try:
            filesystem.delete_file(temporary)
        except OSError:
            pass
        raise


def create_if_absent(filesystem: Any, path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` unless a file (or anything) is there: True when this call
    created it, False when it was there already. The guarantee depends on the filesystem
    (module docs): atomic on a local filesystem, check-then-write elsewhere.

    Raises
    ------
    InvalidArgumentTypeError
        ``data`` is not bytes.
    OSError
        The file cannot be written.

    Notes
    -----
    Local: one write, one hard link and one unlink. Elsewhere: one metadata read, then
    :func:`write_atomic`. O(len(data)).
    """
    from pyarrow import fs

    if not isinstance(data, bytes):
        raise InvalidArgumentTypeError(f"data must be bytes, got {type(data).__name__}")
    if isinstance(filesystem, fs.LocalFileSystem):
        return _create_local(path, data)
    if filesystem.get_file_info(path).type != fs.FileType.NotFound:
        return False
    write_atomic(filesystem, path, data)
    return True


def _create_local(path: str, data: bytes) -> bool:
    """:func:`create_if_absent` on a local path: a whole temporary file hard-linked to
    ``path`` (fails if it exists), or ``O_EXCL`` where hard links are refused."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(temporary, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links on this filesystem: exclusive create of the name
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
