"""Spark interval strings ("10 seconds") wherever a duration is taken, parsed by one function."""

from __future__ import annotations

import datetime
import sys
from datetime import timedelta
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.eventtime import INTERVAL_UNITS, delay_in_units, parse_interval

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPARK_FORMS = ["10 seconds", "1 minute", "500 milliseconds", "1 hour 30 minutes",
               "INTERVAL 2 days", "1.5 seconds", ".5 second", "1 week", "3 microseconds",
               "1 HOUR", "1 hours 1 hours", "2 days 3 hours 4 minutes 5 seconds 6 milliseconds"]


def test_parse_interval_matches_spark_on_each_form(spark: Any) -> None:
    """Spark's own cast of the string to an interval is the oracle."""
    for text in SPARK_FORMS:
        micros = spark.sql(
            "select unix_micros(timestamp'1970-01-01 00:00:00Z' + "
            f"cast('{text}' as interval)) as m").collect()[0]["m"]
        assert parse_interval(text) == timedelta(microseconds=micros), text


@pytest.mark.parametrize("text", ["", "   ", "seconds", "10", "10seconds", "10 sec", "10 s",
                                  "ten seconds", "10 seconds and more", "1 fortnight",
                                  "x 10 seconds", "1e3 seconds", "10 seconds;drop"])
def test_what_is_not_an_interval_string_is_refused_with_the_units(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="second") as err:
        parse_interval(text)
    assert isinstance(err.value, ValueError) and isinstance(err.value, tl.TrilinkError)


@pytest.mark.parametrize("text", ["1 month", "2 years", "1 year 2 days"])
def test_months_and_years_are_not_durations(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not a fixed duration"):
        parse_interval(text)


def test_long_or_non_str_input_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="characters"):
        parse_interval("1 second " * 1000)
    with pytest.raises(InvalidArgumentTypeError):
        parse_interval(10)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="longest"):
        parse_interval("99999999999999999999 weeks")


def test_units_table_is_what_the_parser_uses() -> None:
    for unit, micros in INTERVAL_UNITS.items():
        assert parse_interval(f"1 {unit}") == timedelta(microseconds=micros)
        assert parse_interval(f"2 {unit}s") == timedelta(microseconds=2 * micros)


def test_delay_in_units_takes_strings_for_timestamps_only() -> None:
    assert delay_in_units("2 seconds", "timestamp") == 2_000_000.0
    assert delay_in_units("2 seconds", "timestamp") == delay_in_units(timedelta(seconds=2),
                                                                      "timestamp")
    with pytest.raises(InvalidArgumentTypeError, match="timestamp event time"):
        delay_in_units("2 seconds", "integral")
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        delay_in_units("-1 second", "timestamp")


def _frame(spark: Any) -> Any:
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    rows = [("a", t0 + timedelta(seconds=s), float(s)) for s in (0, 5, 30, 3, 61, 62, 20)]
    rows += [("b", t0 + timedelta(seconds=s), 1.0) for s in (1, 2, 90)]
    return spark.createDataFrame(pd.DataFrame(rows, columns=["k", "ts", "v"])).coalesce(1)


def test_keyed_watermark_delay_as_a_string_equals_the_number(spark: Any) -> None:
    df = _frame(spark)
    text = tl.keyed_watermark(df, "k", "ts", "10 seconds").select("k", "ts", "is_late")
    number = tl.keyed_watermark(df, "k", "ts", 10.0).select("k", "ts", "is_late")
    assert sorted(text.collect()) == sorted(number.collect())
    assert any(r["is_late"] for r in text.collect())


def test_local_merge_slot_and_periodic_delay_as_strings(spark: Any) -> None:
    df = _frame(spark)
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    by_text = tl.local_merge(df, "k", "ts", "1 minute", aggs, mode="periodic",
                             delay="30 seconds")
    by_number = tl.local_merge(df, "k", "ts", 60.0, aggs, mode="periodic", delay=30.0)
    assert sorted(by_text.collect()) == sorted(by_number.collect())
    with pytest.raises(InvalidArgumentError, match="slot"):
        tl.local_merge(df, "k", "ts", "1 month", aggs)


def test_keyed_process_window_size_delay_and_idle_timeout_as_strings(spark: Any) -> None:
    df = _frame(spark)
    text = tl.keyed_process(df, "k", "ts", tl.KeyedWindowAggregate("1 minute", "v", ["sum"]),
                            "10 seconds", idle_timeout="2 minutes")
    number = tl.keyed_process(df, "k", "ts", tl.KeyedWindowAggregate(60.0, "v", ["sum"]),
                              10.0, idle_timeout=120.0)
    assert sorted(text.collect()) == sorted(number.collect())
    assert text.count() > 0


def test_adaptive_period_takes_interval_strings_in_code_and_config() -> None:
    from trilink_spark.switching.settings import validate_update

    ap = tl.AdaptivePartitioner(4, mode="periodic", period_s="1 minute 30 seconds")
    assert ap.to_dict()["settings"]["period_s"] == 90.0
    assert validate_update({"period_s": "500 milliseconds"})["period_s"] == 0.5
    assert validate_update({"period_s": timedelta(seconds=3)})["period_s"] == 3.0
    with pytest.raises(ConfigError, match="not a fixed duration"):
        validate_update({"period_s": "2 months"})
    with pytest.raises(ConfigError):
        validate_update({"period_s": "0 seconds"})
