"""The ``trilink-kafka`` sink: rows to one Kafka topic, honouring a ``partition`` column.

Batch writes (``df.write.format("trilink-kafka")``, :func:`~trilink_spark.kafka.write_kafka`) and
streaming writes (``writeStream.format("trilink-kafka")``). Like Spark's own Kafka sink, a
stream is written at least once: a micro-batch Spark replays after a failure is sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.datasource import WriterCommitMessage

from ..errors import InvalidArgumentError, PartitionCountError
from .client import KafkaOptions, open_producer

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["KafkaCommit", "KafkaArrowWriter", "KafkaStreamArrowWriter"]

logger = logging.getLogger(__name__)

_CHECK_EVERY = 10_000  # sends in flight before the writer waits for their acknowledgements


class KafkaCommit(WriterCommitMessage):
    """What one write task sent: records per partition."""

    def __init__(self, counts: dict[int, int]) -> None:
        self.counts = counts


class _KafkaSender:
    """Rows with ``value`` and optional ``key`` and ``partition`` columns, sent to one topic.

    ``key``/``value`` may be string or binary. A ``partition`` column (as
    :func:`~trilink_spark.placement.ahead_key_by` adds) is honoured; a value outside the topic's
    partitions fails the write with :class:`~trilink_spark.errors.PartitionCountError`. Without
    it, Kafka's default partitioner places the key (murmur2). Each task flushes and checks every
    acknowledgement before it reports success.
    """

    def __init__(self, opts: KafkaOptions, schema: StructType) -> None:
        names = set(schema.fieldNames())
        if "value" not in names:
            raise InvalidArgumentError("writing to Kafka needs a 'value' column")
        self.opts = opts
        self.has_key = "key" in names
        self.has_partition = "partition" in names

    def _send(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        producer, count = open_producer(self.opts)
        counts: dict[int, int] = {}
        futures = []
        try:
            for batch in iterator:
                values = _as_bytes(batch.column(batch.schema.get_field_index("value")))
                keys = (_as_bytes(batch.column(batch.schema.get_field_index("key")))
                        if self.has_key else [None] * batch.num_rows)
                parts = (batch.column(batch.schema.get_field_index("partition")).to_pylist()
                         if self.has_partition else [None] * batch.num_rows)
                self._check_partitions(batch, count)
                for key, value, part in zip(keys, values, parts):
                    futures.append(producer.send(self.opts.topic, key=key, value=value,
                                                 partition=part))
                if len(futures) >= _CHECK_EVERY:
                    self._settle(producer, futures, counts)
            self._settle(producer, futures, counts)
        finally:
            producer.close()
        return KafkaCommit(counts)

    def _check_partitions(self, batch: pa.RecordBatch, count: int) -> None:
        """Refuse a batch with a ``partition`` value outside the topic (before sending any)."""
        import pyarrow.compute as pc

        if not self.has_partition or batch.num_rows == 0:
            return
        bounds = pc.min_max(batch.column(batch.schema.get_field_index("partition")))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is not None and (low < 0 or high >= count):
            bad = low if low < 0 else high
            raise PartitionCountError(
                f"row for partition {bad}, but topic {self.opts.topic!r} has {count} "
                f"partitions (0..{count - 1}); the keys were placed for another count"
            )

    def _settle(self, producer: Any, futures: list[Any], counts: dict[int, int]) -> None:
        """Flush, then check every acknowledgement (a failed send raises here)."""
        producer.flush()
        for future in futures:
            meta = future.get(timeout=self.opts.timeout_ms / 1000)
            counts[meta.partition] = counts.get(meta.partition, 0) + 1
        futures.clear()

    def _log(self, messages: list[WriterCommitMessage | None], what: str) -> None:
        totals: dict[int, int] = {}
        for message in messages:
            if isinstance(message, KafkaCommit):
                for p, c in message.counts.items():
                    totals[p] = totals.get(p, 0) + c
        logger.info("%s: %d records to %s: %s", what, sum(totals.values()), self.opts.topic,
                    dict(sorted(totals.items())))


def _as_bytes(column: Any) -> list[bytes | None]:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise InvalidArgumentError(
            f"Kafka keys and values must be string or binary columns, got {column.type}; cast "
            "them first (e.g. CAST(user AS STRING))"
        )
    values: list[bytes | None] = column.to_pylist()
    return values


class KafkaArrowWriter(_KafkaSender, DataSourceArrowWriter):
    """Batch writes; see :class:`_KafkaSender` for the columns."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._send(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._log(messages, "wrote")


class KafkaStreamArrowWriter(_KafkaSender, DataSourceStreamArrowWriter):
    """Streaming writes, at least once (a replayed micro-batch is sent again)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._send(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._log(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._log(messages, f"micro-batch {batchId} aborted after sending")
