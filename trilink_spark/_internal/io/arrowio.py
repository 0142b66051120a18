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
footer, so a cut anywhere is seen. The schema's metadata carries the tag:

==================== ======================================================================
key                  value
==================== ======================================================================
``trilink.format``   the kind of table, as given to :func:`write_table` (``b"merge-tail"``)
``trilink.version``  :data:`FORMAT_VERSION` as ASCII digits (``b"1"``)
==================== ======================================================================

Every other metadata key of the table (for instance the ``pandas`` key that
``pyarrow.Table.from_pandas`` writes, which restores pandas dtypes) is kept as it is, and
:func:`read_table` removes the tag again: ``read_table(write_table(t, k), k, where)`` equals
``t``, schema metadata included. A kind whose columns change incompatibly takes a new kind name
(``"keyed-state.v2"``), so that an old reader refuses the new files rather than misreading them.

:func:`read_table` raises :class:`~trilink_spark.errors.StateCorruptError`, naming ``where`` and
what the bytes look like, for bytes that are empty, random, a pickle (it is not unpickled), an
Arrow IPC stream, a truncated or corrupt Arrow file, an Arrow file without the tag (another
program's) or with another kind or version. It never returns an empty table for bad bytes: "no
stored state" is the caller's ``None``, never what a reader makes of corrupt data. It cannot see a
flipped bit inside a value (no checksum): the layout (offsets, lengths, UTF-8, the footer) is
checked.

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

import re

import pyarrow as pa

from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError

__all__ = ["write_table", "read_table", "open_table", "StoredTable", "FORMAT_KEY", "VERSION_KEY", "FORMAT_VERSION"]

#: Schema metadata key of the kind tag.
FORMAT_KEY = b"trilink.format"
#: Schema metadata key of the format version.
VERSION_KEY = b"trilink.version"
#: Version of this layout (tagged IPC file); :func:`read_table` reads this version only.
FORMAT_VERSION = 1

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
        An uncompressed Arrow IPC file. The same table gives the same bytes.

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
    Cost: one copy of the table's buffers into the returned bytes, O(size).

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
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema.with_metadata(metadata)) as writer:
        for batch in _batches(table):
            writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


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
        The bytes are not an Arrow IPC file tagged ``kind`` of :data:`FORMAT_VERSION`: empty,
        random, a pickle (never unpickled), an IPC stream, truncated, corrupt (a layout that
        fails Arrow's full validation), untagged, another kind or version. The message starts
        with ``where`` and says which.
    InvalidArgumentTypeError
        ``data`` is not bytes-like, or ``kind`` or ``where`` not a str.
    InvalidArgumentError
        ``kind`` has characters :func:`write_table` refuses.

    Notes
    -----
    Nothing in the bytes is executed: Arrow IPC holds data and a schema only (and pyarrow
    before 14.0.1's pickled extension type is unregistered when this module is imported).
    Cost: zero-copy read, then one full validation pass, O(size).

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
                 refusal: str) -> None:
        self._reader = reader
        self._where = where
        self._refusal = refusal
        self.schema = schema
        self.metadata: dict[bytes, bytes] = dict(schema.metadata or {})
        self.num_batches: int = reader.num_record_batches

    def read(self, batches: list[int] | None = None) -> pa.Table:
        """The stored rows of record batches ``batches`` (all when None), in that order,
        fully validated; :class:`~trilink_spark.errors.StateCorruptError` for a corrupt layout.

        Cost: reads only those batches' bytes (plus the footer, read at open), O(their size).
        """
        picked = list(range(self.num_batches)) if batches is None else list(batches)
        for i in picked:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.num_batches:
                raise StateCorruptError(
                    f"{self._where} has {self.num_batches} record batches; batch {i!r} was "
                    "asked for (its index points past the file)")
        try:
            chunks = [self._reader.get_batch(i) for i in picked]
            # rebuilt from the batches (not replace_schema_metadata, which drops the rows of
            # a table without columns)
            result: pa.Table = pa.Table.from_batches(chunks, schema=self.schema)
            result.validate(full=True)
        except (pa.ArrowException, OSError, ValueError) as err:
            raise StateCorruptError(
                f"{self._where} is a corrupt Arrow IPC file ({type(err).__name__}: {err})"
                f"{self._refusal}") from None
        return result


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
        As :func:`read_table`, for what the file's ends, schema and tag show.

    Notes
    -----
    Cost: O(1) reads (both ends, the footer and the schema), whatever the file's size.

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
    if found_version != expected:
        shown = "no version" if found_version is None else f"version {_shown(found_version)}"
        raise StateCorruptError(
            f"{where} is a trilink {kind!r} table of {shown}; this release reads version "
            f"{FORMAT_VERSION} only (written by another release?)")
    clean = schema.with_metadata(metadata) if metadata else schema.remove_metadata()
    return StoredTable(reader, clean, where, refusal)
