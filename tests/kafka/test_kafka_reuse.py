"""fetch_range reuses one consumer per process, and no offset leaks from one range to the next."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from trilink_spark.kafka import client
from trilink_spark.testing import create_topic


def fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    from kafka import KafkaProducer

    create_topic(bootstrap, topic, partitions)
    producer = KafkaProducer(bootstrap_servers=[bootstrap], acks="all")
    try:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, value=f"{topic}-{p}-{i}".encode(), key=b"k", partition=p)
        producer.flush()
    finally:
        producer.close()


def read(opts: client.KafkaOptions, partition: int, start: int, end: int) -> pa.Table:
    return pa.Table.from_batches(list(client.fetch_range(opts, partition, start, end,
                                                         batch_rows=7)),
                                 schema=client._ARROW_SCHEMA)


def test_ranges_share_one_consumer_and_keep_to_their_offsets(kafka_broker: Any) -> None:
    fill(kafka_broker.bootstrap, "reuse-a", 2, 30)
    fill(kafka_broker.bootstrap, "reuse-b", 1, 5)
    opts = {t: client.KafkaOptions.from_options(
        {"kafka.bootstrap.servers": kafka_broker.bootstrap, "subscribe": t}, streaming=False)
        for t in ("reuse-a", "reuse-b")}
    client.close_cached_consumers()
    opened = client.consumers_opened
    # a range stopped early, another partition, another topic, then back: one consumer
    for topic, partition, start, end in [("reuse-a", 0, 3, 25), ("reuse-a", 1, 10, 12),
                                         ("reuse-b", 0, -2, 5), ("reuse-a", 0, 0, 30),
                                         ("reuse-a", 1, 29, 30)]:
        table = read(opts[topic], partition, start, end)
        first = 0 if start == client.EARLIEST else start
        assert table.column("offset").to_pylist() == list(range(first, end))
        assert table.column("value").to_pylist() == [f"{topic}-{partition}-{i}".encode()
                                                     for i in range(first, end)]
        assert set(table.column("partition").to_pylist()) == {partition}
        assert set(table.column("topic").to_pylist()) == {topic}
    assert client.consumers_opened == opened + 1


def test_a_range_that_fails_closes_its_consumer(kafka_broker: Any) -> None:
    fill(kafka_broker.bootstrap, "reuse-c", 1, 3)
    opts = client.KafkaOptions.from_options(
        {"kafka.bootstrap.servers": kafka_broker.bootstrap, "subscribe": "reuse-c",
         "timeoutMs": "300"}, streaming=False)
    client.close_cached_consumers()
    opened = client.consumers_opened
    # past the broker's end: tansu answers nothing (a stall), a broker may say out of range
    with pytest.raises((client.DataLossError, client.BrokerUnavailableError)):
        read(opts, 0, 10, 20)
    assert read(opts, 0, 0, 3).num_rows == 3  # a fresh consumer: the failed one was closed
    assert client.consumers_opened == opened + 2
    assert client.close_cached_consumers() == 1
