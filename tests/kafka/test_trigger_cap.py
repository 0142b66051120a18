"""A rows-per-trigger cap that reaches a running trilink-kafka stream: the cap file, and the
config center -> follow_trigger_cap -> stream path that apply_advice uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trilink_spark.elastic import apply_advice, follow_trigger_cap
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from trilink_spark.kafka import read_kafka, read_trigger_cap, write_trigger_cap
from trilink_spark.switching.config_center import ConfigCenter
from trilink_spark.elastic.advisor import Advice
from trilink_spark.kafka.client import KafkaOptions

from test_kafka import new_topic, produce


def test_cap_file_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "cap.json")
    assert read_trigger_cap(path) == (False, None)
    write_trigger_cap(path, 7)
    assert read_trigger_cap(path) == (True, 7)
    write_trigger_cap(path, None)
    assert read_trigger_cap(path) == (True, None)


@pytest.mark.parametrize("cap", [0, -1, 2**63, 1.5, True, "10"])
def test_bad_caps_are_refused(tmp_path: Path, cap: Any) -> None:
    path = str(tmp_path / "cap.json")
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)):
        write_trigger_cap(path, cap)
    assert read_trigger_cap(path) == (False, None)  # nothing written


@pytest.mark.parametrize("content", [
    b"", b"nope", b"[]", b'{"max_offsets_per_trigger": 5}',
    b'{"format": "trilink-trigger-cap/1", "max_offsets_per_trigger": 0}',
    b'{"format": "trilink-trigger-cap/1", "max_offsets_per_trigger": 5, "x": 1}',
    b'{"format": "trilink-trigger-cap/1", "max_offsets_per_trigger": "5"}',
    b" " * 2000,
])
def test_foreign_cap_files_are_refused_by_name(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "cap.json"
    path.write_bytes(content)
    with pytest.raises(StateCorruptError, match="cap.json"):
        read_trigger_cap(str(path))


def test_the_cap_file_is_for_streams() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t",
            "maxOffsetsPerTriggerPath": "/tmp/cap.json"}
    with pytest.raises(InvalidArgumentError, match="for streams"):
        KafkaOptions.from_options(base, streaming=False)
    assert KafkaOptions.from_options(base, streaming=True).cap_path == "/tmp/cap.json"


def test_follow_trigger_cap_writes_in_version_order(tmp_path: Path) -> None:
    path = str(tmp_path / "cap.json")
    center = ConfigCenter({"max_offsets_per_trigger": 10})
    stop = follow_trigger_cap(center, path)
    assert read_trigger_cap(path) == (True, 10)  # the current snapshot, at once
    center.publish({"max_offsets_per_trigger": 20})
    assert read_trigger_cap(path) == (True, 20)
    # a snapshot of an older version arriving late never overwrites a newer cap
    for callback in list(center._subscribers):
        callback({"version": 1, "max_offsets_per_trigger": 10})
    assert read_trigger_cap(path) == (True, 20)
    stop()
    center.publish({"max_offsets_per_trigger": 30})
    assert read_trigger_cap(path) == (True, 20)
    with pytest.raises(InvalidArgumentTypeError):
        follow_trigger_cap("not a center", path)


def test_a_running_stream_follows_the_advised_cap(spark: Any, kafka_broker: Any,
                                                  tmp_path: Path) -> None:
    topic = new_topic(kafka_broker)
    produce(kafka_broker, topic, [(i % 40, str(i).encode()) for i in range(1000)])
    path = str(tmp_path / "cap.json")
    center = ConfigCenter({"max_offsets_per_trigger": 100})
    stop = follow_trigger_cap(center, path)
    sizes: list[int] = []
    seen: list[tuple[int, int]] = []
    results: list[bool] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows = batch.select("partition", "offset").collect()
        seen.extend((r["partition"], r["offset"]) for r in rows)
        sizes.append(len(rows))
        if len(sizes) == 3:  # the advisor asks for more while the query runs
            results.append(apply_advice(None, Advice(1, 300, "raise the cap"),
                                        dry_run=False, config_center=center))
        if len(sizes) == 5:  # and lifts it: the stream's own maxOffsetsPerTrigger again
            results.append(apply_advice(None, Advice(1, None, "lift the cap"),
                                        dry_run=False, config_center=center))

    stream = read_kafka(spark, kafka_broker.bootstrap, topic, streaming=True,
                        starting_offsets="earliest", max_records_per_trigger=50,
                        max_records_per_trigger_path=path)
    query = (stream.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
        stop()
    assert results == [True, True]
    assert sizes == [100, 100, 100, 300, 300, 50, 50]
    assert len(seen) == len(set(seen)) == 1000
    assert json.loads(Path(path).read_text())["max_offsets_per_trigger"] is None
