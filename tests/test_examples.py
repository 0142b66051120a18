"""The example job in examples/ runs and shows the improvement it claims."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "balance_orders.py"


def test_balance_orders_example(spark):
    spec = importlib.util.spec_from_file_location("balance_orders", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.main()
    text = out.getvalue()
    hash_bal = float(re.search(r"^hash .* balance ([\d.]+)$", text, re.M).group(1))
    chosen_bal = float(re.search(r"^chosen .* balance ([\d.]+)$", text, re.M).group(1))
    assert chosen_bal > hash_bal
    assert "customers: 2000 shuffles: 1" in text


SENSORS = Path(__file__).resolve().parent.parent / "examples" / "sensor_windows.py"


def test_sensor_windows_example(spark):
    spec = importlib.util.spec_from_file_location("sensor_windows", SENSORS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.main()
    text = out.getvalue()
    first = re.search(r"late by key watermark: (\d+) late by partition watermark: (\d+)", text)
    assert first is not None and int(first.group(1)) == 0 and int(first.group(2)) > 100
    windows = re.search(r"windows (\d+) rows counted: (\d+)", text)
    assert windows is not None and int(windows.group(2)) == 1800
    stream = re.search(r"late rows (\d+) \(a single watermark: (\d+)\)", text)
    assert stream is not None and int(stream.group(1)) == 0 and int(stream.group(2)) > 0
