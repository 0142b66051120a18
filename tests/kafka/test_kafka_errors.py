"""The connector's failures have their own types (no bare TrilinkError)."""

from __future__ import annotations

import sys

import pytest

import trilink_spark as tl
from trilink_spark.errors import DataLossError, MissingDependencyError
from trilink_spark.kafka import client


def _opts(**extra: str) -> client.KafkaOptions:
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **extra}
    return client.KafkaOptions.from_options(options, streaming=False)


def test_missing_kafka_python_is_a_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "kafka", None)  # import kafka raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'kafka-python.*\[kafka\] extra") as info:
        client.open_consumer(_opts())
    assert isinstance(info.value, ImportError) and isinstance(info.value, tl.TrilinkError)


def test_offsets_past_retention_are_data_loss():
    with pytest.raises(DataLossError, match="t-3: offsets 5..9"):
        client.check_retention(_opts(), 3, 5, 10)
    relaxed = _opts(failOnDataLoss="false")
    assert client.check_retention(relaxed, 3, 5, 10) == 10
    assert client.check_retention(_opts(), 3, 12, 10) == 12
