"""The YSB event producer: JSON ad events on a Kafka topic at a given rate, logged for the check.

Events are those of ``yahoo/streaming-benchmarks``: ``user_id``, ``page_id``, ``ad_id``,
``ad_type`` (banner, modal, sponsored-search, mail, mobile), ``event_type`` (view, click,
purchase), ``event_time`` (milliseconds since the epoch) and ``ip_address``, one JSON object
per Kafka record, with the ad's campaign id as the record key.

The producer sends in chunks (every ``chunk_ms``): a chunk is drawn with numpy, sent with
kafka-python, flushed (every record acknowledged), then appended to the event log, a Parquet
file with the typed columns of :data:`LOG_SCHEMA`. The log therefore holds exactly the
acknowledged events: :func:`~trilink_spark.ysb.check` recomputes the expected counts from it.

Placement: with ``placement=None`` records go round-robin over the topic's partitions (what a
producer without a key-aware partitioner does); with a strategy (a name such as
``"least_key"`` or a :class:`~trilink_spark.Partitioner`) each record goes to the partition
the strategy gives its campaign: the Ahead KeyBy layout :func:`~trilink_spark.keyed_by_source`
declares.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import BrokerUnavailableError, InvalidArgumentError, InvalidArgumentTypeError
from ..partitioners import Partitioner
from ..partitioners.catalogue import build
from .catalogue import Catalogue

__all__ = ["AD_TYPES", "EVENT_TYPES", "LOG_SCHEMA", "DEFAULT_TOPIC", "Producer",
           "ProducerReport", "create_topic", "placement_strategy", "read_log"]

logger = logging.getLogger(__name__)

#: The topic of YSB.
DEFAULT_TOPIC = "ad-events"
AD_TYPES: tuple[str, ...] = ("banner", "modal", "sponsored-search", "mail", "mobile")
EVENT_TYPES: tuple[str, ...] = ("view", "click", "purchase")
#: Columns of the event log (Parquet).
LOG_SCHEMA = pa.schema([("ad_id", pa.string()), ("event_type", pa.string()),
                        ("event_time", pa.int64()), ("partition", pa.int32())])
_TEMPLATE = ('{"user_id":"%s","page_id":"%s","ad_id":"%s","ad_type":"%s","event_type":"%s",'
             '"event_time":%d,"ip_address":"1.2.3.4"}')
_LOG_ROWS = 200_000  # rows per Parquet row group


def create_topic(bootstrap: str, topic: str, partitions: int, timeout_ms: int = 10_000) -> None:
    """Create ``topic`` with ``partitions`` partitions (nothing when it exists with that count).

    Raises :class:`~trilink_spark.BrokerUnavailableError` when the broker does not answer and
    :class:`~trilink_spark.InvalidArgumentError` when the topic exists with another count.
    Cost: one or two admin requests.
    """
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","),
                                 request_timeout_ms=timeout_ms)
    except (KafkaError, OSError):
        raise BrokerUnavailableError(f"no Kafka broker answered at {bootstrap}") from None
    try:
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                          replication_factor=1)])
        except TopicAlreadyExistsError:
            described = admin.describe_topics([topic])
            have = len(described[0]["partitions"]) if described else -1
            if have != partitions:
                raise InvalidArgumentError(
                    f"topic {topic!r} exists with {have} partitions, not {partitions}; use "
                    "another topic name") from None
    finally:
        admin.close()


def placement_strategy(strategy: str | Partitioner, catalogue: Catalogue,
                       num_partitions: int) -> Partitioner:
    """The strategy that places campaigns on ``num_partitions`` partitions.

    A name is built from the strategy catalogue; a table strategy (``least_key``,
    ``least_count``, ...) is fitted on the campaign ids (all known up front, each with the same
    expected count). A :class:`~trilink_spark.Partitioner` is used as it is. Cost: O(campaigns).

    Examples
    --------
    >>> cat = Catalogue(("a", "b", "c", "d"), (("x",), ("y",), ("z",), ("w",)))
    >>> sorted(placement_strategy("least_key", cat, 2).assign(list(cat.campaigns)).tolist())
    [0, 0, 1, 1]
    """
    if isinstance(strategy, Partitioner):
        if strategy.num_partitions != num_partitions:
            raise InvalidArgumentError(
                f"the strategy places keys on {strategy.num_partitions} partitions, the topic "
                f"has {num_partitions}")
        return strategy
    if not isinstance(strategy, str):
        raise InvalidArgumentTypeError(
            f"strategy must be a name or a Partitioner, got {type(strategy).__name__}")
    p = build(strategy, num_partitions, key_type="string")
    if p.is_stateful:
        p.fit(list(catalogue.campaigns))
    return p


@dataclass(frozen=True)
class ProducerReport:
    """What a producer run sent (every event acknowledged and logged).

    Attributes
    ----------
    events : int
        Events sent.
    views : int
        Of which ``event_type == "view"``.
    seconds : float
        Wall time from the first send to the last acknowledgement.
    rate : float
        Events per second achieved (``events / seconds``).
    first_time, last_time : int
        Smallest and largest ``event_time`` sent (ms).
    per_partition : tuple of int
        Events per Kafka partition.
    """

    events: int
    views: int
    seconds: float
    rate: float
    first_time: int
    last_time: int
    per_partition: tuple[int, ...]


class Producer:
    """Send YSB events at ``rate`` per second to ``topic``, logging them to ``log_path``.

    Parameters
    ----------
    bootstrap : str
        Kafka bootstrap servers.
    catalogue : Catalogue
        From :func:`~trilink_spark.ysb.setup`.
    log_path : str or Path
        The Parquet event log (overwritten).
    rate : float
        Events per second (the target; :attr:`ProducerReport.rate` says what was achieved).
    events : int, optional
        Stop after this many events.
    duration : float, optional
        Or after this many seconds (one of ``events`` and ``duration`` is needed).
    topic : str
        Default ``"ad-events"``; it must exist (:func:`create_topic`).
    placement : str or Partitioner, optional
        Place records by campaign with this strategy (Ahead KeyBy); default round-robin.
    seed : int
        Seed of the event draws.
    chunk_ms : int
        Pacing step: one chunk of ``rate * chunk_ms / 1000`` events is drawn, sent and
        acknowledged per step.

    Notes
    -----
    Cost: per event about one microsecond of Python to format its JSON and a few to send it
    (kafka-python sends record by record); the draws and the placement are vectorised
    (numpy). The log costs one Parquet row group per 200,000 events. When the client cannot
    keep ``rate``, chunks follow one another without sleeping and ``event_time`` is the wall
    time the chunk was drawn, so event times stay truthful.

    Examples
    --------
    >>> report = Producer("127.0.0.1:9092", cat, "/tmp/events.parquet", rate=10_000,
    ...                   events=100_000).run()  # doctest: +SKIP
    """

    def __init__(self, bootstrap: str, catalogue: Catalogue, log_path: str | Path, *,
                 rate: float, events: int | None = None, duration: float | None = None,
                 topic: str = DEFAULT_TOPIC, placement: str | Partitioner | None = None,
                 seed: int = 0, chunk_ms: int = 50) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise InvalidArgumentError(f"rate must be a positive number of events/s, got {rate!r}")
        if events is None and duration is None:
            raise InvalidArgumentError("give events=N or duration=SECONDS (or both)")
        if events is not None and (isinstance(events, bool) or not isinstance(events, int)
                                   or events < 1):
            raise InvalidArgumentError(f"events must be a positive int, got {events!r}")
        if duration is not None and not duration > 0:
            raise InvalidArgumentError(f"duration must be > 0 seconds, got {duration!r}")
        if isinstance(chunk_ms, bool) or not isinstance(chunk_ms, int) or chunk_ms < 1:
            raise InvalidArgumentError(f"chunk_ms must be a positive int, got {chunk_ms!r}")
        self.bootstrap, self.catalogue, self.log_path = bootstrap, catalogue, Path(log_path)
        self.rate, self.events, self.duration = float(rate), events, duration
        self.topic, self.placement, self.seed, self.chunk_ms = topic, placement, seed, chunk_ms
        self.report: ProducerReport | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0  # events acknowledged so far (read by other threads)

    # ---------------------------------------------------------------- threads
    def start(self) -> Producer:
        """Run :meth:`run` in a background thread; :meth:`join` waits for it."""
        def target() -> None:
            try:
                self.run()
            except BaseException as err:  # reported by join()
                self.error = err

        self._thread = threading.Thread(target=target, name="ysb-producer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask a running producer to stop after its current chunk."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> ProducerReport:
        """Wait for the background run; re-raises its error."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        if self.report is None:
            raise InvalidArgumentError("the producer has not finished (start() it first)")
        return self.report

    # ---------------------------------------------------------------- the run
    def run(self) -> ProducerReport:
        """Send the events (blocking); returns the report. See the class notes for costs."""
        import pyarrow.parquet as pq
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap.split(","), acks="all",
                                     linger_ms=5, batch_size=512 * 1024,
                                     max_request_size=8 * 1024 * 1024)
        except (KafkaError, OSError):
            raise BrokerUnavailableError(f"no Kafka broker answered at {self.bootstrap}") from None
        try:
            parts = producer.partitions_for(self.topic)
        except KafkaError:
            producer.close()
            raise InvalidArgumentError(f"topic {self.topic!r} does not exist at {self.bootstrap}"
                                       ) from None
        n_parts = len(parts)
        strategy = (None if self.placement is None
                    else placement_strategy(self.placement, self.catalogue, n_parts))
        rng = np.random.default_rng(self.seed)
        ads, campaigns = self.catalogue.ad_ids, self.catalogue.ad_campaigns
        ad_part = (strategy.assign(list(campaigns)).astype(np.int32) if strategy is not None
                   else None)
        users = np.array([f"{rng.integers(2**63):016x}-user" for _ in range(100)], dtype=object)
        pages = np.array([f"{rng.integers(2**63):016x}-page" for _ in range(100)], dtype=object)
        ad_keys = [c.encode() for c in campaigns]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        writer = pq.ParquetWriter(str(self.log_path), LOG_SCHEMA)
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        per_part = np.zeros(n_parts, dtype=np.int64)
        views = 0
        first = last = -1
        step = self.chunk_ms / 1000.0
        start = time.monotonic()
        rr = 0
        try:
            k = 0
            while not self._stop.is_set():
                elapsed_target = (k + 1) * step
                if self.duration is not None and k * step >= self.duration:
                    break
                want = int(self.rate * elapsed_target) - self.sent
                if self.events is not None:
                    want = min(want, self.events - self.sent)
                    if want <= 0 and self.sent >= self.events:
                        break
                k += 1
                if want > 0:
                    now_ms = int(time.time() * 1000)
                    times = now_ms + (np.arange(want, dtype=np.int64) * self.chunk_ms) // want
                    idx = rng.integers(0, len(ads), want)
                    etype = rng.integers(0, len(EVENT_TYPES), want)
                    atype = rng.integers(0, len(AD_TYPES), want)
                    uidx = rng.integers(0, 100, want)
                    pidx = rng.integers(0, 100, want)
                    if ad_part is not None:
                        part = ad_part[idx]
                    else:
                        part = ((rr + np.arange(want)) % n_parts).astype(np.int32)
                        rr = (rr + want) % n_parts
                    ad_chunk = ads[idx]
                    et_names = np.array(EVENT_TYPES, dtype=object)[etype]
                    values = [(_TEMPLATE % row).encode() for row in zip(
                        users[uidx], pages[pidx], ad_chunk,
                        np.array(AD_TYPES, dtype=object)[atype], et_names, times.tolist())]
                    futures = [producer.send(self.topic, value=v, key=ad_keys[i], partition=p)
                               for v, i, p in zip(values, idx.tolist(), part.tolist())]
                    producer.flush()
                    failed = [f for f in futures if f.failed()]
                    if failed:
                        raise BrokerUnavailableError(
                            f"{len(failed)} of {want} events were not acknowledged by "
                            f"{self.bootstrap} ({failed[0].exception!r}); stopping")
                    batch = pa.RecordBatch.from_arrays(
                        [pa.array(ad_chunk, pa.string()), pa.array(et_names, pa.string()),
                         pa.array(times, pa.int64()), pa.array(part, pa.int32())],
                        schema=LOG_SCHEMA)
                    pending.append(batch)
                    pending_rows += want
                    if pending_rows >= _LOG_ROWS:
                        writer.write_table(pa.Table.from_batches(pending))
                        pending, pending_rows = [], 0
                    np.add.at(per_part, part, 1)
                    views += int((etype == 0).sum())
                    first = int(times[0]) if first < 0 else first
                    last = int(times[-1])
                    self.sent += want
                sleep = start + elapsed_target - time.monotonic()
                if sleep > 0:
                    self._stop.wait(sleep)
        finally:
            if pending:
                writer.write_table(pa.Table.from_batches(pending))
            writer.close()
            producer.close()
        seconds = max(time.monotonic() - start, 1e-9)
        self.report = ProducerReport(self.sent, views, seconds, self.sent / seconds, first, last,
                                     tuple(int(x) for x in per_part))
        logger.info("YSB producer: %d events (%d views) in %.2f s to %s", self.sent, views,
                    seconds, self.topic)
        return self.report


def read_log(path: str | Path) -> pa.Table:
    """The event log a :class:`Producer` wrote, with the columns of :data:`LOG_SCHEMA`.

    Raises :class:`~trilink_spark.InvalidArgumentError` when ``path`` is missing, not Parquet,
    or lacks those columns and types. Cost: one Parquet read of the three columns.
    """
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(str(path), columns=list(LOG_SCHEMA.names))
    except (OSError, pa.ArrowException, KeyError, ValueError) as err:
        raise InvalidArgumentError(
            f"{path} is not a YSB event log ({type(err).__name__}: {err}); expected Parquet "
            f"with columns {LOG_SCHEMA}") from None
    if not table.schema.equals(LOG_SCHEMA):
        raise InvalidArgumentError(
            f"{path} has columns {table.schema}, a YSB event log has {LOG_SCHEMA}")
    return table
