"""The ``trilink-kafka`` data source: Kafka read and written from PySpark without the JVM connector.

Reading gives **exactly one Spark partition per Kafka partition, in partition order** (Spark
partition ``i`` holds Kafka partition ``i``), with the columns of Spark's own Kafka source. A
topic written by :func:`~trilink_spark.placement.ahead_key_by` therefore arrives with every key
whole on one Spark partition, which :func:`~trilink_spark.placement.keyed_by_source` declares, so
the keyed stage runs without a shuffle (Trilink paper, §4.3 (3), Figure 11 (d)).

Batch and streaming reads are supported. A stream's offsets are per-partition Kafka offsets
(``{"topic": {"0": 120, "1": 97}}``) kept in Spark's checkpoint, so a restarted query resumes
where it stopped, without loss or duplicates. Writing honours the ``partition`` column.

A running stream fetches the topic's metadata on every trigger, so a topic deleted and
re-created while the query runs is noticed at the next trigger: another partition count stops
the query with :class:`~trilink_spark.errors.PartitionCountError`; the same count with offsets
that went backwards (the broker's latest offset below the committed one) is data loss, below.

Options (Spark's Kafka names where they exist): ``kafka.bootstrap.servers``, ``subscribe`` (or
``topic``), ``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger`` and
``maxOffsetsPerTriggerPath`` (Spark >= 4.2),
``numPartitions`` (refuse a topic with another partition count), ``timeoutMs``,
``failOnDataLoss`` (default true). ``failOnDataLoss`` covers, as in Spark's Kafka source,
(a) offsets the broker no longer holds (deleted by retention) and (b) a stream's offsets that
went backwards (topic deleted and re-created, broker that lost its data). When true, both stop
the query with :class:`~trilink_spark.errors.DataLossError` naming the topic, the partition and
the offsets (for (b): the committed offset and the broker's latest). When false, a warning is
logged and (a) reads from the earliest offset still held, (b) restarts those partitions from
their earliest offset; records may then be skipped or, for a broker that lost only part of its
data, read twice. A re-created topic that already holds more records than the committed offsets
when the next trigger runs cannot be told from the old one by offsets, and is read from the
committed offsets on. See :class:`~trilink_spark.kafka.client.KafkaOptions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._internal.spark.executors import ensure_executors
from .client import SOURCE_NAME, KafkaOptions, open_consumer, open_producer, topic_partitions
from .._internal.validation import refuse_streaming

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SOURCE_NAME", "register_kafka_source", "read_kafka", "write_kafka"]


def register_kafka_source(spark: SparkSession) -> None:
    """Register ``trilink-kafka`` with ``spark`` (idempotent; :func:`read_kafka` calls it)."""
    from .datasource import KafkaDataSource

    ensure_executors(spark)  # a cluster's executors must import the package
    spark.dataSource.register(KafkaDataSource)


def read_kafka(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    *,
    streaming: bool = False,
    starting_offsets: str | None = None,
    ending_offsets: str | None = None,
    num_partitions: int | None = None,
    max_records_per_trigger: int | None = None,
    max_records_per_trigger_path: str | None = None,
    timeout_ms: int = 10_000,
    fail_on_data_loss: bool = True,
) -> DataFrame:
    """Read ``topic`` with ``trilink-kafka``: one Spark partition per Kafka partition.

    Checks the broker and the topic on the driver first, so a wrong address, a missing topic or
    a partition count other than ``num_partitions`` fails here with a typed error
    (:class:`~trilink_spark.errors.BrokerUnavailableError`,
    :class:`~trilink_spark.errors.PartitionCountError`).

    Parameters
    ----------
    max_records_per_trigger : int, optional
        ``maxOffsetsPerTrigger``: at most this many records per micro-batch (Spark reads it
        once, when the query starts).
    max_records_per_trigger_path : str, optional
        ``maxOffsetsPerTriggerPath``: a cap file read before every micro-batch; its cap, when
        set, replaces ``max_records_per_trigger`` while the query runs
        (:func:`~trilink_spark.kafka.admission.write_trigger_cap`,
        :func:`~trilink_spark.elastic.follow_trigger_cap`). Streams only.

    Returns
    -------
    pyspark.sql.DataFrame
        Columns key, value, topic, partition, offset, timestamp, timestampType, as Spark's
        Kafka source; a streaming DataFrame when ``streaming=True``.

    Notes
    -----
    Cost: no shuffle. Each task runs one consumer over its partition's offset range; records
    are decoded by kafka-python (a few microseconds each) and handed to Spark as Arrow. The
    driver asks the broker for offsets once per query (batch) or micro-batch (stream).

    Examples
    --------
    >>> from trilink_spark.kafka import read_kafka
    >>> df = read_kafka(spark, "127.0.0.1:9092", "events")  # doctest: +SKIP
    >>> df.rdd.getNumPartitions()  # one per Kafka partition  # doctest: +SKIP
    8
    """
    options: dict[str, str] = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": topic,
        "timeoutMs": str(timeout_ms),
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    for name, value in (("startingOffsets", starting_offsets), ("endingOffsets", ending_offsets),
                        ("numPartitions", num_partitions),
                        ("maxOffsetsPerTrigger", max_records_per_trigger),
                        ("maxOffsetsPerTriggerPath", max_records_per_trigger_path)):
        if value is not None:
            options[name] = str(value)
    opts = KafkaOptions.from_options(options, streaming=streaming)
    consumer = open_consumer(opts)
    try:
        topic_partitions(consumer, opts)
    finally:
        consumer.close()
    register_kafka_source(spark)
    reader = spark.readStream if streaming else spark.read
    frame: DataFrame = reader.format(SOURCE_NAME).options(**options).load()
    return frame


def write_kafka(
    df: DataFrame,
    bootstrap_servers: str,
    topic: str,
    *,
    num_partitions: int | None = None,
    timeout_ms: int = 10_000,
) -> None:
    """Append ``df`` to ``topic`` with the ``trilink-kafka`` sink.

    ``df`` has a ``value`` column and optionally ``key`` (string or binary) and ``partition``
    (e.g. from :func:`~trilink_spark.placement.ahead_key_by`), as for Spark's Kafka sink.
    The broker and the topic are checked on the driver first, as in :func:`read_kafka`: an
    unreachable broker, a missing topic or a partition count other than ``num_partitions``
    fails here with a typed error before anything is written. A ``partition`` value outside
    the topic fails the write (:class:`~trilink_spark.errors.PartitionCountError`).

    Notes
    -----
    Cost: no shuffle; each task runs one producer over its rows (Python per record, as
    kafka-python sends records one by one) and waits for every acknowledgement.

    Examples
    --------
    >>> from trilink_spark.placement import ahead_key_by
    >>> placed = ahead_key_by(orders, "customer", "modulo", 8)  # doctest: +SKIP
    >>> from trilink_spark.kafka import write_kafka
    >>> write_kafka(placed.selectExpr("CAST(customer AS STRING) AS key",
    ...                                  "CAST(amount AS STRING) AS value", "partition"),
    ...                "127.0.0.1:9092", "orders", num_partitions=8)  # doctest: +SKIP
    """
    refuse_streaming(df, "write_kafka", "it appends a bounded frame in one batch write",
                     "Write the stream with the same sink: stream.writeStream.format("
                     "'trilink-kafka').option('kafka.bootstrap.servers', servers).option('topic',"
                     " topic).option('checkpointLocation', path).start()")
    options = {"kafka.bootstrap.servers": bootstrap_servers, "topic": topic,
               "timeoutMs": str(timeout_ms)}
    if num_partitions is not None:
        options["numPartitions"] = str(num_partitions)
    producer, _ = open_producer(KafkaOptions.from_options(options, streaming=False))
    producer.close()  # the broker, the topic and its partition count are fine
    register_kafka_source(df.sparkSession)
    df.write.format(SOURCE_NAME).mode("append").options(**options).save()
