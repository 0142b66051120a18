"""A topic deleted and re-created under a running ``trilink-kafka`` stream (real tansu broker).

Offsets that went backwards are data loss (``failOnDataLoss=true``) or a restart of those
partitions from their earliest offset (``false``); another partition count stops the running
query. Most tests drive :class:`KafkaStreamReader` as Spark does (initialOffset, latestOffset,
partitions, read), which is deterministic; two run a real streaming query.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trilink_spark.errors import DataLossError, PartitionCountError
from trilink_spark.kafka import register_kafka_source
from trilink_spark import kafka as tl_kafka
from trilink_spark.kafka.client import KafkaOptions
from trilink_spark.kafka.datasource import KafkaStreamReader

pytest.importorskip("kafka")

_names = itertools.count()


def _topic(broker: Any, partitions: int) -> str:
    name = f"rewind{next(_names)}-{random.randrange(1 << 30)}"
    broker.create_topic(name, partitions)
    return name


def _recreate(broker: Any, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, empty, with ``partitions`` partitions.

    A broker deletes a topic in the background (over 10 s seen with a query reading it), and a
    create sent before the deletion is done fails, or leaves the old topic in place; so it
    waits until the topic is gone from the listing, creates it, and checks its partitions,
    deleting it again while they are not the ones asked for.
    """
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=5_000)
    try:
        deadline = time.monotonic() + 60
        while True:
            if topic in admin.list_topics():
                admin.delete_topics([topic], timeout_ms=5_000)
                while topic in admin.list_topics() and time.monotonic() < deadline:
                    time.sleep(0.1)
            try:
                admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                              replication_factor=1)])
            except TopicAlreadyExistsError:
                pass
            described = admin.describe_topics([topic])
            if described and len(described[0]["partitions"]) == partitions:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"could not re-create {topic}: {described}")
            time.sleep(0.1)
    finally:
        admin.close()


def _produce(broker: Any, topic: str, partition: int, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_block_ms=5_000)
    try:
        futures = [producer.send(topic, value=v, partition=partition) for v in values]
        producer.flush(timeout=10)
        for future in futures:
            future.get(timeout=10)
    finally:
        producer.close()


def _opts(broker: Any, topic: str, **extra: str) -> KafkaOptions:
    options = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", "timeoutMs": "3000", **extra}
    return KafkaOptions.from_options(options, streaming=True)


def _all() -> Any:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return ReadAllAvailable()


def _read(reader: KafkaStreamReader, start: dict[str, Any],
          end: dict[str, Any]) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of the micro-batch ``[start, end)``, as Spark reads it."""
    rows: list[tuple[int, int, bytes]] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            data = batch.to_pydict()
            rows += zip(data["partition"], data["offset"], data["value"])
    return sorted(rows)


@pytest.fixture()
def reader_factory() -> Iterator[Any]:
    """Stream readers that are stopped (consumer closed) when the test ends."""
    readers: list[KafkaStreamReader] = []

    def make(opts: KafkaOptions) -> KafkaStreamReader:
        reader = KafkaStreamReader(opts)
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.stop()


def _first_batch(broker: Any, reader: KafkaStreamReader, topic: str) -> dict[str, Any]:
    """Ten records on each of the two partitions, read as one micro-batch; returns its end."""
    _produce(broker, topic, 0, [b"old-0-%d" % i for i in range(10)])
    _produce(broker, topic, 1, [b"old-1-%d" % i for i in range(10)])
    start = reader.initialOffset()
    end = reader.latestOffset(start, _all())
    assert end == {topic: {"0": 10, "1": 10}}
    assert len(_read(reader, start, end)) == 20
    return end


def test_stream_refuses_offsets_that_went_backwards(kafka_broker: Any,
                                                    reader_factory: Any) -> None:
    """failOnDataLoss=true (the default): a re-created topic is DataLossError, not a silent
    wait followed by skipped records."""
    topic = _topic(kafka_broker, 2)
    reader = reader_factory(_opts(kafka_broker, topic))
    committed = _first_batch(kafka_broker, reader, topic)
    _recreate(kafka_broker, topic, 2)
    _produce(kafka_broker, topic, 0, [b"new-0-%d" % i for i in range(3)])
    with pytest.raises(DataLossError) as info:
        reader.latestOffset(committed, _all())
    message = str(info.value)
    assert f"{topic}-0: committed offset 10, broker's latest 3" in message
    assert f"{topic}-1: committed offset 10, broker's latest 0" in message
    assert "failOnDataLoss=false" in message
    # a restarted query (fresh reader, same checkpoint) is refused the same way
    with pytest.raises(DataLossError, match=f"{topic}-0: committed offset 10"):
        reader_factory(_opts(kafka_broker, topic)).latestOffset(committed, _all())


def test_stream_restarts_rewound_partitions_from_earliest(kafka_broker: Any, reader_factory: Any,
                                                          caplog: Any) -> None:
    """failOnDataLoss=false: a warning, then the re-created partitions are read from their
    earliest offset, each new record once (also under maxOffsetsPerTrigger)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    topic = _topic(kafka_broker, 2)
    reader = reader_factory(_opts(kafka_broker, topic, failOnDataLoss="false"))
    committed = _first_batch(kafka_broker, reader, topic)
    _recreate(kafka_broker, topic, 2)
    _produce(kafka_broker, topic, 0, [b"new-0-%d" % i for i in range(3)])
    with caplog.at_level(logging.WARNING, logger="trilink_spark.kafka.client"):
        end = reader.latestOffset(committed, ReadMaxRows(2))
    assert end == {topic: {"0": 2, "1": 0}}  # from earliest, within the limit
    assert f"{topic}-0: committed offset 10, broker's latest 3" in caplog.text
    assert _read(reader, committed, end) == [(0, 0, b"new-0-0"), (0, 1, b"new-0-1")]
    after = reader.latestOffset(end, _all())
    assert after == {topic: {"0": 3, "1": 0}}
    assert _read(reader, end, after) == [(0, 2, b"new-0-2")]
    _produce(kafka_broker, topic, 1, [b"new-1-0"])
    last = reader.latestOffset(after, _all())
    assert _read(reader, after, last) == [(1, 0, b"new-1-0")]


def test_replayed_micro_batch_reads_the_same_records(kafka_broker: Any,
                                                     reader_factory: Any) -> None:
    """Spark replays an uncommitted micro-batch after a restart with the checkpointed start and
    end: a fresh reader reads the same records, for a rewound batch too."""
    topic = _topic(kafka_broker, 2)
    reader = reader_factory(_opts(kafka_broker, topic, failOnDataLoss="false"))
    committed = _first_batch(kafka_broker, reader, topic)
    _produce(kafka_broker, topic, 1, [b"more-1-%d" % i for i in range(4)])
    end = reader.latestOffset(committed, _all())
    planned = _read(reader, committed, end)
    assert planned == [(1, 10 + i, b"more-1-%d" % i) for i in range(4)]
    replayer = reader_factory(_opts(kafka_broker, topic, failOnDataLoss="false"))
    assert _read(replayer, committed, end) == planned  # nothing went backwards

    _recreate(kafka_broker, topic, 2)
    _produce(kafka_broker, topic, 0, [b"new-0-%d" % i for i in range(3)])
    rewound = reader.latestOffset(end, _all())
    assert rewound == {topic: {"0": 3, "1": 0}}
    want = [(0, i, b"new-0-%d" % i) for i in range(3)]
    assert _read(reader, end, rewound) == want
    replayer = reader_factory(_opts(kafka_broker, topic, failOnDataLoss="false"))
    assert _read(replayer, end, rewound) == want


def test_replayed_micro_batch_past_the_broker_is_data_loss(kafka_broker: Any,
                                                           reader_factory: Any) -> None:
    """A micro-batch planned before the topic was re-created and replayed after: DataLossError
    when it is planned (not a stalled read ending in BrokerUnavailableError), or with
    failOnDataLoss=false nothing read from it and the next batch restarting from earliest."""
    topic = _topic(kafka_broker, 2)
    reader = reader_factory(_opts(kafka_broker, topic))
    committed = _first_batch(kafka_broker, reader, topic)
    _produce(kafka_broker, topic, 0, [b"more-0-%d" % i for i in range(5)])
    end = reader.latestOffset(committed, _all())
    _recreate(kafka_broker, topic, 2)
    _produce(kafka_broker, topic, 0, [b"new-0-%d" % i for i in range(12)])
    with pytest.raises(DataLossError, match=f"{topic}-0: offsets 10..14, broker's latest 12"):
        reader_factory(_opts(kafka_broker, topic)).partitions(committed, end)

    relaxed = reader_factory(_opts(kafka_broker, topic, failOnDataLoss="false"))
    assert _read(relaxed, committed, end) == []
    after = relaxed.latestOffset(end, _all())
    assert after == {topic: {"0": 12, "1": 0}}
    assert _read(relaxed, end, after) == [(0, i, b"new-0-%d" % i) for i in range(12)]


def test_running_stream_notices_partition_count_change(kafka_broker: Any,
                                                       reader_factory: Any) -> None:
    """The metadata is fetched on every trigger: the same reader, still running, refuses the
    topic re-created with 3 partitions instead of waiting on stale metadata."""
    topic = _topic(kafka_broker, 2)
    reader = reader_factory(_opts(kafka_broker, topic))
    committed = _first_batch(kafka_broker, reader, topic)
    _recreate(kafka_broker, topic, 3)
    for p in range(3):
        _produce(kafka_broker, topic, p, [b"new-%d-%d" % (p, i) for i in range(20)])
    with pytest.raises(PartitionCountError, match="went from 2 to 3 partitions"):
        reader.latestOffset(committed, _all())


def _query(spark: Any, broker: Any, topic: str, checkpoint: Path, seen: list[bytes],
           **options: str) -> Any:
    stream = (spark.readStream.format(tl_kafka.SOURCE_NAME)
              .option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("timeoutMs", "5000")
              .options(**options).load())

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend(r["value"] for r in batch.select("value").collect())

    return (stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint)).start())


def test_running_query_fails_on_partition_count_change(spark: Any, kafka_broker: Any,
                                                       tmp_path: Path) -> None:
    topic = _topic(kafka_broker, 2)
    _produce(kafka_broker, topic, 0, [b"old-%d" % i for i in range(10)])
    register_kafka_source(spark)
    seen: list[bytes] = []
    query = _query(spark, kafka_broker, topic, tmp_path / "checkpoint", seen)
    try:
        query.processAllAvailable()
        assert len(seen) == 10
        _recreate(kafka_broker, topic, 3)
        _produce(kafka_broker, topic, 2, [b"new-%d" % i for i in range(100)])
        # the query triggers on its own: it must stop with the error (bounded wait)
        with pytest.raises(Exception, match="went from 2 to 3 partitions"):
            query.awaitTermination(60)
            pytest.fail("the query still ran after the topic was re-created")
    finally:
        query.stop()
    assert len(seen) == 10


def test_running_query_restarts_rewound_topic_from_earliest(spark: Any, kafka_broker: Any,
                                                            tmp_path: Path) -> None:
    """failOnDataLoss=false end to end: every record of the re-created topic arrives, once."""
    topic = _topic(kafka_broker, 2)
    _produce(kafka_broker, topic, 0, [b"old-%d" % i for i in range(10)])
    register_kafka_source(spark)
    seen: list[bytes] = []
    query = _query(spark, kafka_broker, topic, tmp_path / "checkpoint", seen,
                   failOnDataLoss="false")
    try:
        query.processAllAvailable()
        _recreate(kafka_broker, topic, 2)
        _produce(kafka_broker, topic, 0, [b"new-%d" % i for i in range(4)])
        deadline = time.monotonic() + 60  # a trigger may start before the records are in
        while len(seen) < 14 and query.isActive and time.monotonic() < deadline:
            time.sleep(0.1)
        query.processAllAvailable()  # raises if the query failed
    finally:
        query.stop()
    assert sorted(seen) == sorted([b"old-%d" % i for i in range(10)]
                                  + [b"new-%d" % i for i in range(4)])
