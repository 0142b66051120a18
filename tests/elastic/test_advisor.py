"""ElasticityAdvisor and apply_advice: progress in, advice out, applied where the deployment allows."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from trilink_spark import elastic as el
from trilink_spark.switching.config_center import ConfigCenter
from trilink_spark.elastic.advisor import Advice, ElasticityAdvisor, apply_advice
from trilink_spark.measurement.progress import parse_progress
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError


def _progress(batch, rows, interval_s=1.0, busy_s=0.5, **extra):
    return {"batchId": batch, "numInputRows": rows, "inputRowsPerSecond": rows / interval_s,
            "processedRowsPerSecond": rows / busy_s if busy_s else 0.0,
            "durationMs": {"triggerExecution": int(busy_s * 1000)}, **extra}


def _fed(advisor, batches):
    return [advisor.observe_progress(p) for p in batches]


# ---------------------------------------------------------------------- advice
def test_a_4x_step_raises_the_target_within_two_batches():
    # 2 ms of work per row: 100 rows take 0.2 s, 400 rows 0.8 s of a 0.5 s interval
    calm = [_progress(i, 100, 0.5, 0.2) for i in range(5)]
    burst = [_progress(5 + i, 400, 0.5 + 0.3 * (i > 0), 0.8) for i in range(3)]
    advice = _fed(ElasticityAdvisor("craa", trigger_interval_s=0.5), calm + burst)
    assert [a.target_executors for a in advice[:5]] == [1] * 5
    assert max(a.target_executors for a in advice[5:7]) > 1
    assert advice[5].max_offsets_per_trigger is not None  # admission capped meanwhile
    assert "Eq." in advice[5].reason


def test_progress_forms_and_json():
    adv = ElasticityAdvisor(trigger_interval_s="1 second", unit_rate=100)
    a = adv.observe_progress(json.dumps(_progress(0, 50)))
    b = adv.observe_progress(_progress(1, 50).copy())

    class Fake:  # what StreamingQueryProgress offers: a .json property
        json = json.dumps(_progress(2, 50))

    c = adv.observe_progress(Fake())
    assert (a.batch_id, b.batch_id, c.batch_id) == (0, 1, 2)
    assert adv.batches == 3
    with pytest.raises(InvalidArgumentTypeError, match="StreamingQueryProgress, a dict"):
        adv.observe_progress(42)
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        adv.observe_progress("{nope")


def test_scale_down_when_idle_and_bounds():
    adv = ElasticityAdvisor("ta", trigger_interval_s=1, unit_rate=100, units=8, min_units=2,
                            max_units=10)
    advice = adv.observe_progress(_progress(0, 50))
    assert advice.current_executors == 8 and advice.target_executors == 2  # bounded below
    big = adv.observe_progress(_progress(1, 5000, busy_s=6.25), executors=8)
    assert big.target_executors == 10  # bounded above
    assert "bounded" in big.reason
    assert big.max_offsets_per_trigger is None  # TA does no admission control


def test_cooperative_judgement_holds_a_scale_down_while_input_rises():
    craa = ElasticityAdvisor("craa", trigger_interval_s=1, unit_rate=100, units=20)
    kpa = ElasticityAdvisor("kpa", trigger_interval_s=1, unit_rate=100, units=20)
    rising = [_progress(i, r, busy_s=0.1) for i, r in enumerate([100, 200, 300, 400])]
    a, b = _fed(craa, rising)[-1], _fed(kpa, rising)[-1]
    assert b.target_executors < 20                # KPA shrinks: predicted input < capacity
    assert a.target_executors == 20               # CRAA refuses: the input is rising
    assert "against the input trend" in a.reason


def test_data_loss_maps_to_rows_over_the_latency_bound_and_lag():
    adv = ElasticityAdvisor("craa", trigger_interval_s=1, unit_rate=100, latency_bound_s=2)
    p = _progress(0, 100, sources=[{"endOffset": {"t": {"0": 100, "1": 100}},
                                    "latestOffset": {"t": {"0": 400, "1": 300}}}])
    advice = adv.observe_progress(p)
    assert parse_progress(p).backlog_rows == 500
    assert advice.rows_over_bound == pytest.approx(500 - 2 * 100)
    assert adv.lag_row_seconds == pytest.approx(500)


def test_bad_advisor_arguments():
    with pytest.raises(InvalidArgumentError, match="trigger_interval_s is required"):
        ElasticityAdvisor("craa")
    with pytest.raises(InvalidArgumentError, match="unknown policy 'fast'"):
        ElasticityAdvisor("fast", trigger_interval_s=1)
    with pytest.raises(InvalidArgumentError, match="max_units must be >= min_units"):
        ElasticityAdvisor(trigger_interval_s=1, min_units=3, max_units=2)
    assert isinstance(ElasticityAdvisor(el.CRAA(beta=0.9), trigger_interval_s=1).policy, el.CRAA)


# ---------------------------------------------------------------------- apply_advice
def test_apply_advice_publishes_the_cap_through_a_center(caplog):
    center = ConfigCenter(validator=lambda u: dict(u))
    advice = Advice(1, 250, "test", current_executors=1)
    assert apply_advice(None, advice, dry_run=False, config_center=center)
    assert center.current()["max_offsets_per_trigger"] == 250
    lift = Advice(1, None, "test", current_executors=1)
    assert apply_advice(None, lift, dry_run=False, config_center=center)
    assert center.current()["max_offsets_per_trigger"] is None
    # the default validator knows the field and checks it
    default = ConfigCenter()
    assert apply_advice(None, advice, dry_run=False, config_center=default)
    assert default.current()["max_offsets_per_trigger"] == 250
    with caplog.at_level(logging.WARNING):
        bad = Advice(1, 0, "a cap of 0 rows", current_executors=1)
        assert not apply_advice(None, bad, dry_run=False, config_center=default)
    assert "refused" in caplog.text
    assert default.current()["max_offsets_per_trigger"] == 250
    assert not apply_advice(None, advice)  # no center: nothing can carry the cap


def test_apply_advice_never_raises():
    class Broken:
        @property
        def sparkContext(self):
            raise RuntimeError("connect")

    assert not apply_advice(Broken(), Advice(3, None, "x", current_executors=1))
    assert not apply_advice(None, "advice")
    assert apply_advice(None, Advice(1, None, "no change", current_executors=1))


# ---------------------------------------------------------------------- a real stream
def test_real_stream_step_up_and_local_mode(spark, tmp_path, caplog):
    src = tmp_path / "in"
    src.mkdir()
    sizes = [100] * 4 + [400] * 3
    now = time.time() - 100
    for i, n in enumerate(sizes):  # one file per trigger, in order of modification time
        f = src / f"part-{i:03d}.txt"
        f.write_text("".join(f"{i}-{j}\n" for j in range(n)))
        os.utime(f, (now + i, now + i))

    def slow(df, batch_id):  # 2.5 ms of work per row: capacity ~400 rows/s
        time.sleep(df.count() * 0.0025)

    query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(src))
             .writeStream.foreachBatch(slow).trigger(processingTime="0.5 seconds")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        progress = [p for p in query.recentProgress if p.numInputRows > 0]
    finally:
        query.stop()
    assert [p.numInputRows for p in progress] == sizes
    advisor = ElasticityAdvisor("craa", trigger_interval_s="0.5 seconds")
    advice = [advisor.observe_progress(p) for p in progress]
    before = advice[3].target_executors
    assert max(a.target_executors for a in advice[4:6]) > before
    step = next(a for a in advice[4:6] if a.target_executors > before)
    with caplog.at_level(logging.WARNING):
        assert apply_advice(spark, step) is False
        assert apply_advice(spark, step, dry_run=False) is False
    assert "local mode" in caplog.text
