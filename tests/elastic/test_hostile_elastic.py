"""Hostile inputs for the elastic simulator, its workloads and policies, ElasticityAdvisor and
apply_advice. Each test is named after what it protects."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import pytest

from trilink_spark import elastic as el
from trilink_spark.elastic.advisor import Advice, ElasticityAdvisor, apply_advice
from trilink_spark.elastic.model import MAX_UNITS, unit_change
from trilink_spark.elastic.workloads import MAX_WINDOWS
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError

POLICIES = [el.TA, el.KPA, el.CRAA]


def _progress(batch: int, rows: int, *, rate: float | None = None, ms: float = 500.0,
              stamp: str = "", **extra: Any) -> dict[str, Any]:
    return {"batchId": batch, "numInputRows": rows, "timestamp": stamp or f"t{batch}",
            "inputRowsPerSecond": float(rows) if rate is None else rate,
            "durationMs": {"triggerExecution": ms}, **extra}


# ---------------------------------------------------------------------- the simulator
@pytest.mark.parametrize("kw", [{"window_s": 1e-300, "duration_s": 60},
                                {"window_s": 1, "duration_s": 1e12},
                                {"window_s": "1 millisecond", "duration_s": "30 days"}])
def test_runs_beyond_max_windows_are_refused_at_once(kw: dict[str, Any]) -> None:
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="at most 1,000,000"):
        el.simulate(el.paper_operators(), el.paper_workload("step"), el.TA(), **kw)
    assert time.perf_counter() - start < 1.0


def test_a_random_workload_with_a_tiny_hold_is_a_typed_error_not_a_memory_error() -> None:
    with pytest.raises(InvalidArgumentError, match="hold_s"):
        el.simulate(el.paper_operators(), el.Workload.random(1, 5, hold_s=1e-9), el.TA(),
                    duration_s=60)
    with pytest.raises(InvalidArgumentError, match="windows must be at most"):
        el.paper_workload("step").rates(5, MAX_WINDOWS + 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_levels_near_the_float_max_are_a_typed_error(policy: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="float range"):
        el.simulate(el.paper_operators(), el.Workload.step([1e308, 0]), policy(), duration_s=60)


@pytest.mark.parametrize("make", [
    lambda: el.Operator("a", 10 ** 400, 100), lambda: el.Operator("a", 100, 10 ** 400),
    lambda: el.Workload.step([10 ** 400]), lambda: el.KalmanFilter(level_noise=10 ** 400),
    lambda: ElasticityAdvisor(trigger_interval_s=1, unit_rate=10 ** 400),
])
def test_integers_beyond_the_float_range_are_typed_errors(make: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="bits"):
        make()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5"])
def test_zero_negative_nan_buffer_sizes_and_rates_are_refused(bad: Any) -> None:
    for kw in ({"buffer_size": bad, "unit_rate": 100}, {"buffer_size": 100, "unit_rate": bad}):
        with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)):
            el.Operator("a", **kw)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_tiny_unit_rate_caps_units_instead_of_overflowing(policy: Any) -> None:
    ops = [el.Operator("a", 100, 1e-300), el.Operator("b", 1e6, 1e300)]
    res = el.simulate(ops, el.paper_workload("step"), policy(), duration_s=60)
    assert res.timeline["units"].max() <= MAX_UNITS
    assert res.per_operator.loc["a", "adjustments"] >= 1
    assert np.isfinite(res.per_operator.to_numpy(dtype=float)).all()


def test_unit_change_is_capped_at_max_units() -> None:
    assert unit_change(1e300, 1.0, 0.7, 1e-300, 1.0) == MAX_UNITS
    assert unit_change(-1e300, 1.0, 0.7, 1e-300, 1.0) == -MAX_UNITS
    assert unit_change(1500.0, 1000, 0.7, 100.0, 5.0) == 2  # the paper's example is unchanged


def test_a_duration_that_is_not_a_multiple_of_the_window_rounds_up() -> None:
    res = el.simulate(el.paper_operators(), el.paper_workload("step"), el.TA(), window_s=7,
                      duration_s=60)
    assert len(res.input_rates) == 9 and res.timeline["time_s"].max() == 56.0
    assert len(el.simulate(el.paper_operators(), el.paper_workload("step"), el.TA(),
                           window_s=100, duration_s=60).input_rates) == 1


def test_simulation_time_grows_linearly_with_the_duration() -> None:
    times = []
    for duration in (600, 6_000, 60_000):
        start = time.perf_counter()
        el.simulate(el.paper_operators(), el.paper_workload("random"), el.TA(),
                    duration_s=duration)
        times.append(time.perf_counter() - start)
    assert times[-1] < 10.0
    assert times[-1] < 40 * max(times[1], 1e-3)  # 10x the windows, well below 10x^2


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("workload", ["random", "sine", "jitter"])
def test_the_same_seed_twice_gives_identical_frames(policy: Any, workload: str) -> None:
    wl = (el.Workload.sine(5000, 2500, 100, noise=300.0) if workload == "sine"
          else el.paper_workload(workload))
    a = el.simulate(el.paper_operators(), wl, policy(), duration_s=200, seed=11)
    b = el.simulate(el.paper_operators(), wl, policy(), duration_s=200, seed=11)
    assert a.timeline.equals(b.timeline) and a.per_operator.equals(b.per_operator)
    assert np.array_equal(a.input_rates, b.input_rates)


# ---------------------------------------------------------------------- the advisor
@pytest.mark.parametrize("policy", ["craa", "kpa", "ta"])
def test_the_same_progress_event_twice_counts_once(policy: str) -> None:
    once = ElasticityAdvisor(policy, trigger_interval_s=1)
    twice = ElasticityAdvisor(policy, trigger_interval_s=1)
    events = [_progress(0, 100, ms=2000), _progress(1, 300, ms=2500)]
    for e in events:
        once.observe_progress(e)
    for e in (events[0], events[0], events[1], events[1]):
        twice.observe_progress(e)
    assert twice.last_advice == once.last_advice
    assert (twice.batches, twice.rows_over_bound, twice.lag_row_seconds) == \
        (once.batches, once.rows_over_bound, once.lag_row_seconds)
    # an idle trigger's event repeats the batch id with a new timestamp: it counts
    twice.observe_progress(_progress(1, 0, ms=0, stamp="later"))
    assert twice.batches == once.batches + 1


@pytest.mark.parametrize("policy", ["craa", "kpa", "ta"])
@pytest.mark.parametrize("case", ["huge rate", "huge backlog", "tiny busy", "tiny unit rate"])
def test_absurd_progress_gives_bounded_finite_advice(policy: str, case: str) -> None:
    adv = ElasticityAdvisor(policy, trigger_interval_s=1,
                            unit_rate=1e-300 if case == "tiny unit rate" else None)
    for b in range(4):
        extra: dict[str, Any] = {}
        if case == "huge backlog":
            extra["sources"] = [{"endOffset": {"t": {"0": 0}},
                                 "latestOffset": {"t": {"0": 2 ** 62}}}]
        advice = adv.observe_progress(_progress(
            b, 2 ** 62 if case == "tiny busy" else 1000 * (b + 1),
            rate=1.7e308 if case == "huge rate" else None,
            ms=1e-300 if case == "tiny busy" else 500.0, **extra))
        assert 1 <= advice.target_executors <= MAX_UNITS
        assert advice.max_offsets_per_trigger is None or \
            1 <= advice.max_offsets_per_trigger <= 2 ** 63 - 1
        assert math.isfinite(advice.predicted_input_rate)
        assert not math.isnan(advice.buffer_ratio)
        assert math.isfinite(adv.rows_over_bound) and math.isfinite(adv.lag_row_seconds)


@pytest.mark.parametrize("policy", ["craa", "kpa", "ta"])
def test_zero_rows_and_zero_busy_time_give_no_change(policy: str) -> None:
    adv = ElasticityAdvisor(policy, trigger_interval_s=1)
    for b, (rows, ms) in enumerate([(0, 0), (100, 0), (0, 500)]):
        advice = adv.observe_progress(_progress(b, rows, ms=ms))
        assert advice.target_executors == 1 and advice.max_offsets_per_trigger is None


def test_bad_advisor_arguments_are_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="max_units must be >= min_units"):
        ElasticityAdvisor(trigger_interval_s=1, min_units=3, max_units=2)
    with pytest.raises(InvalidArgumentError, match="unknown policy 'CRAA2'"):
        ElasticityAdvisor("CRAA2", trigger_interval_s=1)
    with pytest.raises(InvalidArgumentTypeError):
        ElasticityAdvisor(5, trigger_interval_s=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="month"):
        ElasticityAdvisor(trigger_interval_s="1 month")
    with pytest.raises(InvalidArgumentError, match="month"):
        ElasticityAdvisor(trigger_interval_s=1, latency_bound_s="2 months")
    with pytest.raises(InvalidArgumentError, match="> 0"):
        ElasticityAdvisor(trigger_interval_s="0 seconds")


# ---------------------------------------------------------------------- apply_advice
class _Context:
    """A SparkContext after ``stop()``: attributes read, the JVM gone."""

    master = "spark://host:7077"
    _jvm = None
    _jsc = None

    def getConf(self) -> dict[str, str]:
        return {"spark.dynamicAllocation.enabled": "true"}


class _Session:
    def __init__(self, sc: Any) -> None:
        self.sparkContext = sc


class _Connect:
    @property
    def sparkContext(self) -> Any:
        raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext")


def test_apply_advice_on_a_stopped_context_or_connect_returns_false_and_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    scale = Advice(3, None, "scale", current_executors=1)
    with caplog.at_level(logging.WARNING):
        assert apply_advice(_Session(_Context()), scale, dry_run=False) is False
        assert apply_advice(_Connect(), scale, dry_run=False) is False
        assert apply_advice(_Connect(), scale) is False
    assert "advice not applied" in caplog.text and "Spark Connect" in caplog.text
    assert apply_advice(_Session(_Context()), scale) is True  # a dry run asks nothing


def test_apply_advice_in_local_mode_returns_false_and_logs(
        spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert apply_advice(spark, Advice(4, None, "x", current_executors=1),
                            dry_run=False) is False
    assert "local mode" in caplog.text
