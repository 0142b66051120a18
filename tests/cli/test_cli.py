"""The trilink-spark command."""

from __future__ import annotations

import io
import json

import pytest

from trilink_spark.cli import main

SMALL = ["--records", "20000", "--keys", "400", "--partitions", "8"]


def run(args):
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def test_scenarios_json(spark):
    code, text = run(["balance", "--scenario", "skewed_records", "--scenario", "zipf", "--zipf", "1.1", "--json", *SMALL])
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
    from trilink_spark.partitioners.scenarios import make_scenario

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
    assert run(["balance", str(tmp_path / "data.txt"), "--key", "k"])[0] == 2
    assert "--format" in capsys.readouterr().err


def test_the_moved_ysb_command_says_where_it_went(capsys):
    assert main(["ysb", "--events", "10"]) == 2
    assert "python -m benches.ysb" in capsys.readouterr().err
