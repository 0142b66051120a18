"""The dashboard's feed: what a batch's progress turns into on the view."""

from __future__ import annotations

import json
import logging

import pytest

from trilink_spark.advice import BottleneckAdvisor
from trilink_spark.ui.feed import Feed
from trilink_spark.ui.model import DashboardModel


def progress_json(batch: int, rows: int) -> str:
    return json.dumps({"id": "q", "runId": "r", "name": "clicks", "batchId": batch,
                       "numInputRows": rows, "inputRowsPerSecond": 300.0,
                       "processedRowsPerSecond": 1000.0,
                       "durationMs": {"triggerExecution": 1000, "addBatch": 900}})


def test_a_stage_with_no_measured_time_still_gives_ds2_advice(
        caplog: pytest.LogCaptureFixture) -> None:
    # tiny batches: a stage whose tasks took 0 ms has an unmeasured (infinite) rate; the feed
    # shows it as "not measured" and still posts the DS2 advice beside the bottleneck's
    advisor = BottleneckAdvisor(warmup_batches=0)
    model = DashboardModel()
    feed = Feed(model, runs=[], partitioners=[], advisors=[advisor])
    with caplog.at_level(logging.WARNING, logger="trilink_spark"):
        for batch in range(3):
            advisor.observe_operator("parse", 1000, 0.0, 2)
            advisor.observe_operator("count", 1000, 2500.0, 2)
            feed.progress(progress_json(batch, 1000))
    assert not [r for r in caplog.records if r.name.startswith("trilink_spark.ui")]
    advice = model.snapshot()["advice"]
    by_source = dict(zip(advice["source"], advice["reason"]))
    assert set(by_source) == {"bottleneck", "ds2"}
    assert "parse" not in by_source["ds2"].split("rates:")[1].split(";")[0]
    assert "count 400/s" in by_source["ds2"]
    assert model.snapshot()["progress"]["batch"] == [0, 1, 2]


def test_no_stage_measured_still_gives_ds2_advice_saying_so() -> None:
    # every stage took 0 ms: no rate is finite, the advice says "not measured", nothing raises
    advisor = BottleneckAdvisor(warmup_batches=0)
    model = DashboardModel()
    feed = Feed(model, runs=[], partitioners=[], advisors=[advisor])
    for batch in range(3):
        advisor.observe_operator("parse", 1000, 0.0, 2)
        advisor.observe_operator("count", 1000, 0.0, 2)
        feed.progress(progress_json(batch, 1000))
    advice = model.snapshot()["advice"]
    by_source = dict(zip(advice["source"], advice["reason"]))
    assert by_source["ds2"].startswith("true processing rates: not measured;")
    assert "no bottleneck" in dict(zip(advice["source"], advice["advice"]))["bottleneck"]
