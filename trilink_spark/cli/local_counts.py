"""Key counts of a local ``balance`` input read with Arrow, without starting Spark.

Starting Spark costs seconds to tens of seconds, more than scoring the strategies on a file
that fits in memory. :func:`local_key_counts` reads the key column of a checked local input
(:class:`~trilink_spark.cli.inputs.InputCheck`) with pyarrow and counts its keys, **as Spark
would read them**, or answers ``None`` where it cannot be sure of that; the command then reads
the input with Spark as before. It reads:

- Parquet files (a file, or a directory without ``key=value`` sub-directories): the column's
  Arrow type gives the key kind Spark reads it as (int8/16/32 and uint8/16: ``int``; int64 and
  uint32: ``long``; string; binary).
- CSV (plain, ``.gz``, ``.bz2``, ``.zst``): the header as Spark names its fields
  (:func:`~trilink_spark.cli.inputs.spark_csv_header`), an empty field (quoted or not) as
  null, ``\\``
  as the escape character, and the key column's type as Spark's ``inferSchema`` gives it:
  ``int`` or ``long`` when every value is a whole number that fits, ``string`` when at least
  one value reads as no number, boolean, date or time. Any other column (decimals, dates, a
  whole number past 64 bits, a ``+`` sign) is left to Spark, whose type decides.
- JSON lines (plain, ``.gz``, ``.bz2``, ``.zst``): whole numbers are ``long``, strings
  ``string`` (as Spark's schema inference gives them); anything else, and any line pyarrow
  cannot parse (Spark keeps it as a corrupt record), is left to Spark.

Inputs over :data:`LOCAL_MAX_BYTES` on disk, more distinct keys than
:data:`~trilink_spark.partitioners.tables.table.DEFAULT_MAX_KEYS`, Hadoop's ``.lz4``,
``.snappy`` and ``.deflate`` codecs and partitioned directories go to Spark.

Every read runs on the calling thread (``use_threads=False``): Arrow's thread pool, once
started, could still be tearing down when the command's process exits, and a pool worker
alive at exit aborts the process (SIGABRT) after the answer was printed. A file small enough
for this path parses in well under a second on one thread.

Examples
--------
>>> import os, tempfile
>>> from trilink_spark.cli.inputs import check_input
>>> path = os.path.join(tempfile.mkdtemp(), "events.csv")
>>> _ = open(path, "w").write("user,v\\nann,1\\nbob,2\\nann,3\\n")
>>> got = local_key_counts(check_input(path, "user"), "user")
>>> got.kind, got.keys, got.rows.tolist(), got.nulls
('string', ['ann', 'bob'], [2, 1], 0)
"""

from __future__ import annotations

import bz2
import gzip
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .inputs import InputCheck, spark_csv_header, split_suffix

__all__ = ["LOCAL_MAX_BYTES", "LocalCounts", "local_key_counts"]

logger = logging.getLogger(__name__)

#: Largest input, in bytes on disk, read without Spark (larger inputs go to Spark).
LOCAL_MAX_BYTES = 1 << 30
#: The codecs read here (Hadoop's block formats and ``.deflate`` go to Spark).
_CODECS = (None, "gzip", "bzip2", "zstd")
#: A whole number as Spark's CSV ``inferSchema`` reads one (no sign ``+``, no blank).
_WHOLE = r"^-?[0-9]+$"
#: A value Spark's CSV inference may read as a number, boolean, date or time: a number of
#: any form, NaN or infinity, true/false, or anything that starts with a digit (dates, times).
_TYPED = (r"^\s*([+-]?([0-9].*|\.[0-9].*|nan|inf|infinity)|true|false)\s*$")
_INT32 = (-(1 << 31), (1 << 31) - 1)
#: A quoted empty field (Spark reads it as null, as an unquoted empty one).
_EMPTY_QUOTED = re.compile(rb'(?m)(?:^|(?<=,))""(?=,|$)')


@dataclass(frozen=True)
class LocalCounts:
    """The keys of a local input's key column and their rows.

    Attributes
    ----------
    kind : str
        The key kind Spark reads the column as: ``"int"``, ``"long"``, ``"string"`` or
        ``"binary"``.
    keys : list
        The distinct non-null keys (Python ``int``, ``str`` or ``bytes``).
    rows : numpy.ndarray
        Rows per key (int64), in the order of ``keys``.
    nulls : int
        Rows whose key is null.
    """

    kind: str
    keys: list[Any]
    rows: Any
    nulls: int


def local_key_counts(check: InputCheck, key: str, *, max_keys: int | None = None,
                     max_bytes: int = LOCAL_MAX_BYTES) -> LocalCounts | None:
    """Count ``key``'s values in a checked local input with Arrow, or ``None`` for Spark.

    Parameters
    ----------
    check : InputCheck
        What :func:`~trilink_spark.cli.inputs.check_input` found (its ``local_files``).
    key : str
        The key column, as Spark names it.
    max_keys : int, optional
        Most distinct keys counted here (default
        :data:`~trilink_spark.partitioners.tables.table.DEFAULT_MAX_KEYS`); more go to Spark,
        whose executors count them.
    max_bytes : int
        Largest input on disk read here.

    Returns
    -------
    LocalCounts or None
        ``None`` where Spark must read the input (see the module notes).

    Notes
    -----
    Cost: one read of the files and of the key column's values, O(rows) time, memory O(the
    largest file + distinct keys); no Spark, no JVM.
    """
    from ..partitioners.tables.table import DEFAULT_MAX_KEYS

    limit = DEFAULT_MAX_KEYS if max_keys is None else max_keys
    files = [f for f in check.local_files if os.path.getsize(f) > 0]
    if not check.key_checked or not files or check.partition_columns:
        return None
    if sum(os.path.getsize(f) for f in check.local_files) > max_bytes:
        return None
    import pyarrow as pa

    try:
        columns = [_read_column(f, check.format, key) for f in files]
    except (pa.ArrowException, ValueError, OSError, EOFError) as err:
        logger.debug("pyarrow cannot read %s as Spark does (%s): Spark reads it", files[0], err)
        return None
    if any(c is None for c in columns):
        return None
    arrays = [c for c in columns if c is not None]
    kind = _kind(arrays, check.format)
    if kind is None:
        return None
    values = pa.chunked_array([a.cast(arrays[0].type) for a in arrays]
                              if check.format != "csv" else arrays)
    if check.format == "csv" and kind in ("int", "long"):
        values = values.cast(pa.int64())
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    counted = values.value_counts()
    keys = counted.field("values")
    rows = counted.field("counts").to_numpy(zero_copy_only=False).astype(np.int64)
    present = keys.is_valid().to_numpy(zero_copy_only=False)
    nulls = int(rows[~present].sum())
    if int(present.sum()) > limit:
        return None
    kept = keys.filter(pa.array(present)).to_pylist()
    return LocalCounts(kind, kept, rows[present], nulls)


def _read_column(name: str, fmt: str, key: str) -> Any:
    """The key column of one file as an Arrow array, or ``None`` for Spark."""
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(name)
        if schema.names.count(key) != 1:
            return None  # a file without the column (Spark reads nulls) or twice: Spark
        table = pq.read_table(name, columns=[key], use_threads=False)
        return table.column(key).combine_chunks()
    codec = split_suffix(name)[1]
    if codec not in _CODECS:
        return None
    data = _decompressed(name, codec)
    if data is None:
        return None
    if fmt == "csv":
        return _csv_column(data, key)
    return _json_column(data, key)


def _decompressed(name: str, codec: str | None) -> bytes | None:
    import pyarrow as pa

    if codec is None:
        with open(name, "rb") as fh:
            return fh.read()
    if codec == "gzip":
        return gzip.decompress(open(name, "rb").read())
    if codec == "bzip2":
        return bz2.decompress(open(name, "rb").read())
    if not pa.Codec.is_available("zstd"):
        return None
    with pa.CompressedInputStream(pa.OSFile(name), "zstd") as stream:
        return bytes(stream.read())


def _csv_column(data: bytes, key: str) -> Any:
    """The key column of CSV bytes as strings, named as Spark names the header's fields."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\r" in data:
        if data.count(b"\r") != data.count(b"\r\n"):
            return None  # Spark's line reader ends a line at a lone \r; pyarrow does not
        data = data.replace(b"\r\n", b"\n")  # Windows line ends: the same lines for both
    lines = data.split(b"\n", 1)
    skipped = 0
    while lines[0].strip() == b"" and len(lines) == 2:  # Spark's header: the first line
        lines = lines[1].split(b"\n", 1)                 # that is not blank
        skipped += 1
    header = pcsv.read_csv(pa.BufferReader(lines[0] + b"\n"), read_options=pcsv.ReadOptions(
        autogenerate_column_names=True, use_threads=False), parse_options=_csv_parse()).to_pylist()
    names = spark_csv_header(["" if v is None else str(v) for v in header[0].values()]) \
        if header else []
    if names.count(key) != 1:
        return None
    index = names.index(key)
    generated = [f"c{i}" for i in range(len(names))]
    body = lines[1] if len(lines) == 2 else b""
    if b'""' in body and b'""' in _EMPTY_QUOTED.sub(b"", body):
        return None  # a doubled quote inside a value: Spark keeps the raw text, quotes too
    if not body.strip():
        return pa.array([], pa.string())
    table = pcsv.read_csv(
        pa.BufferReader(body),
        read_options=pcsv.ReadOptions(column_names=generated, block_size=1 << 24,
                                      use_threads=False),
        parse_options=_csv_parse(),
        convert_options=pcsv.ConvertOptions(
            include_columns=[generated[index]], column_types={generated[index]: pa.string()},
            null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=True))
    if b'"' in body and table.num_rows != _filled_lines(body):
        return None  # a quoted value over two lines: Spark reads a record per line
    return table.column(0).combine_chunks()


def _filled_lines(body: bytes) -> int:
    """How many lines of ``body`` hold anything (Spark's records). O(bytes): two memchr-like
    passes, and a numpy pass only where blank lines are (a line between two ``\\n``)."""
    if not body:
        return 0
    empty = int(body.startswith(b"\n")) + int(body.endswith(b"\n"))
    if b"\n\n" in body:
        newline = np.frombuffer(body, np.uint8) == ord("\n")
        empty += int(np.count_nonzero(newline[1:] & newline[:-1]))
    return body.count(b"\n") + 1 - empty


def _csv_parse() -> Any:
    import pyarrow.csv as pcsv

    # Spark's CSV defaults: quote ", escape \, a record per line. A row with another field
    # count than the header raises here (Spark's PERMISSIVE mode pads or cuts it, which
    # pyarrow cannot): Spark reads that file
    return pcsv.ParseOptions(escape_char="\\", double_quote=False, newlines_in_values=False,
                             ignore_empty_lines=True)


def _json_column(data: bytes, key: str) -> Any:
    import pyarrow as pa
    import pyarrow.json as pjson

    table = pjson.read_json(pa.BufferReader(data), read_options=pjson.ReadOptions(
        block_size=1 << 24, use_threads=False))
    if table.schema.names.count(key) != 1:
        return None
    return table.column(key).combine_chunks()


def _kind(arrays: list[Any], fmt: str) -> str | None:
    """The key kind Spark reads these values as, or ``None`` for Spark to decide."""
    import pyarrow as pa
    import pyarrow.compute as pc

    types = {a.type for a in arrays}
    if fmt != "csv":
        if len(types) != 1:
            return None
        t = types.pop()
        t = t.value_type if pa.types.is_dictionary(t) else t
        if fmt == "json":  # Spark's JSON inference: whole numbers long, text string
            if pa.types.is_int64(t):
                return "long"
            return "string" if pa.types.is_string(t) or pa.types.is_large_string(t) else None
        if t in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()):
            return "int"
        if t in (pa.int64(), pa.uint32()):
            return "long"
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return "string"
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) \
                or pa.types.is_fixed_size_binary(t):
            return "binary"
        return None
    values = pa.chunked_array(arrays, pa.string()).drop_null()
    if len(values) == 0:
        return None  # no value: Spark calls the column string; it decides
    whole = pc.match_substring_regex(values, _WHOLE)
    if pc.all(whole).as_py():
        try:
            numbers = values.cast(pa.int64())
        except pa.ArrowInvalid:
            return None  # past 64 bits: a decimal to Spark
        low, high = pc.min_max(numbers).values()
        return "int" if _INT32[0] <= low.as_py() and high.as_py() <= _INT32[1] else "long"
    typed = pc.match_substring_regex(values, _TYPED, ignore_case=True)
    return "string" if not pc.all(typed).as_py() else None
