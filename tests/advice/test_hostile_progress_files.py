"""Hostile progress files for ``trilink-spark advise``: fields named twice, integers longer
than Python converts, a byte order mark, and every numeric field given every odd value. Each
gives a report in strict JSON or one typed error naming the line and the field."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from trilink_spark.cli import main
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.measurement import parse_progress


def event(batch: int, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "batchId": batch, "timestamp": "2026-01-01T00:00:00.000Z", "numInputRows": 1000,
        "inputRowsPerSecond": 500.0, "processedRowsPerSecond": 400.0,
        "durationMs": {"addBatch": 1500, "getBatch": 10, "triggerExecution": 2000}}
    base.update(fields)
    return base


GOOD = [json.dumps(event(i)) for i in range(8)]


def advise(tmp_path: Path, lines: list[str], head: bytes = b"") -> tuple[int, str]:
    path = tmp_path / "progress.jsonl"
    path.write_bytes(head + "\n".join(lines).encode() + b"\n")
    out = io.StringIO()
    return main(["advise", "--progress", str(path), "--json"], out=out), out.getvalue()


def strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("line,field", [
    ('{"batchId": 9, "batchId": 10}', "batchId"),
    ('{"batchId": 9, "numInputRows": 5, "numInputRows": -5}', "numInputRows"),
    ('{"batchId": 9, "durationMs": {"addBatch": 5, "addBatch": 1e308}}', "addBatch"),
])
def test_a_field_named_twice_is_refused_by_name(tmp_path: Path, capsys: Any, line: str,
                                                field: str) -> None:
    # json keeps the last value silently: {"numInputRows": 5, "numInputRows": -5} read as -5
    with pytest.raises(InvalidArgumentError, match=f"names field '{field}' twice"):
        parse_progress(line)
    assert advise(tmp_path, GOOD + [line])[0] == 2
    assert f"line 9: progress names field '{field}' twice" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["batchId", "numInputRows", "inputRowsPerSecond",
                                   "durationMs.addBatch"])
def test_integers_longer_than_python_converts_name_the_field(field: str) -> None:
    # was: "progress is not JSON (Exceeds the limit (4300 digits) ...)", no field named
    huge = "9" * 5000
    if field.startswith("durationMs."):
        line = f'{{"batchId": 1, "durationMs": {{"addBatch": {huge}}}}}'
    else:
        line = json.dumps(event(1)).replace(f'"{field}": ', f'"{field}": {huge}, "_x": ', 1)
    with pytest.raises(InvalidArgumentError, match=rf"{field.split('.')[0]}.*an integer of "
                                                   r"5000 digits"):
        parse_progress(line)


def test_offsets_longer_than_python_converts_leave_the_backlog_unknown() -> None:
    sources = [{"endOffset": {"t": {"0": 1}}, "latestOffset": {"t": {"0": 1}}}]
    assert parse_progress(json.dumps(event(1, sources=sources))).backlog_rows == 0
    text = json.dumps(event(1, sources=sources)).replace('"latestOffset": {"t": {"0": 1}}',
                                                         '"latestOffset": {"t": {"0": '
                                                         + "9" * 5000 + "}}")
    assert parse_progress(text).backlog_rows is None  # as for any offset beyond 64 bits


def test_a_byte_order_mark_before_the_first_event_is_read(tmp_path: Path) -> None:
    # a file saved by an editor or PowerShell as "UTF-8 with BOM": refused as not JSON before
    code, text = advise(tmp_path, GOOD, head=b"\xef\xbb\xbf")
    assert code == 0 and strict(text)["events"] == 8


ODD = ["-1", "-1e308", "1e308", "Infinity", "-Infinity", "NaN", "-0.0", "1e-320", "true",
       '"5"', "[]", "{}", "null", "9" * 5000, "1" + "0" * 5000 + ".5"]


@pytest.mark.parametrize("field", ["numInputRows", "inputRowsPerSecond",
                                   "processedRowsPerSecond", "durationMs.addBatch",
                                   "durationMs.triggerExecution", "batchId"])
def test_every_numeric_field_with_every_odd_value(tmp_path: Path, capsys: Any,
                                                  field: str) -> None:
    for value in ODD:
        line = json.dumps(event(9)).replace(
            '"addBatch": 1500' if field == "durationMs.addBatch" else
            '"triggerExecution": 2000' if field == "durationMs.triggerExecution" else
            f'"{field}": {json.dumps(event(9)[field])}',
            f'"{field.split(".")[-1]}": {value}')
        code, text = advise(tmp_path, GOOD + [line])
        err = capsys.readouterr().err
        if code == 0:
            report = strict(text)
            assert report["events"] == 9
            assert all(n["ds2_parallelism"] <= 1_000_000 for n in report["nodes"])
        else:
            assert code == 2 and err.count("\n") == 1, (field, value[:20], err)
            assert f"line 9: progress" in err and field.split(".")[-1] in err, (field, err)


def test_a_progress_with_figures_per_source_only_is_summed_as_spark_does() -> None:
    # a Spark Connect query's lastProgress.json has no top-level numInputRows or rates: they
    # were read as 0, so advise reported no flow at all from such a file
    sources = [{"description": "a", "numInputRows": 30, "inputRowsPerSecond": 10.0,
                "processedRowsPerSecond": 20.0},
               {"description": "b", "numInputRows": 10, "inputRowsPerSecond": float("nan"),
                "processedRowsPerSecond": 5.0}]
    got = parse_progress({"batchId": 1, "durationMs": {"triggerExecution": 100},
                          "sources": sources})
    assert (got.input_rows, got.input_rate, got.processed_rate) == (40, 10.0, 25.0)
    sources[1]["numInputRows"] = -1
    with pytest.raises(InvalidArgumentError, match="numInputRows"):
        parse_progress({"batchId": 1, "sources": sources})
    top = parse_progress({"batchId": 1, "numInputRows": 7, "inputRowsPerSecond": 1.0,
                          "sources": [{"numInputRows": 40, "inputRowsPerSecond": 9.0}]})
    assert (top.input_rows, top.input_rate) == (7, 1.0)  # the event's own figures first


@pytest.mark.connect
def test_the_progress_of_a_query_on_this_session_is_read_whole(spark: Any,
                                                               tmp_path: Path) -> None:
    """Classic and Spark Connect: the object, its ``json`` and a file line of it."""
    source = tmp_path / "in"
    spark.range(50).selectExpr("id AS k").write.parquet(str(source))
    query = (spark.readStream.schema("k long").parquet(str(source)).writeStream
             .format("noop").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        progress = [p for p in query.recentProgress if p.numInputRows]
    finally:
        query.stop()
    assert sum(p.numInputRows for p in progress) == 50
    for p in progress:
        for form in (p, p.json):
            got = parse_progress(form)
            assert got.input_rows == p.numInputRows
            assert got.processed_rate == pytest.approx(p.processedRowsPerSecond)
            assert got.processed_rate > 0
    code, text = advise(tmp_path, [p.json for p in progress])
    assert code == 0 and strict(text)["events"] == len(progress)
