"""Strategies stored as JSON files: a keyed state's placement, an Ahead KeyBy assignment.

A stored strategy is the :meth:`~trilink_spark.Partitioner.to_json` text of a strategy (its
table included), written atomically. Reading it back never executes code: it is JSON, checked
by the strategy's own ``from_dict``.

Examples
--------
>>> import os, tempfile
>>> from trilink_spark._internal.io.files import resolve_filesystem
>>> import trilink_spark as tl
>>> fs, path = resolve_filesystem(os.path.join(tempfile.mkdtemp(), "strategy.json"))
>>> write_strategy(fs, path, tl.LeastKeyPartitioner(2).fit(["a", "b"]))
>>> read_strategy(fs, path).partition("b")
1
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import StateCorruptError
from ..._internal.io.files import write_atomic
from .base import Partitioner

__all__ = ["read_strategy", "write_strategy"]


def write_strategy(filesystem: Any, path: str, strategy: Partitioner) -> None:
    """Store ``strategy`` (its table included) as JSON at ``path``, atomically.

    Notes
    -----
    O(keys in the table): one write and one rename.
    """
    write_atomic(filesystem, path, strategy.to_json().encode("utf-8"))


def read_strategy(filesystem: Any, path: str) -> Partitioner | None:
    """The strategy stored at ``path`` by :func:`write_strategy`, or None when there is none.

    Raises :class:`~trilink_spark.errors.StateCorruptError` naming the file when it is not a stored
    strategy (truncated, corrupt or foreign).
    """
    from pyarrow import fs

    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
        return Partitioner.from_dict(data)
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise StateCorruptError(
            f"{path} is not a stored strategy ({type(err).__name__}: {err}); restore it or "
            "remove it to start with a new placement"
        ) from None
