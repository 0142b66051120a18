"""Hostile inputs for ``trilink-spark balance PATH --key K``: files and paths that real users
have, checked before Spark starts as Spark would then read them, and what Spark itself fails
on turned into one typed error (exit 2) instead of a Java stack trace."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trilink_spark.cli import _reads_local_files, main
from trilink_spark.cli.inputs import HEAD_BYTES, InputCheck, check_input, spark_csv_header
from trilink_spark.errors import InvalidArgumentError, MissingColumnError


def run(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(args, out=out), out.getvalue()


# ---------------------------------------------------------------------- CSV headers
@pytest.mark.parametrize("data", [b"v,k\r1,2\r3,4\r", b"v,k\r\n1,2\r\n", b"\r \rv,k\r1,2"])
def test_csv_lines_end_where_hadoop_ends_them(tmp_path: Path, data: bytes) -> None:
    # a lone \r ends a line for Spark's reader; the header was read as one line with \r in it
    path = tmp_path / "mac.csv"
    path.write_bytes(data)
    assert check_input(str(path), "k").key_checked
    with pytest.raises(MissingColumnError, match=r"its columns are \['v', 'k'\]"):
        check_input(str(path), "user")


def test_a_header_name_given_twice_is_named_as_spark_names_it(tmp_path: Path) -> None:
    # Spark's header=true renames copies (ignoring case) by position: k,K,v -> k0,K1,v
    path = tmp_path / "dup.csv"
    path.write_bytes(b"k,K,v,\n1,2,3,4\n")
    assert spark_csv_header(["k", "K", "v", ""]) == ["k0", "K1", "v", "_c3"]
    with pytest.raises(MissingColumnError,
                       match=r"names 'k' 2 times .* Spark calls the copies 'k0', 'K1'\); its "
                             r"columns are \['k0', 'K1', 'v', '_c3'\]"):
        check_input(str(path), "k")
    assert check_input(str(path), "K1").key_checked


def test_a_header_name_beyond_the_csv_field_limit_is_left_to_spark(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    path.write_bytes(b"k," + b"x" * 200_000 + b"\n1,2\n")
    assert check_input(str(path), "k") == InputCheck("csv", 1, False)


# ---------------------------------------------------------------------- JSON records
@pytest.mark.parametrize("record", [b'{"k": 1, "k": 2}', b'{"k": 1, "K": 2}',
                                    b'{"k": 1, "a": {"b": 1, "b": 2}}'])
def test_a_json_object_naming_a_field_twice_is_refused(tmp_path: Path, record: bytes) -> None:
    # Spark refuses the whole file ([COLUMN_ALREADY_EXISTS]) when it infers the schema
    path = tmp_path / "twice.json"
    path.write_bytes(b'{"k": 0}\n' + record + b"\n")
    with pytest.raises(InvalidArgumentError, match=r"twice.json', line 2: an object names "
                                                   r"'[kKb]' twice"):
        check_input(str(path), "k")


# ---------------------------------------------------------------------- nothing to count
@pytest.mark.parametrize("name,data,words", [
    ("nothing.csv.gz", gzip.compress(b"", mtime=0), "holds no header line"),
    ("blank.csv.bz2", bz2.compress(b"\n \n"), "holds no header line"),
    ("nothing.json.gz", gzip.compress(b"\n", mtime=0), "holds no record"),
    ("header.csv", b"k,v\n", "has column 'k' but no rows"),
    ("header.csv.gz", gzip.compress(b"k,v\r\n\r\n", mtime=0), "has column 'k' but no rows"),
])
def test_input_without_rows_says_so(tmp_path: Path, name: str, data: bytes, words: str) -> None:
    # before: "its columns are []", or Spark's "no keys to evaluate" after it started
    (tmp_path / name).write_bytes(data)
    with pytest.raises(InvalidArgumentError, match=words):
        check_input(str(tmp_path / name), "k")


def test_a_directory_of_header_only_files_or_a_parquet_file_of_no_rows(tmp_path: Path) -> None:
    table = tmp_path / "headers"
    table.mkdir()
    for i in range(3):
        (table / f"part-{i}.csv").write_bytes(b"k,v\n")
    with pytest.raises(InvalidArgumentError, match="has column 'k' but no rows"):
        check_input(str(table), "k")
    (table / "part-3.csv").write_bytes(b"k,v\n1,2\n")  # one file with a row is enough
    assert check_input(str(table), "k").key_checked
    pq.write_table(pa.table({"k": pa.array([], pa.int64())}), tmp_path / "none.parquet")
    with pytest.raises(InvalidArgumentError, match="has column 'k' but no rows"):
        check_input(str(tmp_path / "none.parquet"), "k")


# ---------------------------------------------------------------------- paths
def test_a_local_name_with_glob_characters_is_given_to_spark_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "dir [x] {y}"
    folder.mkdir()
    (folder / "data[1].csv").write_bytes(b"k,v\n1,2\n")
    got = check_input(str(folder / "data[1].csv"), "k")
    assert got.key_checked
    assert got.spark_path == str(folder / "data[1].csv").translate(
        {ord(c): "\\" + c for c in "[]{}"})


def test_names_hadoop_cannot_read_and_links_that_lead_nowhere(tmp_path: Path) -> None:
    (tmp_path / "a:b.csv").write_bytes(b"k\n1\n")
    with pytest.raises(InvalidArgumentError, match=r"whose name holds ':' \('a:b.csv'\)"):
        check_input(str(tmp_path / "a:b.csv"), "k")
    table = tmp_path / "table"
    table.mkdir()
    (table / "part-0.csv").write_bytes(b"k\n1\n")
    (table / "part-1:x.csv").write_bytes(b"k\n1\n")
    with pytest.raises(InvalidArgumentError, match="whose name holds ':'"):
        check_input(str(table), "k")
    (table / "part-1:x.csv").unlink()
    os.symlink(tmp_path / "gone.csv", table / "part-2.csv")  # dangling
    with pytest.raises(InvalidArgumentError, match="part-2.csv' in .* leads nowhere"):
        check_input(str(table), "k")
    os.symlink(tmp_path / "loop-b.csv", tmp_path / "loop-a.csv")
    os.symlink(tmp_path / "loop-a.csv", tmp_path / "loop-b.csv")
    with pytest.raises(InvalidArgumentError, match="symbolic link that leads nowhere"):
        check_input(str(tmp_path / "loop-a.csv"), "k")


def test_a_file_uri_is_read_as_hadoop_reads_it(tmp_path: Path) -> None:
    # Hadoop does not decode %20 in a file: URI: it names a file with '%20' in its name
    (tmp_path / "a b.csv").write_bytes(b"k\n1\n")
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        check_input(f"file://{tmp_path}/a%20b.csv", "k")
    (tmp_path / "a%20b.csv").write_bytes(b"user\n1\n")
    with pytest.raises(MissingColumnError, match=r"its columns are \['user'\]"):
        check_input(f"file://{tmp_path}/a%20b.csv", "k")


def test_paths_are_left_to_spark_when_it_does_not_read_this_machines_files(
        tmp_path: Path) -> None:
    assert _reads_local_files("local[*]", None) and _reads_local_files("yarn", "local[2]")
    assert not _reads_local_files("yarn", None)
    assert not _reads_local_files("local[*]", "sc://cluster:15002")
    # on a cluster the path is the server's (or HDFS's): not refused for missing here
    assert check_input("/user/me/events.parquet", "k", local=False) == \
        InputCheck("parquet", 0, False)
    with pytest.raises(InvalidArgumentError, match="cannot tell the format"):
        check_input("/user/me/events", "k", local=False)
    (tmp_path / "here.csv").write_bytes(b"user\n1\n")  # a local file is not what Spark reads
    assert check_input(str(tmp_path / "here.csv"), "k", local=False) == InputCheck("csv", 0, False)


# ---------------------------------------------------------------------- read by Spark
def test_what_spark_fails_on_is_one_typed_error(spark: Any, tmp_path: Path, capsys: Any) -> None:
    rows = b"".join(b"u%d,%d\n" % (i % 7, i) for i in range(2 * HEAD_BYTES // 8))
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(b"k,v\n" + rows)[:-4096])  # past what the check reads
    assert check_input(str(cut), "k").key_checked
    code, _ = run(["balance", str(cut), "--key", "k", "--no-measure"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("trilink-spark: error: Spark failed reading") and \
        "Unexpected end of input stream" in err and err.count("\n") == 1
    twice = tmp_path / "twice.json"
    # the key is in the first record; the duplicate is past what the check reads
    twice.write_bytes(b'{"k": 1}\n' + b'{"v": 1}\n' * (HEAD_BYTES // 9) + b'{"v": 1, "v": 2}\n')
    assert run(["balance", str(twice), "--key", "k", "--no-measure"])[0] == 2
    assert "COLUMN_ALREADY_EXISTS" in capsys.readouterr().err


def test_spark_reads_the_file_the_check_read(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "data[1].csv").write_bytes(b"k,v\n" + b"a,1\n" * 3)
    (tmp_path / "data1.csv").write_bytes(b"k,v\n" + b"b,1\n" * 5)  # what the glob would match
    code, text = run(["balance", str(tmp_path / "data[1].csv"), "--key", "k", "--json",
                      "--no-measure", "--partitions", "2"])
    assert code == 0 and json.loads(text)["datasets"][0]["records"] == 3
    dup = tmp_path / "dup.csv"
    dup.write_bytes(b"k,k,user.id\n" + b"".join(b"%d,1,u%d\n" % (i, i % 3) for i in range(9)))
    for key, keys in (("k0", 9), ("user.id", 3)):  # Spark's name of a copy; a dotted name
        code, text = run(["balance", str(dup), "--key", key, "--json", "--partitions", "2"])
        assert code == 0, key
        assert json.loads(text)["datasets"][0]["distinct_keys"] == keys


def test_a_parquet_key_of_a_type_balance_cannot_place_is_refused_before_spark(
        spark: Any, tmp_path: Path) -> None:
    # a double, boolean, struct ... key was refused only after Spark started; the check and
    # Spark's reading of each Parquet type agree
    from trilink_spark.placement.key_by import key_kind

    columns = {
        "i8": pa.array([1], pa.int8()), "u32": pa.array([1], pa.uint32()),
        "u64": pa.array([1], pa.uint64()), "i64": pa.array([1], pa.int64()),
        "s": pa.array(["a"]), "ls": pa.array(["a"], pa.large_string()),
        "b": pa.array([b"a"]), "fb": pa.array([b"ab"], pa.binary(2)),
        "d": pa.array(["a"]).dictionary_encode(), "f": pa.array([1.5]),
        "bo": pa.array([True]), "ts": pa.array([1], pa.timestamp("us")),
        "dec": pa.array([1], pa.decimal128(5, 0)), "st": pa.array([{"x": 1}]),
        "ar": pa.array([[1]])}
    path = tmp_path / "types.parquet"
    pq.write_table(pa.table(columns), path)
    df = spark.read.parquet(str(path))
    for name in columns:
        placeable = key_kind(df, name)[0] is not None
        if placeable:
            assert check_input(str(path), name).key_checked, name
        else:
            with pytest.raises(InvalidArgumentError, match=f"key column '{name}' of .* is .* "
                               "in its Parquet schema; balance needs int, long"):
                check_input(str(path), name)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_a_device_is_refused_without_being_opened(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        path = str(tmp_path / "in.csv")
        os.mkfifo(path)  # no writer: opening it would block
    else:
        path = "/dev/zero"  # endless bytes
    with pytest.raises(InvalidArgumentError, match="not a regular file or a directory"):
        check_input(path, "k", "csv")
