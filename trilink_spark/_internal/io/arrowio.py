"""Stored tables as tagged Arrow IPC bytes: what trilink-spark writes instead of pickles.

State that trilink-spark keeps between micro-batches (a merge buffer's tail, keyed state) is
stored as bytes. Those bytes are never unpickled: unpickling runs whatever code the bytes
name, so a file planted in (or left over in) a state path would run code on every executor.
They are Arrow IPC instead, read by :func:`read_table` with nothing executed, and tagged so
that bytes written by something else are recognised and refused.

Format
------
The Arrow IPC **file** format (``ARROW1`` magic, schema, record batches, footer, ``ARROW1``),
uncompressed. Not the stream format: a stream cut at a batch boundary still reads as a valid,
shorter stream, so a truncated state would silently lose rows; the file format ends with a
footer, so a cut anywhere is seen. The schema's metadata carries the tag and the checksums:

==================== ======================================================================
key                  value
==================== ======================================================================
``trilink.format``   the kind of table, as given to :func:`write_table` (``b"merge-tail"``)
``trilink.version``  :data:`FORMAT_VERSION` as ASCII digits (``b"2"``)
``trilink.checksum`` JSON ``{"algorithm": "crc32", "schema": "<8 hex>", "batches": ["<8 hex>",
                     ...]}``: the CRC-32 (``zlib.crc32``) of the schema (its metadata without
                     this key) and of each record batch (version 2; see Checksums)
==================== ======================================================================

Every other metadata key of the table (for instance the ``pandas`` key that
``pyarrow.Table.from_pandas`` writes, which restores pandas dtypes) is kept as it is, and
:func:`read_table` removes the tag again: ``read_table(write_table(t, k), k, where)`` equals
``t``, schema metadata included. A kind whose columns change incompatibly takes a new kind name
(``"keyed-state.v2"``), so that an old reader refuses the new files rather than misreading them.

Checksums
---------
A record batch's checksum is the CRC-32 of its Arrow IPC stream serialisation (schema without
metadata, dictionaries, the batch), computed by :func:`write_table` from the batches it writes
and by the reader from the batches it reads back; the schema's is the CRC-32 of the schema's
IPC serialisation with every metadata key but ``trilink.checksum``. A byte changed anywhere in
the file after it was written either changes what Arrow reads (then a checksum no longer
matches, or the layout is refused) or changes nothing that is read (padding, the copy of the
schema the file reader does not use): a damaged value is not read back as another value
(CRC-32 detects every damage within 32 consecutive bits, a flipped byte included, and other
damage but for a chance of 2**-32; it guards against accidents, not against forgery). The
checksum of a batch is checked when that batch is read (:meth:`StoredTable.read`), so reading
some batches of a file checks those and the schema only. Cost: one CRC pass over the bytes of
what is written or read, O(bytes) (zlib's CRC-32, plus a fixed cost of
about 70 µs per record batch), with no copy of the data.

Version 1 (files of releases before checksums: the same layout, no ``trilink.checksum``) is
still read, without a checksum to check; such files are replaced as the store moves on (each
batch writes new state versions). A file tagged version 1 that has a ``trilink.checksum`` key
is a damaged version-2 file and is refused, as is a version-2 file without one.

:func:`read_table` raises :class:`~trilink_spark.errors.StateCorruptError`, naming ``where`` and
what the bytes look like, for bytes that are empty, random, a pickle (it is not unpickled), an
Arrow IPC stream, a truncated or corrupt Arrow file, an Arrow file without the tag (another
program's) or with another kind or version, or a file whose checksums do not match. It never
returns an empty table for bad bytes: "no stored state" is the caller's ``None``, never what a
reader makes of corrupt data.

Examples
--------
>>> import pyarrow as pa
>>> data = write_table(pa.table({"x": [1, None, 3]}), "example")
>>> data[:6]
b'ARROW1'
>>> read_table(data, "example", "example data").column("x").to_pylist()
[1, None, 3]
>>> read_table(data[:-10], "example", "example data")
Traceback (most recent call last):
...
trilink_spark.errors.StateCorruptError: example data is a truncated Arrow IPC file ...
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError

__all__ = ["write_table", "write_batches", "read_table", "open_table", "StoredTable", "FORMAT_KEY", "VERSION_KEY",
           "CHECKSUM_KEY", "FORMAT_VERSION"]

#: Schema metadata key of the kind tag.
FORMAT_KEY = b"trilink.format"
#: Schema metadata key of the format version.
VERSION_KEY = b"trilink.version"
#: Schema metadata key of the checksums (version 2).
CHECKSUM_KEY = b"trilink.checksum"
#: Version of this layout (tagged IPC file with checksums) that :func:`write_table` writes;
#: :func:`read_table` reads it and version 1 (no checksums).
FORMAT_VERSION = 2
_UNCHECKED_VERSION = b"1"  # the layout before checksums: still read

_MAGIC = b"ARROW1"
_STREAM_START = b"\xff\xff\xff\xff"  # an IPC stream's first message's continuation marker
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SHOWN = 40  # bytes of a foreign tag value shown in a message


def _refuse_pickled_extension_types() -> None:  # pragma: no cover - pyarrow < 14.0.1 only
    """pyarrow before 14.0.1 unpickles the metadata of ``arrow.py_extension_type`` fields
    while it reads IPC data (CVE-2023-47248); unregister that type so such a field reads as
    its storage type and nothing is unpickled (what ``pyarrow_hotfix`` does)."""
    parts = [int(p) if p.isdigit() else 0 for p in pa.__version__.split(".")[:3]]
    if tuple(parts + [0] * (3 - len(parts))) >= (14, 0, 1):
        return
    try:
        pa.unregister_extension_type("arrow.py_extension_type")
    except (KeyError, pa.ArrowException):
        pass


_refuse_pickled_extension_types()


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str):
        raise InvalidArgumentTypeError(f"kind must be a str, got {type(kind).__name__}")
    if not _KIND.fullmatch(kind):
        raise InvalidArgumentError(
            f"kind must be 1 to 64 of a-z, 0-9, '.', '_', '-' (starting with a letter or "
            f"digit), got {kind!r}"
        )
    return kind


def write_table(table: pa.Table, kind: str) -> bytes:
    """``table`` as Arrow IPC file bytes tagged with ``kind`` (see the module docs).

    Parameters
    ----------
    table : pyarrow.Table
        Any columns, any number of rows (zero included: the bytes then hold the schema only).
        Its schema metadata is kept; it must not already hold the tag keys.
    kind : str
        What the table is, e.g. ``"merge-tail"``: 1 to 64 of ``a-z 0-9 . _ -``.
        :func:`read_table` refuses the bytes under any other kind.

    Returns
    -------
    bytes
        An uncompressed Arrow IPC file of :data:`FORMAT_VERSION`, with the checksums of its
        schema and record batches. The same table gives the same bytes.

    Raises
    ------
    InvalidArgumentTypeError
        ``table`` is not a ``pyarrow.Table`` or ``kind`` not a str.
    InvalidArgumentError
        ``kind`` has other characters, or ``table``'s schema metadata already has
        ``trilink.format`` or ``trilink.version`` (read it with :func:`read_table`, which
        removes them).

    Notes
    -----
    Cost: one copy of the table's buffers into the returned bytes, and one CRC-32 pass over
    them, O(size).

    Examples
    --------
    >>> import pyarrow as pa
    >>> data = write_table(pa.table({"x": pa.array([], pa.int64())}), "example")
    >>> read_table(data, "example", "example data").schema
    x: int64
    """
    _check_kind(kind)
    if not isinstance(table, pa.Table):
        raise InvalidArgumentTypeError(f"table must be a pyarrow.Table, got {type(table).__name__}")
    metadata = dict(table.schema.metadata or {})
    clash = sorted(k.decode() for k in (FORMAT_KEY, VERSION_KEY) if k in metadata)
    if clash:
        raise InvalidArgumentError(
            f"the table's schema metadata already has {', '.join(clash)}: trilink's tag keys; "
            "read stored tables with read_table, which removes them"
        )
    metadata[FORMAT_KEY] = kind.encode("ascii")
    metadata[VERSION_KEY] = str(FORMAT_VERSION).encode("ascii")
    batches = _batches(table)
    schema = table.schema.with_metadata(metadata)
    sums = {"algorithm": _ALGORITHM, "schema": _hex(_schema_crc(schema)),
            "batches": [_hex(_batch_crc(batch)) for batch in batches]}
    metadata[CHECKSUM_KEY] = json.dumps(sums, separators=(",", ":")).encode("ascii")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema.with_metadata(metadata)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def write_batches(file: Any, schema: pa.Schema, batches: Callable[[], Iterator[pa.RecordBatch]],
                  kind: str) -> None:
    """Write the bytes :func:`write_table` would write for a table of ``schema`` and the
    batches ``batches()`` yields, to ``file``, holding one batch in memory at a time.

    ``batches`` is called twice: once to checksum the batches (the checksums go in the schema,
    which comes first in the file), once to write them; both calls must yield the same batches.
    Cost: two passes over the batches, O(size); memory: one batch.
    """
    _check_kind(kind)
    metadata = dict(schema.metadata or {})
    metadata[FORMAT_KEY] = kind.encode("ascii")
    metadata[VERSION_KEY] = str(FORMAT_VERSION).encode("ascii")
    tagged = schema.with_metadata(metadata)
    sums = {"algorithm": _ALGORITHM, "schema": _hex(_schema_crc(tagged)),
            "batches": [_hex(_batch_crc(batch)) for batch in batches()]}
    metadata[CHECKSUM_KEY] = json.dumps(sums, separators=(",", ":")).encode("ascii")
    with pa.ipc.new_file(file, schema.with_metadata(metadata)) as writer:
        for batch in batches():
            writer.write_batch(batch)


_ALGORITHM = "crc32"


def _hex(crc: int) -> str:
    return f"{crc:08x}"


class _Crc32Sink:
    """A write-only file object that keeps the CRC-32 of what is written to it (nothing kept:
    the bytes are hashed as they pass)."""

    def __init__(self) -> None:
        self.crc = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _batch_crc(batch: pa.RecordBatch) -> int:
    """CRC-32 of ``batch``'s IPC stream serialisation (schema without metadata, dictionaries,
    the batch). The same for a batch and that batch read back from a file: the writer
    normalises offsets and slices. O(bytes), streamed: no copy of the batch is made."""
    sink = _Crc32Sink()
    plain = batch.replace_schema_metadata(None)
    with pa.PythonFile(sink, mode="w") as file:
        with pa.ipc.new_stream(file, plain.schema) as writer:
            writer.write_batch(plain)
    return sink.crc


def _schema_crc(schema: pa.Schema) -> int:
    """CRC-32 of ``schema``'s IPC serialisation, metadata included (in its order)."""
    return zlib.crc32(schema.serialize())


def _batches(table: pa.Table) -> list[pa.RecordBatch]:
    """``table``'s record batches; one of its length for a table with rows but no columns
    (pyarrow gives a table without columns no batches, which would store zero rows)."""
    if table.num_columns or not table.num_rows:
        batches: list[pa.RecordBatch] = table.to_batches()
        return batches
    return [pa.record_batch([pa.nulls(table.num_rows)], names=["_"]).select([])]


def _sniff(head: bytes, tail: bytes, size: int) -> str | None:
    """What ``size`` bytes starting with ``head`` and ending with ``tail`` are, when that is
    plainly not a whole Arrow IPC file (else None)."""
    if size == 0:
        return "empty (0 bytes)"
    if head[:1] == b"\x80" and head[1:2] and 2 <= head[1] <= 5 and tail.endswith(b"."):
        return (f"a Python pickle (protocol {head[1]}, {size} bytes), which trilink-spark "
                "never unpickles")
    if head.startswith(_MAGIC):
        if size < 2 * len(_MAGIC) + 4 or not tail.endswith(_MAGIC):
            return f"a truncated Arrow IPC file (no footer; {size} bytes)"
        return None
    if head.startswith(_STREAM_START):
        return (f"an Arrow IPC stream ({size} bytes), not the tagged Arrow IPC file "
                "trilink-spark writes")
    return f"not an Arrow IPC file ({size} bytes, starting {head[:8].hex()})"


def _shown(value: bytes) -> str:
    text = value[:_SHOWN].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(value) > _SHOWN else ""))


def read_table(data: bytes | bytearray | memoryview, kind: str, where: str) -> pa.Table:
    """The table :func:`write_table` wrote as ``kind``; anything else raises.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        Stored bytes (not None: "nothing stored" is for the caller to handle).
    kind : str
        The kind the bytes must be tagged with.
    where : str
        What the bytes are and where they come from, for error messages (a file, or a
        partition and a batch): ``"merge tail of partition 3 before batch 7 in /state"``.

    Returns
    -------
    pyarrow.Table
        The stored table, schema metadata as written (the tag removed); zero rows for a
        stored empty table. It references ``data``'s memory (no copy).

    Raises
    ------
    StateCorruptError
        The bytes are not an Arrow IPC file tagged ``kind`` of :data:`FORMAT_VERSION` (or of
        version 1, written before checksums): empty, random, a pickle (never unpickled), an
        IPC stream, truncated, corrupt (a layout that fails Arrow's full validation), untagged,
        another kind or version, or damaged after they were written (a checksum of the schema
        or of a record batch does not match). The message starts with ``where`` and says
        which.
    InvalidArgumentTypeError
        ``data`` is not bytes-like, or ``kind`` or ``where`` not a str.
    InvalidArgumentError
        ``kind`` has characters :func:`write_table` refuses.

    Notes
    -----
    Nothing in the bytes is executed: Arrow IPC holds data and a schema only (and pyarrow
    before 14.0.1's pickled extension type is unregistered when this module is imported).
    Cost: zero-copy read, then one full validation pass and one CRC-32 pass (no copy),
    O(size).

    Examples
    --------
    >>> import pickle
    >>> read_table(pickle.dumps([1]), "example", "state file /tmp/x.state")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.StateCorruptError: state file /tmp/x.state is a Python pickle ...
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        _check_kind(kind)
        raise InvalidArgumentTypeError(
            f"data must be bytes, bytearray or memoryview, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    return open_table(pa.py_buffer(view), kind, where).read()


class StoredTable:
    """A tagged Arrow IPC file opened for reading some of its record batches
    (see :func:`open_table`).

    Attributes
    ----------
    schema : pyarrow.Schema
        The stored schema, metadata as written with the tag removed.
    metadata : dict of bytes to bytes
        ``schema.metadata`` (empty when none).
    num_batches : int
        Record batches in the file.
    """

    def __init__(self, reader: pa.ipc.RecordBatchFileReader, schema: pa.Schema, where: str,
                 refusal: str, checksums: list[int] | None = None) -> None:
        self._reader = reader
        self._where = where
        self._refusal = refusal
        self._checksums = checksums
        self.schema = schema
        self.metadata: dict[bytes, bytes] = dict(schema.metadata or {})
        self.num_batches: int = reader.num_record_batches

    def read(self, batches: list[int] | None = None) -> pa.Table:
        """The stored rows of record batches ``batches`` (all when None), in that order,
        fully validated and checked against their checksums;
        :class:`~trilink_spark.errors.StateCorruptError` for a corrupt layout or a checksum
        that does not match.

        Cost: reads only those batches' bytes (plus the footer, read at open), then one
        validation and one CRC pass over them, O(their size).
        """
        picked = list(range(self.num_batches)) if batches is None else list(batches)
        for i in picked:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.num_batches:
                raise StateCorruptError(
                    f"{self._where} has {self.num_batches} record batches; batch {i!r} was "
                    "asked for (its index points past the file)")
        try:
            chunks = [self._reader.get_batch(i) for i in picked]
            for chunk in chunks:  # before a checksum pass serialises them
                chunk.validate(full=True)
            # rebuilt from the batches (not replace_schema_metadata, which drops the rows of
            # a table without columns)
            result: pa.Table = pa.Table.from_batches(chunks, schema=self.schema)
            result.validate(full=True)
            if self._checksums is not None:
                for i, chunk in zip(picked, chunks):
                    found = _batch_crc(chunk)
                    if found != self._checksums[i]:
                        raise StateCorruptError(
                            f"{self._where} fails its checksum: record batch {i} has CRC-32 "
                            f"{_hex(found)}, it was written with {_hex(self._checksums[i])}; "
                            f"the file was damaged after it was written{_DAMAGED}")
        except (pa.ArrowException, OSError, ValueError) as err:
            if isinstance(err, StateCorruptError):
                raise
            raise StateCorruptError(
                f"{self._where} is a corrupt Arrow IPC file ({type(err).__name__}: {err})"
                f"{self._refusal}") from None
        return result


_DAMAGED = " (restore it from a copy, or start over with an empty state path)"


def open_table(file: pa.NativeFile, kind: str, where: str) -> StoredTable:
    """Open the tagged Arrow IPC file in ``file`` (random access) and check its tag, reading
    only its ends; :meth:`StoredTable.read` then reads the record batches asked for.

    Parameters
    ----------
    file : pyarrow.NativeFile
        A readable, seekable file (``pyarrow.fs.FileSystem.open_input_file``, a
        ``pyarrow.BufferReader`` or ``pyarrow.py_buffer`` of bytes).
    kind, where : str
        As for :func:`read_table`.

    Returns
    -------
    StoredTable

    Raises
    ------
    StateCorruptError, InvalidArgumentTypeError, InvalidArgumentError
        As :func:`read_table`, for what the file's ends, schema, tag and the schema's checksum
        show (the record batches' checksums are checked when they are read).

    Notes
    -----
    Cost: O(1) reads (both ends, the footer and the schema), whatever the file's size, and a
    CRC-32 of the schema, O(schema size).

    Examples
    --------
    >>> import pyarrow as pa
    >>> data = write_table(pa.Table.from_batches([pa.record_batch({"x": [1, 2]}),
    ...                                           pa.record_batch({"x": [3]})]), "example")
    >>> stored = open_table(pa.BufferReader(data), "example", "example data")
    >>> stored.num_batches, stored.read([1]).column("x").to_pylist()
    (2, [3])
    """
    _check_kind(kind)
    if not isinstance(where, str):
        raise InvalidArgumentTypeError(f"where must be a str, got {type(where).__name__}")
    if isinstance(file, pa.Buffer):
        file = pa.BufferReader(file)
    if not isinstance(file, pa.NativeFile):
        raise InvalidArgumentTypeError(
            f"file must be a pyarrow NativeFile, got {type(file).__name__}")
    refusal = f"; it is not a trilink {kind!r} table, and is not read as an empty one"
    try:
        size = file.size()
        head = file.read_at(min(8, size), 0) if size else b""
        tail = file.read_at(min(8, size), max(0, size - 8)) if size else b""
    except (pa.ArrowException, OSError, ValueError) as err:
        raise StateCorruptError(f"cannot read {where} ({type(err).__name__}: {err})") from None
    problem = _sniff(bytes(head), bytes(tail), size)
    if problem is not None:
        raise StateCorruptError(f"{where} is {problem}{refusal}")
    try:
        reader = pa.ipc.open_file(file)
        schema = reader.schema
    except (pa.ArrowException, OSError, ValueError) as err:
        raise StateCorruptError(
            f"{where} is a corrupt Arrow IPC file ({type(err).__name__}: {err}){refusal}"
        ) from None
    metadata = dict(schema.metadata or {})
    raw_sums = metadata.pop(CHECKSUM_KEY, None)
    checksums = None
    if metadata.get(VERSION_KEY) == str(FORMAT_VERSION).encode("ascii") or raw_sums is not None:
        # checked first: a damaged tag is then named as damage, not as another kind of file
        checksums = _checked_sums(raw_sums, schema.with_metadata(metadata),
                                  reader.num_record_batches, where)
    found_kind = metadata.pop(FORMAT_KEY, None)
    found_version = metadata.pop(VERSION_KEY, None)
    if found_kind is None:
        raise StateCorruptError(
            f"{where} is an Arrow IPC file without trilink's {FORMAT_KEY.decode()} tag "
            f"(written by another program; schema {schema.names}){refusal}")
    if found_kind != kind.encode("ascii"):
        raise StateCorruptError(
            f"{where} is a trilink {_shown(found_kind)} table, not a {kind!r} table (the "
            "path holds another kind of state)")
    expected = str(FORMAT_VERSION).encode("ascii")
    if found_version == _UNCHECKED_VERSION and raw_sums is not None:
        raise StateCorruptError(
            f"{where} is tagged version 1 but has a {CHECKSUM_KEY.decode()} key, which only "
            f"version {FORMAT_VERSION} files have: its version tag was damaged{_DAMAGED}")
    if found_version not in (expected, _UNCHECKED_VERSION):
        shown = "no version" if found_version is None else f"version {_shown(found_version)}"
        raise StateCorruptError(
            f"{where} is a trilink {kind!r} table of {shown}; this release reads versions "
            f"1 and {FORMAT_VERSION} (written by another release?)")
    clean = schema.with_metadata(metadata) if metadata else schema.remove_metadata()
    return StoredTable(reader, clean, where, refusal, checksums)


def _checked_sums(raw: bytes | None, schema: pa.Schema, batches: int, where: str) -> list[int]:
    """The per-batch checksums of a version-2 file, after checking its schema's;
    StateCorruptError when they are missing, malformed or do not match. O(schema size)."""
    if raw is None:
        raise StateCorruptError(
            f"{where} is tagged version {FORMAT_VERSION} but has no {CHECKSUM_KEY.decode()} key "
            f"(every version-{FORMAT_VERSION} file has one): the file was damaged{_DAMAGED}")
    try:
        sums = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        sums = None
    ok = (isinstance(sums, dict) and sums.get("algorithm") == _ALGORITHM
          and isinstance(sums.get("batches"), list) and len(sums["batches"]) == batches
          and all(_is_hex(v) for v in [sums.get("schema"), *sums["batches"]]))
    if not ok or not isinstance(sums, dict):
        raise StateCorruptError(
            f"{where} has a malformed {CHECKSUM_KEY.decode()} ({_shown(raw)}; one CRC-32 for "
            f"the schema and one for each of its {batches} record batches): the file was "
            f"damaged{_DAMAGED}")
    found = _schema_crc(schema)
    if found != int(sums["schema"], 16):
        raise StateCorruptError(
            f"{where} fails its checksum: the schema and its metadata have CRC-32 "
            f"{_hex(found)}, they were written with {sums['schema']}; the file was damaged "
            f"after it was written{_DAMAGED}")
    return [int(v, 16) for v in sums["batches"]]


def _is_hex(value: object) -> bool:
    return (isinstance(value, str) and len(value) == 8
            and all(c in "0123456789abcdef" for c in value))
