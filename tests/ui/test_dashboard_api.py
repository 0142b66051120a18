"""``tl.dashboard`` and ``trilink-spark report`` as a user calls them: arguments, lifecycle,
what the feed reads from runs, partitioners and Spark's listener, classic and Connect."""

from __future__ import annotations

import io
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

pytest.importorskip("bokeh", reason="the [ui] extra (Bokeh) is not installed")

import trilink_spark as tl  # noqa: E402
from trilink_spark.cli import main  # noqa: E402
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError  # noqa: E402
from trilink_spark.keyed.records.history import read_history  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def clicks(b: int, rows: int = 600) -> pd.DataFrame:
    rng = np.random.default_rng(b)
    user = np.where(rng.random(rows) < 0.4, 0, rng.integers(1, 60, rows))
    return pd.DataFrame({"user": [f"u{u:03d}" for u in user],
                         "ts": np.arange(b * rows, (b + 1) * rows, dtype=np.int64),
                         "v": np.ones(rows)})


def make_run(path: Path, **kw: Any) -> Any:
    return tl.keyed_foreach_batch(lambda df, b: None, "user", "ts",
                                  tl.KeyedWindowAggregate(1000, value="v", aggs=("count",)),
                                  10, str(path), num_partitions=3, **kw)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bytes(reply.read())


def test_arguments_are_checked_at_the_call(tmp_path: Path) -> None:
    run = make_run(tmp_path / "state")
    with pytest.raises(InvalidArgumentError, match="history"):
        tl.dashboard(runs=[run], history=0)
    with pytest.raises(InvalidArgumentError, match="refresh"):
        tl.dashboard(runs=[run], refresh="2 hours")
    with pytest.raises(InvalidArgumentError, match="token"):
        tl.dashboard(runs=[run], host="0.0.0.0")
    with pytest.raises(InvalidArgumentError, match="share a name"):
        tl.dashboard(runs=[run, str(tmp_path / "state")])
    with pytest.raises(InvalidArgumentTypeError, match="runs must be"):
        tl.dashboard(runs=[42])
    with pytest.raises(InvalidArgumentTypeError, match="AdaptivePartitioner"):
        tl.dashboard(partitioners=[tl.HashPartitioner(4)])
    with pytest.raises(InvalidArgumentTypeError, match="advisors must be"):
        tl.dashboard(advisors=[object()])
    with pytest.raises(InvalidArgumentTypeError, match="SparkSession"):
        tl.dashboard(object())


def test_a_dashboard_follows_runs_and_partitioners_and_stops_cleanly(
        spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", strategy="least_count")
    other = make_run(tmp_path / "b")
    adaptive = tl.AdaptivePartitioner(3, sample_rate=1.0, min_sample=10)
    url = tl.dashboard(runs={"a": run, "b": other.store.path}, partitioners=[adaptive],
                       history=2, refresh=0.2)
    try:
        assert isinstance(url, str) and url.startswith("http://127.0.0.1:")
        assert repr(url) == f"Dashboard({url.url!r})"
        for b in range(4):
            run(spark.createDataFrame(clicks(b)), b)
        other(spark.createDataFrame(clicks(9)), 0)
        adaptive.observe(clicks(0)["user"].tolist())
        adaptive.decide(force=True)
        url.refresh()
        model = url.model
        assert model.runs == ["a", "b"]
        assert model.batches("a") == [2, 3]  # bounded: the newest `history` batches
        assert model.batches("b") == [0]
        page = get(url.url).decode()
        assert "<html" in page.lower() and "cdn.bokeh.org" not in page
        headline = get(url.url + "data/headline.json")
        assert b'"a"' in headline and b"least_count" in headline
        assert b"switching" in get(url.url + "data/advice.json")
        port = int(url.url.rsplit(":", 1)[1].strip("/"))
    finally:
        url.stop()
    url.stop()  # twice: nothing left to stop
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with url:  # a context manager too (stops again: a no-op)
        pass


def test_the_report_command_writes_one_self_contained_page(spark: Any,
                                                           tmp_path: Path) -> None:
    run = make_run(tmp_path / "state")
    for b in range(3):
        run(spark.createDataFrame(clicks(b)), b)
    html = tmp_path / "report.html"
    out = io.StringIO()
    assert main(["report", str(tmp_path / "state"), "--html", str(html)], out=out) == 0
    assert "batches 0..2 (3 kept)" in out.getvalue()
    text = html.read_text()
    # every asset inlined: no script or stylesheet fetched from anywhere
    assert re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)=', text) == []
    assert "u000" in text and "least_count" in text  # the hot user, the candidates
    assert main(["report", str(tmp_path / "state"), "--html", str(html), "--last", "1"],
                out=io.StringIO()) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty), "--html", str(html)], out=io.StringIO()) == 2
    assert main(["report", str(tmp_path / "state"), "--html",
                 str(tmp_path / "missing" / "r.html")], out=io.StringIO()) == 2


@pytest.mark.connect
def test_a_dashboard_follows_a_streaming_query(spark: Any, tmp_path: Path) -> None:
    """Classic and Connect: the listener's progress and the run's history (written where
    foreachBatch runs: on Connect, the server's Python process) reach the page."""
    src = tmp_path / "in"
    src.mkdir()
    for b in range(3):
        path = src / f"part-{b}.parquet"
        clicks(b).to_parquet(path)
        stamp = time.time() - 10 + b
        os.utime(path, (stamp, stamp))  # the file source takes them in this order
    run = make_run(tmp_path / "state")
    url = tl.dashboard(spark, runs={"clicks": run}, refresh=0.2)
    try:
        query = (spark.readStream.schema("user string, ts long, v double")
                 .option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.foreachBatch(run).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(120)
        assert query.exception() is None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            progress = url.model.snapshot("clicks")["progress"]
            if url.model.batches("clicks") == [0, 1, 2] and len(progress["batch"]) >= 3:
                break
            time.sleep(0.2)
        assert url.model.batches("clicks") == [0, 1, 2]
        assert sorted(progress["batch"])[:3] == [0, 1, 2]
        assert progress["input_rows"][:3] == [600, 600, 600]
        assert [r["batch"] for r in read_history(str(tmp_path / "state"))] == [0, 1, 2]
    finally:
        url.stop()


@pytest.mark.connect
def test_stopping_dashboards_while_a_query_posts_events_never_hangs(spark: Any,
                                                                    tmp_path: Path) -> None:
    """Classic and Connect: dashboards stopped while a query's progress events arrive (on
    Connect, removing a client's last listener with an event pending deadlocks PySpark,
    SPARK-59623; the dashboard keeps a do-nothing listener first). Each stop returns."""
    import threading

    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .writeStream.format("noop").trigger(processingTime="100 milliseconds")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        for _ in range(4):
            url = tl.dashboard(spark, refresh=0.2)
            time.sleep(0.3)  # a few progress events reach the listener
            stopper = threading.Thread(target=url.stop, daemon=True)
            stopper.start()
            stopper.join(30)
            assert not stopper.is_alive(), "dashboard.stop() hung removing its listener"
    finally:
        query.stop()
