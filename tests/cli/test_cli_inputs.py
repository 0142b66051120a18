"""What ``trilink-spark balance`` checks of PATH, its format and the key column before Spark."""

from __future__ import annotations

import bz2
import gzip
import json
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trilink_spark.cli.inputs import HEAD_BYTES, MAX_FILES_CHECKED, InputCheck, check_input
from trilink_spark.cli.inputs import split_suffix
from trilink_spark.errors import InvalidArgumentError, MissingColumnError

HEADER = b"year,tailnum,delay\n2013,N1,5\n2013,N2,7\n"


@pytest.mark.parametrize("name,told", [
    ("flights.csv.gz", ("csv", "gzip")), ("flights.CSV.GZ", ("csv", "gzip")),
    ("events.json.bz2", ("json", "bzip2")), ("events.jsonl", ("json", None)),
    ("events.ndjson.zst", ("json", "zstd")), ("x.csv.deflate", ("csv", "deflate")),
    ("part-00000-c000.csv.lz4", ("csv", "lz4")), ("part-1.json.snappy", ("json", "snappy")),
    ("part-00000-c000.snappy.parquet", ("parquet", None)), ("data.parquet/", ("parquet", None)),
    ("notes.txt", (None, None)), ("archive.gz", (None, "gzip")), ("part-0", (None, None)),
])
def test_a_name_tells_format_and_compression(name: str, told: tuple[str | None, str | None]):
    assert split_suffix(name) == told


@pytest.mark.parametrize("codec,pack", [
    ("gz", gzip.compress), ("bz2", bz2.compress), ("deflate", zlib.compress),
    ("zst", lambda b: pa.compress(b, codec="zstd", asbytes=True)),
])
def test_the_header_of_a_compressed_csv_is_read_as_spark_would(tmp_path: Path, codec: str,
                                                               pack):
    path = tmp_path / f"flights.csv.{codec}"
    path.write_bytes(pack(HEADER))
    assert check_input(str(path), "tailnum") == InputCheck("csv", 1, True)
    with pytest.raises(MissingColumnError, match=r"did you mean 'tailnum'\?.*"
                       r"its columns are \['year', 'tailnum', 'delay'\]"):
        check_input(str(path), "TailNum")


def test_csv_header_quirks_follow_spark(tmp_path: Path):
    path = tmp_path / "quirks.csv"
    # a BOM, blank lines before the header, a quoted name with a comma, a blank name
    path.write_bytes(b"\xef\xbb\xbf\n  \n\"tail,num\",,delay\r\nx,y,z\n")
    assert check_input(str(path), "tail,num").key_checked
    assert check_input(str(path), "_c1").key_checked  # Spark's name of a blank header field
    with pytest.raises(MissingColumnError):
        check_input(str(path), "tailnum")
    long = tmp_path / "long.csv"
    long.write_bytes(b"a" * (HEAD_BYTES + 10) + b"\n1\n")
    assert check_input(str(long), "b") == InputCheck("csv", 1, False)  # left to Spark


def test_json_lines_are_searched_for_the_key_until_the_file_ends(tmp_path: Path):
    path = tmp_path / "events.json"
    lines = [{"a": 1}, {"b": 2}, "not json", [{"user": "u1"}, {"user": "u2"}]]
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    assert check_input(str(path), "user").key_checked  # a later record, in an array line
    with pytest.raises(MissingColumnError, match=r"its columns are \['a', 'b', 'user'\]"):
        check_input(str(path), "tailnum")
    big = tmp_path / "big.json.gz"
    filler = b"".join(json.dumps({"a": i}).encode() + b"\n" for i in range(HEAD_BYTES // 8))
    big.write_bytes(gzip.compress(filler + b'{"late": 1}\n'))
    # not seen in the first HEAD_BYTES, and the file goes on: Spark may still find it
    assert check_input(str(big), "late") == InputCheck("json", 1, False)


def test_parquet_schema_and_partition_directories(tmp_path: Path):
    pq.write_table(pa.table({"user": ["a"], "v": [1]}), tmp_path / "one.parquet")
    assert check_input(str(tmp_path / "one.parquet"), "user") == InputCheck("parquet", 1, True)
    with pytest.raises(MissingColumnError, match=r"its columns are \['user', 'v'\]"):
        check_input(str(tmp_path / "one.parquet"), "tailnum")
    table = tmp_path / "table"
    for day in ("2024-01-01", "2024-01-02"):
        (table / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"user": ["a"]}), table / f"day={day}" / "part-0.parquet")
    (table / "_SUCCESS").write_text("")
    (table / ".part-0.parquet.crc").write_bytes(b"crc")
    assert check_input(str(table), "day") == InputCheck("parquet", 2, True)  # a partition
    assert check_input(str(table), "user") == InputCheck("parquet", 2, True)
    with pytest.raises(MissingColumnError, match=r"its columns are \['day', 'user'\]"):
        check_input(str(table), "tailnum")
    (tmp_path / "fake.parquet").write_bytes(HEADER)
    with pytest.raises(InvalidArgumentError, match="not a Parquet file"):
        check_input(str(tmp_path / "fake.parquet"), "year")
    (tmp_path / "whole.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(InvalidArgumentError, match="Parquet compressed as a whole"):
        check_input(str(tmp_path / "whole.parquet.gz"), "year")


def test_directories_need_data_files_of_one_told_format(tmp_path: Path):
    only_hidden = tmp_path / "hidden"
    only_hidden.mkdir()
    (only_hidden / "_SUCCESS").write_text("")
    with pytest.raises(InvalidArgumentError, match="holds no data file"):
        check_input(str(only_hidden), "k")
    unnamed = tmp_path / "hive"
    unnamed.mkdir()
    (unnamed / "000000_0").write_bytes(HEADER)
    with pytest.raises(InvalidArgumentError, match="names do not tell their format"):
        check_input(str(unnamed), "tailnum")
    assert check_input(str(unnamed), "tailnum", "csv") == InputCheck("csv", 1, True)
    empty = tmp_path / "empty.csv"
    empty.mkdir()
    (empty / "part-0.csv").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="holds only empty files"):
        check_input(str(empty), "tailnum")


def test_a_csv_directory_is_refused_when_no_checked_file_has_the_key(tmp_path: Path):
    many = tmp_path / "many"
    many.mkdir()
    for i in range(MAX_FILES_CHECKED + 3):
        (many / f"part-{i:05d}.csv.gz").write_bytes(gzip.compress(b"a,b\n1,2\n"))
    with pytest.raises(MissingColumnError, match=r"its columns are \['a', 'b'\]"):
        check_input(str(many), "tailnum")
    # JSON takes its columns from every record: the unread files could have it
    js = tmp_path / "js"
    js.mkdir()
    for i in range(MAX_FILES_CHECKED + 1):
        (js / f"part-{i:05d}.json").write_text('{"a": 1}\n')
    assert check_input(str(js), "tailnum") == InputCheck("json", MAX_FILES_CHECKED + 1, False)
    (js / f"part-{MAX_FILES_CHECKED + 1:05d}.json").unlink(missing_ok=True)
    (js / f"part-{MAX_FILES_CHECKED:05d}.json").unlink()
    with pytest.raises(MissingColumnError):  # now every file was read to its end
        check_input(str(js), "tailnum")


@pytest.mark.parametrize("name,data,words", [
    ("plain.csv.gz", HEADER, "cannot be decompressed as gzip"),
    ("plain.csv.bz2", HEADER, "cannot be decompressed as bzip2"),
    ("plain.csv.deflate", HEADER, "cannot be decompressed as deflate"),
    ("plain.csv.zst", HEADER, "cannot be decompressed as zstd"),
    ("frame.csv.lz4", pa.compress(HEADER, codec="lz4", asbytes=True), "LZ4 frame file"),
    ("raw.csv.snappy", pa.compress(HEADER, codec="snappy", asbytes=True),
     "not in Hadoop's snappy block format"),
    ("cut.csv.gz", gzip.compress(HEADER, mtime=0)[:12], "cannot be decompressed as gzip"),
])
def test_files_that_are_not_what_their_name_says_are_refused(tmp_path: Path, name: str,
                                                             data: bytes, words: str):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(InvalidArgumentError, match=words):
        check_input(str(tmp_path / name), "tailnum")


def test_uris_and_globs_are_left_to_spark_but_file_uris_are_checked(tmp_path: Path):
    assert check_input("s3a://bucket/flights.csv.gz", "k") == InputCheck("csv", 0, False)
    assert check_input("hdfs://nn:8020/t/events.parquet", "k").format == "parquet"
    assert check_input(str(tmp_path / "*.json.bz2"), "k") == InputCheck("json", 0, False)
    with pytest.raises(InvalidArgumentError, match="cannot tell the format"):
        check_input("gs://bucket/table", "k")
    path = tmp_path / "flights.csv.gz"
    path.write_bytes(gzip.compress(HEADER))
    assert check_input(path.as_uri(), "tailnum") == InputCheck("csv", 1, True)
    with pytest.raises(MissingColumnError):
        check_input(path.as_uri(), "user")
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        check_input((tmp_path / "nope.csv").as_uri(), "user")


@pytest.mark.parametrize("codec", ["lz4", "snappy", "deflate", "bzip2"])
def test_what_spark_writes_compressed_is_checked(spark, tmp_path: Path, codec: str):
    df = spark.createDataFrame([(f"u{i % 5}", i) for i in range(50)], "user string, v int")
    out = tmp_path / "out"
    df.repartition(2).write.option("compression", codec).json(str(out))
    assert check_input(str(out), "user") == InputCheck("json", 2, True)
    with pytest.raises(MissingColumnError, match=r"its columns are \['user', 'v'\]"):
        check_input(str(out), "tailnum")
