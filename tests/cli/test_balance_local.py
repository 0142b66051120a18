"""``trilink-spark balance`` without Spark: a local file is counted with Arrow, as Spark reads
it, and the scenarios are scored from their counts. Spark's own read is the reference."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from trilink_spark.cli import main, thinned
from trilink_spark.cli.inputs import check_input
from trilink_spark.cli.local_counts import local_key_counts


def run(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def scored(text: str) -> list[dict]:
    """The figures that must agree between the two reads: everything but the measurement."""
    datasets = json.loads(text)["datasets"]
    for d in datasets:
        d.pop("measured", None)
    return datasets


#: Hostile CSV bodies (after the header ``k,v``) and whether Arrow reads them as Spark does
#: (``True``) or hands them to Spark (``False``).
CSV_CASES = {
    # a doubled quote inside a quoted value: Spark keeps the raw text, quotes included
    "doubled quote": ('k,v\n"a""b",1\nc,2\n"a""b",3\n', False),
    # a quoted empty field is null, as an unquoted empty one
    "quoted empty": ('k,v\n"",1\n,2\nx,3\nx,4\n', True),
    # a byte-order mark before the header
    "bom": ("\ufeffk,v\nx,1\ny,2\nx,3\n", True),
    # numbers and words in one column: Spark infers string
    "mixed types": ("k,v\n1,1\nx,2\n2,3\n01,4\n", True),
    # whole numbers within 32 bits: int; past them: long (the hash differs by kind)
    "ints": ("".join(["k,v\n"] + [f"{i % 37},{i}\n" for i in range(300)]), True),
    "longs": ("".join(["k,v\n"] + [f"{(i % 41) * 3_000_000_000},{i}\n" for i in range(300)]),
              True),
    # a quote in the middle of an unquoted field is kept as text
    "quote mid-field": ('k,v\nab"c,1\nab"c,2\nd,3\n', True),
    # an escaped quote inside quotes reads as the quote itself
    "escaped quote": ('k,v\n"a\\"b",1\n"a\\"b",2\nc,3\n', True),
    # blank lines before the header and between rows
    "blank lines": ("\n\nk,v\nx,1\n\ny,2\nx,3\n", True),
    # a row with another field count: Spark pads it, Arrow cannot
    "short row": ("k,v\nx,1\ny\nx,3\n", False),
    # Windows line ends: the same lines for both
    "crlf": ("k,v\r\nx,1\r\ny,2\r\nx,3\r\n", True),
    "crlf with bom": ("\ufeffk,v\r\nx,1\r\n\r\ny,2\r\n", True),
    # a quoted value over two lines: Spark reads a record per line, Arrow one value
    "crlf in quotes": ('k,v\r\n"x\r\ny",1\r\nz,2\r\n', False),
    "newline in quotes": ('k,v\n"x\ny",1\nz,2\n', False),
    # a lone carriage return: Spark ends a line there, Arrow does not
    "lone cr": ("k,v\rx,1\ry,2\n", False),
}


@pytest.mark.parametrize("case", sorted(CSV_CASES))
def test_a_hostile_csv_scores_as_spark_reads_it(spark, tmp_path, case):
    body, local = CSV_CASES[case]
    path = tmp_path / "data.csv"
    path.write_bytes(body.encode())
    counts = local_key_counts(check_input(str(path), "k"), "k")
    assert (counts is not None) == local, counts
    args = ["balance", str(path), "--key", "k", "--partitions", "4", "--json"]
    plain, measured = run(args), run([*args, "--measure"])
    assert plain[0] == measured[0] == 0
    assert scored(plain[1]) == scored(measured[1])
    if counts is not None:  # the counts themselves are Spark's
        df = spark.read.option("header", "true").option("inferSchema", "true").csv(str(path))
        by = {r[0]: r[1] for r in df.groupBy("k").count().collect()}
        assert counts.nulls == by.pop(None, 0)
        assert dict(zip(counts.keys, counts.rows.tolist())) == by
        spark_kind = {"int": "int", "bigint": "long", "string": "string"}[df.dtypes[0][1]]
        assert counts.kind == spark_kind


def test_gzip_json_parquet_and_a_directory_score_as_spark_reads_them(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [(f"N{i % 53}" if i % 17 else None, i % 7) for i in range(2000)]
    gz = tmp_path / "flights.csv.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write("tailnum,dep\n" + "".join(f"{k or ''},{d}\n" for k, d in rows))
    js = tmp_path / "events.json"
    js.write_text("".join(json.dumps({"user": d * 1000, "tag": k}) + "\n" for k, d in rows))
    pdir = tmp_path / "parts"
    pdir.mkdir()
    for part in range(3):
        pq.write_table(pa.table({"id": pa.array([d + part for _, d in rows], pa.int32())}),
                       pdir / f"part-{part}.parquet")
    for path, key in ((gz, "tailnum"), (js, "user"), (js, "tag"), (pdir, "id")):
        assert local_key_counts(check_input(str(path), key), key) is not None, path
        args = ["balance", str(path), "--key", key, "--partitions", "6", "--json"]
        plain, measured = run(args), run([*args, "--measure"])
        assert plain[0] == measured[0] == 0, path
        assert scored(plain[1]) == scored(measured[1]), path
    counts = local_key_counts(check_input(str(pdir), "id"), "id")
    assert counts.kind == "int" and int(counts.rows.sum()) == 6000


def test_the_scenarios_scored_from_their_counts_are_spark_s_figures(spark):
    args = ["balance", "--records", "30000", "--keys", "500", "--partitions", "8", "--json"]
    plain, measured = run(args), run([*args, "--measure"])
    assert plain[0] == measured[0] == 0
    assert scored(plain[1]) == scored(measured[1])
    assert len(scored(plain[1])) >= 3


@pytest.mark.parametrize("payload, name, words", [
    (b"PAR1" + b"\x15\x04\x15" + bytes(200) + b"PAR1", "data.csv", "Parquet"),
    (gzip.compress(b"k,v\nx,1\n", mtime=0), "data.csv", "gzip"),
    (gzip.compress(b'{"k": 1}\n', mtime=0), "data.json", "gzip"),
], ids=["parquet-as-csv", "gzip-as-csv", "gzip-as-json"])
def test_a_file_whose_bytes_are_another_format_is_refused_by_name(tmp_path, capsys, payload,
                                                                  name, words):
    path = tmp_path / name
    path.write_bytes(payload)
    assert main(["balance", str(path), "--key", "k"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert words in err and name in err, err
    # a Parquet file named by --format csv is told by its bytes too, not listed as columns
    pq_path = tmp_path / "real.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"k": [1, 2]}), pq_path)
    assert main(["balance", str(pq_path), "--key", "k", "--format", "csv"],
                out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "is a Parquet file" in err and "its columns are" not in err, err


@pytest.mark.parametrize("body, name, fmt, words", [
    (b'{"k": "a", "v": 1}\n{"k": "b", "v": 2}\n', "data.csv", None, "pass --format json"),
    (b'{"k": "a"}\n', "data.json", "csv", "pass --format json"),
    (b"k,v\na,1\nb,2\n", "data.csv", "json", "pass --format csv"),
    (b"k,v\na,1\n", "data.json", None, "pass --format csv"),
], ids=["json-named-csv", "json-told-csv", "csv-told-json", "csv-named-json"])
def test_text_of_the_other_format_is_named_in_the_missing_key_error(tmp_path, capsys, body,
                                                                    name, fmt, words):
    path = tmp_path / name
    path.write_bytes(body)
    told = [] if fmt is None else ["--format", fmt]
    assert main(["balance", str(path), "--key", "k", *told], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "key column 'k' is not in" in err and words in err, err


def test_a_csv_header_that_is_not_json_gets_no_format_hint(tmp_path, capsys):
    path = tmp_path / "data.csv"
    path.write_bytes(b"{a},v\nx,1\n")  # braces, but not a JSON record
    assert main(["balance", str(path), "--key", "k"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "is not in" in err and "--format" not in err, err


@pytest.mark.parametrize("args, words", [
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--records", "0"], "--records must be >= 1"),
    (["--keys", "0"], "--keys must be >= 1"),
    (["--scenario", "zipf", "--zipf", "0"], "--zipf must be > 0"),
    (["--key", "k"], "--key names a column"),
    (["--format", "csv"], "--format names a column or format"),
    (["--partitions", "0"], "--partitions must be >= 1"),
    (["--partitions", "99999999999"], "--partitions must be at most 1,000,000"),
    (["--keys", "99999999999"], "--keys must be at most 10,000,000"),
    (["--scenario", "autoincrement", "--records", "99999999999"],
     "--records must be at most 10,000,000"),
    (["--sample-rate", "1.5"], "--sample-rate must be in (0, 1]"),
])
def test_bad_flags_are_refused_by_their_names(capsys, args, words):
    assert main(["balance", *args], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert words in err, err


def test_a_path_with_too_many_partitions_is_refused_before_spark(tmp_path, capsys):
    path = tmp_path / "k.csv"
    path.write_text("k\na\nb\n")
    assert main(["balance", str(path), "--key", "k", "--partitions", "99999999999"],
                out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "--partitions must be at most" in err and "spark.sql" not in err, err


def test_huge_records_keep_the_table_columns_apart(capsys):
    out = io.StringIO()
    assert main(["balance", "--scenario", "uniform", "--records", "99999999999", "--keys",
                 "10"], out=out) == 0
    row = next(line for line in out.getvalue().splitlines() if "least_count" in line)
    assert row.split()[-2:] == ["10,000,000,000", "1,666,666,666.7"], row


def test_null_keys_refused_in_flag_terms_without_spark(tmp_path, capsys):
    path = tmp_path / "nulls.csv"
    path.write_text("k,v\nx,1\n,2\n")
    assert main(["balance", str(path), "--key", "k", "--null-policy", "error"],
                out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "--null-policy error refuses them" in err and "--null-policy group" in err, err
    assert "argument null_policy" not in err and "spark.trilink" not in err, err
    code, text = run(["balance", str(path), "--key", "k", "--json"])
    assert code == 0 and json.loads(text)["datasets"][0]["null_rows"] == 1


def test_a_local_file_is_scored_without_a_jvm(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "data.csv"
    path.write_text("k,v\n" + "".join(f"u{i % 97},{i}\n" for i in range(5000)))
    root = str(Path(__file__).resolve().parents[2])
    code = (
        "import io, json, sys\n"
        "from trilink_spark.cli import main\n"
        "out = io.StringIO()\n"
        f"rc = main(['balance', {str(path)!r}, '--key', 'k', '--json'], out=out)\n"
        "print(json.dumps({'rc': rc, 'jvm': 'py4j.java_gateway' in sys.modules\n"
        "                  and __import__('pyspark').SparkContext._active_spark_context"
        " is not None, 'records': json.loads(out.getvalue())['datasets'][0]['records']}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True, env={"PYTHONPATH": root, "JAVA_HOME":
                                                        str(tmp_path / "no-java"),
                                                        "PATH": "/usr/bin:/bin"})
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"rc": 0, "jvm": False, "records": 5000}


def test_thinned_keeps_a_seeded_binomial_share_of_each_key():
    counts = {f"k{i}": 1000 + i for i in range(200)}
    half = thinned(counts, 0.5, 7)
    assert half == thinned(counts, 0.5, 7)  # seeded
    assert half != thinned(counts, 0.5, 8)
    assert set(half) <= set(counts) and all(0 < half[k] <= counts[k] for k in half)
    total, kept = sum(counts.values()), sum(half.values())
    assert abs(kept - total / 2) < 5 * (total * 0.25) ** 0.5  # within 5 sigma
    assert thinned(counts, 1.0, 7) == counts
    assert thinned({"a": 1, "b": 0}, 0.01, 3).get("b") is None  # empty keys are dropped
