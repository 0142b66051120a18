"""The example jobs in examples/ run and show the improvement they claim."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: object) -> str:
    """Import ``examples/<name>.py``, run its ``main(*args)`` and return what it printed."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.main(*args)
    return out.getvalue()


def test_balance_orders_example(spark):
    text = run_example("balance_orders")
    hash_bal = float(re.search(r"^hash .* balance ([\d.]+)$", text, re.M).group(1))
    chosen_bal = float(re.search(r"^chosen .* balance ([\d.]+)$", text, re.M).group(1))
    assert chosen_bal > hash_bal
    assert "customers: 2000 shuffles: 1" in text


def test_sensor_windows_example(spark):
    text = run_example("sensor_windows")
    first = re.search(r"late by key watermark: (\d+) late by partition watermark: (\d+)", text)
    assert first is not None and int(first.group(1)) == 0 and int(first.group(2)) > 100
    windows = re.search(r"windows (\d+) rows counted: (\d+)", text)
    assert windows is not None and int(windows.group(2)) == 1800
    stream = re.search(r"late rows (\d+) \(a single watermark: (\d+)\)", text)
    assert stream is not None and int(stream.group(1)) == 0 and int(stream.group(2)) > 0


def test_kafka_orders_example(spark, kafka_broker):
    text = run_example("kafka_orders", kafka_broker.bootstrap)
    balance = re.search(r"partitions 8 balance ([\d.]+) \(Kafka's default partitioner: ([\d.]+)\)",
                        text)
    assert balance is not None and float(balance.group(1)) > float(balance.group(2))
    assert "ahead keyBy shuffles: 0 key_by shuffles: 1 same totals: True" in text
    moved = re.search(r"rows key_by moves to another partition: (\d+)%", text)
    assert moved is not None and int(moved.group(1)) > 50


def test_rescale_stream_example(spark):
    text = run_example("rescale_stream")
    moves = re.findall(r"(\d+) -> (\d+) partitions, moved (\d+) of (\d+) users", text)
    assert [(int(a), int(b)) for a, b, _, _ in moves] == [(4, 6), (6, 3)]
    assert all(0 < int(m) < int(total) for _, _, m, total in moves)  # some users, not all
    assert "partitions [0, 1, 2] query restarted: no, counts exact: True" in text
