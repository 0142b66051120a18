"""Hostile pass on interval strings: ``parse_interval`` against Spark's own
``CAST(text AS INTERVAL)`` on thousands of generated strings (whitespace of every kind, signs,
fractions, huge numbers, abbreviations, prefixes, unicode), and ``delay_in_units`` on bad input.

The contract checked: every string parse_interval accepts, Spark accepts with the same value
(and no months); every string Spark accepts with fixed units only (no month or year), within a
timedelta's range and at most 200 characters, parse_interval accepts with the same value; every
refusal is a typed ``InvalidArgumentError``.
"""

from __future__ import annotations

import math
import random
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.eventtime import delay_in_units, parse_interval

# each pool: (usual choices, hostile choices); a hostile one is drawn 7% of the time
SPACES = ([" ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f"], ["\u00a0", "\u2003", ""])
EDGES = (["", " ", "\t\n", "\x00", "\x01", "\x7f", "\x1f"], ["\u00a0", "x", "'"])
SIGNS = (["", "", "", "+", "-", "- ", "+\t"], ["--", "+-", "-+"])
NUMBERS = (["0", "1", "7", "10", "00001", "59", "999", "2147483647", "2147483648", "306783378",
            "106751991", "106751992", "2562047788", "2562047789", "153722867280",
            "153722867281", "9223372036854775", "9223372036854775807", "1.5", ".5", "1.",
            "0.0000005", "1.0000005", "1.123456789", "1.9999999", "0.000001", "12.000000"],
           ["9223372036854775808", "99999999999999999999", ".", "1.1234567891", "1e3", "0x10",
            "1_000", "1,5", "\uff11", "\u0661", "5.5.5", "-", ""])
UNITS = (["week", "weeks", "day", "days", "hour", "hours", "minute", "minutes", "second",
          "seconds", "second", "seconds", "millisecond", "milliseconds", "microsecond",
          "microseconds", "SECOND", "Minutes", "dAyS"],
         ["month", "months", "year", "YEARS", "nanosecond", "nanoseconds", "sec", "secs", "s",
          "ms", "us", "min", "hr", "h", "d", "w", "secondss", "fortnight", "second,",
          "seconds;", "secondes", "mins", "microsecondss"])
PREFIXES = (["", "", "", "interval ", "INTERVAL ", "Interval\t", "interval  "],
            ["interval", "intervalx ", "interval interval ", "'"])


def _pick(rng: random.Random, pool: tuple[list[str], list[str]]) -> str:
    return rng.choice(pool[1] if rng.random() < 0.07 else pool[0])


def _generated(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = set()
    while len(out) < count:
        parts = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            parts.append(_pick(rng, SIGNS) + _pick(rng, NUMBERS) + _pick(rng, SPACES)
                         + _pick(rng, UNITS))
        text = _pick(rng, PREFIXES) + _pick(rng, SPACES).join(parts)
        if rng.random() < 0.1:  # a random mutation: insert, delete or swap one character
            i = rng.randrange(len(text) + 1)
            what = rng.random()
            if what < 0.4:
                text = text[:i] + rng.choice("s .-+0:;,x\t") + text[i:]
            elif what < 0.8:
                text = text[:i] + text[i + 1:]
            else:
                text = text.upper()
        text = _pick(rng, EDGES) + text + _pick(rng, EDGES)
        if len(text) <= 200:
            out.add(text)
    return sorted(out)


_SPARK_PART = re.compile(r"(-?\d+(?:\.\d+)?) (years|months|days|hours|minutes|seconds)")
_MICROS = {"days": 86_400_000_000, "hours": 3_600_000_000, "minutes": 60_000_000,
           "seconds": 1_000_000}


def _spark_value(shown: str) -> tuple[int, int]:
    """(months, microseconds) of a CalendarInterval as Spark prints it ('1 days 2.5 seconds')."""
    months, micros = 0, Decimal(0)
    for number, unit in _SPARK_PART.findall(shown):
        if unit in ("years", "months"):
            months += int(number) * (12 if unit == "years" else 1)
        else:
            micros += Decimal(number) * _MICROS[unit]
    assert micros == int(micros), shown
    return months, int(micros)


def _spark_oracle(spark: Any, texts: list[str]) -> dict[str, tuple[int, int] | None]:
    """Spark's cast of each text to an interval: (months, micros), or None when refused."""
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    rows = df.selectExpr("i", "cast(try_cast(t as interval) as string) as s").collect()
    out: dict[str, tuple[int, int] | None] = {}
    for row in rows:
        out[texts[row["i"]]] = None if row["s"] is None else _spark_value(row["s"])
    return out


def _ours(text: str) -> int | None:
    try:
        got = parse_interval(text)
    except InvalidArgumentError as err:
        assert isinstance(err, ValueError) and isinstance(err, tl.TrilinkError)
        return None
    return (got.days * 86_400 + got.seconds) * 1_000_000 + got.microseconds


def _mismatches(spark: Any, texts: list[str]) -> list[str]:
    oracle = _spark_oracle(spark, texts)
    bad = []
    for text in texts:
        ours, theirs = _ours(text), oracle[text]
        if ours is not None:  # we accept: Spark must, with the same value and no months
            if theirs is None or theirs != (0, ours):
                bad.append(f"{text!r}: ours {ours}, Spark {theirs}")
        elif theirs is not None and theirs[0] == 0 and not re.search(
                r"(?i)month|year", text) and abs(theirs[1]) < timedelta.max.days * 86_400e6:
            bad.append(f"{text!r}: refused, Spark {theirs}")
    return bad


HAND_PICKED = [
    "- 1 second", "+ 1 second", "-\t1 second", "1.5 minutes", "1.5 hours", "1.5 days",
    "1.5 milliseconds", "1.5 microseconds", "1.0000005 seconds", "1.0000015 seconds",
    "1.123456789 seconds", "1.1234567891 seconds", "1.9999999 seconds", "-1.9999999 seconds",
    "-0.0000005 seconds", "0.1234575 seconds", "\uff11 second", "1\u00a0second",
    "interval1 second", "interval", "INTERVAL", "interval 1 second", "\x001 second\x00",
    "1 second\x7f", "1\x00second", "9223372036854775807 microseconds",
    "9223372036854775808 microseconds", "-9223372036854775807 microseconds",
    "-9223372036854775808 microseconds", "2562047788 hours", "2562047789 hours",
    "153722867280 minutes 54775807 microseconds", "9223372036854775807 microseconds 1 second",
    "9223372036854775807 microseconds 1 microsecond -1 microsecond", "2147483647 days",
    "-2147483648 days", "2147483648 days", "306783378 weeks", "999999999 days",
    "106751991 days 2147483647 days", "-. second", "+. seconds", ". second", "1. second",
    "1. minute", "-.5 seconds", "- .5 seconds", "1 second\n", "\n1 second", "1 secondss",
    "1 SECONDS 2 MiNuTeS", "1 seconds2 minutes", "1 second  -2 minutes", "1 second -",
    "1 hour -30 minutes", "0 seconds", "-0 seconds", "1 ms", "1 sec", "1 nanosecond",
    "1 month", "0 months", "1 year 1 second", "1 week 1 day 1 hour 1 minute 1 second 1 "
    "millisecond 1 microsecond",
]


def test_hand_picked_strings_agree_with_sparks_cast(spark: Any) -> None:
    assert _mismatches(spark, HAND_PICKED) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_generated_strings_agree_with_sparks_cast(spark: Any, seed: int) -> None:
    texts = _generated(2500, seed)
    bad = _mismatches(spark, texts)
    assert bad == [], f"{len(bad)} of {len(texts)} disagree, e.g. {bad[:10]}"
    accepted = sum(_ours(t) is not None for t in texts)
    assert 200 < accepted < len(texts) - 200  # the generator exercises both sides


def test_values_are_exact_integers_of_microseconds() -> None:
    assert parse_interval("9223372036854775807 microseconds") == \
        timedelta(microseconds=2**63 - 1)
    assert parse_interval("1.9999999 seconds") == timedelta(microseconds=1_999_999)
    assert parse_interval("-1.9999999 seconds") == -timedelta(microseconds=1_999_999)
    assert parse_interval("0.000001 seconds") == timedelta(microseconds=1)


@pytest.mark.parametrize("text, match", [
    ("1.5 minutes", "only seconds"), ("9223372036854775808 microseconds", "longest"),
    ("2147483648 days", "longest"), ("1 month", "not a fixed duration"),
    ("1.1234567891 seconds", "9 fractional digits"), ("\uff11 second", "second"),
    ("interval1 second", "not an interval string"), ("x" * 201, "at most 200"),
])
def test_refusals_say_what_was_wrong_and_what_is_allowed(text: str, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        parse_interval(text, "slot")


def test_parse_is_linear_in_the_text() -> None:
    import time

    def timed(text: str) -> float:
        start = time.perf_counter()
        for _ in range(200):
            with pytest.raises(InvalidArgumentError):
                parse_interval(text)
        return time.perf_counter() - start

    # adversarial for a backtracking regex: long runs of digits and spaces with no unit
    short, long = timed("1" * 19 + " " * 10 + "x"), timed("1" * 19 + " " * 170 + "x")
    assert long < 20 * short + 0.05


@pytest.mark.parametrize("delay", [math.nan, math.inf, -math.inf, -1, "-1 second", 1e308,
                                   np.float64("nan"), 10**400])
def test_delay_in_units_refuses_what_is_no_duration(delay: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        delay_in_units(delay, "timestamp")


@pytest.mark.parametrize("delay, kind", [(True, "timestamp"), (np.bool_(False), "integral"),
                                         ("1 second", "fractional"), (b"1 second", "timestamp"),
                                         (timedelta(seconds=1), "integral"), (None, "integral"),
                                         ([1], "timestamp")])
def test_delay_in_units_refuses_wrong_types(delay: Any, kind: str) -> None:
    with pytest.raises(InvalidArgumentTypeError) as err:
        delay_in_units(delay, kind, "delay")
    assert isinstance(err.value, TypeError) and "delay" in str(err.value)


def test_delay_in_units_strings_equal_timedeltas() -> None:
    for text, td in [("1 hour 30 minutes", timedelta(minutes=90)),
                     ("INTERVAL 2 days", timedelta(days=2)),
                     (".5 second", timedelta(milliseconds=500))]:
        assert delay_in_units(text, "timestamp") == delay_in_units(td, "timestamp")
