"""What ``trilink-spark balance PATH --key K`` checks before Spark starts.

Starting Spark takes seconds to tens of seconds; a path that does not exist, a name whose
format cannot be told, or a key column the file does not have should not wait for it.
:func:`check_input` looks at a local path with Python alone: it exists and can be read, its
format is known (from ``--format`` or the name), and the key column is there: the header line
of a CSV file, the records of a JSON-lines file, the schema of a Parquet file
(``pyarrow.parquet.read_schema``), or a partition directory (``key=value``). Compressed CSV and
JSON are read as Spark reads them, by the name's last suffix (:data:`CODEC_SUFFIXES`).

A URI with a scheme (``s3a://``, ``hdfs://``, ``gs://``, ...) and a glob pattern that matches
nothing as written are left to Spark: only their format is told from the name.

Examples
--------
>>> split_suffix("flights.csv.gz")
('csv', 'gzip')
>>> split_suffix("part-00000-c000.snappy.parquet")
('parquet', None)
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlparse

from ..errors import InvalidArgumentError, MissingColumnError

__all__ = [
    "FORMATS",
    "FORMAT_SUFFIXES",
    "CODEC_SUFFIXES",
    "MAX_FILES_CHECKED",
    "HEAD_BYTES",
    "InputCheck",
    "split_suffix",
    "check_input",
]

logger = logging.getLogger(__name__)

#: The formats ``--format`` takes.
FORMATS = ("parquet", "csv", "json")
#: A name's format, by its suffix (case ignored). JSON is JSON lines: one object per line.
FORMAT_SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json",
                   ".ndjson": "json"}
#: Compression Spark's CSV and JSON readers undo by the file name's last suffix (Hadoop's
#: codecs, case ignored): gzip and bzip2 as the ``gzip`` and ``bzip2`` tools write them,
#: ``.deflate`` a zlib stream, ``.zst`` Zstandard frames, and ``.lz4`` and ``.snappy`` in
#: Hadoop's block format only (what Spark writes with ``compression="lz4"``/``"snappy"``; a
#: file of the ``lz4`` tool is refused: Spark runs out of memory on it).
CODEC_SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".deflate": "deflate", ".zst": "zstd",
                  ".lz4": "lz4", ".snappy": "snappy"}
#: Data files of a directory whose key column is looked at (the first ones by name).
MAX_FILES_CHECKED = 64
#: Bytes of a file (decompressed) read to find its header line or its JSON records.
HEAD_BYTES = 1 << 20

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_GLOB = re.compile(r"[*?\[{]")
_LZ4_FRAME = b"\x04\x22\x4d\x18"
#: Largest raw length of one Hadoop compression block taken as real (its default is 256 KiB).
_MAX_BLOCK = 1 << 30
_ALLOWED = (f"--format {'|'.join(FORMATS)}, or a name ending in "
            f"{', '.join(FORMAT_SUFFIXES)} (CSV and JSON also compressed: "
            f"{', '.join(CODEC_SUFFIXES)})")


@dataclass(frozen=True)
class InputCheck:
    """What :func:`check_input` found.

    Attributes
    ----------
    format : str
        One of :data:`FORMATS`.
    files : int
        Data files found (0 for a path left to Spark).
    key_checked : bool
        Whether the key column was found before Spark starts (False: left to Spark, e.g. a
        remote URI, or a compression this Python cannot read).
    """

    format: str
    files: int
    key_checked: bool


def split_suffix(name: str) -> tuple[str | None, str | None]:
    """The format and the compression a file name says, ``None`` for what it does not say.

    Parameters
    ----------
    name : str
        A file or directory name (a path works: only the last component counts).

    Returns
    -------
    (str or None, str or None)
        The format (:data:`FORMAT_SUFFIXES`) and the codec (:data:`CODEC_SUFFIXES`).

    Notes
    -----
    O(len(name)).

    Examples
    --------
    >>> split_suffix("events.JSON.bz2"), split_suffix("part-0"), split_suffix("x.gz")
    (('json', 'bzip2'), (None, None), (None, 'gzip'))
    """
    suffixes = [s.lower() for s in PurePosixPath(name.rstrip("/")).suffixes]
    codec = CODEC_SUFFIXES.get(suffixes[-1]) if suffixes else None
    if codec is not None:
        suffixes = suffixes[:-1]
    fmt = FORMAT_SUFFIXES.get(suffixes[-1]) if suffixes else None
    return fmt, codec


def _shown(path: str) -> str:
    return repr(path) if len(path) <= 200 else repr(path[:100] + "..." + path[-60:])


def _format_of(path: str, fmt: str | None) -> tuple[str, str | None]:
    told, codec = split_suffix(path)
    chosen = fmt or told
    if chosen is None:
        raise InvalidArgumentError(
            f"cannot tell the format of {_shown(path)} from its name; pass {_ALLOWED}")
    if chosen == "parquet" and codec is not None:
        raise InvalidArgumentError(
            f"{_shown(path)} is Parquet compressed as a whole ({codec}), which Spark does not "
            "read: Parquet compresses inside the file; decompress it, or pass the right "
            f"--format ({'|'.join(FORMATS)})")
    return chosen, codec


def check_input(path: str, key: str, fmt: str | None = None) -> InputCheck:
    """Check a ``balance`` input before Spark starts: path, format and key column.

    Parameters
    ----------
    path : str
        A local file or directory, a ``file:`` URI, a glob pattern, or a URI Spark reads
        (``s3a://``, ``hdfs://``, ...).
    key : str
        The key column (matched exactly, as the command later does).
    fmt : str, optional
        One of :data:`FORMATS`; default: from the name (a directory without a suffix: from its
        data files' names, which must agree).

    Returns
    -------
    InputCheck

    Raises
    ------
    InvalidArgumentError
        The format cannot be told (or the files of a directory disagree), a local path that
        does not exist, cannot be read or holds no data file, a file that is not what its
        name says (not gzip, not Parquet, an LZ4 frame file, ...).
    MissingColumnError
        The key column is not in the CSV header, in any JSON record of the files (every file
        read to its end), in the Parquet schema, nor a partition directory's name: the message
        lists the columns there are. A CSV or Parquet directory is refused when none of the
        first :data:`MAX_FILES_CHECKED` files has it (Spark takes the columns from one file).

    Notes
    -----
    O(names in the directory) to list it, plus at most :data:`HEAD_BYTES` (decompressed) of
    at most :data:`MAX_FILES_CHECKED` files, or their Parquet footers. Nothing is written.

    Examples
    --------
    >>> check_input("s3a://bucket/flights.csv.gz", "tailnum")
    InputCheck(format='csv', files=0, key_checked=False)
    """
    if path.lower().startswith("file:"):
        local = unquote(urlparse(path).path) or path[5:]
    elif _SCHEME.match(path):
        return InputCheck(_format_of(path, fmt)[0], 0, False)
    else:
        local = path
    if not os.path.exists(local):
        if _GLOB.search(local):  # Spark expands it (Hadoop glob syntax)
            return InputCheck(_format_of(local, fmt)[0], 0, False)
        raise InvalidArgumentError(
            f"{_shown(path)} does not exist; PATH is a Parquet, CSV or JSON file or directory "
            "(or a URI such as s3a://bucket/key)")
    if os.path.isdir(local):
        return _check_directory(path, local, key, fmt)
    chosen, codec = _format_of(local, fmt)
    if not os.access(local, os.R_OK):
        raise InvalidArgumentError(f"{_shown(path)} cannot be read (permission denied)")
    if os.path.getsize(local) == 0:
        raise InvalidArgumentError(
            f"{_shown(path)} is empty; a {chosen.upper()} file with a {key!r} column is needed")
    state, columns = _file_has_key(local, chosen, codec, key)
    if state in ("no", "empty"):
        _missing(key, path, columns)
    return InputCheck(chosen, 1, state == "yes")


def _hidden(name: str) -> bool:
    """Names Spark's file listing skips (``_SUCCESS``, ``.crc`` files, ``_temporary``)."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or \
        name.endswith("._COPYING_")


def _walk(root: str) -> tuple[list[str], set[str]]:
    """Data files under ``root`` (sorted) and the partition columns of ``key=value`` dirs."""
    files: list[str] = []
    partitions: set[str] = set()

    def failed(err: OSError) -> None:
        raise InvalidArgumentError(
            f"cannot list {_shown(err.filename or root)} ({err.strerror or err})")

    for here, dirs, names in os.walk(root, onerror=failed):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for d in dirs:
            if "=" in d:
                partitions.add(d.split("=", 1)[0])
        files.extend(os.path.join(here, n) for n in sorted(names) if not _hidden(n))
    return files, partitions


def _check_directory(path: str, local: str, key: str, fmt: str | None) -> InputCheck:
    if not os.access(local, os.R_OK | os.X_OK):
        raise InvalidArgumentError(f"{_shown(path)} cannot be read (permission denied)")
    files, partitions = _walk(local)
    if not files:
        raise InvalidArgumentError(
            f"{_shown(path)} holds no data file (names starting with '_' or '.' are not data); "
            "PATH is a Parquet, CSV or JSON file or a directory of them")
    told = fmt or split_suffix(local)[0] or _format_of_files(path, files)
    if key in partitions:
        return InputCheck(told, len(files), True)
    data = [f for f in files if os.path.getsize(f) > 0]
    if not data:
        raise InvalidArgumentError(
            f"{_shown(path)} holds only empty files; a {told.upper()} file with a {key!r} "
            "column is needed")
    seen: list[str] = sorted(partitions)
    states: set[str] = set()
    for name in data[:MAX_FILES_CHECKED]:
        chosen, codec = _format_of(name, told)
        state, columns = _file_has_key(name, chosen, codec, key)
        if state == "yes":
            return InputCheck(told, len(files), True)
        states.add(state)
        seen.extend(c for c in columns if c not in seen)
    # Spark takes the columns of CSV and Parquet from one file, of JSON from every record
    if states <= {"no", "empty"} and (told != "json" or len(data) <= MAX_FILES_CHECKED):
        _missing(key, path, seen)
    return InputCheck(told, len(files), False)


def _format_of_files(path: str, files: list[str]) -> str:
    kinds = {split_suffix(f)[0] for f in files}
    known = sorted(k for k in kinds if k is not None)
    if None in kinds or len(known) != 1:
        parts = [f"{' and '.join(known)} files"] if known else []
        if None in kinds:
            parts.append("files whose names do not tell their format")
        what = "holds " + ", and ".join(parts)
        raise InvalidArgumentError(
            f"cannot tell the format of directory {_shown(path)}: it {what}; pass {_ALLOWED}")
    return known[0]


def _missing(key: str, path: str, columns: Iterable[str]) -> None:
    have = list(columns)
    near = [c for c in have if c.lower() == key.lower()]
    hint = f" (did you mean {near[0]!r}? names are matched exactly)" if near else ""
    shown = have[:40] + (["..."] if len(have) > 40 else [])
    raise MissingColumnError(
        f"key column {key!r} is not in {_shown(path)}{hint}; its columns are {shown}"[:2000])


def _file_has_key(name: str, fmt: str, codec: str | None, key: str) -> tuple[str, list[str]]:
    """Whether one file has column ``key``: ``"yes"``, ``"no"``, ``"empty"`` (no header, no
    record) or ``"unknown"`` (cannot tell: left to Spark); and the columns seen."""
    if fmt == "parquet":
        return _parquet_has_key(name, key)
    head = _head(name, codec)
    if head is None:
        return "unknown", []
    data, complete = head
    if fmt == "csv":
        return _csv_has_key(data, complete, key)
    return _json_has_key(data, complete, key)


def _yes_no(found: bool) -> str:
    return "yes" if found else "no"


def _parquet_has_key(name: str, key: str) -> tuple[str, list[str]]:
    with open(name, "rb") as fh:
        start = fh.read(4)
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(size - 4, 0))
        end = fh.read(4)
    if size < 12 or start not in (b"PAR1", b"PARE") or end not in (b"PAR1", b"PARE"):
        raise InvalidArgumentError(
            f"{_shown(name)} is not a Parquet file (no PAR1 magic bytes); pass the right "
            f"--format ({'|'.join(FORMATS)})")
    if end == b"PARE":  # an encrypted footer: Spark reads it with the keys it is given
        return "unknown", []
    import pyarrow.parquet as pq

    try:
        names = list(pq.read_schema(name).names)
    except Exception as err:  # noqa: BLE001 - pyarrow's reasons vary; Spark has the last word
        logger.debug("cannot read the Parquet schema of %s (%s): left to Spark", name, err)
        return "unknown", []
    return _yes_no(key in names), names


def _csv_has_key(data: bytes, complete: bool, key: str) -> tuple[str, list[str]]:
    # Spark's header is the first line that is not blank
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            if not complete:
                return "unknown", []  # no header within HEAD_BYTES
            end = len(data)
        line = data[start:end].decode("utf-8", errors="replace").removeprefix("\ufeff")
        if line.strip() or end >= len(data):
            break
        start = end + 1
    line = line.rstrip("\r")
    if not line.strip():
        return "empty", []
    names = next(csv.reader([line], escapechar="\\"), [])
    names = [n if n else f"_c{i}" for i, n in enumerate(names)]  # Spark's name of a blank one
    return _yes_no(key in names), names


def _json_has_key(data: bytes, complete: bool, key: str) -> tuple[str, list[str]]:
    lines = data.split(b"\n")
    if not complete:
        lines = lines[:-1]  # the last one may be cut
    seen: dict[str, None] = {}
    records = 0
    for raw in lines:
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            records += 1  # Spark's PERMISSIVE mode keeps it as a corrupt record
            continue
        for record in value if isinstance(value, list) else [value]:
            records += 1
            if isinstance(record, dict):
                if key in record:
                    return "yes", []
                seen.update(dict.fromkeys(str(k) for k in record))
    if not complete:
        return "unknown", list(seen)
    return ("no" if records else "empty"), list(seen)


def _not_codec(name: str, codec: str, err: BaseException) -> InvalidArgumentError:
    why = " ".join(str(err).split())  # one line: pyarrow's messages span several
    return InvalidArgumentError(
        f"{_shown(name)} cannot be decompressed as {codec}, as its name says "
        f"({why[:80]}); Spark decompresses by the name's last suffix: rename, "
        "recompress or repair it")


def _head(name: str, codec: str | None) -> tuple[bytes, bool] | None:
    """Up to :data:`HEAD_BYTES` of ``name`` decompressed, and whether that is all of it;
    ``None`` when this Python cannot decompress it (Spark still may)."""
    limit = HEAD_BYTES
    if codec == "zstd":
        return _zstd_head(name, limit)
    if codec in ("lz4", "snappy"):
        return _hadoop_block_head(name, codec, limit)
    try:
        if codec is None:
            with open(name, "rb") as fh:
                data = fh.read(limit + 1)
        elif codec == "gzip":
            with gzip.open(name, "rb") as gz:
                data = gz.read(limit + 1)
        elif codec == "bzip2":
            with bz2.open(name, "rb") as bz:
                data = bz.read(limit + 1)
        else:
            data = _inflate(name, limit + 1)
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise _not_codec(name, str(codec), err) from None
    except OSError as err:
        if err.errno is None and codec is not None:  # bz2: "Invalid data stream"
            raise _not_codec(name, codec, err) from None
        raise InvalidArgumentError(
            f"cannot read {_shown(name)} ({err.strerror or err})") from None
    return data[:limit], len(data) <= limit


def _inflate(name: str, want: int) -> bytes:
    """The first ``want`` bytes of a zlib stream (Hadoop's ``.deflate``)."""
    inflater = zlib.decompressobj()
    out = bytearray()
    with open(name, "rb") as fh:
        while len(out) < want and not inflater.eof:
            chunk = fh.read(1 << 16)
            if not chunk:
                raise EOFError("the stream ends early")
            out += inflater.decompress(chunk, want - len(out))
            while inflater.unconsumed_tail and len(out) < want:
                out += inflater.decompress(inflater.unconsumed_tail, want - len(out))
    return bytes(out)


def _zstd_head(name: str, limit: int) -> tuple[bytes, bool] | None:
    import pyarrow as pa

    if not pa.Codec.is_available("zstd"):
        return None
    try:
        with pa.CompressedInputStream(pa.OSFile(name), "zstd") as stream:
            data = stream.read(limit + 1)
    except (pa.ArrowException, OSError) as err:
        raise _not_codec(name, "zstd", err) from None
    return bytes(data[:limit]), len(data) <= limit


def _hadoop_block_head(name: str, codec: str, limit: int) -> tuple[bytes, bool] | None:
    """The first chunk of a file in Hadoop's block format (lz4, snappy): per block, its raw
    length, then chunks of (compressed length, compressed bytes), lengths big-endian."""
    import pyarrow as pa

    arrow_codec = "lz4_raw" if codec == "lz4" else "snappy"
    if not pa.Codec.is_available(arrow_codec):
        return None
    size = os.path.getsize(name)
    with open(name, "rb") as fh:
        header = fh.read(8)
        if header[:4] == _LZ4_FRAME:
            raise InvalidArgumentError(
                f"{_shown(name)} is an LZ4 frame file (the lz4 tool's format); Spark reads "
                "Hadoop's LZ4 block format only (what it writes with compression=lz4): "
                "decompress it, or recompress it with gzip, bzip2 or zstd")
        raw_len, chunk_len = struct.unpack(">II", header) if len(header) == 8 else (0, 0)
        bad = not (0 < raw_len <= _MAX_BLOCK and 0 < chunk_len <= size - 8)
        chunk = b"" if bad else fh.read(chunk_len)
    if not bad:
        try:
            data = pa.decompress(chunk, decompressed_size=raw_len, codec=arrow_codec,
                                 asbytes=True)
        except (pa.ArrowException, ValueError, OSError):
            bad = True
    if bad:
        raise InvalidArgumentError(
            f"{_shown(name)} is not in Hadoop's {codec} block format (what Spark writes with "
            f"compression={codec}), the only {codec} Spark reads: decompress it, or recompress "
            "it with gzip, bzip2 or zstd")
    whole = 8 + chunk_len == size
    return bytes(data[:limit]), whole and raw_len <= limit
