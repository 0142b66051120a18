"""The YSB event producer: JSON ad events on a Kafka topic at a given rate, logged for the check.

Events are those of ``yahoo/streaming-benchmarks``: ``user_id``, ``page_id``, ``ad_id``,
``ad_type`` (banner, modal, sponsored-search, mail, mobile), ``event_type`` (view, click,
purchase), ``event_time`` (milliseconds since the epoch) and ``ip_address``, one JSON object
per Kafka record, with the ad's campaign id as the record key.

The producer sends in chunks (every ``chunk_ms``): a chunk is drawn with numpy, sent with
kafka-python, flushed (every record acknowledged), then appended to the event log, a Parquet
file with the typed columns of :data:`LOG_SCHEMA`. The log therefore holds exactly the
acknowledged events: :func:`~benches.ysb.check` recomputes the expected counts from it.
With ``processes=n`` the events are shared by ``n`` spawned processes, each with its own Kafka
client, its share of the rate and its own part of the log (a directory of parts, read as one
by :func:`read_log`).

Placement: with ``placement=None`` records go round-robin over the topic's partitions (what a
producer without a key-aware partitioner does); with a strategy (a name such as
``"least_key"`` or a :class:`~trilink_spark.Partitioner`) each record goes to the partition
the strategy gives its campaign: the Ahead KeyBy layout
:func:`~trilink_spark.placement.keyed_by_source` declares.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trilink_spark import Partitioner
from trilink_spark.errors import BrokerUnavailableError, InvalidArgumentError
from trilink_spark.errors import InvalidArgumentTypeError, TrilinkError
from trilink_spark.partitioners.choosing.catalogue import build
from .catalogue import Catalogue

__all__ = ["AD_TYPES", "EVENT_TYPES", "LOG_SCHEMA", "DEFAULT_TOPIC", "Producer",
           "ProducerError", "ProducerReport", "placement_strategy", "read_log"]

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
_MAX_CHUNK = 2_000  # events sent (then acknowledged) at most per chunk


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
    processes : int
        Producing processes that shared the events.
    """

    events: int
    views: int
    seconds: float
    rate: float
    first_time: int
    last_time: int
    per_partition: tuple[int, ...]
    processes: int = 1


class ProducerError(TrilinkError, RuntimeError):
    """A producing process of a multi-process :class:`Producer` failed or died."""


@dataclass(frozen=True)
class _Share:
    """One producing process's part of a run (picklable: spawned processes receive it)."""

    bootstrap: str
    catalogue: Catalogue
    log_path: str
    rate: float
    events: int | None
    duration: float | None
    topic: str
    placement: str | Partitioner | None
    seed: int
    chunk_ms: int
    index: int
    count: int


def _share_events(events: int | None, index: int, count: int) -> int | None:
    """Events of share ``index`` of ``count``: an even split, the first shares one more."""
    if events is None:
        return None
    return events // count + (1 if index < events % count else 0)


def _kafka_producer(bootstrap: str) -> Any:
    """A kafka-python producer that batches: records of one partition go in batches of up to
    1 MiB, lingering 10 ms. Raises BrokerUnavailableError when the broker does not answer."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    try:
        return KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all",
                             linger_ms=10, batch_size=1024 * 1024,
                             max_request_size=8 * 1024 * 1024)
    except (KafkaError, OSError):
        raise BrokerUnavailableError(f"no Kafka broker answered at {bootstrap}") from None


def _encode_events(users: Any, pages: Any, ads: Any, ad_types: Any, event_types: Any,
                   times: Any) -> list[bytes]:
    """The JSON bytes of a chunk of events (YSB's field order): one ``%`` format per event
    over columns prepared by numpy, encoded as one buffer and split. O(events)."""
    text = "\n".join([_TEMPLATE % row for row in zip(users, pages, ads, ad_types, event_types,
                                                       times)])
    return text.encode().split(b"\n")


def _produce(share: _Share, stop: Any, set_sent: Callable[[int], None],
             ready: Callable[[], None]) -> dict[str, Any]:
    """Send one share's events, paced at ``share.rate``, and log them to ``share.log_path``.

    ``ready`` is called once the broker answered and everything is prepared (a spawned
    process waits there for the others); ``set_sent`` receives the count acknowledged after
    each chunk; ``stop`` (an Event) ends the run after the current chunk. Returns the share's
    figures (plain values). Cost: see :class:`Producer`.
    """
    import pyarrow.parquet as pq
    from kafka.errors import KafkaError

    producer = _kafka_producer(share.bootstrap)
    try:
        parts = producer.partitions_for(share.topic)
    except KafkaError:
        producer.close()
        raise InvalidArgumentError(f"topic {share.topic!r} does not exist at {share.bootstrap}"
                                   ) from None
    n_parts = len(parts)
    strategy = (None if share.placement is None
                else placement_strategy(share.placement, share.catalogue, n_parts))
    # one share: the draws of ``seed`` itself; several: an independent stream per share
    rng = np.random.default_rng(share.seed if share.count == 1 else [share.seed, share.index])
    ads, campaigns = share.catalogue.ad_ids, share.catalogue.ad_campaigns
    ad_part = (strategy.assign(list(campaigns)).astype(np.int32) if strategy is not None
               else None)
    users = np.array([f"{rng.integers(2**63):016x}-user" for _ in range(100)], dtype=object)
    pages = np.array([f"{rng.integers(2**63):016x}-page" for _ in range(100)], dtype=object)
    ad_types = np.array(AD_TYPES, dtype=object)
    event_types = np.array(EVENT_TYPES, dtype=object)
    ad_keys = [c.encode() for c in campaigns]
    send = producer.send
    log_path = Path(share.log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    writer = pq.ParquetWriter(str(log_path), LOG_SCHEMA)
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    per_part = np.zeros(n_parts, dtype=np.int64)
    views = sent = 0
    first = last = -1
    step = share.chunk_ms / 1000.0
    rr = share.index % n_parts  # shares start their round robin at different partitions
    ready()
    start = time.monotonic()
    try:
        k = 0
        while not stop.is_set():
            elapsed_target = (k + 1) * step
            if share.duration is not None and k * step >= share.duration:
                break
            # behind the rate (or unpaced), chunks stay at most _MAX_CHUNK events: the client
            # sends the first batches while the next records are appended
            want = min(int(share.rate * elapsed_target) - sent, _MAX_CHUNK)
            if share.events is not None:
                want = min(want, share.events - sent)
                if want <= 0 and sent >= share.events:
                    break
            k += 1
            if want > 0:
                now_ms = int(time.time() * 1000)
                times = now_ms + (np.arange(want, dtype=np.int64) * share.chunk_ms) // want
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
                et_names = event_types[etype]
                values = _encode_events(users[uidx], pages[pidx], ad_chunk, ad_types[atype],
                                        et_names, times.tolist())
                futures = [send(share.topic, value=v, key=ad_keys[i], partition=p)
                           for v, i, p in zip(values, idx.tolist(), part.tolist())]
                producer.flush()
                failed = [f for f in futures if f.failed()]
                if failed:
                    raise BrokerUnavailableError(
                        f"{len(failed)} of {want} events were not acknowledged by "
                        f"{share.bootstrap} ({failed[0].exception!r}); stopping")
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
                sent += want
                set_sent(sent)
            sleep = start + elapsed_target - time.monotonic()
            if sleep > 0:
                stop.wait(sleep)
    finally:
        if pending:
            writer.write_table(pa.Table.from_batches(pending))
        writer.close()
        producer.close()
    return {"events": sent, "views": views, "first": first, "last": last,
            "per_partition": [int(x) for x in per_part],
            "seconds": time.monotonic() - start}


def _worker(share: _Share, sent: Any, stop: Any, go: Any, messages: Any) -> None:
    """Body of a spawned producing process: report ready, wait for ``go``, produce, report.

    Messages are plain tuples: ``("ready", i)``, ``("done", i, figures)`` or
    ``("error", i, type name, message)``."""
    def set_sent(n: int) -> None:
        sent[share.index] = n

    def ready() -> None:
        messages.put(("ready", share.index))
        if not go.wait(_START_TIMEOUT_S):
            raise ProducerError(f"producer process {share.index} was not started within "
                                f"{_START_TIMEOUT_S:g} s")

    try:
        figures = _produce(share, stop, set_sent, ready)
    except BaseException as err:  # reported to the parent, which raises it
        messages.put(("error", share.index, type(err).__name__, str(err)))
        return
    messages.put(("done", share.index, figures))


#: Most producing processes one :class:`Producer` spawns (each is a Python interpreter with its
#: own Kafka client: far more than the cores only costs memory and start time).
MAX_PROCESSES = 256
#: How long a spawned producing process may take to start (imports, broker metadata).
_START_TIMEOUT_S = 120.0
#: Errors a producing process reports that the parent raises as the same type.
_REPORTED_ERRORS: dict[str, type[TrilinkError]] = {
    "BrokerUnavailableError": BrokerUnavailableError,
    "InvalidArgumentError": InvalidArgumentError,
    "InvalidArgumentTypeError": InvalidArgumentTypeError,
}


class Producer:
    """Send YSB events at ``rate`` per second to ``topic``, logging them to ``log_path``.

    Parameters
    ----------
    bootstrap : str
        Kafka bootstrap servers.
    catalogue : Catalogue
        From :func:`~benches.ysb.setup`.
    log_path : str or Path
        The Parquet event log (overwritten): one file with one process; with several, a
        directory of one ``part-NNN.parquet`` per process. :func:`read_log` (and so
        :func:`~benches.ysb.check`) reads either as one log.
    rate : float
        Events per second (the target; :attr:`ProducerReport.rate` says what was achieved).
    events : int, optional
        Stop after this many events.
    duration : float, optional
        Or after this many seconds (one of ``events`` and ``duration`` is needed).
    topic : str
        Default ``"ad-events"``; it must exist (:func:`trilink_spark.testing.create_topic`).
    placement : str or Partitioner, optional
        Place records by campaign with this strategy (Ahead KeyBy); default round-robin.
    seed : int
        Seed of the event draws (with several processes, each draws from ``(seed, i)``).
    chunk_ms : int
        Pacing step: one chunk of ``rate * chunk_ms / 1000`` events (at most 2,000; a producer
        behind its rate sends chunks back to back) is drawn, sent and acknowledged per step.
    processes : int
        Producing processes (default 1: in this process). With ``n > 1``, ``n`` processes are
        spawned (``multiprocessing``'s spawn start method: nothing of this process, a Spark
        driver included, is forked); each has its own Kafka client, sends an even share of the
        events at ``rate / n`` and logs them to its own part of the log. They start sending
        together, once every one has connected.

    Notes
    -----
    Cost: per event a few microseconds of Python in kafka-python's ``send`` (one call per
    record: 90 % of a process's time), under one microsecond to format its JSON (one ``%``
    per event, one encode per chunk); the draws and the placement are vectorised (numpy).
    One process reaches about 30k events/s with a core to itself; ``processes=n`` multiplies
    that by up to the free cores (2 processes: 38k/s at a 40k/s target on 2 cores shared with
    the broker). Each spawned process also costs one to a few seconds to start (imports and
    the broker's metadata), not counted in :attr:`ProducerReport.seconds`. The log costs one Parquet row group per 200,000 events. When
    the client cannot keep ``rate``, chunks follow one another without sleeping and
    ``event_time`` is the wall time the chunk was drawn, so event times stay truthful.
    Spawned processes re-import the main module: a script that makes a multi-process
    producer needs the usual ``if __name__ == "__main__":`` guard.

    Examples
    --------
    >>> report = Producer("127.0.0.1:9092", cat, "/tmp/events.parquet", rate=40_000,
    ...                   events=400_000, processes=2).run()  # doctest: +SKIP
    """

    def __init__(self, bootstrap: str, catalogue: Catalogue, log_path: str | Path, *,
                 rate: float, events: int | None = None, duration: float | None = None,
                 topic: str = DEFAULT_TOPIC, placement: str | Partitioner | None = None,
                 seed: int = 0, chunk_ms: int = 50, processes: int = 1) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or \
                not 0 < rate < float("inf"):
            raise InvalidArgumentError(
                f"rate must be a positive finite number of events/s, got {rate!r}")
        if events is None and duration is None:
            raise InvalidArgumentError("give events=N or duration=SECONDS (or both)")
        if events is not None and (isinstance(events, bool) or not isinstance(events, int)
                                   or events < 1):
            raise InvalidArgumentError(f"events must be a positive int, got {events!r}")
        if duration is not None and (isinstance(duration, bool)
                                     or not isinstance(duration, (int, float))
                                     or not duration > 0):
            raise InvalidArgumentError(f"duration must be > 0 seconds, got {duration!r}")
        if isinstance(chunk_ms, bool) or not isinstance(chunk_ms, int) or chunk_ms < 1:
            raise InvalidArgumentError(f"chunk_ms must be a positive int, got {chunk_ms!r}")
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1 \
                or processes > MAX_PROCESSES:
            raise InvalidArgumentError(
                f"processes must be an int >= 1 and <= {MAX_PROCESSES}, got {processes!r}")
        self.bootstrap, self.catalogue, self.log_path = bootstrap, catalogue, Path(log_path)
        self.rate, self.events, self.duration = float(rate), events, duration
        self.topic, self.placement, self.seed, self.chunk_ms = topic, placement, seed, chunk_ms
        # never more processes than events: each must have one to send
        self.processes = min(processes, events) if events is not None else processes
        self.report: ProducerReport | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sent = 0
        self._shared: Any = None  # the spawned processes' counters
        #: Wall time (``time.time()``) the first chunk was sent (after the processes started).
        self.started: float | None = None

    @property
    def sent(self) -> int:
        """Events acknowledged so far (read by other threads while the producer runs)."""
        shared = self._shared
        if shared is not None:
            return int(sum(shared[:]))
        return self._sent

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
    def _share(self, index: int, count: int, log_path: Path) -> _Share:
        return _Share(self.bootstrap, self.catalogue, str(log_path), self.rate / count,
                      _share_events(self.events, index, count), self.duration, self.topic,
                      self.placement, self.seed, self.chunk_ms, index, count)

    def run(self) -> ProducerReport:
        """Send the events (blocking); returns the report. See the class notes for costs.

        Raises
        ------
        BrokerUnavailableError
            The broker does not answer, or did not acknowledge events.
        InvalidArgumentError
            The topic does not exist (or the placement does not fit it).
        ProducerError
            A spawned producing process died or could not start.
        """
        _clear_log(self.log_path)
        if self.processes == 1:
            def set_sent(n: int) -> None:
                self._sent = n

            def ready() -> None:
                self.started = time.time()

            figures = [_produce(self._share(0, 1, self.log_path), self._stop, set_sent, ready)]
        else:
            figures = self._run_processes()
        self.report = _combine(figures, self.processes)
        logger.info("YSB producer: %d events (%d views) in %.2f s to %s (%d process(es))",
                    self.report.events, self.report.views, self.report.seconds, self.topic,
                    self.processes)
        return self.report

    def _run_processes(self) -> list[dict[str, Any]]:
        """Spawn the producing processes, start them together, gather their figures."""
        import multiprocessing
        import queue

        ctx = multiprocessing.get_context("spawn")
        n = self.processes
        self.log_path.mkdir(parents=True, exist_ok=True)
        shared = ctx.Array("q", n, lock=False)
        stop, go, messages = ctx.Event(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_worker, name=f"ysb-producer-{i}", daemon=True,
                             args=(self._share(i, n, self.log_path / f"part-{i:03d}.parquet"),
                                   shared, stop, go, messages))
                 for i in range(n)]
        for proc in procs:
            proc.start()
        self._shared = shared
        figures: dict[int, dict[str, Any]] = {}
        errors: list[tuple[int, str, str]] = []
        ready: set[int] = set()
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while len(figures) + len(errors) < n:
                if self._stop.is_set():
                    stop.set()
                try:
                    msg = messages.get(timeout=0.1)
                except queue.Empty:
                    dead = [i for i, p in enumerate(procs) if not p.is_alive()
                            and i not in figures and i not in {e[0] for e in errors}]
                    if dead:  # a process that died without a word (killed, out of memory)
                        time.sleep(0.2)  # its last message may still be in the pipe
                        if messages.empty():
                            for i in dead:
                                errors.append((i, "ProducerError", "producer process "
                                               f"{i} exited with code {procs[i].exitcode}"))
                            stop.set()  # the others stop after their chunk, and those
                            go.set()  # waiting for the start give up at once (stop is set)
                    if not go.is_set() and time.monotonic() > deadline:
                        errors.append((-1, "ProducerError", "the producer processes did not "
                                       f"all start within {_START_TIMEOUT_S:g} s"))
                        break
                    continue
                if msg[0] == "ready":
                    ready.add(int(msg[1]))
                    if len(ready) == n:
                        self.started = time.time()
                        go.set()
                elif msg[0] == "done":
                    figures[int(msg[1])] = msg[2]
                else:
                    errors.append((int(msg[1]), str(msg[2]), str(msg[3])))
                    stop.set()  # the others stop after their chunk
                    go.set()  # and those still waiting give up at once (stop is set)
        finally:
            stop.set()
            go.set()
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():  # pragma: no cover - a process stuck in the client
                    proc.terminate()
                    proc.join(timeout=5)
            self._sent = self.sent
            self._shared = None
            messages.close()
        if errors:
            index, kind, message = errors[0]
            raise _REPORTED_ERRORS.get(kind, ProducerError)(
                message if kind in _REPORTED_ERRORS else
                f"producer process {index} failed ({kind}: {message})")
        return [figures[i] for i in range(n)]


def _combine(figures: list[dict[str, Any]], processes: int) -> ProducerReport:
    """One report from the shares' figures (events, views and partitions added up)."""
    events = sum(int(f["events"]) for f in figures)
    seconds = max(max(float(f["seconds"]) for f in figures), 1e-9)
    firsts = [int(f["first"]) for f in figures if int(f["first"]) >= 0]
    lasts = [int(f["last"]) for f in figures if int(f["last"]) >= 0]
    per_part = np.sum([np.asarray(f["per_partition"], dtype=np.int64) for f in figures], axis=0)
    return ProducerReport(events, sum(int(f["views"]) for f in figures), seconds,
                          events / seconds, min(firsts) if firsts else -1,
                          max(lasts) if lasts else -1, tuple(int(x) for x in per_part),
                          processes)


def _clear_log(path: Path) -> None:
    """Remove a previous log at ``path``: a file, or a directory of ``part-*.parquet`` files
    (refused when it holds anything else)."""
    if path.is_dir():
        for part in path.glob("part-*.parquet"):
            part.unlink()
        try:
            path.rmdir()
        except OSError:
            raise InvalidArgumentError(
                f"{path} is a directory holding files other than an event log's parts; give "
                "another log_path") from None
    elif path.exists():
        path.unlink()


def read_log(path: str | Path) -> pa.Table:
    """The event log a :class:`Producer` wrote, with the columns of :data:`LOG_SCHEMA`: one
    Parquet file, or a directory of ``part-*.parquet`` files (one per producing process),
    read as one table.

    Raises :class:`~trilink_spark.errors.InvalidArgumentError` when ``path`` is missing, not
    Parquet, an empty directory, or lacks those columns and types. Cost: one Parquet read of the
    four columns per file.
    """
    import pyarrow.parquet as pq

    where = Path(path)
    files = sorted(where.glob("part-*.parquet")) if where.is_dir() else [where]
    if not files:
        raise InvalidArgumentError(
            f"{path} is a directory without part-*.parquet files, not a YSB event log")
    if where.is_dir():  # a producer's parts: part-000.parquet .. part-{n-1}, plain files
        for i, file in enumerate(files):
            if file.name != f"part-{i:03d}.parquet" or not file.is_file():
                raise InvalidArgumentError(
                    f"{file} is not a part of the YSB event log in {path} (a producer "
                    f"writes plain files part-000.parquet to part-{len(files) - 1:03d}.parquet"
                    "); remove it or give the log's own directory")
    tables = []
    for file in files:
        try:
            table = pq.read_table(str(file), columns=list(LOG_SCHEMA.names))
        except (OSError, pa.ArrowException, KeyError, ValueError) as err:
            raise InvalidArgumentError(
                f"{file} is not a YSB event log ({type(err).__name__}: {err}); expected "
                f"Parquet with columns {LOG_SCHEMA}") from None
        if not table.schema.equals(LOG_SCHEMA):
            raise InvalidArgumentError(
                f"{file} has columns {table.schema}, a YSB event log has {LOG_SCHEMA}")
        tables.append(table)
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
