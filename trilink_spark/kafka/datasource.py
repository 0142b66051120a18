"""The ``trilink-kafka`` PySpark data source classes (imported when the source is registered).

See :mod:`trilink_spark.kafka.source` for what the source does and its options.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader
from pyspark.sql.datasource import DataSourceStreamArrowWriter, DataSourceStreamReader
from pyspark.sql.datasource import InputPartition

from ..errors import DataLossError, InvalidArgumentError, PartitionCountError
from .admission import read_trigger_cap
from .client import EARLIEST, KAFKA_SCHEMA, LATEST, SOURCE_NAME, KafkaOptions, check_rewind
from .client import fetch_range, latest_offsets, open_consumer, resolve_offsets, rewind_error
from .client import split_limit, topic_partitions
from .sink import KafkaArrowWriter, KafkaStreamArrowWriter

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["SOURCE_NAME", "KafkaDataSource"]

logger = logging.getLogger(__name__)


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
    partition ids stay the Kafka ones. The topic's metadata is fetched on every trigger: a
    change in its partition count (e.g. the topic deleted and re-created while the query
    runs) stops the query with :class:`~trilink_spark.errors.PartitionCountError`, as keys
    placed for the old count would no longer be whole on one partition.

    Offsets that went backwards (the broker's latest offset below the committed one: the
    topic re-created with the same count, or a broker that lost its data) stop the query with
    :class:`~trilink_spark.errors.DataLossError` when ``failOnDataLoss`` is true; when false,
    those partitions restart from their earliest offset (see
    :func:`~trilink_spark.kafka.client.check_rewind`). Such a micro-batch has an end offset
    below its start offset on those partitions, which :meth:`partitions` reads as "from the
    earliest offset": replaying it from the checkpoint reads the same records.
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts
        self._consumer: Any = None
        self._partitions: list[int] | None = None
        self._planned: dict[int, int] | None = None  # the last end latestOffset settled
        # the broker's latest offsets at the last check, and the partitions it was unsure of
        self._latest: tuple[dict[int, int], frozenset[int]] | None = None
        self._file_cap: int | None = None  # the cap file's last good cap

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_consumer": None, "_partitions": None, "_planned": None,
                "_latest": None, "_file_cap": None}

    def _cap(self, limit: Any) -> int | None:
        """This batch's cap: the cap file's when it holds one, else ``limit``'s (Spark's
        ``maxOffsetsPerTrigger``). A cap file that cannot be read or is not one keeps the
        last cap read from it (logged): configuration never stops the stream."""
        cap = getattr(limit, "max_rows", None) if limit is not None else None
        path = self.opts.cap_path
        if path is None:
            return cap
        try:
            found, value = read_trigger_cap(path)
        except Exception as err:  # noqa: BLE001 - whatever the file or path, the stream runs
            logger.warning("trigger cap not read (%s: %s); keeping %s", type(err).__name__,
                           err, "no cap from the file" if self._file_cap is None
                           else f"the last one, {self._file_cap}")
        else:
            if value != self._file_cap:
                logger.info("%s: rows per trigger capped at %s from the next micro-batch", path,
                            value if value is not None else cap)
            self._file_cap = value if found else None
        return self._file_cap if self._file_cap is not None else cap

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

    def _check_ids(self, offsets: dict[int, int], ids: list[int]) -> None:
        if sorted(offsets) != ids:
            raise PartitionCountError(
                f"the query's offsets cover {len(offsets)} partitions of {self.opts.topic!r}, "
                f"the topic now has {len(ids)}; restart the query with a new checkpoint"
            )

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """The end of the next micro-batch: the broker's latest offsets, capped by ``limit``.

        Refreshes the topic's metadata and checks the committed ``start`` against the broker
        (partition count, offsets that went backwards: see the class docstring).

        Cost: a metadata request, a ListOffsets request and a confirming fetch per non-empty
        partition (see :func:`~trilink_spark.kafka.client.latest_offsets`); one more
        ListOffsets request when offsets went backwards.
        """
        consumer, ids = self._client()
        latest, unsure = latest_offsets(consumer, self.opts, ids)
        self._latest, self._planned = (latest, unsure), None
        if start is None:  # Spark 4.1 calls latestOffset() with no start and no limit
            if self.opts.max_per_trigger is not None or self.opts.cap_path is not None:
                raise InvalidArgumentError(
                    "maxOffsetsPerTrigger and maxOffsetsPerTriggerPath need pyspark >= 4.2")
            return _as_json(self.opts.topic, latest)  # partitions() checks for rewinds
        begin = _from_json(self.opts.topic, start)
        self._check_ids(begin, ids)
        if any(latest[p] < begin[p] for p in ids if p not in unsure):
            earliest = resolve_offsets(consumer, self.opts, ids, "earliest")
            begin = check_rewind(self.opts, begin, latest, earliest, unsure)
        end = split_limit(begin, latest, self._cap(limit))
        self._planned = end
        return _as_json(self.opts.topic, end)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.opts.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_per_trigger)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One range per Kafka partition; a partition whose end is below its start went
        backwards and is read from its earliest offset (see the class docstring).

        Cost: nothing for a micro-batch :meth:`latestOffset` just planned. Otherwise (a batch
        replayed from the checkpoint after a restart, or planned by Spark < 4.2) its offsets
        are checked against the broker: the same requests as :meth:`latestOffset`, once.
        """
        begin, stop = _from_json(self.opts.topic, start), _from_json(self.opts.topic, end)
        skip = set() if stop == self._planned else self._check_replayed(begin, stop)
        ranges: list[InputPartition] = []
        for p in sorted(stop):
            first = begin.get(p, 0)
            if p in skip:
                ranges.append(KafkaRange(p, first, first))
            elif stop[p] < first:
                ranges.append(KafkaRange(p, EARLIEST, stop[p]))
            else:
                ranges.append(KafkaRange(p, first, stop[p]))
        return ranges

    def _check_replayed(self, begin: dict[int, int], stop: dict[int, int]) -> set[int]:
        """Check a micro-batch this reader did not plan; returns the partitions to leave
        unread (their records are gone, ``failOnDataLoss`` is false)."""
        back = sorted(p for p in stop if p in begin and stop[p] < begin[p])
        if back:
            where = ", ".join(f"{self.opts.topic}-{p}: committed offset {begin[p]}, broker's "
                              f"latest {stop[p]}" for p in back)
            if self.opts.fail_on_data_loss:
                raise rewind_error(self.opts, where)
            logger.warning("offsets went backwards (%s); reading those partitions again from "
                           "their earliest offset (failOnDataLoss=false)", where)
        if self._latest is None or not set(stop) <= set(self._latest[0]):
            consumer, ids = self._client()
            self._check_ids(stop, ids)
            self._latest = latest_offsets(consumer, self.opts, ids)
        latest, unsure = self._latest
        gone = sorted(p for p in stop
                      if p not in back and p not in unsure and latest[p] < stop[p])
        if not gone:
            return set()
        where = ", ".join(f"{self.opts.topic}-{p}: offsets {begin.get(p, 0)}..{stop[p] - 1}, "
                          f"broker's latest {latest[p]}" for p in gone)
        if self.opts.fail_on_data_loss:
            raise DataLossError(
                f"a micro-batch replayed from the checkpoint reads past the broker's latest "
                f"offsets ({where}): the topic was deleted and re-created, or the broker lost "
                "data. Restart the query with a new checkpoint, or set failOnDataLoss=false"
            )
        logger.warning("a replayed micro-batch reads past the broker's latest offsets (%s); "
                       "leaving those partitions unread (failOnDataLoss=false), the next "
                       "micro-batch restarts them from their earliest offset", where)
        return set(gone)

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


