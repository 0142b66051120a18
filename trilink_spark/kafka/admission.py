"""A rows-per-trigger cap a running ``trilink-kafka`` stream reads before every micro-batch.

Spark reads ``maxOffsetsPerTrigger`` once, when the query starts. A stream given
``maxOffsetsPerTriggerPath`` (``read_kafka(..., max_records_per_trigger_path=...)``) also reads
a small JSON file at that path each time it plans a micro-batch; when the file holds a cap, that
cap replaces ``maxOffsetsPerTrigger`` from that batch on, without restarting the query. Write it
with :func:`write_trigger_cap`, or let :func:`trilink_spark.elastic.follow_trigger_cap` write what
a config center publishes.

The file::

    {"format": "trilink-trigger-cap/1", "max_offsets_per_trigger": 5000}

``null`` (or no file) means "no cap from the file": ``maxOffsetsPerTrigger``, if given, applies.
A file that is not such a record is refused with
:class:`~trilink_spark.errors.StateCorruptError` naming it; the running stream logs that and
keeps the last cap it read (a configuration file never stops a query).

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "cap.json")
>>> read_trigger_cap(path)
(False, None)
>>> write_trigger_cap(path, 5000)
>>> read_trigger_cap(path)
(True, 5000)
"""

from __future__ import annotations

import json
from typing import Any

from .._internal.validation import INT64_MAX, count
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from .._internal.io.files import resolve_filesystem, write_atomic

__all__ = ["TRIGGER_CAP_FORMAT", "TRIGGER_CAP_OPTION", "read_trigger_cap", "write_trigger_cap"]

#: The format marker of a cap file.
TRIGGER_CAP_FORMAT = "trilink-trigger-cap/1"
#: The ``trilink-kafka`` option naming the cap file.
TRIGGER_CAP_OPTION = "maxOffsetsPerTriggerPath"
#: Largest cap: ``maxOffsetsPerTrigger`` is a Java long.
MAX_CAP = INT64_MAX
_MAX_BYTES = 1024


def _check_cap(cap: Any) -> int | None:
    if cap is None:
        return None
    return count(cap, "max_offsets_per_trigger (or None: no cap)", 1, high=MAX_CAP, plain=True)


def _resolve(path: Any) -> tuple[Any, str]:
    if not isinstance(path, str) or not path:
        raise InvalidArgumentTypeError(f"path must be a non-empty str, got {path!r:.80}")
    try:
        return resolve_filesystem(path)
    except ValueError as err:  # pyarrow's ArrowInvalid: not a URI it knows
        raise InvalidArgumentError(
            f"trigger cap path {path!r:.200} is not a path or a filesystem URI pyarrow knows "
            f"({err})") from None


def write_trigger_cap(path: str, cap: int | None) -> None:
    """Write the cap a running stream applies from its next micro-batch (``None``: the
    stream's ``maxOffsetsPerTrigger``, or no cap). Atomic: the stream reads the old file or the
    new one. O(1).

    Raises
    ------
    InvalidArgumentTypeError, InvalidArgumentError
        ``cap`` is not an int in ``[1, 2**63 - 1]`` or None; ``path`` is not a non-empty str,
        or neither a path nor a filesystem URI pyarrow knows.
    OSError
        The file could not be written.
    """
    value = _check_cap(cap)
    fs, where = _resolve(path)
    parent = where.rsplit("/", 1)[0]
    if parent and parent != where:
        fs.create_dir(parent, recursive=True)
    data = json.dumps({"format": TRIGGER_CAP_FORMAT, "max_offsets_per_trigger": value},
                      separators=(",", ":")).encode()
    write_atomic(fs, where, data)


def read_trigger_cap(path: str) -> tuple[bool, int | None]:
    """``(found, cap)``: ``(False, None)`` when there is no file, else the file's cap (``None``:
    no cap from the file). One small read; O(1).

    Raises
    ------
    InvalidArgumentTypeError, InvalidArgumentError
        ``path`` is not a non-empty str, or neither a path nor a filesystem URI pyarrow knows.
    StateCorruptError
        The file is not a cap record (foreign, truncated, a bad cap, a directory or anything
        else that is not a regular file); the message names it.
    OSError
        The filesystem could not be read.
    """
    from pyarrow import fs as pafs

    fs, where = _resolve(path)
    # what is there first: opening a named pipe would block the stream's planning forever
    info = fs.get_file_info(where)
    if info.type == pafs.FileType.NotFound:
        return False, None
    if info.type != pafs.FileType.File:
        raise StateCorruptError(f"{path}: not a file ({info.type.name}); a trigger cap file "
                                "is a regular file")
    try:
        with fs.open_input_stream(where) as f:
            raw: bytes = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:  # removed between the two calls
        return False, None
    if len(raw) > _MAX_BYTES:
        raise StateCorruptError(f"{path}: more than {_MAX_BYTES} bytes is not a trigger cap file")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise StateCorruptError(f"{path}: not JSON; a trigger cap file holds "
                                f'{{"format": "{TRIGGER_CAP_FORMAT}", '
                                '"max_offsets_per_trigger": <int or null>}') from None
    if not isinstance(value, dict) or value.get("format") != TRIGGER_CAP_FORMAT \
            or set(value) != {"format", "max_offsets_per_trigger"}:
        raise StateCorruptError(f"{path}: not a {TRIGGER_CAP_FORMAT} record")
    try:
        return True, _check_cap(value["max_offsets_per_trigger"])
    except (InvalidArgumentError, InvalidArgumentTypeError) as err:
        raise StateCorruptError(f"{path}: {err}") from None
