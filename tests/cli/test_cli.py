"""The trilink-spark command."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from trilink_spark.cli import main

SMALL = ["--records", "20000", "--keys", "400", "--partitions", "8"]


def run(args):
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def test_scenarios_json(spark):
    code, text = run(["balance", "--scenario", "skewed_records", "--scenario", "zipf", "--zipf", "1.1", "--json", "--measure", *SMALL])
    assert code == 0
    data = json.loads(text)
    assert [d["name"] for d in data["datasets"]] == ["skewed_records", "zipf(s=1.1)"]
    first = data["datasets"][0]
    names = [s["strategy"] for s in first["strategies"]]
    assert names == ["hash", "modulo", "least_key", "least_count"]
    assert first["records"] == 20000
    best = first["best"]
    # the measured Spark placement agrees with the computed one
    computed = next(s for s in first["strategies"] if s["strategy"] == best)
    assert first["measured"][best]["balance_degree"] == pytest.approx(computed["balance_degree"])
    assert first["measured"]["hash"]["balance_degree"] == pytest.approx(first["strategies"][0]["balance_degree"])


def test_table_output_and_plot(spark, tmp_path):
    png = tmp_path / "loads.png"
    code, text = run(["balance", "--scenario", "uniform", "--no-measure", "--plot", str(png), *SMALL])
    assert code == 0
    assert "uniform: 20,000 records" in text and "least_count" in text
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_kafka_default_placement(spark):
    import numpy as np

    from trilink_spark.partitioners import balance_degree, kafka_default_partition
    from trilink_spark.partitioners.choosing.scenarios import make_scenario

    code, text = run(["balance", "--scenario", "skewed_both", "--kafka", "--no-measure", "--json",
                      *SMALL])
    assert code == 0
    got = json.loads(text)["datasets"][0]["kafka_murmur2"]
    sc = make_scenario("skewed_both", 20000, 400, seed=0)
    keep = sc.counts > 0
    loads = np.bincount(kafka_default_partition(sc.keys[keep], 8), weights=sc.counts[keep],
                        minlength=8)
    assert got["balance_degree"] == pytest.approx(balance_degree(loads))
    code, text = run(["balance", "--scenario", "uniform", "--kafka", "--no-measure", *SMALL])
    assert "Kafka's default partitioner (murmur2), 8 Kafka partitions: balance" in text


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_path_input(spark, tmp_path, fmt):
    df = spark.createDataFrame([(f"u{i % 13}", i) for i in range(500)], "user string, v int")
    path = str(tmp_path / f"data.{fmt}")
    writer = df.coalesce(1).write
    if fmt == "csv":
        writer = writer.option("header", "true")
    writer.format(fmt).save(path)
    code, text = run(["balance", path, "--key", "user", "--partitions", "4", "--json", "--sample-rate", "0.5"])
    assert code == 0
    data = json.loads(text)["datasets"][0]
    assert data["records"] == 500 and data["distinct_keys"] == 13
    assert "modulo" not in [s["strategy"] for s in data["strategies"]]


def test_errors_exit_2(spark, tmp_path, capsys):
    assert run(["balance", "x.parquet"])[0] == 2
    assert "needs --key" in capsys.readouterr().err
    assert run(["balance", "--scenario", "uniform", "--partitions", "0"])[0] == 2
    assert "--partitions must be >= 1" in capsys.readouterr().err
    assert run(["balance", str(tmp_path / "data.txt"), "--key", "k"])[0] == 2
    assert "data.txt' does not exist" in capsys.readouterr().err
    (tmp_path / "data.txt").write_text("k\n1\n")
    assert run(["balance", str(tmp_path / "data.txt"), "--key", "k"])[0] == 2
    assert "--format" in capsys.readouterr().err
    assert run(["balance", str(tmp_path / "data.txt"), "--key", "k", "--format", "csv",
                "--plot", str(tmp_path / "loads.txt")])[0] == 2
    assert "matplotlib writes no .txt file; end the name in .png" in capsys.readouterr().err


def test_the_moved_ysb_command_says_where_it_went(capsys):
    assert main(["ysb", "--events", "10"]) == 2
    assert "python -m benches.ysb" in capsys.readouterr().err


# ---------------------------------------------------------------------- real files
def flights(n=600):
    """Rows of a small flights table: a skewed string key and an integer column."""
    return [{"year": 2013, "tailnum": f"N{(i * i) % 17:03d}", "delay": i % 40} for i in range(n)]


def write_csv_gz(path, rows):
    import gzip

    with gzip.open(path, "wt") as fh:
        fh.write("year,tailnum,delay\n")
        fh.writelines(f"{r['year']},{r['tailnum']},{r['delay']}\n" for r in rows)


def write_json_bz2(path, rows):
    import bz2

    with bz2.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("name", ["flights.csv.gz", "flights.json.bz2"])
def test_compressed_files_are_read_by_spark_end_to_end(spark, tmp_path, name):
    rows = flights()
    path = tmp_path / name
    (write_csv_gz if name.endswith(".gz") else write_json_bz2)(path, rows)
    code, text = run(["balance", str(path), "--key", "tailnum", "--partitions", "4", "--json",
                      "--no-measure"])
    assert code == 0
    data = json.loads(text)["datasets"][0]
    assert data["records"] == 600 and data["distinct_keys"] == len({r["tailnum"] for r in rows})
    assert data["skipped"] == {"modulo": "string keys (Modulo needs integer keys)"}
    code, text = run(["balance", str(path), "--key", "year", "--partitions", "4", "--no-measure"])
    assert code == 0 and "modulo" in text and "skipped" not in text  # integer keys: scored


def test_a_directory_of_compressed_part_files_is_told_by_its_files(spark, tmp_path):
    df = spark.createDataFrame(flights(), "year int, tailnum string, delay int")
    out = tmp_path / "flights"  # no suffix: the part files' names tell the format
    df.repartition(3).write.option("header", "true").option("compression", "gzip").csv(str(out))
    assert any(p.name.endswith(".csv.gz") for p in out.iterdir())
    code, text = run(["balance", str(out), "--key", "tailnum", "--partitions", "4",
                      "--no-measure"])
    keys = len({r["tailnum"] for r in flights()})
    assert code == 0 and f"600 records, {keys} keys" in text
    assert "modulo: skipped, string keys (Modulo needs integer keys)" in text


# A Python that runs the command with a Java that does not exist: Spark cannot start there,
# so an error that comes from the checks before Spark proves they ran first.
NO_SPARK_DRIVER = r"""
import contextlib, io, json, sys, time
from trilink_spark.cli import main
results = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(args, out=io.StringIO())
        except Exception as exc:  # noqa: BLE001 - Spark could not start
            rc = type(exc).__name__
    results.append({"rc": rc, "err": err.getvalue(), "seconds": time.perf_counter() - start})
from pyspark import SparkContext
print(json.dumps({"results": results, "context": SparkContext._active_spark_context is not None}))
"""


def test_path_format_key_and_plot_errors_come_before_spark_starts(tmp_path):
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "flights.csv.gz"
    write_csv_gz(good, flights(20))
    write_json_bz2(tmp_path / "events.json.bz2", flights(20))
    pq.write_table(pa.table({"user": ["a", "b"]}), tmp_path / "users.parquet")
    (tmp_path / "notes.txt").write_text("tailnum\nN1\n")
    (tmp_path / "plain.csv.gz").write_text("tailnum\nN1\n")  # not gzip
    (tmp_path / "frame.csv.lz4").write_bytes(
        pa.compress(b"tailnum\nN1\n", codec="lz4", asbytes=True))  # the lz4 tool's format
    (tmp_path / "empty.csv").write_text("")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.csv").write_text("tailnum\nN1\n")
    (mixed / "b.json").write_text('{"tailnum": "N1"}\n')
    cases = {
        "missing": (["balance", str(tmp_path / "nope.csv"), "--key", "k"], "does not exist"),
        "format": (["balance", str(tmp_path / "notes.txt"), "--key", "tailnum"],
                   "cannot tell the format of"),
        "csv key": (["balance", str(good), "--key", "TailNum"],
                    "key column 'TailNum' is not in"),
        "json key": (["balance", str(tmp_path / "events.json.bz2"), "--key", "user"],
                     "its columns are ['year', 'tailnum', 'delay']"),
        "parquet key": (["balance", str(tmp_path / "users.parquet"), "--key", "tailnum"],
                        "its columns are ['user']"),
        "not gzip": (["balance", str(tmp_path / "plain.csv.gz"), "--key", "tailnum"],
                     "cannot be decompressed as gzip"),
        "lz4 frame": (["balance", str(tmp_path / "frame.csv.lz4"), "--key", "tailnum"],
                      "LZ4 frame file"),
        "empty": (["balance", str(tmp_path / "empty.csv"), "--key", "tailnum"], "is empty"),
        "mixed": (["balance", str(mixed), "--key", "tailnum"], "holds csv and json files"),
        "plot": (["balance", str(good), "--key", "tailnum", "--plot",
                  str(tmp_path / "no" / "such" / "dir.png")], "cannot write into"),
        # good input is scored with Arrow: no Java needed, and none started
        "local": (["balance", str(good), "--key", "tailnum", "--no-measure"], None),
        # the control: --measure places the data with Spark, which cannot start without Java
        "spark": (["balance", str(good), "--key", "tailnum", "--measure"], None),
    }
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_HOME")}
    env["JAVA_HOME"] = str(tmp_path / "no-java")
    root = str(Path(__file__).resolve().parents[2])  # this checkout's trilink_spark
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", NO_SPARK_DRIVER, json.dumps([a for a, _ in cases.values()])],
        env=env, capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    got = dict(zip(cases, report["results"]))
    for name, (_, words) in cases.items():
        if words is None:
            continue
        assert got[name]["rc"] == 2, (name, got[name])
        err = got[name]["err"]
        assert err.startswith("trilink-spark: error: ") and err.count("\n") == 1, (name, err)
        assert words in err, (name, err)
        assert got[name]["seconds"] < 5, (name, got[name])
    assert "did you mean 'tailnum'?" in got["csv key"]["err"]
    assert "--format parquet|csv|json" in got["format"]["err"]
    # a local file is scored without a JVM; --measure reaches Spark, which cannot start
    # without Java: the checks are all that ran before it
    assert got["local"]["rc"] == 0, got["local"]
    assert got["spark"]["rc"] not in (0, 2) and not report["context"]


def test_plot_names_axes_marks_the_chosen_strategy_and_spaces_bars():
    from trilink_spark.cli import BalanceResult, _plot_figure
    from trilink_spark.partitioners.choosing.evaluation import choose_best, evaluate_strategies

    counts = {f"N{i}": 1 + (i * 37) % 11 * (50 if i < 3 else 1) for i in range(40)}
    scores = evaluate_strategies(counts, 6, key_type="string")
    res = BalanceResult("/data/deep/folder/flights.csv.gz", sum(counts.values()), len(counts),
                        sum(counts.values()), scores, choose_best(scores).name)
    fig = _plot_figure([res])
    axes = fig.axes
    assert len(axes) == len(scores)
    for ax, score in zip(axes, scores):
        title = ax.get_title()
        assert title.startswith("flights.csv.gz\n") and "/data" not in title
        assert f"{score.name}: balance {score.balance_degree:.3f}" in title
        assert title.split("\n")[1].startswith("\u2605 ") == (score.name == res.best)
        assert ax.get_xlabel() == "partition"
        widths = {round(p.get_width(), 6) for p in ax.patches}
        assert widths == {0.8}  # bars that do not touch
    assert axes[0].get_ylabel() == "records"
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---------------------------------------------------------------------- advise bounds
def advise_file(tmp_path, bad_line):
    events = [{"batchId": b, "numInputRows": 1000, "inputRowsPerSecond": 900.0,
               "durationMs": {"triggerExecution": 1100, "addBatch": 1000}} for b in range(5)]
    lines = [json.dumps(e) for e in events]
    lines[2] = bad_line
    path = tmp_path / "progress.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def event_with(field, raw):
    """Batch 2's event, with ``field`` written as the raw JSON text ``raw``."""
    event = {"batchId": 2, "numInputRows": 1000, "inputRowsPerSecond": 900.0,
             "durationMs": {"triggerExecution": 1100, "addBatch": 1000}}
    if field.startswith("durationMs."):
        event["durationMs"][field.split(".", 1)[1]] = "@"
    else:
        event[field] = "@"
    return json.dumps(event).replace('"@"', raw)


@pytest.mark.parametrize("field,raw", [
    ("durationMs.addBatch", "1e308"), ("durationMs.addBatch", "1e18"),
    ("durationMs.triggerExecution", "1e300"), ("durationMs.addBatch", "Infinity"),
    ("durationMs.addBatch", "NaN"), ("durationMs.addBatch", "-1"),
    ("durationMs.addBatch", '"slow"'), ("durationMs.addBatch", "31557600001"),
    ("numInputRows", "9223372036854775808"), ("numInputRows", "-5"), ("numInputRows", "NaN"),
    ("numInputRows", "1e308"), ("numInputRows", '"many"'),
    ("inputRowsPerSecond", "Infinity"), ("inputRowsPerSecond", "-1.5"),
    ("processedRowsPerSecond", '"fast"'),
])
def test_advise_refuses_figures_out_of_range_naming_line_and_field(tmp_path, capsys, field,
                                                                  raw):
    path = advise_file(tmp_path, event_with(field, raw))
    assert main(["advise", "--progress", path], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.startswith("trilink-spark: error: ") and err.count("\n") == 1
    assert f"progress.jsonl, line 3: progress field {field} must be" in err
    if field.startswith("durationMs."):
        assert "in [0, 31557600000] ms (a year)" in err


def test_advise_extreme_figures_within_bounds_give_capped_advice(tmp_path):
    from trilink_spark.advice.bottleneck import MAX_ADVISED_TASKS
    from trilink_spark.measurement import MAX_DURATION_MS

    year = {"triggerExecution": MAX_DURATION_MS, "addBatch": MAX_DURATION_MS}
    lines = [json.dumps({"batchId": b, "numInputRows": 1, "inputRowsPerSecond": 1e15,
                         "durationMs": year}) for b in range(5)]
    # Spark writes NaN rates for an empty batch: they count 0, not an error
    lines.append(json.dumps({"batchId": 5, "numInputRows": 0, "inputRowsPerSecond": math.nan,
                             "durationMs": year}))
    path = tmp_path / "progress.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = io.StringIO()
    assert main(["advise", "--progress", str(path), "--json"], out) == 0
    report = json.loads(out.getvalue())
    assert report["bottleneck"] == ["phase addBatch"]
    assert [n["ds2_parallelism"] for n in report["nodes"]] == [MAX_ADVISED_TASKS]
    limit = next(a for a in report["actions"] if "maxOffsetsPerTrigger" in a["setting"])
    assert limit["setting"] == "maxOffsetsPerTrigger=1"
