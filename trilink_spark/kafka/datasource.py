"""The ``trilink-kafka`` PySpark data source classes (imported when the source is registered).

See :mod:`trilink_spark.kafka.source` for what the source does and its options.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader
from pyspark.sql.datasource import DataSourceStreamArrowWriter, DataSourceStreamReader
from pyspark.sql.datasource import InputPartition

from ..errors import InvalidArgumentError, PartitionCountError
from .client import KAFKA_SCHEMA, LATEST, SOURCE_NAME, KafkaOptions, fetch_range
from .client import open_consumer, resolve_offsets, split_limit, topic_partitions
from .sink import KafkaArrowWriter, KafkaStreamArrowWriter

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["SOURCE_NAME", "KafkaDataSource"]


class KafkaRange(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition: one Spark partition."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__(partition)
        self.partition, self.start, self.end = partition, start, end


def _as_json(topic: str, offsets: dict[int, int]) -> dict[str, Any]:
    return {topic: {str(p): int(o) for p, o in sorted(offsets.items())}}


def _from_json(topic: str, data: dict[str, Any]) -> dict[int, int]:
    if topic not in data:
        raise InvalidArgumentError(
            f"the checkpointed offsets are for topic(s) {sorted(data)}, not {topic!r}; a query "
            "checkpoint belongs to one topic"
        )
    return {int(p): int(o) for p, o in data[topic].items()}


def _read(opts: KafkaOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of one planned range (batch and streaming reads alike)."""
    if not isinstance(partition, KafkaRange):  # pragma: no cover - Spark passes ours back
        raise InvalidArgumentError(f"not a Kafka range: {partition!r}")
    return fetch_range(opts, partition.partition, partition.start, partition.end)


class KafkaBatchReader(DataSourceReader):
    """Batch read: offsets resolved once on the driver, one task per Kafka partition."""

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        consumer = open_consumer(self.opts)
        try:
            ids = topic_partitions(consumer, self.opts)
            start = resolve_offsets(consumer, self.opts, ids, self.opts.starting)
            end = resolve_offsets(consumer, self.opts, ids, self.opts.ending, missing=LATEST)
        finally:
            consumer.close()
        for p in ids:
            if end[p] < start[p]:
                raise InvalidArgumentError(
                    f"{self.opts.topic}-{p}: ending offset {end[p]} is before starting offset "
                    f"{start[p]}"
                )
        return [KafkaRange(p, start[p], end[p]) for p in ids]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class KafkaStreamReader(DataSourceStreamReader):
    """Micro-batch read: offsets are ``{topic: {partition: offset}}``, checkpointed by Spark.

    Every micro-batch has one Spark partition per Kafka partition (empty ones included), so
    partition ids stay the Kafka ones. A change in the topic's partition count stops the
    query with :class:`~trilink_spark.errors.PartitionCountError`: keys placed for the old
    count would no longer be whole on one partition.
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts
        self._consumer: Any = None
        self._partitions: list[int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_consumer": None, "_partitions": None}

    def _client(self) -> tuple[Any, list[int]]:
        if self._consumer is None:
            self._consumer = open_consumer(self.opts)
        ids = topic_partitions(self._consumer, self.opts)
        if self._partitions is not None and ids != self._partitions:
            raise PartitionCountError(
                f"topic {self.opts.topic!r} went from {len(self._partitions)} to {len(ids)} "
                "partitions while the query ran; keys may now be split over partitions. Restart "
                "the query (new checkpoint) after re-placing the keys"
            )
        self._partitions = ids
        return self._consumer, ids

    def initialOffset(self) -> dict[str, Any]:
        consumer, ids = self._client()
        return _as_json(self.opts.topic, resolve_offsets(consumer, self.opts, ids,
                                                         self.opts.starting))

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        consumer, ids = self._client()
        latest = resolve_offsets(consumer, self.opts, ids, "latest")
        if start is None:  # Spark 4.1 calls latestOffset() with no start and no limit
            if self.opts.max_per_trigger is not None:
                raise InvalidArgumentError("maxOffsetsPerTrigger needs pyspark >= 4.2")
            return _as_json(self.opts.topic, latest)
        begin = _from_json(self.opts.topic, start)
        if sorted(begin) != ids:
            raise PartitionCountError(
                f"the query's offsets cover {len(begin)} partitions of {self.opts.topic!r}, the "
                f"topic now has {len(ids)}; restart the query with a new checkpoint"
            )
        cap = getattr(limit, "max_rows", None) if limit is not None else None
        return _as_json(self.opts.topic, split_limit(begin, latest, cap))

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.opts.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_per_trigger)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _from_json(self.opts.topic, start), _from_json(self.opts.topic, end)
        return [KafkaRange(p, begin.get(p, 0), stop[p]) for p in sorted(stop)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets; Kafka keeps the records."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class KafkaDataSource(DataSource):
    """``spark.read.format("trilink-kafka")`` / ``readStream`` / ``write``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(KafkaOptions.from_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(KafkaOptions.from_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise InvalidArgumentError("Kafka topics are append-only; use mode('append')")
        return KafkaArrowWriter(KafkaOptions.from_options(self.options, streaming=False), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        if overwrite:
            raise InvalidArgumentError("Kafka topics are append-only; use outputMode('append')")
        return KafkaStreamArrowWriter(KafkaOptions.from_options(self.options, streaming=False),
                                      schema)


