"""Files on any ``pyarrow.fs`` filesystem: where a path lives, and writes readers never see half of.

Used by the keyed state store and by stored strategies (Ahead KeyBy assignments).

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
from typing import Any

from ...errors import InvalidArgumentTypeError

__all__ = ["resolve_filesystem", "write_atomic"]


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
