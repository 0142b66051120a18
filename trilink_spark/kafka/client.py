"""Talking to Kafka for the ``trilink-kafka`` data source: options, offsets, fetching ranges.

Everything here runs in Python (``kafka-python``, the ``kafka`` extra), on the driver when a
query is planned and in the tasks that read. Offsets follow Spark's Kafka source: a JSON object
``{"topic": {"0": 23, "1": -2}}`` where ``-2`` means earliest and ``-1`` latest.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from .._internal.install import install_hint
from ..errors import BrokerUnavailableError, DataLossError, InvalidArgumentError
from ..errors import MissingDependencyError, PartitionCountError

__all__ = [
    "SOURCE_NAME",
    "KAFKA_SCHEMA",
    "KafkaOptions",
    "open_consumer",
    "topic_partitions",
    "resolve_offsets",
    "latest_offsets",
    "check_rewind",
    "rewind_error",
    "fetch_range",
    "close_cached_consumers",
    "FETCH_CONFIG",
    "open_producer",
    "split_limit",
    "check_retention",
]

#: The format name: ``spark.read.format("trilink-kafka")``.
SOURCE_NAME = "trilink-kafka"

logger = logging.getLogger(__name__)

#: The columns of Spark's own Kafka source, in its order and types.
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
])
EARLIEST, LATEST = -2, -1
_BOOTSTRAP_KEYS = ("kafka.bootstrap.servers", "bootstrap.servers", "bootstrapServers")
_TOPIC_KEYS = ("subscribe", "topic")


def _first(options: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if options.get(name):
            return str(options[name])
    return None


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise InvalidArgumentError(f"option {name} must be a positive integer, got {value}")
    return value


@dataclass(frozen=True)
class KafkaOptions:
    """The source's options, checked (picklable: shipped to every task).

    Attributes
    ----------
    bootstrap : str
        ``kafka.bootstrap.servers`` (also accepted: ``bootstrap.servers``).
    topic : str
        ``subscribe`` (also accepted: ``topic``): one topic.
    starting, ending : str
        ``startingOffsets`` (``"earliest"``, ``"latest"`` or Spark's JSON) and, for batch reads,
        ``endingOffsets`` (``"latest"`` or JSON).
    max_per_trigger : int or None
        ``maxOffsetsPerTrigger``: most records per micro-batch, spread over the partitions in
        proportion to what each has waiting.
    cap_path : str or None
        ``maxOffsetsPerTriggerPath``: a cap file read before every micro-batch; its cap, when
        set, replaces ``maxOffsetsPerTrigger`` (:mod:`~trilink_spark.kafka.admission`).
    num_partitions : int or None
        ``numPartitions``: the partition count the keys were placed for; a topic with another
        count is refused with :class:`~trilink_spark.errors.PartitionCountError`.
    timeout_ms : int
        ``timeoutMs``: how long to wait for the broker (connect, metadata, a fetch that makes no
        progress) before failing with a clear error. Default 10,000.
    fail_on_data_loss : bool
        ``failOnDataLoss`` (default true): refuse offsets the broker no longer holds, instead of
        skipping ahead to the earliest available one; and refuse a stream whose committed
        offsets are past the broker's latest ones (offsets went backwards: the topic was
        deleted and re-created, or the broker lost data), instead of restarting those
        partitions from their earliest offset (see :func:`check_rewind`).
    check_crcs : bool
        ``kafka.check.crcs`` (default true, as Kafka's consumer): check each record batch's
        CRC32C. kafka-python computes it in pure Python unless the ``crc32c`` package is
        installed, and that is then most of a read's cost; false skips the check.
    """

    bootstrap: str
    topic: str
    starting: str
    ending: str
    max_per_trigger: int | None
    num_partitions: int | None
    cap_path: str | None
    timeout_ms: int
    fail_on_data_loss: bool
    check_crcs: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, str], streaming: bool) -> KafkaOptions:
        """Check Spark reader options; the message of every refusal names the option."""
        bootstrap = _first(options, _BOOTSTRAP_KEYS)
        if not bootstrap:
            raise InvalidArgumentError(
                "trilink-kafka needs option kafka.bootstrap.servers, e.g. '127.0.0.1:9092'"
            )
        topic = _first(options, _TOPIC_KEYS)
        if not topic:
            raise InvalidArgumentError("trilink-kafka needs option subscribe (the topic to read)")
        if "," in topic:
            raise InvalidArgumentError(
                f"trilink-kafka reads one topic; subscribe={topic!r} names several"
            )
        starting = options.get("startingOffsets") or ("latest" if streaming else "earliest")
        ending = options.get("endingOffsets") or "latest"
        if streaming and options.get("endingOffsets"):
            raise InvalidArgumentError("endingOffsets is for batch reads; a stream has no end")
        if not streaming and starting == "latest":
            raise InvalidArgumentError(
                "startingOffsets='latest' would read nothing in a batch query; use 'earliest' "
                "or JSON offsets"
            )
        if not streaming and ending == "earliest":
            raise InvalidArgumentError("endingOffsets must be 'latest' or JSON offsets")
        for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
            _parse_spec(spec, topic, name)
        cap_path = options.get("maxOffsetsPerTriggerPath") or None
        if cap_path is not None and not streaming:
            raise InvalidArgumentError(
                "maxOffsetsPerTriggerPath is for streams: a batch read has no triggers")
        loss = str(options.get("failOnDataLoss", "true")).lower()
        if loss not in ("true", "false"):
            raise InvalidArgumentError(f"failOnDataLoss must be true or false, got {loss!r}")
        crcs = str(options.get("kafka.check.crcs", "true")).lower()
        if crcs not in ("true", "false"):
            raise InvalidArgumentError(f"kafka.check.crcs must be true or false, got {crcs!r}")
        return cls(
            bootstrap=bootstrap,
            topic=topic,
            starting=starting,
            ending=ending,
            max_per_trigger=_positive(options, "maxOffsetsPerTrigger", None),
            num_partitions=_positive(options, "numPartitions", None),
            cap_path=cap_path,
            timeout_ms=_positive(options, "timeoutMs", 10_000) or 10_000,
            fail_on_data_loss=loss == "true",
            check_crcs=crcs == "true",
        )


def _parse_spec(spec: str, topic: str, name: str) -> str | dict[int, int]:
    """``"earliest"``/``"latest"``, or ``{partition: offset}`` from Spark's JSON form."""
    if spec in ("earliest", "latest"):
        return spec
    try:
        data = json.loads(spec)
    except json.JSONDecodeError:
        raise InvalidArgumentError(
            f"{name} must be 'earliest', 'latest' or JSON like "
            f'{{"{topic}": {{"0": 42}}}}, got {spec!r}'
        ) from None
    if not isinstance(data, dict) or set(data) != {topic} or not isinstance(data[topic], dict):
        raise InvalidArgumentError(f"{name} JSON must name exactly the topic {topic!r}: {spec}")
    try:
        offsets = {int(p): int(o) for p, o in data[topic].items()}
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} JSON maps partitions to integer offsets: {spec}")
    if any(o < EARLIEST for o in offsets.values()):
        raise InvalidArgumentError(f"{name}: offsets are >= 0, or -2 (earliest), -1 (latest)")
    return offsets


def _kafka() -> Any:
    try:
        import kafka
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "trilink-kafka needs kafka-python: " + install_hint("kafka", "kafka-python")
        ) from None
    return kafka


def _timeouts(kafka: Any, cls: Any, opts: KafkaOptions) -> dict[str, int]:
    """Connection timeouts under kafka-python 3 (``bootstrap_timeout_ms``) or 2."""
    config: dict[str, int] = {"request_timeout_ms": max(opts.timeout_ms, 1_000) + 500}
    if "bootstrap_timeout_ms" in cls.DEFAULT_CONFIG:
        config["bootstrap_timeout_ms"] = opts.timeout_ms
    else:  # pragma: no cover - kafka-python 2
        config["api_version_auto_timeout_ms"] = opts.timeout_ms
    return config


def _unreachable(opts: KafkaOptions) -> BrokerUnavailableError:
    return BrokerUnavailableError(
        f"no Kafka broker answered at {opts.bootstrap} within {opts.timeout_ms} ms; check "
        "kafka.bootstrap.servers and that the broker is running"
    )


def open_consumer(opts: KafkaOptions, source: bool = False) -> Any:
    """A ``KafkaConsumer`` with no group, no auto commit (offsets are Spark's to keep) and no
    topic creation (its metadata requests never ask the broker to create a missing topic).

    ``source=True`` gives the readers' consumer (:func:`fetch_range`): the fetch sizes of
    :data:`FETCH_CONFIG`, and no automatic offset reset (an offset out of range is raised, so
    that ``failOnDataLoss`` decides). Cost: a connection and a metadata request.
    """
    kafka = _kafka()
    config: dict[str, Any] = (
        {**FETCH_CONFIG, "auto_offset_reset": "none"} if source
        else {"auto_offset_reset": "earliest", "max_poll_records": 10_000})
    if "allow_auto_create_topics" in kafka.KafkaConsumer.DEFAULT_CONFIG:
        # a reader never creates a topic: a broker with auto.create.topics.enable would make a
        # mistyped or deleted topic exist, with the broker's default partition count
        config["allow_auto_create_topics"] = False
    try:
        return kafka.KafkaConsumer(
            bootstrap_servers=opts.bootstrap.split(","),
            enable_auto_commit=False,
            group_id=None,
            check_crcs=opts.check_crcs,
            **config,
            **_timeouts(kafka, kafka.KafkaConsumer, opts),
        )
    except (kafka.errors.KafkaError, OSError):
        raise _unreachable(opts) from None


def topic_partitions(consumer: Any, opts: KafkaOptions) -> list[int]:
    """The topic's partition ids, sorted; refuses a missing topic or a different count.

    The metadata is fetched from the broker on every call, never taken from the consumer's
    cache, so a long-lived consumer (a stream's, asked once per trigger) sees a topic deleted
    and re-created with another partition count.

    Cost: one metadata request (for all the topics the client may see), more only while the
    topic does not exist yet (polled every 50 ms, at most ``timeout_ms``).

    Raises
    ------
    BrokerUnavailableError
        The broker did not answer the metadata request.
    InvalidArgumentError
        The topic does not exist (within ``timeout_ms``).
    PartitionCountError
        The topic does not have ``numPartitions`` partitions.
    """
    kafka = _kafka()
    deadline = time.monotonic() + opts.timeout_ms / 1000
    while True:
        try:
            consumer.topics()  # refresh the cached metadata
        except (kafka.errors.KafkaError, OSError):
            raise _unreachable(opts) from None
        partitions = consumer.partitions_for_topic(opts.topic)
        if partitions or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if not partitions:
        raise InvalidArgumentError(f"Kafka topic {opts.topic!r} does not exist at {opts.bootstrap}")
    ids = sorted(partitions)
    if ids != list(range(len(ids))):  # pragma: no cover - Kafka numbers partitions 0..n-1
        raise PartitionCountError(f"topic {opts.topic!r} has unexpected partition ids {ids}")
    _check_count(opts, len(ids), f"; read it with numPartitions={len(ids)} or recreate the topic")
    return ids


def _check_count(opts: KafkaOptions, count: int, advice: str = "") -> None:
    """Refuse a topic whose partition count is not the ``numPartitions`` the keys were placed
    for (nothing to check when the option is not set)."""
    if opts.num_partitions is not None and count != opts.num_partitions:
        raise PartitionCountError(
            f"topic {opts.topic!r} has {count} partitions but its keys were placed for "
            f"{opts.num_partitions} (numPartitions){advice}"
        )


def _latest(consumer: Any, topic: str, partitions: list[int]) -> dict[int, int]:
    """End offsets, confirmed by a fetch where possible (see :func:`_confirmed_latest`)."""
    return _confirmed_latest(consumer, topic, partitions)[0]


def _confirmed_latest(
    consumer: Any, topic: str, partitions: list[int]
) -> tuple[dict[int, int], frozenset[int]]:
    """End offsets, confirmed by a fetch: some Kafka-compatible brokers report the start of the
    last record batch as the end, which would leave that batch's records unread.

    Also returns the partitions whose confirming fetch did not come back within 2 s: their
    offset is the broker's report, which may be below the true end."""
    kafka = _kafka()
    tps = [kafka.TopicPartition(topic, p) for p in partitions]
    reported = {tp.partition: int(o) for tp, o in consumer.end_offsets(tps).items()}
    confirm = [tp for tp in tps if reported[tp.partition] > 0]
    if not confirm:
        return reported, frozenset()
    consumer.assign(confirm)
    for tp in confirm:
        consumer.seek(tp, reported[tp.partition] - 1)
    pending = set(confirm)
    deadline = time.monotonic() + 2.0
    while pending and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=100).items():
            if records:
                reported[tp.partition] = max(reported[tp.partition], records[-1].offset + 1)
                pending.discard(tp)
                consumer.pause(tp)
        for tp in list(pending):  # e.g. a transaction marker last: the fetch moved past it
            if consumer.position(tp) >= reported[tp.partition]:
                pending.discard(tp)
                consumer.pause(tp)
    consumer.unsubscribe()
    return reported, frozenset(tp.partition for tp in pending)


def latest_offsets(
    consumer: Any, opts: KafkaOptions, partitions: list[int]
) -> tuple[dict[int, int], frozenset[int]]:
    """The broker's latest offset of every partition, and the partitions where it is unsure.

    Unsure partitions are those whose end the broker reported but a fetch could not confirm
    within 2 s (some Kafka-compatible brokers report the start of the last record batch as
    the end); their true end may be higher, so they must not be taken for offsets that went
    backwards.

    Cost: one ListOffsets request, then one fetch from each non-empty partition (a few
    milliseconds on a healthy broker, at most 2 s).
    """
    return _confirmed_latest(consumer, opts.topic, partitions)


def check_rewind(
    opts: KafkaOptions,
    start: Mapping[int, int],
    latest: Mapping[int, int],
    earliest: Mapping[int, int],
    unsure: frozenset[int] = frozenset(),
) -> dict[int, int]:
    """Where a stream's next micro-batch begins on each partition, given the committed
    ``start`` offsets and the broker's ``latest`` ones.

    A partition whose latest offset is below the committed one went backwards: the topic was
    deleted and re-created, or the broker lost data, and the offsets no longer name the
    records the query read. As Spark's own Kafka source does, this is refused with
    :class:`~trilink_spark.errors.DataLossError` when ``failOnDataLoss`` is true; when it is
    false, the partition restarts from ``earliest`` (the oldest offset the broker holds) and a
    warning is logged. Partitions in ``unsure`` are left as they are: their latest offset may
    be below the true end (see :func:`latest_offsets`).

    Cost: pure Python, O(partitions).

    Raises
    ------
    DataLossError
        Some partition went backwards and ``failOnDataLoss`` is true; the message names the
        topic, each such partition, its committed offset and the broker's latest.

    Examples
    --------
    >>> opts = KafkaOptions.from_options(
    ...     {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "failOnDataLoss": "false"},
    ...     streaming=True)
    >>> check_rewind(opts, {0: 10, 1: 4}, {0: 3, 1: 9}, {0: 0, 1: 0})
    {0: 0, 1: 4}
    """
    back = sorted(p for p in start if p not in unsure and latest[p] < start[p])
    if not back:
        return dict(start)
    where = ", ".join(
        f"{opts.topic}-{p}: committed offset {start[p]}, broker's latest {latest[p]}" for p in back
    )
    if opts.fail_on_data_loss:
        raise rewind_error(opts, where)
    logger.warning("offsets went backwards (%s); reading those partitions again from their "
                   "earliest offset (failOnDataLoss=false)", where)
    return {p: earliest[p] if p in back else o for p, o in start.items()}


def rewind_error(opts: KafkaOptions, where: str) -> DataLossError:
    """The :class:`DataLossError` for offsets that went backwards; ``where`` names the
    partitions and their offsets."""
    return DataLossError(
        f"offsets of topic {opts.topic!r} went backwards ({where}): the topic was deleted and "
        "re-created, or the broker lost data, so records may have been lost. Restart the query "
        "with a new checkpoint, or set failOnDataLoss=false to read those partitions again "
        "from their earliest offset"
    )


def resolve_offsets(
    consumer: Any, opts: KafkaOptions, partitions: list[int], spec: str, missing: int = EARLIEST
) -> dict[int, int]:
    """Concrete offsets for ``spec`` (earliest/latest/JSON) on every partition.

    Partitions a JSON spec leaves out get ``missing``: earliest (``-2``, for starting offsets)
    or latest (``-1``, for ending offsets). An
    offset the broker no longer holds is refused when ``failOnDataLoss`` is true, else moved
    to the earliest one with a warning.
    """
    parsed = _parse_spec(spec, opts.topic, "offsets")
    if parsed == "latest":
        return _latest(consumer, opts.topic, partitions)
    kafka = _kafka()
    tps = [kafka.TopicPartition(opts.topic, p) for p in partitions]
    earliest = {tp.partition: int(o) for tp, o in consumer.beginning_offsets(tps).items()}
    if parsed == "earliest":
        return earliest
    parsed = cast(dict[int, int], parsed)
    unknown = sorted(set(parsed) - set(partitions))
    if unknown:
        raise InvalidArgumentError(
            f"offsets name partitions {unknown} that topic {opts.topic!r} does not have "
            f"(it has {len(partitions)})"
        )
    wanted = {p: parsed.get(p, missing) for p in partitions}
    latest = (_latest(consumer, opts.topic, partitions) if LATEST in wanted.values()
              else earliest)  # only read for -1 entries
    resolved: dict[int, int] = {}
    for p, want in wanted.items():
        offset = earliest[p] if want == EARLIEST else latest[p] if want == LATEST else want
        resolved[p] = check_retention(opts, p, offset, earliest[p])
    return resolved


def check_retention(opts: KafkaOptions, partition: int, offset: int, earliest: int) -> int:
    """``offset``, or the earliest one the broker still holds when retention deleted it and
    ``failOnDataLoss`` is false (refused when it is true)."""
    if offset >= earliest:
        return offset
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"{opts.topic}-{partition}: offsets {offset}..{earliest - 1} are no longer on the "
            "broker (records were deleted); set failOnDataLoss=false to skip them"
        )
    logger.warning("%s-%d: offsets %d..%d are gone; reading from %d", opts.topic, partition,
                   offset, earliest - 1, earliest)
    return earliest


#: Fetch settings of the source's consumers: bigger fetches than kafka-python's defaults (fewer
#: requests per range), and a short broker-side wait so that a cached consumer's last,
#: pipelined fetch past a range's end returns quickly before the next range is assigned.
FETCH_CONFIG: dict[str, int] = {
    "max_partition_fetch_bytes": 8 * 1024 * 1024,
    "fetch_max_bytes": 64 * 1024 * 1024,
    "fetch_max_wait_ms": 100,
    "max_poll_records": 50_000,
}
#: Idle consumers kept per Python process (Spark reuses its Python workers across tasks).
_POOL_SIZE = 4
_pool: OrderedDict[tuple[str, int, bool], list[Any]] = OrderedDict()
_pool_lock = threading.Lock()
#: Consumers opened by :func:`fetch_range` in this process (read by tests and benchmarks).
consumers_opened = 0


def _pool_key(opts: KafkaOptions) -> tuple[str, int, bool]:
    """What a consumer depends on: the brokers and the client settings, not the topic or the
    offsets (every range assigns and seeks its own partition)."""
    return (opts.bootstrap, opts.timeout_ms, opts.check_crcs)


def _take_consumer(opts: KafkaOptions) -> Any:
    """An idle cached consumer for ``opts`` (taken out of the pool: one user at a time), or a
    new one. Cost: O(1), or a connection and a metadata request for a new consumer."""
    global consumers_opened
    key = _pool_key(opts)
    with _pool_lock:
        idle = _pool.get(key)
        if idle:
            return idle.pop()
    consumer = open_consumer(opts, source=True)
    with _pool_lock:
        consumers_opened += 1
    return consumer


def _give_back(opts: KafkaOptions, consumer: Any) -> None:
    """Return a consumer that read its range completely to the pool (unassigned: nothing of
    the range stays buffered); the least recently used idle ones past the pool's size are
    closed. Cost: O(pool size) plus the closes."""
    try:
        consumer.unsubscribe()
    except Exception:  # noqa: BLE001 - a consumer in doubt is closed, never reused
        _close(consumer)
        return
    evicted: list[Any] = []
    key = _pool_key(opts)
    with _pool_lock:
        _pool.setdefault(key, []).append(consumer)
        _pool.move_to_end(key)
        while sum(len(v) for v in _pool.values()) > _POOL_SIZE:
            oldest = next(iter(_pool))
            evicted.append(_pool[oldest].pop(0))
            if not _pool[oldest]:
                del _pool[oldest]
    for old in evicted:
        _close(old)


def _close(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception as err:  # noqa: BLE001 - closing is best effort
        logger.debug("closing a Kafka consumer failed: %s", err)


def close_cached_consumers() -> int:
    """Close every idle cached consumer of this process; returns how many. O(pool size)."""
    with _pool_lock:
        idle = [c for v in _pool.values() for c in v]
        _pool.clear()
    for consumer in idle:
        _close(consumer)
    return len(idle)


def fetch_range(
    opts: KafkaOptions, partition: int, start: int, end: int, batch_rows: int = 10_000
) -> Iterator[pa.RecordBatch]:
    """Records ``[start, end)`` of one partition as Arrow batches with :data:`KAFKA_SCHEMA`.

    ``start`` may be ``-2`` (:data:`EARLIEST`): the oldest offset the broker holds when the
    task runs (a stream partition restarted after its offsets went backwards).

    The consumer comes from a per-process pool keyed by the brokers and client settings
    (Spark reuses its Python workers, so a worker opens one consumer, not one per range); the
    range assigns and seeks its partition, keeps only records of ``[start, end)`` and gives the
    consumer back, unassigned, only when it read the whole range: a range that fails (a task
    that will be retried) or is abandoned closes its consumer.

    A ``start`` the broker no longer holds (retention) is noticed by the fetch itself (the
    broker answers "offset out of range"), so the common case costs no offset request: then
    ``failOnDataLoss`` decides, as in :func:`check_retention`.

    Cost: fetches of up to 8 MiB; kafka-python decodes records in Python (and checks CRC32C
    checksums, in Python unless the ``crc32c`` package is installed: most of the time per
    record; ``kafka.check.crcs=false`` skips it), then one C-level transpose and one Arrow
    array per column per poll. Raises :class:`BrokerUnavailableError` when the broker makes no
    progress for ``timeout_ms``.
    """
    if end <= start:
        return
    kafka = _kafka()
    consumer = _take_consumer(opts)
    finished = False
    try:
        tp = kafka.TopicPartition(opts.topic, partition)
        if start == EARLIEST:
            start = int(consumer.beginning_offsets([tp])[tp])
            if end <= start:
                finished = True
                return
        consumer.assign([tp])
        consumer.seek(tp, start)
        pending: list[pa.RecordBatch] = []
        rows = 0
        stalled_since = time.monotonic()
        while consumer.position(tp) < end:
            try:
                records = consumer.poll(timeout_ms=200, max_records=batch_rows).get(tp, [])
            except kafka.errors.OffsetOutOfRangeError:
                start = _out_of_range(consumer, opts, tp, consumer.position(tp), end)
                if start >= end:
                    break
                consumer.seek(tp, start)
                continue
            if not records:
                if time.monotonic() - stalled_since > opts.timeout_ms / 1000:
                    raise BrokerUnavailableError(
                        f"{opts.topic}-{partition}: no records past offset "
                        f"{consumer.position(tp)} (want up to {end}) within {opts.timeout_ms} ms"
                    )
                continue
            stalled_since = time.monotonic()
            batch = _records_batch(records, opts.topic, partition, start, end)
            if batch.num_rows:
                pending.append(batch)
                rows += batch.num_rows
            if records[-1].offset >= end - 1:
                break
            if rows >= batch_rows:
                yield _combine(pending)
                pending, rows = [], 0
        if pending:
            yield _combine(pending)
        finished = True
    finally:
        if finished:
            _give_back(opts, consumer)
        else:  # failed or abandoned: its state is in doubt
            _close(consumer)


def _out_of_range(consumer: Any, opts: KafkaOptions, tp: Any, offset: int, end: int) -> int:
    """Where to go on when the broker says ``offset`` is out of range: the earliest offset
    it holds (retention deleted the records; refused when ``failOnDataLoss``), or ``end``
    (nothing to read) when the records are past the broker's latest offset. One or two
    ListOffsets requests."""
    earliest = int(consumer.beginning_offsets([tp])[tp])
    if offset < earliest:
        return check_retention(opts, tp.partition, offset, earliest)
    latest = int(consumer.end_offsets([tp])[tp])
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"{opts.topic}-{tp.partition}: offsets {offset}..{end - 1} are past the broker's "
            f"latest offset {latest} (the topic was re-created or the broker lost data); set "
            "failOnDataLoss=false to skip them"
        )
    logger.warning("%s-%d: offsets %d..%d are past the broker's latest offset %d; skipping them",
                   opts.topic, tp.partition, offset, end - 1, latest)
    return end


#: Field positions in kafka-python's ``ConsumerRecord`` named tuple.
_OFFSET, _TIMESTAMP, _TS_TYPE, _KEY, _VALUE = 3, 4, 5, 6, 7


def _records_batch(records: list[Any], topic: str, partition: int, start: int,
                   end: int) -> pa.RecordBatch:
    """One Arrow batch of the records of ``[start, end)`` (records come in offset order).

    Cost: one C-level transpose of the record tuples (``zip``), one Arrow array per column;
    no per-record Python statement.
    """
    import numpy as np

    columns = list(zip(*records))
    offsets = np.asarray(columns[_OFFSET], dtype=np.int64)
    lo, hi = (int(i) for i in np.searchsorted(offsets, [start, end]))
    n = hi - lo
    whole = lo == 0 and hi == len(records)

    def cut(values: tuple[Any, ...]) -> Any:
        return values if whole else values[lo:hi]

    arrays = [
        pa.array(cut(columns[_KEY]), pa.binary()),
        pa.array(cut(columns[_VALUE]), pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets[lo:hi]),
        pa.array(np.asarray(cut(columns[_TIMESTAMP]), dtype=np.int64) * 1000).cast(
            pa.timestamp("us", tz="UTC")),
        pa.array(np.asarray(cut(columns[_TS_TYPE]), dtype=np.int32)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_ARROW_SCHEMA)


def _combine(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of several (one copy per column when there are several)."""
    if len(batches) == 1:
        return batches[0]
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.to_batches()[0]


def open_producer(opts: KafkaOptions) -> tuple[Any, int]:
    """A producer for ``opts.topic`` and the topic's partition count (checked against
    ``numPartitions``). Waits for every replica's acknowledgement (``acks="all"``)."""
    kafka = _kafka()
    try:
        producer = kafka.KafkaProducer(
            bootstrap_servers=opts.bootstrap.split(","),
            acks="all",
            max_block_ms=opts.timeout_ms,
            **_timeouts(kafka, kafka.KafkaProducer, opts),
        )
    except (kafka.errors.KafkaError, OSError):
        raise _unreachable(opts) from None
    try:
        partitions = producer.partitions_for(opts.topic)
    except kafka.errors.KafkaTimeoutError:
        producer.close()
        raise InvalidArgumentError(
            f"Kafka topic {opts.topic!r} does not exist at {opts.bootstrap}; create it with the "
            "partition count the keys were placed for"
        ) from None
    count = len(partitions)
    try:
        _check_count(opts, count)
    except PartitionCountError:
        producer.close()
        raise
    return producer, count


def split_limit(start: dict[int, int], latest: dict[int, int], limit: int | None) -> dict[int, int]:
    """End offsets reading at most ``limit`` records, spread over partitions by backlog.

    Each partition gets ``floor(limit * backlog / total)``; what rounding leaves goes to the
    largest remainders (ties to the lower partition id), so the split is deterministic. A
    partition whose ``latest`` is below its ``start`` reads nothing (its end is its start):
    callers settle offsets that went backwards first, with :func:`check_rewind`.

    Cost: pure Python, O(partitions log partitions).

    Examples
    --------
    >>> split_limit({0: 0, 1: 0}, {0: 30, 1: 10}, 20)
    {0: 15, 1: 5}
    >>> split_limit({0: 5}, {0: 8}, 100)
    {0: 8}
    """
    backlog = {p: max(latest[p] - start[p], 0) for p in start}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return {p: max(latest[p], start[p]) for p in start}
    quota = {p: limit * b // total for p, b in backlog.items()}
    left = limit - sum(quota.values())
    order = sorted(backlog, key=lambda p: (-(limit * backlog[p] % total), p))
    for p in order[:left]:
        quota[p] += 1
    return {p: start[p] + quota[p] for p in start}
