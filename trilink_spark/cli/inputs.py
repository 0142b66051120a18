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
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from pathlib import PurePosixPath
from urllib.parse import urlparse

from ..errors import InvalidArgumentError, MissingColumnError

__all__ = [
    "FORMATS",
    "FORMAT_SUFFIXES",
    "CODEC_SUFFIXES",
    "MAX_FILES_CHECKED",
    "HEAD_BYTES",
    "InputCheck",
    "split_suffix",
    "spark_csv_header",
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
#: The characters Hadoop's glob syntax gives a meaning (escaped with a backslash).
_HADOOP_GLOB = re.compile(r"[\\*?\[\]{}]")
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
    spark_path : str
        The path to give Spark's reader: a local path that exists with Hadoop's glob
        characters escaped (``data[1].csv`` is that file, not a pattern), else PATH as given.
        Neither compared nor shown.
    local_files : tuple of str
        The data files of a local PATH (empty for a path left to Spark), for a reader that
        needs no Spark (:mod:`~trilink_spark.cli.local_counts`). Neither compared nor shown.
    partition_columns : frozenset of str
        The column names of a local directory's ``key=value`` sub-directories.
    """

    format: str
    files: int
    key_checked: bool
    spark_path: str = field(default="", compare=False, repr=False)
    local_files: tuple[str, ...] = field(default=(), compare=False, repr=False)
    partition_columns: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


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


def check_input(path: str, key: str, fmt: str | None = None, *,
                local: bool = True) -> InputCheck:
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
    local : bool
        Whether Spark reads paths without a scheme from this machine's file system (a local
        master). False (a cluster master, a Spark Connect server): PATH is left to Spark as a
        URI is, and only its format is told from the name.

    Returns
    -------
    InputCheck

    Raises
    ------
    InvalidArgumentError
        The format cannot be told (or the files of a directory disagree), a local path that
        does not exist, cannot be read or holds no data file, a symbolic link that leads
        nowhere, a name with ``:`` (Hadoop cannot read it), a file that is not what its name
        says (not gzip, not Parquet, an LZ4 frame file, ...), a JSON object naming a field
        twice (Spark refuses the file), input without a header, a record or a row.
    MissingColumnError
        The key column is not in the CSV header (as Spark names its fields: ``_c<i>`` for a
        blank one, ``k0``, ``k1`` for a name given twice), in any JSON record of the files
        (every file read to its end), in the Parquet schema, nor a partition directory's name:
        the message lists the columns there are. A CSV or Parquet directory is refused when
        none of the first :data:`MAX_FILES_CHECKED` files has it (Spark takes the columns from
        one file).

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
        # Hadoop takes the path of a file: URI as written: %20 is those three characters
        local_path = urlparse(path).path or path[5:]
    elif _SCHEME.match(path) or not local:
        return InputCheck(_format_of(path, fmt)[0], 0, False, path)
    else:
        local_path = path
    if not os.path.exists(local_path):
        if os.path.lexists(local_path):
            raise InvalidArgumentError(
                f"{_shown(path)} is a symbolic link that leads nowhere (its target is missing, "
                "or the links form a loop)")
        if _GLOB.search(local_path):  # Spark expands it (Hadoop glob syntax)
            return InputCheck(_format_of(local_path, fmt)[0], 0, False, path)
        raise InvalidArgumentError(
            f"{_shown(path)} does not exist; PATH is a Parquet, CSV or JSON file or directory "
            "(or a URI such as s3a://bucket/key)")
    _refuse_colon(path, os.path.basename(os.path.normpath(local_path)))
    # the file itself, not a pattern; absolute, so that no name before a '/' reads as a scheme
    spark_path = _HADOOP_GLOB.sub(r"\\\g<0>", path if path.lower().startswith("file:")
                                  else os.path.abspath(path))
    if os.path.isdir(local_path):
        found = _check_directory(path, local_path, key, fmt)
        return InputCheck(found.format, found.files, found.key_checked, spark_path,
                          found.local_files, found.partition_columns)
    if not os.path.isfile(local_path):  # a FIFO, a device, a socket: never opened
        raise InvalidArgumentError(
            f"{_shown(path)} is not a regular file or a directory (a pipe, a device or a "
            "socket); PATH is a Parquet, CSV or JSON file or directory")
    chosen, codec = _format_of(local_path, fmt)
    if not os.access(local_path, os.R_OK):
        raise InvalidArgumentError(f"{_shown(path)} cannot be read (permission denied)")
    if os.path.getsize(local_path) == 0:
        raise InvalidArgumentError(
            f"{_shown(path)} is empty; a {chosen.upper()} file with a {key!r} column is needed")
    found_key = _file_has_key(local_path, chosen, codec, key)
    if found_key.state == "empty":
        _nothing(path, chosen, key)
    if found_key.state == "no":
        _missing(key, path, found_key.columns, found_key.note)
    if found_key.rows is False:
        _no_rows(path, key)
    return InputCheck(chosen, 1, found_key.state == "yes", spark_path, (local_path,))


def _refuse_colon(path: str, name: str) -> None:
    """Hadoop reads no file or directory whose name holds ``:`` (it takes ``a:b`` for a URI
    with scheme ``a``): refuse it by name instead of Spark's ``URISyntaxException``."""
    if ":" in name:
        raise InvalidArgumentError(
            f"{_shown(path)}: Spark (Hadoop's file system) cannot read a file or directory "
            f"whose name holds ':' ({name[:80]!r}); rename it")


def _hidden(name: str) -> bool:
    """Names Spark's file listing skips (``_SUCCESS``, ``.crc`` files, ``_temporary``)."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or \
        name.endswith("._COPYING_")


def _walk(path: str, root: str) -> tuple[list[str], set[str]]:
    """Data files under ``root`` (sorted) and the partition columns of ``key=value`` dirs."""
    files: list[str] = []
    partitions: set[str] = set()

    def failed(err: OSError) -> None:
        raise InvalidArgumentError(
            f"cannot list {_shown(err.filename or root)} ({err.strerror or err})")

    for here, dirs, names in os.walk(root, onerror=failed):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for d in dirs:
            _refuse_colon(os.path.join(here, d), d)
            if "=" in d:
                partitions.add(d.split("=", 1)[0])
        for n in sorted(names):
            if _hidden(n):
                continue
            name = os.path.join(here, n)
            _refuse_colon(name, n)
            if not os.path.exists(name):  # os.walk lists a dangling link as a file
                raise InvalidArgumentError(
                    f"{_shown(name)} in {_shown(path)} is a symbolic link that leads nowhere "
                    "(its target is missing, or the links form a loop); Spark fails on it: "
                    "remove it")
            files.append(name)
    return files, partitions


def _check_directory(path: str, local: str, key: str, fmt: str | None) -> InputCheck:
    if not os.access(local, os.R_OK | os.X_OK):
        raise InvalidArgumentError(f"{_shown(path)} cannot be read (permission denied)")
    files, partitions = _walk(path, local)
    if not files:
        raise InvalidArgumentError(
            f"{_shown(path)} holds no data file (names starting with '_' or '.' are not data); "
            "PATH is a Parquet, CSV or JSON file or a directory of them")
    told = fmt or split_suffix(local)[0] or _format_of_files(path, files)
    data = [f for f in files if os.path.getsize(f) > 0]
    if key in partitions and data:
        return InputCheck(told, len(files), True, "", tuple(files), frozenset(partitions))
    if not data:
        raise InvalidArgumentError(
            f"{_shown(path)} holds only empty files; a {told.upper()} file with a {key!r} "
            "column is needed")
    seen: list[str] = sorted(partitions)
    states: set[str] = set()
    notes: list[str] = []
    has_key = False
    rows: set[bool | None] = set()
    for name in data[:MAX_FILES_CHECKED]:
        chosen, codec = _format_of(name, told)
        found = _file_has_key(name, chosen, codec, key)
        has_key = has_key or found.state == "yes"
        rows.add(found.rows)
        if has_key and rows - {False}:  # the key, and rows (or maybe rows) to read
            return InputCheck(told, len(files), True, "", tuple(files), frozenset(partitions))
        states.add(found.state)
        notes.extend(n for n in [found.note] if n and n not in notes)
        seen.extend(c for c in found.columns if c not in seen)
    every_file = len(data) <= MAX_FILES_CHECKED
    if has_key:  # each file has a header or schema, and none a row
        if every_file:
            _no_rows(path, key)
        return InputCheck(told, len(files), True, "", tuple(files), frozenset(partitions))
    if states == {"empty"} and every_file:
        _nothing(path, told, key)
    # Spark takes the columns of CSV and Parquet from one file, of JSON from every record
    if states <= {"no", "empty"} and (told != "json" or every_file):
        _missing(key, path, seen, "; ".join(notes))
    return InputCheck(told, len(files), False, "", tuple(files), frozenset(partitions))


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


def _missing(key: str, path: str, columns: Iterable[str], note: str = "") -> None:
    have = list(columns)
    near = [c for c in have if c.lower() == key.lower()]
    hint = f" (did you mean {near[0]!r}? names are matched exactly)" if near else ""
    hint = f" ({note})" if note else hint
    shown = have[:40] + (["..."] if len(have) > 40 else [])
    raise MissingColumnError(
        f"key column {key!r} is not in {_shown(path)}{hint}; its columns are {shown}"[:2000])


def _nothing(path: str, fmt: str, key: str) -> None:
    """Refuse input without a CSV header line or a JSON record (e.g. an empty file inside
    its compression)."""
    what = "no header line" if fmt == "csv" else "no record"
    raise InvalidArgumentError(
        f"{_shown(path)} holds {what} (blank, or empty once decompressed); a {fmt.upper()} "
        f"input with a {key!r} column is needed")


def _no_rows(path: str, key: str) -> None:
    """Refuse input whose files have the key column but no row (a CSV header alone, a
    Parquet file of no rows): there are no keys to count."""
    raise InvalidArgumentError(
        f"{_shown(path)} has column {key!r} but no rows (a header or schema alone); there are "
        "no keys to balance")


class _Found(NamedTuple):
    """What one file says: ``state`` ``"yes"`` or ``"no"`` (the key column is there or
    not), ``"empty"`` (no header, no record) or ``"unknown"`` (cannot tell: left to Spark);
    the columns seen; whether it holds rows (None: cannot tell); a note for the message."""

    state: str
    columns: Sequence[str] = ()
    rows: bool | None = None
    note: str = ""


def _file_has_key(name: str, fmt: str, codec: str | None, key: str) -> _Found:
    """Whether one file has column ``key`` (and rows), as Spark would read it."""
    if fmt == "parquet":
        return _parquet_has_key(name, key)
    head = _head(name, codec)
    if head is None:
        return _Found("unknown")
    data, complete = head
    _refuse_foreign(name, fmt, codec, data)
    if fmt == "csv":
        return _csv_has_key(data, complete, key)
    return _json_has_key(name, data, complete, key)


#: Magic bytes that open a file of another format than CSV or JSON text, what it is and what
#: to pass instead; a match counts only where the first bytes also hold a control byte (text
#: never does), so a CSV header that happens to start ``PAR1,`` is still read.
_MAGIC = ((b"PAR1", "a Parquet file", "--format parquet, or a name ending in .parquet"),
          (b"\x1f\x8b", "gzip-compressed", "a name ending in .gz"),
          (b"BZh", "bzip2-compressed", "a name ending in .bz2"),
          (b"\x28\xb5\x2f\xfd", "Zstandard-compressed", "a name ending in .zst"),
          (_LZ4_FRAME, "an LZ4 frame file", "its decompressed form"),
          (b"PK\x03\x04", "a ZIP archive", "its unzipped files"))
_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")


def _refuse_foreign(name: str, fmt: str, codec: str | None, data: bytes) -> None:
    """Refuse a CSV or JSON input whose (decompressed) bytes open with another format's
    magic bytes: Spark would read a Parquet file's binary header as CSV column names."""
    if not _CONTROL.search(data[:256]):
        return
    for magic, what, fix in _MAGIC:
        if data.startswith(magic):
            inside = f" inside its {codec} compression" if codec else ""
            raise InvalidArgumentError(
                f"{_shown(name)} is {what}{inside} (its first bytes are {magic!r}), not "
                f"{fmt.upper()} as --format or its name says; pass {fix}")


def _yes_no(found: bool) -> str:
    return "yes" if found else "no"


def _parquet_has_key(name: str, key: str) -> _Found:
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
        return _Found("unknown")
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(name)
        schema = meta.schema.to_arrow_schema()
    except Exception as err:  # noqa: BLE001 - pyarrow's reasons vary; Spark has the last word
        logger.debug("cannot read the Parquet schema of %s (%s): left to Spark", name, err)
        return _Found("unknown")
    names = list(schema.names)
    if names.count(key) == 1 and not _placeable(schema.field(key).type):
        raise InvalidArgumentError(
            f"key column {key!r} of {_shown(name)} is {schema.field(key).type} in its Parquet "
            "schema; balance needs int, long, string or binary keys")
    return _Found(_yes_no(key in names), names, meta.num_rows > 0)


def _placeable(arrow_type: Any) -> bool:
    """Whether Spark reads a Parquet column of this Arrow type as a key a strategy places:
    an integer of at most 64 signed bits (uint64 is a decimal in Spark), a string or binary
    (dictionary-encoded too)."""
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if pa.types.is_integer(t):
        return not pa.types.is_uint64(t)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


#: Spark's CSV and JSON readers end a line at ``\n``, ``\r\n`` or a lone ``\r`` (Hadoop's
#: line reader).
_LINE_END = re.compile(rb"\r\n|\r|\n")


def spark_csv_header(names: list[str]) -> list[str]:
    """The column names Spark gives a CSV header's fields (``header=true``, the default
    case-insensitive analysis): a blank name becomes ``_c<i>``, and names that occur more
    than once (ignoring case) get their position appended (``k,K`` -> ``k0,K1``).

    O(fields).

    Examples
    --------
    >>> spark_csv_header(["k", "", "v", "K"])
    ['k0', '_c1', 'v', 'K3']
    """
    seen = Counter(n.lower() for n in names if n)
    return [f"_c{i}" if not n else f"{n}{i}" if seen[n.lower()] > 1 else n
            for i, n in enumerate(names)]


def _csv_has_key(data: bytes, complete: bool, key: str) -> _Found:
    # Spark's header is the first line that is not blank; lines end as Hadoop's reader says
    start = 0
    while True:
        match = _LINE_END.search(data, start)
        if match is None:
            if not complete:
                return _Found("unknown")  # no header within HEAD_BYTES
            end = stop = len(data)
        else:
            end, stop = match.span()
        line = data[start:end].decode("utf-8", errors="replace").removeprefix("\ufeff")
        if line.strip() or stop >= len(data):
            break
        start = stop
    if not line.strip():
        return _Found("empty")
    try:
        fields = next(csv.reader([line], escapechar="\\"), [])
    except csv.Error:  # a name beyond the csv module's field limit: Spark has the last word
        return _Found("unknown")
    names = spark_csv_header(fields)
    rest = data[stop:]
    # a data row: a line that is not blank after the header (Spark skips blank lines)
    rows: bool | None = bool(rest.strip()) or (None if not complete else False)
    note = ""
    copies = [n for f, n in zip(fields, names) if f and f.lower() == key.lower()]
    if key not in names and len(copies) > 1:
        note = (f"the header names {key!r} {len(copies)} times (ignoring case), and Spark "
                f"calls the copies {', '.join(repr(c) for c in copies)}")
    elif key not in names and _json_record(line):
        note = ("its first line is a JSON record, read here as CSV: pass --format json, or "
                "a name ending in .json")
    return _Found(_yes_no(key in names), names, rows, note)


def _json_record(line: str) -> bool:
    """Whether ``line`` is one JSON object (a CSV header never is)."""
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


class _TwiceNamed(ValueError):
    """A JSON object that names a field twice (ignoring case)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for name, _ in pairs:
        if name.lower() in seen:
            raise _TwiceNamed(name)
        seen.add(name.lower())
    return dict(pairs)


def _json_has_key(name: str, data: bytes, complete: bool, key: str) -> _Found:
    lines = _LINE_END.split(data)
    if not complete:
        lines = lines[:-1]  # the last one may be cut
    seen: dict[str, None] = {}
    records = 0
    parsed = 0
    found = False
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw, object_pairs_hook=_no_duplicates)
        except _TwiceNamed as err:
            raise InvalidArgumentError(
                f"{_shown(name)}, line {number}: an object names {str(err)[:80]!r} twice "
                "(names are compared ignoring case, as Spark does); Spark refuses such a JSON "
                "file ([COLUMN_ALREADY_EXISTS]): rename or drop one of them") from None
        except (ValueError, RecursionError):
            records += 1  # Spark's PERMISSIVE mode keeps it as a corrupt record
            continue
        parsed += 1
        for record in value if isinstance(value, list) else [value]:
            records += 1
            if isinstance(record, dict):
                found = found or key in record
                seen.update(dict.fromkeys(str(k) for k in record))
    # every record read is a row (a corrupt one too); a cut head may hold none yet
    rows = True if records else (False if complete else None)
    if found:
        return _Found("yes", list(seen), rows)
    if not complete:
        return _Found("unknown", list(seen), rows)
    note = ("no line of it is JSON: Spark would read every line as a corrupt record; pass "
            "--format csv, or a name ending in .csv, if it is CSV"
            if records and not parsed else "")
    return _Found("no" if records else "empty", list(seen), rows, note)


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
